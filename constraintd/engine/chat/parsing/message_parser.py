# The assistant's message from a generated text, as llama.cpp's chat layer parses a whole text, or a
# stream's text so far (is_partial), on the templates its auto-parser handles: the PEG parser
# autoparser::build_parser builds (chat-auto-parser-generator.cpp: build_tool_parser_json_native with
# standard_json_tools in chat-peg-parser.cpp, build_tool_parser_tag_json and build_tool_parser_tag_tagged
# with build_func_parser) and common_chat_peg_mapper, run on the generation prompt followed by the text
# (common_chat_peg_parse), written here as a direct scan (message_scan.py; the tagged arguments' calls in
# tagged_message_parser.py).
#
# Contract:
# - `parse_message` gives the content, the reasoning content and the tool calls (name, arguments as the JSON
#   text the model wrote, id) llama.cpp's parser gives, for: a request without tools (or tool_choice none),
#   and tools on a template that writes tool calls as JSON with flat fields or the name as the key, or in a
#   tag format with JSON arguments (`<function=name>{...}</function>`, the part json_tool_grammar.py ports),
#   its call id where one comes between the name and the arguments (`[CALL_ID]id[ARGS]`), or with tagged
#   arguments (`<arg_key>city</arg_key><arg_value>Paris</arg_value>`: the arguments are the JSON text
#   llama.cpp's mapper writes from them).
# - The parse is llama.cpp's: the generation prompt's text up to the thinking tag is matched, then (unless the
#   template is pure content) whitespace; the optional thinking block; the content up to the first tool-call
#   marker (or the wrapped content); the calls; the end of the text. Where llama.cpp's parser stops for more
#   input at the end of the text (the content, the thinking or a call reaching it), what was read is the
#   message: a call cut short is kept once its name is read (a tag format's: once its whole open is read),
#   with the arguments read so far.
# - A text that does not match raises MessageParseError with llama.cpp's words; read as partial, it is an
#   empty message where the failed parse ends past the input's start (common_chat_peg_parse maps the
#   failed result's nodes, and a failed result holds none), and only a failure at the start raises.
# - What is not ported (the parts of build_tool_parser_tag_json json_tool_grammar.py does not port, the
#   call ids of tagged arguments, fields nested under a function object) raises NotPorted.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from constraintd.engine.chat.analysis.diff_split import trim_whitespace
from constraintd.engine.chat.analysis.reasoning import ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import (
    ContentMode,
    TemplateAnalysis,
    ToolFormat,
    ToolMode,
)
from constraintd.engine.chat.content import AnswerState, parse_json_answer
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.params.json_tool_grammar import (
    call_id_before_arguments,
    call_keys,
    tag_json_grammar_not_done,
)
from constraintd.engine.chat.parsing import peg_parse
from constraintd.engine.chat.parsing.gemma4_message import gemma4_message
from constraintd.engine.chat.parsing.message_scan import SPACE, NeedMore, ParsedToolCall, Scan, ScanFail
from constraintd.engine.chat.parsing.minimax_m3_message import minimax_m3_message
from constraintd.engine.chat.parsing.tagged_message_parser import tagged_functions, tagged_tool_calls

__all__ = ["MessageParseError", "ParsedMessage", "ParsedToolCall", "parse_message"]


class MessageParseError(ValueError):
    """A generated text llama.cpp's parser does not match (it throws the same words)."""


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """The assistant's message: content, reasoning content and tool calls (common_chat_msg)."""

    content: str = ""
    reasoning_content: str = ""
    tool_calls: tuple[ParsedToolCall, ...] = ()


def _string_content(scan: Scan) -> str:
    # a JSON string's characters up to its closing quote (string_content('"'))
    start = scan.pos
    text = scan.text
    while scan.pos < len(text):
        c = text[scan.pos]
        if c == '"':
            return text[start:scan.pos]
        scan.pos += 2 if c == "\\" else 1
    raise NeedMore


def _comma(scan: Scan) -> None:
    scan.literal(",")
    scan.space()


def _key(scan: Scan, key: str) -> None:
    # `"key"` and its colon, with the spaces around the colon
    scan.literal(f'"{key}"')
    scan.space()
    scan.literal(":")
    scan.space()


def _number(scan: Scan) -> str:
    start = scan.pos
    value = scan.json_value()
    if not value or value[0] not in "-0123456789":
        scan.pos = start
        raise ScanFail
    return value


