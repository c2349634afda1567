# llama.cpp's chat auto-parser analysis of a template (autoparser::analyze_template in
# common/chat-diff-analyzer.cpp): reasoning, content, the tool-call format (its mode, and its markers and
# fields: JSON calls', or the tag formats' function, argument and call id markers); the preserved tokens; then
# the patches of known templates. Not done: the user and assistant start markers (no chat param reads them).
#
# Contract:
# - Phases in llama.cpp's order, each reading the ones before as they were before the patches: reasoning
#   (reasoning.py), content (are answers wrapped in markers?), tools (only where the template's capabilities
#   say it renders tool calls), preserved tokens (every marker found, trimmed, once each), then the patches.
# - The tool-call format's mode is found first (none, JSON, tag with JSON arguments, tag with tagged
#   arguments), then its markers: for JSON calls the JSON's fields and what is around the JSON; for the tag
#   formats the section and per-call markers, the function name's, the arguments' (tagged arguments only) and
#   the call id's, each from two renderings that differ in one point (a second call, another function,
#   another argument, another value, another id).
# - Like the reasoning phase, every match is one of the analysis's small PEG parsers written as the regular
#   expression it is, tried at each position in turn. A PEG repetition never gives back what it took, so the
#   expressions repeat possessively (`*+`) wherever giving back could let a later part match where the
#   parser's would not.
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from constraintd.engine.chat.analysis.diff_split import (
    C_SPACE,
    Render,
    diff_split,
    trim_whitespace,
)
from constraintd.engine.chat.analysis.reasoning import (
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
from constraintd.engine.chat.templates.template_inputs import TemplateCaps

__all__ = ["CallIdPosition", "ContentMode", "TemplateAnalysis", "ToolFormat", "ToolMode", "analyze_template"]

CALL_ID_002 = "call00002"
CALL_ID_999 = "call99999"


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


class CallIdPosition(enum.Enum):
    """Where a tag format writes a call's id (llama.cpp's call_id_position)."""

    NONE = "none"
    PRE_FUNC_NAME = "pre_func_name"  # [CALL_ID]id[FUNC]name{args}
    BETWEEN_FUNC_AND_ARGS = "between_func_and_args"  # [FUNC]name[CALL_ID]id{args}
    POST_ARGS = "post_args"  # [FUNC]name{args}[CALL_ID]id


@dataclass(slots=True)
class ToolFormat:
    """The tool-call format's markers and JSON fields (llama.cpp's tool_format_analysis, and its
    tool_function_analysis, tool_arguments_analysis and tool_id_analysis, their fields named after their
    struct where the bare name would be ambiguous)."""

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
    # tool_function_analysis: around the function's name, and after its arguments (the tag formats)
    name_prefix: str = ""
    name_suffix: str = ""
    args_separator: str = ""
    function_close: str = ""
    # tool_arguments_analysis: around each argument's name and value (tagged arguments); llama.cpp's analysis
    # sets args_start, args_end and arg_separator to nothing but the empty text, and a patch trims the latter
    args_start: str = ""
    args_end: str = ""
    arg_name_prefix: str = ""
    arg_name_suffix: str = ""
    arg_value_prefix: str = ""
    arg_value_suffix: str = ""
    arg_separator: str = ""
    tolerate_intertag_whitespace: bool = False
    # tool_id_analysis: where the call's id is written, and its markers (the tag formats)
    call_id_position: CallIdPosition = CallIdPosition.NONE
    call_id_prefix: str = ""
    call_id_suffix: str = ""


@dataclass(slots=True)
class TemplateAnalysis:
    """What the analysis found (see the module's contract)."""

    reasoning: ReasoningAnalysis
    content_mode: ContentMode = ContentMode.PLAIN
    content_start: str = ""
    content_end: str = ""
    tools: ToolFormat = field(default_factory=ToolFormat)
    preserved_tokens: list[str] = field(default_factory=list)
    additional_stops: list[str] = field(default_factory=list)

    @property
    def trigger_marker(self) -> str:
        """The word a lazy tool grammar waits for: the section's start, else the call's (may be empty)."""
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
    if tools.mode is ToolMode.JSON_NATIVE:
        _json_native(clean, tools)
        if caps.supports_parallel_tool_calls:
            _json_parallel_calls(probe, tools)
    else:
        _tag_sections(clean, tools)
    tools.section_end = trim_whitespace(tools.section_end)
    tools.per_call_end = trim_whitespace(tools.per_call_end)
    if tools.mode is ToolMode.JSON_NATIVE:
        return
    # the tag formats (the analyze_tools constructor's phases 3a to 3c)
    if caps.supports_parallel_tool_calls:
        _per_call_markers(probe, tools)
    _function_markers(probe, tools)
    if tools.mode is ToolMode.TAG_WITH_TAGGED:
        _argument_names(probe, tools)
        _argument_values(probe, tools)
    # extract_argument_separator: the text before the first common prefix of ARG_FIRST and ARG_SECOND, which
    # have none (AA_..., BB_...), so the separator stays empty; extract_args_markers reads its probes only for
    # JSON calls, which do not come here: args_start and args_end stay empty
    _call_id_markers(probe, tools)


# The pieces of the analysis's PEG parsers: PEG's space (C whitespace) and its repetitions never give back
SP = f"[{re.escape(C_SPACE)}]*+"
NOT_MARKER_RUN = f"(?:(?!{MARKER}).)*+"
"""zero_or_more(negate(marker) + any): the text up to the next marker, or the end."""
LAST_MARKER = f"{MARKER}{NOT_MARKER_RUN}\\Z"
"""A marker with no marker after it (marker + zero_or_more(negate(marker) + any) + end)."""


def _until(*delimiters: str) -> str:
    # until / until_one_of: up to the first delimiter (the delimiter's partial match at the end stops it too,
    # but every use here then needs the delimiter itself, which fails either way)
    return "(?:(?!" + "|".join(re.escape(d) for d in delimiters) + ").)*+"


def _match(pattern: str, text: str) -> dict[str, str] | None:
    # parse_and_extract: the parser at the text's start; its tags, an unmatched one empty
    found = re.match(pattern, text, re.DOTALL)
    return None if found is None else {k: v or "" for k, v in found.groupdict().items()}


def _search(pattern: str, text: str) -> dict[str, str] | None:
    # parse_anywhere_and_extract: the parser at each position in turn, the first success
    found = re.search(pattern, text, re.DOTALL)
    return None if found is None else {k: v or "" for k, v in found.groupdict().items()}


def _last_marker_text(text: str, tag: str) -> dict[str, str] | None:
    # zero_or_more(negate(last) + any) + tag(last): the last marker and the text after it
    return _match(f"(?:(?!{LAST_MARKER}).)*+(?P<{tag}>{LAST_MARKER})", text)


def _tag_sections(haystack: str, tools: ToolFormat) -> None:
    # analyze_tool_call_format_non_json: is the function's name inside a marker (<function=NAME>, [NAME...)?
    # then up to two markers before it are the section's and the call's, and up to two after the call
    fun = re.escape(FUN_FIRST)
    named = _search(
        f"(?P<fun_marker>(?P<fun_pre><{_until('>', FUN_FIRST)}){fun}(?!{SP}<)[^>]*+>{SP}"
        f"|(?P<fun_pre_square>\\[{_until(']', FUN_FIRST)}){fun}(?!{SP}\\[[^\\]]*+\\]){SP})", haystack)
    fun_marker = named["fun_marker"] if named is not None else FUN_FIRST
    fun_pre = named["fun_pre"] or named["fun_pre_square"] if named is not None else ""
    marker = re.escape(fun_marker)
    call = _search(f"(?P<sec_start>{MARKER}{SP})(?P<call_start>{MARKER}{SP})(?P<fun_pre>{_until(fun_marker)})"
                   f"{marker}(?P<rest>.*)", haystack)
    if call is not None:
        ends = _search(f"(?P<call_end>{MARKER}{SP})(?P<sec_end>{MARKER}{SP})\\Z", call["rest"])
        tools.name_prefix = fun_pre + tools.name_prefix
    else:
        call = _search(f"(?P<sec_start>{MARKER}{SP}){marker}(?P<rest>.*)", haystack)
        ends = _search(f"(?P<sec_end>{MARKER}{SP})\\Z", call["rest"] if call is not None else "")
    tools.per_call_start = call.get("call_start", "") if call is not None else ""
    tools.section_start = call["sec_start"] if call is not None else ""
    tools.per_call_end = ends.get("call_end", "") if ends is not None else ""
    tools.section_end = ends["sec_end"] if ends is not None else ""


def _calls(probe: Probe, *calls: dict[str, Any]) -> dict[str, Any]:
    user = {"role": "user", "content": USER_MSG}
    return probe.context([user, {"role": "assistant", "content": "", "tool_calls": list(calls)}],
                         tools=probe_tools())


def _per_call_markers(probe: Probe, tools: ToolFormat) -> None:
    # check_per_call_markers: a second call that starts with the section's start makes it the call's; an end
    # written once however many calls is the section's
    compared = probe.compare(_calls(probe, _arguments_object(FUN_FIRST)),
                             _calls(probe, _arguments_object(FUN_FIRST),
                                    _arguments_object(FUN_SECOND, call_id=CALL_ID_002)))
    if compared is None:
        return
    second = diff_split(compared.diff.suffix, compared.diff.right).right.lstrip(C_SPACE)
    if tools.section_start and second.startswith(tools.section_start):
        tools.per_call_start, tools.per_call_end = tools.section_start, tools.section_end
        tools.section_start = tools.section_end = ""
    if tools.per_call_end:
        calls_one = compared.output_a.count(tools.per_call_end)
        if calls_one > 0 and calls_one == compared.output_b.count(tools.per_call_end):
            tools.section_end, tools.per_call_end = tools.per_call_end, ""


def _function_markers(probe: Probe, tools: ToolFormat) -> None:
    # extract_function_markers: a call of FUN_FIRST beside one of FUN_SECOND
    first = _arguments_object(FUN_FIRST)
    compared = probe.compare(_calls(probe, first),
                             _calls(probe, _arguments_object(FUN_SECOND, call_id=CALL_ID_002)))
    if compared is None:
        return
    diff = compared.diff
    if FUN_FIRST not in diff.left or FUN_SECOND not in diff.right:
        return
    prefix_marker = tools.per_call_start or tools.section_start
    if prefix_marker and prefix_marker in diff.prefix:
        tools.name_prefix = diff.prefix[diff.prefix.rfind(prefix_marker) + len(prefix_marker):]
    name = _match(f"(?P<pre>{_until(FUN_FIRST)}){re.escape(FUN_FIRST)}(?P<post>{NOT_MARKER_RUN})", diff.left)
    if name is not None:
        tools.name_prefix += name["pre"]
        tools.name_suffix = name["post"]
    if tools.mode is ToolMode.TAG_WITH_JSON:
        # up to the first { or [ outside a marker, markers included, if a marker follows the JSON
        extension = _match(f"(?P<ext>(?:{MARKER}|[^{{\\[])*+){NOT_MARKER_RUN}{MARKER}", diff.suffix)
        if extension is not None:
            tools.name_suffix += extension["ext"]
    else:
        # up to the first marker (an argument's); between it and the argument marker, the separator
        ext = _match(f"(?P<ext>{NOT_MARKER_RUN})", diff.suffix)
        assert ext is not None  # a repetition always matches
        tools.name_suffix += ext["ext"]
        arg_start = f"{MARKER}{SP}(?:{re.escape(ARG_FIRST)}|{re.escape(ARG_SECOND)})"
        separator = _match(f"(?P<sep>(?:(?!{arg_start}).)*+){arg_start}", diff.suffix[len(ext["ext"]):])
        if separator is not None:
            tools.args_separator = trim_whitespace(separator["sep"])
    suffix_marker = tools.per_call_end or tools.section_end
    closer = ""
    if not suffix_marker:
        # no end marker: what a call adds after its last value, seen beside an answer without calls
        user = {"role": "user", "content": USER_MSG}
        answer = probe.context([user, {"role": "assistant", "content": ASSISTANT_MSG}], tools=probe_tools())
        no_call = probe.compare(_calls(probe, first), answer)
        if no_call is not None:
            at = no_call.diff.left.find("YYYY")
            # not found: llama.cpp's npos + 4 wraps around to 3
            closer = no_call.diff.left[at + 4 if at >= 0 else 3:]
    else:
        at = diff.suffix.find(suffix_marker)
        closer = diff.suffix if at < 0 else diff.suffix[:at]
    # (llama.cpp then trims the close's leading whitespace: neither branch leaves any)
    if closer and tools.mode is ToolMode.TAG_WITH_TAGGED:
        # after the last value and the marker that closes it, and the whitespace after that
        close = _match(f"{_until('YYYY')}YYYY{SP}{MARKER}{SP}(?P<close>.*)", closer)
        if close is not None:
            tools.function_close = close["close"]
    elif closer and tools.mode is ToolMode.TAG_WITH_JSON:
        # after the JSON's last } or ], if anything is
        after = _match(f"{_until('YYYY')}YYYY(?P<post_val>.*)", closer)
        if after is not None:
            post = after["post_val"]
            at = max(post.rfind("}"), post.rfind("]"))
            if 0 <= at < len(post) - 1:
                tools.function_close = post[at + 1:].lstrip(C_SPACE)


def _argument_names(probe: Probe, tools: ToolFormat) -> None:
    # extract_argument_name_markers: a call with ARG_FIRST beside one with ARG_SECOND
    compared = probe.compare(_calls(probe, tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                             _calls(probe, tool_call(FUN_FIRST, {ARG_SECOND: "YYYY"})))
    if compared is None:
        return
    diff = compared.diff
    if not diff.left or not diff.right:
        return
    left = _search(f"(?P<pre>{_until(ARG_FIRST)}){re.escape(ARG_FIRST)}(?P<suffix>[^\"X]*+)", diff.left)
    right = _search(f"(?P<pre>{_until(ARG_SECOND)}){re.escape(ARG_SECOND)}(?P<suffix>[^\"Y]*+)", diff.right)
    if left is not None and right is not None and left["pre"] and left == right:
        # the name inside a structure (a JSON key): the shared wrapper around it
        tools.arg_name_prefix, tools.arg_name_suffix = left["pre"], left["suffix"]
    elif diff.left.startswith(ARG_FIRST) and diff.right.startswith(ARG_SECOND):
        # the name alone in the difference: the last marker before it, and up to the next marker after it
        prefix = _last_marker_text(diff.prefix, "name_prefix")
        tools.arg_name_prefix = prefix["name_prefix"] if prefix is not None else diff.prefix
        after_first = diff.left[len(ARG_FIRST):] + diff.suffix
        suffix = _search(f"(?P<suffix>{NOT_MARKER_RUN}{MARKER}{SP})", after_first)
        if suffix is not None:
            tools.arg_name_suffix = suffix["suffix"]


def _argument_values(probe: Probe, tools: ToolFormat) -> None:
    # extract_argument_value_markers: the value XXXX beside YYYY
    compared = probe.compare(_calls(probe, tool_call(FUN_FIRST, {ARG_FIRST: "XXXX"})),
                             _calls(probe, tool_call(FUN_FIRST, {ARG_FIRST: "YYYY"})))
    if compared is None:
        return
    diff = compared.diff
    if diff.left != "XXXX" or diff.right != "YYYY":
        return
    name_ending = ARG_FIRST + tools.arg_name_suffix
    prefix = diff.prefix
    if name_ending in prefix:
        prefix = prefix[prefix.rfind(name_ending) + len(name_ending):]
    if prefix:
        value_prefix = _last_marker_text(prefix, "val_prefix")
        tools.arg_value_prefix = value_prefix["val_prefix"] if value_prefix is not None else prefix
    value_suffix = diff.suffix
    end_marker = tools.function_close or tools.per_call_end or tools.section_end
    if end_marker and end_marker in value_suffix:
        value_suffix = value_suffix[:value_suffix.find(end_marker)]
    if trim_whitespace(value_suffix):
        tools.arg_value_suffix = value_suffix


def _call_id_markers(probe: Probe, tools: ToolFormat) -> None:
    # extract_call_id_markers: the call's id call00001 beside call99999; where the function's name is (before
    # or after the difference) and where the arguments' { is say where the id is written
    compared = probe.compare(_calls(probe, _arguments_object(FUN_FIRST)),
                             _calls(probe, _arguments_object(FUN_FIRST, call_id=CALL_ID_999)))
    if compared is None:
        return
    diff = compared.diff
    if not diff.left and not diff.right:
        return
    common_id = "call"  # the two ids' common prefix
    in_prefix, in_suffix = diff.prefix.rfind(FUN_FIRST), diff.suffix.find(FUN_FIRST)

    def last_marker(text: str) -> str:
        found = _search(f"(?:(?!{LAST_MARKER}).)*+(?P<m>{MARKER})", text)
        return found["m"] if found is not None else ""

    def first_marker(text: str) -> str:
        found = _search(f"(?P<m>{MARKER})", text)
        return found["m"] if found is not None else ""

    if in_prefix >= 0 and in_suffix < 0:
        args_in_prefix, args_in_suffix = diff.prefix.find("{", in_prefix), diff.suffix.find("{")
        if args_in_suffix >= 0 and args_in_prefix < 0:
            tools.call_id_position = CallIdPosition.BETWEEN_FUNC_AND_ARGS
            # the marker right before the id (no marker between), else the last marker after the name
            after_func = diff.prefix[in_prefix + len(FUN_FIRST):]
            marked = _search(f"(?P<prefix>{MARKER})(?:(?!{MARKER})(?!{common_id}).)*+{common_id}", after_func)
            tools.call_id_prefix = marked["prefix"] if marked is not None else last_marker(after_func)
            # the first marker of the suffix not after a {
            suffix = _search(f"(?:(?!{MARKER})[^{{])*+(?P<suffix>{MARKER})", diff.suffix)
            if suffix is not None:
                tools.call_id_suffix = suffix["suffix"]
        elif args_in_prefix >= 0:
            tools.call_id_position = CallIdPosition.POST_ARGS
            after_args = diff.prefix[args_in_prefix:]
            closing = after_args.rfind("}")
            if closing >= 0:
                tools.call_id_prefix = last_marker(after_args[closing + 1:])
            tools.call_id_suffix = first_marker(diff.suffix)
    elif in_suffix >= 0 and in_prefix < 0:
        tools.call_id_position = CallIdPosition.PRE_FUNC_NAME
        tools.call_id_prefix = last_marker(diff.prefix)
        tools.call_id_suffix = first_marker(diff.suffix[:in_suffix])
    if tools.call_id_prefix == tools.args_end:
        tools.call_id_prefix = ""
    if tools.call_id_suffix == tools.args_start:
        tools.call_id_suffix = ""
    # an id found: a call end that starts with its suffix held the id and sample arguments
    if (tools.call_id_position is not CallIdPosition.NONE and tools.call_id_suffix
            and tools.per_call_end.startswith(tools.call_id_suffix)):
        tools.per_call_end = ""


def _collect_preserved(found: TemplateAnalysis) -> None:
    tokens: list[str] = []
    tools = found.tools
    for marker in (found.reasoning.start, found.reasoning.end, found.content_start, found.content_end,
                   tools.section_start, tools.section_end, tools.per_call_start, tools.per_call_end,
                   tools.name_prefix, tools.name_suffix, tools.args_separator, tools.function_close,
                   tools.args_start, tools.args_end, tools.arg_name_prefix, tools.arg_name_suffix,
                   tools.arg_separator, tools.arg_value_prefix, tools.arg_value_suffix, tools.call_id_prefix,
                   tools.call_id_suffix):
        token = trim_whitespace(marker)
        if token and token not in tokens:
            tokens.append(token)
    found.preserved_tokens = tokens


def _add_preserved(found: TemplateAnalysis, *tokens: str) -> None:
    found.preserved_tokens.extend(tokens)


# The patches of known templates (the analysis's workarounds), in llama.cpp's order: marks in the source, and
# what each sets.
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
        # Laguna: the tags without the template's formatting whitespace, whitespace taken between argument
        # tags, and </assistant> as a stop string
        reasoning.start, reasoning.end = trim_whitespace(reasoning.start), trim_whitespace(reasoning.end)
        tools.arg_value_prefix = trim_whitespace(tools.arg_value_prefix)
        tools.arg_value_suffix = trim_whitespace(tools.arg_value_suffix)
        tools.arg_separator = trim_whitespace(tools.arg_separator)
        tools.tolerate_intertag_whitespace = True
        found.additional_stops.append("</assistant>")
    if "Bailing V3 chat template" in source:  # Bailing V3: as Laguna, for the value's end
        tools.arg_value_suffix = trim_whitespace(tools.arg_value_suffix)
        tools.tolerate_intertag_whitespace = True


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
