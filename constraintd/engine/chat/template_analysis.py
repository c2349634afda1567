# llama.cpp's chat auto-parser analysis of a template (autoparser::analyze_template in
# common/chat-diff-analyzer.cpp), as far as it is ported: reasoning, content, the tool-call format's mode and,
# for JSON tool calls, its markers and fields; the preserved tokens; then the patches of known templates.
#
# Contract:
# - Phases in llama.cpp's order, each reading the ones before as they were before the patches: reasoning
#   (reasoning.py), content (are answers wrapped in markers?), tools (only where the template's capabilities
#   say it renders tool calls), preserved tokens (every marker found, trimmed, once each), then the patches.
# - The tool-call format's mode is always found (none, JSON, tag with JSON arguments, tag with tagged
#   arguments); its markers and fields only for JSON calls. For the tag formats `tools_complete` is False and
#   `preserved_tokens` is None: they need the analysis of function and argument markers, not ported yet.
# - Like the reasoning phase, every match is one of the analysis's small PEG parsers written as the regular
#   expression it is, tried at each position in turn.
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from constraintd.engine.chat.diff_split import (
    C_SPACE,
    Render,
    trim_whitespace,
)
from constraintd.engine.chat.reasoning import (
    ARG_FIRST,
    ARG_SECOND,
    ASSISTANT_MSG,
    CALL_ID_001,
    FUN_FIRST,
    FUN_SECOND,
    MARKER,
    SPACE,
    THINKING_CONTENT,
    USER_MSG,
    Probe,
    ReasoningAnalysis,
    ReasoningMode,
    analyze_reasoning,
    probe_tools,
    tool_call,
)
from constraintd.engine.chat.template_inputs import TemplateCaps

__all__ = ["ContentMode", "TemplateAnalysis", "ToolFormat", "ToolMode", "analyze_template"]

CALL_ID_002 = "call00002"


class ContentMode(enum.Enum):
    """How a template shows an answer's content (llama.cpp's content_mode)."""

    PLAIN = "plain"
    ALWAYS_WRAPPED = "always_wrapped"
    WRAPPED_WITH_REASONING = "wrapped_with_reasoning"


class ToolMode(enum.Enum):
    """How a template writes a tool call (llama.cpp's tool_format)."""

    NONE = "none"
    JSON_NATIVE = "json_native"  # {"name": ..., "arguments": {...}}
    TAG_WITH_JSON = "tag_with_json"  # <function=name>{...}</function>
    TAG_WITH_TAGGED = "tag_with_tagged"  # <param=key>value</param>


@dataclass(slots=True)
class ToolFormat:
    """The tool-call format's markers and JSON fields (tool_format_analysis, tool_function_analysis)."""

    mode: ToolMode = ToolMode.NONE
    section_start: str = ""
    section_end: str = ""
    per_call_start: str = ""
    per_call_end: str = ""
    fun_name_is_key: bool = False
    tools_array_wrapped: bool = False
    openai_wrapper_trigger: bool = False
    function_field: str = "function"
    name_field: str = "name"
    args_field: str = "arguments"
    id_field: str = ""
    gen_id_field: str = ""
    parameter_order: list[str] = field(default_factory=list)
    # tool_function_analysis, set here only by the patches of known templates
    name_prefix: str = ""
    function_close: str = ""


@dataclass(slots=True)
class TemplateAnalysis:
    """What the analysis found (see the module's contract)."""

    reasoning: ReasoningAnalysis
    content_mode: ContentMode = ContentMode.PLAIN
    content_start: str = ""
    content_end: str = ""
    tools: ToolFormat = field(default_factory=ToolFormat)
    tools_complete: bool = True
    preserved_tokens: list[str] | None = None
    additional_stops: list[str] = field(default_factory=list)

    @property
    def trigger_marker(self) -> str | None:
        """The word a lazy tool grammar waits for (the section's start, else the call's), or None where the
        format's markers are not analysed here."""
        if not self.tools_complete:
            return None
        return self.tools.section_start or self.tools.per_call_start