def _call_id(scan: Scan, key: str, *, numbers: bool) -> str:
    _key(scan, key)
    if scan.text.startswith('"', scan.pos):
        scan.literal('"')
        value = _string_content(scan)
        scan.literal('"')
        return value
    if not numbers:
        raise ScanFail
    return _number(scan)


def _keep_cut_call(scan: Scan, name: str, found: dict[str, str]) -> None:
    # a JSON call the text ends inside, once named: the arguments read whole, else those read so far, else
    # the "{" the mapper opened them with
    scan.calls.append(ParsedToolCall(name, found["arguments"] or scan.partial or "{", found["id"]))


def _flat_call(scan: Scan, names: Sequence[str], tools: ToolFormat, name_key: str, args_key: str) -> None:
    # build_json_tools_flat_keys: "{" [type] the fields in the template's order "}", one choice per tool
    fields = [name_key, args_key]
    if tools.id_field:
        fields.append(tools.id_field)
    if tools.gen_id_field:
        fields.append(tools.gen_id_field)
    order = tools.parameter_order
    fields.sort(key=lambda key: order.index(key) if key in order else len(order))
    for name in names:
        start = scan.pos
        try:
            found = {"name": "", "arguments": "", "id": ""}
            scan.literal("{")
            scan.space()
            if tools.openai_wrapper_trigger:
                def wrapper() -> None:
                    for part in ('"type"', ":", '"function"', ","):
                        scan.literal(part)
                        scan.space()
                scan.optional(wrapper)
            for at, key in enumerate(fields):
                if key == name_key:
                    _key(scan, name_key)
                    scan.literal(f'"{name}"')
                    found["name"] = name
                elif key == args_key:
                    _key(scan, args_key)
                    found["arguments"] = scan.json_value().rstrip(SPACE)
                else:
                    def read_id(key: str = key, found: dict[str, str] = found) -> None:
                        found["id"] = _call_id(scan, key, numbers=True)
                    scan.optional(read_id)
                if at < len(fields) - 1:
                    scan.space()
                    scan.literal(",")
                    scan.space()
            scan.space()
            scan.literal("}")
        except ScanFail:
            scan.pos = start
            continue
        except NeedMore:
            if found["name"]:  # the mapper keeps a call once it has its name
                _keep_cut_call(scan, found["name"], found)
            raise
        scan.calls.append(ParsedToolCall(found["name"], found["arguments"], found["id"]))
        return
    raise ScanFail


def _keyed_call(scan: Scan, names: Sequence[str], tools: ToolFormat, args_key: str,
                effective_args: str) -> None:
    # build_json_tools_function_is_key: {"<name>": <arguments>} or {"<name>": {ids, "<args>": <arguments>}};
    # the name is a literal of its own between the quotes (not atomic): the call has it once it is read,
    # its closing quote still to come
    for name in names:
        start = scan.pos
        named = False
        try:
            found = {"arguments": "", "id": ""}
            scan.literal("{")
            scan.space()
            scan.literal('"')
            scan.literal(name)
            named = True
            scan.literal('"')
            scan.space()
            scan.literal(":")
            scan.space()
            inner = [key for key in (tools.id_field, tools.gen_id_field) if key]
            if not args_key and not inner:
                found["arguments"] = scan.json_value().rstrip(SPACE)
            else:
                scan.literal("{")
                scan.space()
                for key, numbers in ((tools.id_field, False), (tools.gen_id_field, True)):
                    if not key:
                        continue

                    def read_id(key: str = key, numbers: bool = numbers,
                                found: dict[str, str] = found) -> None:
                        found["id"] = _call_id(scan, key, numbers=numbers)
                        scan.space()
                        scan.optional(lambda: _comma(scan))
                    scan.optional(read_id)
                    scan.space()
                if args_key:
                    _key(scan, effective_args)
                found["arguments"] = scan.json_value().rstrip(SPACE)
                scan.space()
                scan.literal("}")
            scan.space()
            scan.literal("}")
        except ScanFail:
            scan.pos = start
            continue
        except NeedMore:
            if named:
                _keep_cut_call(scan, name, found)
            raise
        scan.calls.append(ParsedToolCall(name, found["arguments"], found["id"]))
        return
    raise ScanFail


def _tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(tool["function"]["name"]) for tool in tools if isinstance(tool.get("function"), Mapping)]


def _calls(scan: Scan, names: Sequence[str], tools: ToolFormat, *, parallel: bool) -> None:
    # standard_json_tools: the choice of tools, more after commas when parallel, in [ ] when wrapped
    keys = call_keys(tools)
    if keys is None:
        raise NotPorted("the parser of JSON tool calls nested under a function object")
    args_key, effective_name, effective_args = keys

    def one() -> None:
        if tools.fun_name_is_key:
            _keyed_call(scan, names, tools, args_key, effective_args)
        else:
            _flat_call(scan, names, tools, effective_name, effective_args)

    if tools.tools_array_wrapped:
        scan.literal("[")
        scan.space()
    one()
    while parallel:
        start, count = scan.pos, len(scan.calls)
        try:
            scan.space()
            scan.literal(",")
            scan.space()
            one()
        except ScanFail:
            scan.pos = start
            del scan.calls[count:]
            break
    if tools.tools_array_wrapped:
        scan.space()
        scan.literal("]")


def _section(scan: Scan, start: str, end: str, names: Sequence[str], tools: ToolFormat, *,
             parallel: bool) -> None:
    scan.literal(start)
    scan.space()
    _calls(scan, names, tools, parallel=parallel)
    scan.space()
    scan.literal(end)


def _json_tools(scan: Scan, analysis: TemplateAnalysis, names: Sequence[str], *, required: bool,
                parallel: bool) -> None:
    tools = analysis.tools
    if not tools.section_start and tools.per_call_start:
        # one_or_more(call + space)
        def call() -> None:
            _section(scan, tools.per_call_start, tools.per_call_end, names, tools, parallel=parallel)
            scan.space()
        call()
        while True:
            before = scan.pos
            scan.optional(call)
            if scan.pos == before:
                break
        return

    def section() -> None:
        _section(scan, tools.section_start, tools.section_end, names, tools, parallel=parallel)
    if required:
        section()
    else:
        scan.optional(section)


def _tag_json_call(scan: Scan, names: Sequence[str], tools: ToolFormat) -> None:
    # build_func_parser with a name suffix, or without one before a call id: the call's open (the name
    # between the function's name prefix and suffix), its call id, space, the arguments' JSON, then the
    # close: space and the function's close, or a look at the call's end marker. The open is atomic
    # (tool_open; without a name suffix, with the call id): the mapper keeps the call once the whole of it
    # is read, never from a part of it; its arguments are the JSON where it is an object, else "{", which a
    # close makes "{}".
    for name in names:
        start = scan.pos
        opened = False
        arguments = "{"
        call_id = ""
        try:
            scan.literal(tools.name_prefix + name + tools.name_suffix)
            # without a name suffix the open and the call id are one atomic parser: the call is kept once
            # both are read
            opened = bool(tools.name_suffix)
            if call_id_before_arguments(tools):
                # optional(prefix tool_id(until(suffix))) suffix: the id as written, trailing space trimmed,
                # once the until is done (an id the text ends inside is not the mapper's)
                def read_id() -> None:
                    nonlocal call_id
                    scan.literal(tools.call_id_prefix)
                    call_id = scan.until([tools.call_id_suffix]).rstrip(SPACE)
                scan.optional(read_id)
                scan.literal(tools.call_id_suffix)
                opened = True
            scan.space()
            try:
                value = scan.json_value().rstrip(SPACE)
            except NeedMore:
                if scan.partial.startswith("{"):
                    arguments = scan.partial
                raise
            if value.startswith("{"):
                arguments = value
            if tools.function_close:
                scan.space()
                scan.literal(tools.function_close)
            elif tools.per_call_end:
                before = scan.pos
                scan.literal(tools.per_call_end)
                scan.pos = before
            else:
                scan.space()  # tool_close(space()): the call closes where its arguments end
            if arguments == "{":
                arguments = "{}"
        except ScanFail:
            scan.pos = start
            continue
        except NeedMore:
            if opened:
                scan.calls.append(ParsedToolCall(name, arguments, call_id))
            raise
        scan.calls.append(ParsedToolCall(name, arguments, call_id))
        return
    raise ScanFail


def _tag_json_tools(scan: Scan, names: Sequence[str], tools: ToolFormat, *, required: bool,
                    parallel: bool) -> None:
    # build_tool_parser_tag_json: each call between the per-call markers, more after space when parallel,
    # all in the section where there is one; optional unless tool_choice is required
    def wrapped() -> None:
        scan.literal(tools.per_call_start)
        _tag_json_call(scan, names, tools)
        scan.literal(tools.per_call_end)

    def calls() -> None:
        if tools.section_start:
            scan.literal(tools.section_start)
            scan.space()
        wrapped()
        while parallel:
            before = scan.pos

            def another() -> None:
                scan.space()
                wrapped()
            scan.optional(another)
            if scan.pos == before:
                break
        if tools.section_start:
            scan.space()
            scan.literal(tools.section_end)

    if required:
        calls()
    else:
        scan.optional(calls)