def _content(probe: Probe, reasoning: ReasoningAnalysis, found: TemplateAnalysis) -> None:
    user = {"role": "user", "content": USER_MSG}
    content_only = {"role": "assistant", "content": ASSISTANT_MSG}
    with_tools = {"role": "assistant", "content": "",
                  "tool_calls": [tool_call("test_func", {"arg1": "value1"})]}
    with_reasoning = {"role": "assistant", "content": "", "reasoning_content": THINKING_CONTENT}
    tools = probe_tools()
    base = probe.context([user, content_only], tools=tools)
    compared_tools = probe.compare(base, probe.context([user, with_tools], tools=tools))
    compared_reasoning = probe.compare(base, probe.context([user, with_reasoning], tools=tools))
    if compared_tools is None or compared_reasoning is None:
        return
    diff_tools, diff_reasoning = compared_tools.diff, compared_reasoning.diff
    plain = False
    if trim_whitespace(diff_tools.left) == ASSISTANT_MSG:
        # space, the text itself, space, a marker or not, space, the end: taken unless the text starts with a
        # space (the first space parser has eaten it)
        if not diff_reasoning.left[:1] or diff_reasoning.left[0] not in C_SPACE:
            plain = True
        elif reasoning.mode is not ReasoningMode.NONE and reasoning.end:
            after = re.compile(f"{re.escape(reasoning.end)}{SPACE}{re.escape(ASSISTANT_MSG)}")
            plain = after.search(diff_reasoning.left) is not None
    if plain:
        found.content_mode = ContentMode.PLAIN
    else:
        rdiff = diff_reasoning.left
        if reasoning.end and reasoning.end in rdiff:
            rdiff = rdiff[rdiff.find(reasoning.end) + len(reasoning.end):]
        pure = rdiff if len(rdiff) > len(diff_tools.left) else diff_tools.left
        wrapped = re.compile(
            f"(?P<pre>{MARKER}{SPACE}){re.escape(ASSISTANT_MSG)}{SPACE}(?P<post>{MARKER}{SPACE})", re.DOTALL)
        match = wrapped.search(pure)
        found.content_start = match.group("pre") if match else ""
        found.content_end = match.group("post") if match else ""
    if found.content_start or found.content_end:
        found.content_mode = ContentMode.ALWAYS_WRAPPED


def _in_json(haystack: str, needle: str) -> bool:
    return re.search(f'[{{:]{SPACE}"{re.escape(needle)}"', haystack) is not None


def _arguments_object(name: str, *, call_id: str = CALL_ID_001) -> dict[str, Any]:
    return tool_call(name, {ARG_FIRST: "XXXX", ARG_SECOND: "YYYY"}, call_id)


def _json_native(haystack: str, tools: ToolFormat) -> None:
    # analyze_tool_call_format_json_native: the call's JSON, its fields, what is around it
    json_start = haystack.find("{")
    json_end = haystack.rfind("}")
    cut = haystack[json_start:json_end + 1]
    call = json.loads(cut, object_pairs_hook=lambda pairs: dict(pairs))

    def dump(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    def register(prefix: str, key: str, value: Any) -> None:
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, str) and "call0000" in value:
            tools.id_field = name
        elif isinstance(value, str) and value == FUN_FIRST:
            tools.name_field = name
        elif ARG_FIRST in dump(value):
            tools.args_field = name
        elif "id" in key:
            tools.gen_id_field = name

    items = call.items() if isinstance(call, dict) else ()
    for key, value in items:
        if key == FUN_FIRST:
            tools.fun_name_is_key = True
            tools.name_field = tools.args_field = ""
            continue
        if isinstance(value, dict) and ARG_FIRST not in dump(value):
            tools.function_field = key
            for sub_key, sub_value in value.items():
                register(key, sub_key, sub_value)
        register("", key, value)
    wrapped = re.search(f"(?P<pre>\\[{SPACE}){re.escape(cut)}(?P<post>{SPACE}\\])", haystack)
    if wrapped is not None:
        tools.tools_array_wrapped = True
        json_start -= len(wrapped.group("pre"))
        json_end += len(wrapped.group("post"))
    json_end += 1
    located = []
    for name in (tools.name_field, tools.args_field, tools.id_field, tools.gen_id_field):
        if name:
            at = haystack.find(name)
            located.append((at if at >= 0 else len(haystack) + (1 << 62), name))
    tools.parameter_order = [name for _, name in sorted(located)]
    tools.section_start = haystack[:json_start].lstrip(C_SPACE)
    tools.section_end = trim_whitespace(haystack[json_end:])
    if tools.tools_array_wrapped and tools.section_end == "]":
        tools.section_end = ""