def _response_format(scan: Scan) -> None:
    # the answer after the thinking block: the content rule's (chat/content.py), whose content is the
    # value's text; an answer that cannot parse does not match, one still open is read so far
    answer = parse_json_answer(scan.text[scan.pos:])
    if answer.state is AnswerState.INVALID:
        scan.pos = _answer_end(scan)  # where the end() that follows fails, or the choice's start
        raise ScanFail
    scan.content.append(answer.content)
    scan.pos = len(scan.text)


def _answer_end(scan: Scan) -> int:
    # where llama.cpp's choice of the answer ("```json" space value space "```" | space value space) ends
    # when one of them matches, else where it starts
    start = scan.pos
    for fence in ("```json", ""):
        scan.pos = start
        try:
            scan.literal(fence)
            scan.space()
            scan.json_value()
            scan.space()
            scan.literal(fence[:3])
            return scan.pos
        except (ScanFail, NeedMore):
            continue
    return start


def _reasoning(scan: Scan, analysis: TemplateAnalysis, *, extracting: bool) -> None:
    # analyze_reasoning::build_parser: optional(optspace(start) reasoning(until(end)) optspace(end))
    reasoning = analysis.reasoning
    if not extracting or reasoning.mode not in (ReasoningMode.TAG_BASED, ReasoningMode.TOOLS_ONLY) \
            or not reasoning.end:
        return

    def block() -> None:
        if reasoning.start:
            scan.optspace(reasoning.start)
        start = scan.pos
        try:
            text = scan.until([trim_whitespace(reasoning.end)])
        except NeedMore:
            scan.reasoning.append(scan.text[start:])
            raise
        scan.reasoning.append(text)
        scan.optspace(reasoning.end)
    scan.optional(block)


def _content_until(scan: Scan, delimiters: Sequence[str]) -> None:
    start = scan.pos
    try:
        scan.content.append(scan.until(delimiters))
    except NeedMore:
        scan.content.append(scan.text[start:])
        raise


def _format_message(text: str, grammar: ChatGrammar, *, generation_prompt: str,
                    partial: bool) -> ParsedMessage:
    # a hand-written format's request: its own parser (the arena its grammar is written from) run on the
    # generation prompt and the text (common_chat_peg_parse), its tagged nodes mapped (peg_parse.py)
    arena, name = grammar.arena, grammar.format_name
    assert arena is not None
    if any(arena.kind(parser) == "tag" and not arena.text(parser) for parser in range(len(arena))):
        raise NotPorted(f"the parser of the {name or 'unnamed'} format")  # a tag its mapper cannot read
    try:
        result = peg_parse.run(arena, generation_prompt + text)
    except NotImplementedError as exc:
        raise NotPorted(str(exc)) from None
    if result.outcome is peg_parse.Outcome.FAIL:
        return _refused(result.end, partial=partial)
    if name == "gemma4":  # the formats with a mapper of their own
        content, reasoning, calls = gemma4_message(result.nodes)
    elif name == "minimax-m3":
        content, reasoning, calls = minimax_m3_message(result.nodes)
    else:
        content, reasoning, calls = peg_parse.message(result.visit())
    return ParsedMessage(content, reasoning, calls)


def _refused(end: int, *, partial: bool) -> ParsedMessage:
    # common_chat_peg_parse on a text its parser fails on: a partial parse whose failure lies past the start
    # of the input maps the nodes of the failed result, and a failed result holds none: an empty message
    if partial and end > 0:
        return ParsedMessage()
    raise MessageParseError(
        "The model produced output that does not match the expected peg-native format") from None


def parse_message(
    text: str, grammar: ChatGrammar, *, generation_prompt: str, tools: Sequence[Mapping[str, Any]] = (),
    tool_choice: str = "auto", parallel_tool_calls: bool = False, reasoning_format: str = "auto",
    supports_tool_calls: bool = True, has_response_format: bool = False, partial: bool = False,
) -> ParsedMessage:
    """The message llama.cpp's chat parser reads in a generated `text` (see the module's contract).

    `grammar` is the request's chat params (chat_params.chat_params), `generation_prompt` its generation
    prompt; `supports_tool_calls` the template's capability (TemplateCaps). `partial` reads the text as
    llama-server reads a stream's text so far (common_chat_parse with is_partial): the same message, except
    that a text the format does not match gives an empty message once the parse has read past the input's
    start (it may be the start of a longer text that matches).

    Raises:
        MessageParseError: the text does not match the format (and, when partial, the parse failed at
            the input's start).
        NotPorted: the format's parser is not ported.
    """
    if grammar.arena is not None:
        return _format_message(text, grammar, generation_prompt=generation_prompt, partial=partial)
    analysis = grammar.analysis
    if analysis is None and grammar.format_name:
        # a hand-written format that gives no parser (FormatParams.arena None): every ported one gives it
        raise NotPorted(f"the parser of a {grammar.format_name} request without a grammar")
    if analysis is None:
        raise NotPorted("the parser of a request without the auto-parser's analysis")
    scan = Scan(generation_prompt + text)
    reasoning = analysis.reasoning
    start_tag = trim_whitespace(reasoning.start)
    prefix = generation_prompt[:generation_prompt.find(start_tag)] \
        if start_tag and start_tag in generation_prompt else generation_prompt
    extracting = reasoning_format != "none" and reasoning.mode is not ReasoningMode.NONE
    wrapped = analysis.content_mode is ContentMode.ALWAYS_WRAPPED
    with_tools = bool(tools) and tool_choice != "none" and supports_tool_calls
    if with_tools and analysis.tools.mode is ToolMode.TAG_WITH_JSON and not has_response_format:
        missing = tag_json_grammar_not_done(analysis.tools)
        if missing:
            raise NotPorted(f"the parser of {missing}")
    functions = tagged_functions(tools, analysis.tools) \
        if with_tools and analysis.tools.mode is ToolMode.TAG_WITH_TAGGED and not has_response_format else []
    try:
        scan.literal(prefix)
        if has_response_format:
            # prefix << reasoning space ( "```json" space VALUE space "```" | space VALUE space ) end
            scan.space()
            _reasoning(scan, analysis, extracting=extracting)
            _response_format(scan)
        elif with_tools and analysis.tools.mode is ToolMode.TAG_WITH_JSON:
            # reasoning, optional content up to the trigger marker (no wrapped content), the calls, the end
            scan.space()
            _reasoning(scan, analysis, extracting=extracting)
            scan.optional(lambda: _content_until(scan, [analysis.trigger_marker]))
            _tag_json_tools(scan, _tool_names(tools), analysis.tools, required=tool_choice == "required",
                            parallel=parallel_tool_calls)
        elif with_tools and analysis.tools.mode is ToolMode.TAG_WITH_TAGGED:
            # the same, with the calls' arguments tagged one by one (tagged_message_parser.py)
            scan.space()
            _reasoning(scan, analysis, extracting=extracting)
            if analysis.trigger_marker:
                scan.optional(lambda: _content_until(scan, [analysis.trigger_marker]))
            tagged_tool_calls(scan, functions, analysis.tools, parallel=parallel_tool_calls,
                              required=tool_choice == "required")
        elif with_tools:
            if analysis.tools.mode is not ToolMode.JSON_NATIVE:
                raise NotPorted("the parser of a template whose tool-call format is not found")
            scan.space()
            _reasoning(scan, analysis, extracting=extracting)
            if wrapped:
                def wrapped_content() -> None:
                    scan.literal(analysis.content_start)
                    _content_until(scan, [analysis.content_end])
                    scan.literal(analysis.content_end)
                scan.optional(wrapped_content)
            else:
                tool_start = analysis.tools.section_start or analysis.tools.per_call_start or "{"
                scan.optional(lambda: _content_until(scan, [tool_start]))
            _json_tools(scan, analysis, _tool_names(tools), required=tool_choice == "required",
                        parallel=parallel_tool_calls)
        else:
            if reasoning.mode is not ReasoningMode.NONE:
                scan.space()
            if wrapped:
                if not extracting:
                    _content_until(scan, [analysis.content_start])
                else:
                    _reasoning(scan, analysis, extracting=extracting)
                scan.literal(analysis.content_start)
                _content_until(scan, [analysis.content_end])
                scan.literal(analysis.content_end)
            else:
                _reasoning(scan, analysis, extracting=extracting)
                scan.content.append(scan.text[scan.pos:])
                scan.pos = len(scan.text)
        scan.end()
    except NeedMore:
        pass
    except ScanFail:
        # the scan stands where llama.cpp's failed sequence ends (message_scan.py's contract)
        return _refused(scan.pos, partial=partial)
    reasoning_text = "".join(scan.reasoning)
    if not reasoning_text.strip(" \n\r\t"):
        reasoning_text = ""
    return ParsedMessage("".join(scan.content), reasoning_text, tuple(scan.calls))