def _json_parallel_calls(probe: Probe, tools: ToolFormat) -> None:
    user = {"role": "user", "content": USER_MSG}
    one = {"role": "assistant", "content": "", "tool_calls": [_arguments_object(FUN_FIRST)]}
    two = {"role": "assistant", "content": "", "tool_calls": [
        _arguments_object(FUN_FIRST), _arguments_object(FUN_SECOND, call_id=CALL_ID_002)]}
    listed = probe_tools()
    compared = probe.compare(probe.context([user, one], tools=listed),
                             probe.context([user, two], tools=listed))
    if compared is None:
        return
    if tools.section_start and tools.section_start in compared.diff.right:
        tools.per_call_start, tools.per_call_end = tools.section_start, tools.section_end
        tools.section_start = tools.section_end = ""


def _tools(probe: Probe, caps: TemplateCaps, reasoning: ReasoningAnalysis, found: TemplateAnalysis) -> None:
    user = {"role": "user", "content": USER_MSG}
    plain = {"role": "assistant", "content": ASSISTANT_MSG}
    calling = {"role": "assistant", "content": "", "tool_calls": [_arguments_object(FUN_FIRST)]}
    listed = probe_tools()
    compared = probe.compare(probe.context([user, plain], tools=listed),
                             probe.context([user, calling], tools=listed))
    if compared is None or not compared.diff.right:
        return
    haystack = compared.diff.right
    tools = found.tools
    if _in_json(haystack, FUN_FIRST):
        tools.mode = ToolMode.JSON_NATIVE
    elif _in_json(haystack, ARG_FIRST):
        tools.mode = ToolMode.TAG_WITH_JSON
    else:
        tools.mode = ToolMode.TAG_WITH_TAGGED
    clean = haystack
    if reasoning.start and reasoning.start in haystack:
        at = haystack.find(reasoning.start)
        clean = haystack[:at] + haystack[at + len(reasoning.start):]
    if reasoning.end and reasoning.end in clean:
        at = clean.find(reasoning.end)
        clean = clean[:at] + clean[at + len(reasoning.end):]
    if tools.mode is not ToolMode.JSON_NATIVE:
        found.tools_complete = False  # the tag formats' markers: not ported
        return
    _json_native(clean, tools)
    if caps.supports_parallel_tool_calls:
        _json_parallel_calls(probe, tools)
    tools.section_end = trim_whitespace(tools.section_end)
    tools.per_call_end = trim_whitespace(tools.per_call_end)


def _collect_preserved(found: TemplateAnalysis) -> None:
    if not found.tools_complete:
        return
    tokens: list[str] = []
    tools = found.tools
    for marker in (found.reasoning.start, found.reasoning.end, found.content_start, found.content_end,
                   tools.section_start, tools.section_end, tools.per_call_start, tools.per_call_end):
        token = trim_whitespace(marker)
        if token and token not in tokens:
            tokens.append(token)
    found.preserved_tokens = tokens


def _add_preserved(found: TemplateAnalysis, *tokens: str) -> None:
    if found.preserved_tokens is not None:
        found.preserved_tokens.extend(tokens)


# The patches of known templates (the analysis's workarounds), in llama.cpp's order: marks in the source, and
# what each sets. A patch that replaces the whole preserved token list makes it known even for a tag format.
def _patch(source: str, found: TemplateAnalysis) -> None:
    reasoning, tools = found.reasoning, found.tools
    if ("content.split('</think>')" in source and "reasoning_content" not in source
            and "<SPECIAL_12>" not in source and reasoning.mode is ReasoningMode.NONE):
        # old Qwen / DeepSeek thinking templates: they drop reasoning, but the model writes it
        reasoning.mode, reasoning.start, reasoning.end = ReasoningMode.TAG_BASED, "<think>", "</think>"
        _add_preserved(found, "<think>", "</think>")
    if ("Write your thoughts between <think></think> and write your response between <response></response>"
            in source):  # Granite 3.3
        reasoning.mode, reasoning.start, reasoning.end = ReasoningMode.TAG_BASED, "<think>", "</think>"
        _add_preserved(found, "<think>", "</think>")
        found.content_mode = ContentMode.WRAPPED_WITH_REASONING
        found.content_start, found.content_end = "<response>", "</response>"
        _add_preserved(found, "<response>", "</response>")
    if "<|CHATBOT_TOKEN|>" in source and "<|END_OF_TURN_TOKEN|>" in source and not found.content_start:
        # Cohere Command R+
        found.content_mode = ContentMode.ALWAYS_WRAPPED
        found.content_start, found.content_end = "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"
        _add_preserved(found, "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
    if ('set has_code_interpreter = tools | selectattr("type", "equalto", "code_interpreter") | list | '
            'length > 0' in source):  # Functionary 3.1: no section markers; the preserved tokens replaced
        found.content_mode, found.content_end = ContentMode.PLAIN, ""
        tools.name_prefix = tools.section_start = tools.section_end = tools.function_close = ""
        tools.per_call_start, tools.per_call_end = "<function=", "</function>"
        found.preserved_tokens = ["<|eot_id|>", "<|eom_id|>", "<function=", ">", "</function>"]
    if ("{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'"
            in source):  # DeepSeek-R1-Distill-Qwen
        tools.section_start, tools.section_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
        tools.per_call_start, tools.per_call_end = "<｜tool▁call▁begin｜>function", "<｜tool▁call▁end｜>"
        tools.name_prefix, tools.function_close = "<｜tool▁sep｜>", "```"
    if all(mark in source for mark in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        # Nemotron Nano v2: JSON calls in <TOOLCALL>[...]</TOOLCALL>; the preserved tokens replaced
        tools.mode = ToolMode.JSON_NATIVE
        tools.section_start = tools.section_end = ""
        tools.per_call_start, tools.per_call_end = "<TOOLCALL>", "</TOOLCALL>"
        tools.tools_array_wrapped = True
        found.content_mode, found.content_start, found.content_end = ContentMode.PLAIN, "", ""
        reasoning.mode, reasoning.start, reasoning.end = ReasoningMode.TAG_BASED, "<think>\n", "</think>"
        found.preserved_tokens = ["<SPECIAL_11>", "</think>", "<TOOLCALL>", "</TOOLCALL>"]
    if 'Respond in the format {"name": function name' in source and "Do not use variables." in source:
        tools.openai_wrapper_trigger = True  # the model writes OpenAI's function wrapper
    if "laguna_glm_thinking" in source:
        # Laguna: the tags without the template's formatting whitespace, and </assistant> as a stop string
        reasoning.start, reasoning.end = trim_whitespace(reasoning.start), trim_whitespace(reasoning.end)
        found.additional_stops.append("</assistant>")


def analyze_template(source: str, render: Render, caps: TemplateCaps, *, bos_token: str = "",
                     eos_token: str = "") -> TemplateAnalysis:
    """The template's analysis as llama.cpp's auto-parser makes it (see the module's contract).

    `render(context)` renders `source` in llama.cpp's Jinja dialect; a probe it raises on gives no answer.

    Raises:
        ValueError: the JSON of the template's tool call does not parse (llama.cpp refuses the template).
    """
    probe = Probe(render, caps, bos_token, eos_token)
    reasoning = analyze_reasoning(probe, supports_tool_calls=caps.supports_tool_calls)
    found = TemplateAnalysis(reasoning)
    _content(probe, reasoning, found)
    if caps.supports_tool_calls:
        _tools(probe, caps, reasoning, found)
    _collect_preserved(found)
    _patch(source, found)
    return found
