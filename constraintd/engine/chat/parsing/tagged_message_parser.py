# The tool calls of the tag formats whose arguments are tagged one by one, as llama.cpp's chat parser reads
# them: the parser analyze_tools::build_tool_parser_tag_tagged builds (chat-auto-parser-generator.cpp, with
# build_func_parser) and the arguments common_chat_peg_mapper writes from its nodes (chat-peg-parser.cpp),
# on the scan of message_scan.py. tagged_tool_grammar.py ports the same parser's grammar.
#
# Contract:
# - Each tool is tried in the request's order: its name between the function's name prefix and suffix (then
#   space and the arguments' separator where there is one), space, the required arguments in the order of the
#   parameters' properties (space between), then optional ones in any order (each after space), then the
#   close: space and the function's close, a look at the call's end (after space where the template tolerates
#   it), or space.
# - An argument is its name between the argument name markers, the value prefix, then where its schema may
#   be a string any text up to the value suffix, which becomes a JSON string (escaped, never trimmed), else a
#   JSON value read as llama.cpp's PEG JSON parser reads it (no space around it, raw control characters
#   allowed in strings, no schema check), written as it is; then the value suffix.
# - The arguments are the mapper's text: `{`, then `"name":value` for each argument (after `,` but the first),
#   closed at the call's close (a string's quote, then a `}` for each brace left open). A call is kept once
#   its open is read; what the text ends inside stands unclosed (`{"city":"Par`). The mapper's atomic parts
#   keep nothing where the text ends inside them: the function's open, an argument's open and close, the
#   call's close; where the name has no suffix, the open up to a look at the first argument's marker (a
#   function with required arguments), else the whole function.
# - The calls: each between the per-call markers (more after space when parallel calls are on), then space,
#   in the section where there is one (then space, or the end of the text where the section has no end);
#   where no call is marked, the section holds the calls, more after ", " when parallel.
# - Not ported (NotPorted): call ids, an empty value suffix, and what tagged_tool_grammar.py's schema reading
#   does not port.
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from constraintd.engine.chat.analysis.template_analysis import ToolFormat
from constraintd.engine.chat.params.chat_params import NotPorted
from constraintd.engine.chat.params.json_tool_grammar import call_id_before_arguments
from constraintd.engine.chat.params.tagged_tool_grammar import may_be_string, tagged_arguments
from constraintd.engine.chat.parsing.message_scan import NeedMore, ParsedToolCall, Scan, ScanFail, brace_depth

__all__ = ["TaggedFunction", "tagged_functions", "tagged_tool_calls"]

_ESCAPES = '"\\/bfnrt'  # what may follow a backslash in a JSON string, `u` apart
_HEX = "0123456789abcdefABCDEF"
_DIGITS = "0123456789"


@dataclass(frozen=True, slots=True)
class TaggedFunction:
    """A tool as the parser reads it: its name, and its arguments' names with whether each may be a string,
    required ones (in order) apart from optional ones."""

    name: str
    required: tuple[tuple[str, bool], ...]
    optional: tuple[tuple[str, bool], ...]


def tagged_functions(tool_defs: Sequence[Mapping[str, object]], tools: ToolFormat) -> list[TaggedFunction]:
    """The request's tools as build_tool_parser_tag_tagged reads them (foreach_function, foreach_parameter).

    Raises:
        NotPorted: a part of the parser not ported (the module's contract).
    """
    if call_id_before_arguments(tools):
        raise NotPorted("the parser of the tag formats' call ids")
    if not tools.arg_value_suffix:
        raise NotPorted("the parser of tagged arguments with no value suffix")
    found = []
    for tool_def in tool_defs:
        function = tool_def.get("function")
        if not isinstance(function, Mapping):
            continue
        params = function.get("parameters")
        try:
            arguments = tagged_arguments(params if isinstance(params, Mapping) and params else
                                         {"type": "object", "properties": {}})
            read = [(argument.name, may_be_string(argument.schema), argument.required)
                    for argument in arguments]
        except NotImplementedError as exc:
            raise NotPorted(f"the parser of {exc}") from None
        found.append(TaggedFunction(str(function["name"]),
                                    tuple((name, string) for name, string, required in read if required),
                                    tuple((name, string) for name, string, required in read if not required)))
    return found


class _Arguments:
    # common_chat_peg_mapper's arguments of the current call: the text, the arguments written, a quote open
    __slots__ = ("count", "pending", "text")

    def __init__(self) -> None:
        self.text = "{"  # the mapper's text once the tool's name is read
        self.count = 0
        self.pending = False

    def mark(self) -> tuple[str, int, bool]:
        return self.text, self.count, self.pending

    def restore(self, mark: tuple[str, int, bool]) -> None:
        self.text, self.count, self.pending = mark

    def name(self, name: str) -> None:  # TOOL_ARG_OPEN, then TOOL_ARG_NAME
        self.pending = False
        self.text += ("," if self.count else "") + json.dumps(name, ensure_ascii=False) + ":"
        self.count += 1

    def string(self, value: str) -> None:  # TOOL_ARG_STRING_VALUE
        if not self.pending:
            self.text += '"'
            self.pending = True
        self.text += json.dumps(value, ensure_ascii=False)[1:-1]

    def json(self, value: str) -> None:  # TOOL_ARG_VALUE: a JSON value is its own text (no quotes to change)
        self.text += value

    def close_argument(self) -> None:  # TOOL_ARG_CLOSE
        if self.pending:
            self.text += '"'
            self.pending = False

    def close_call(self) -> None:  # TOOL_CLOSE: the open quote, then the braces left open
        self.close_argument()
        self.text += "}" * brace_depth(self.text)


# llama.cpp's PEG JSON value (common_peg_parser_builder::json): each reader advances the scan, raises
# ScanFail, or NeedMore with the scan's position where the parser stopped (the value's text is up to there)

def _word(scan: Scan, word: str) -> None:
    # a literal: where the text ends inside it, the parser stopped at the text's end
    if scan.text.startswith(word, scan.pos):
        scan.pos += len(word)
        return
    if word.startswith(scan.text[scan.pos:]):
        scan.pos = len(scan.text)
        raise NeedMore
    raise ScanFail


def _digits(scan: Scan) -> None:
    # chars("[0-9]"): one or more
    text = scan.text
    if scan.pos >= len(text):
        raise NeedMore
    if text[scan.pos] not in _DIGITS:
        raise ScanFail
    while scan.pos < len(text) and text[scan.pos] in _DIGITS:
        scan.pos += 1


def _optional(scan: Scan, read: Callable[[Scan], None]) -> None:
    # optional(): nothing at the text's end; a failed try reads nothing
    if scan.pos >= len(scan.text):
        return
    start = scan.pos
    try:
        read(scan)
    except ScanFail:
        scan.pos = start


def _fraction(scan: Scan) -> None:
    _word(scan, ".")
    _digits(scan)


def _exponent(scan: Scan) -> None:
    if scan.text[scan.pos] not in "eE":
        raise ScanFail
    scan.pos += 1
    if scan.pos < len(scan.text) and scan.text[scan.pos] in "+-":
        scan.pos += 1
    _digits(scan)


def _number(scan: Scan) -> None:
    text = scan.text
    _optional(scan, lambda scan: _word(scan, "-"))
    if scan.pos >= len(text):
        raise NeedMore
    if text[scan.pos] == "0":
        scan.pos += 1
    elif text[scan.pos] in _DIGITS:
        _digits(scan)
    else:
        raise ScanFail
    _optional(scan, _fraction)
    _optional(scan, _exponent)
    # a number is read once the next character cannot extend it (its end waits for more)
    if scan.pos >= len(text):
        raise NeedMore
    if text[scan.pos] in "0123456789.eE+-":
        raise ScanFail


def _string(scan: Scan) -> None:
    text = scan.text
    _word(scan, '"')
    while scan.pos < len(text):
        c = text[scan.pos]
        if c == '"':
            scan.pos += 1
            return
        if c != "\\":
            scan.pos += 1
            continue
        escape = text[scan.pos + 1:scan.pos + 2]
        if escape == "u":
            digits = text[scan.pos + 2:scan.pos + 6]
            if any(d not in _HEX for d in digits):
                raise ScanFail
            if len(digits) < 4:
                raise NeedMore  # the escape begun is not read: the parser stopped before it
            scan.pos += 6
        elif not escape:
            raise NeedMore
        elif escape in _ESCAPES:
            scan.pos += 2
        else:
            raise ScanFail
    raise NeedMore


def _container(scan: Scan, open_: str, close: str, item: Callable[[Scan], None]) -> None:
    # "{" ws ("}" | members ws "}"), members = item (ws "," ws item)*; the same for "[" and "]"
    _word(scan, open_)
    scan.space()
    if scan.pos >= len(scan.text):
        raise NeedMore
    if scan.text[scan.pos] == close:
        scan.pos += 1
        return
    item(scan)
    while scan.pos < len(scan.text):
        start = scan.pos
        try:
            scan.space()
            _word(scan, ",")
            scan.space()
            item(scan)
        except ScanFail:
            scan.pos = start
            break
    scan.space()
    _word(scan, close)


def _member(scan: Scan) -> None:
    _string(scan)
    scan.space()
    _word(scan, ":")
    scan.space()
    _json_value(scan)


def _json_value(scan: Scan) -> None:
    # json(): one value, no space around it; the choice's options begin with different characters
    if scan.pos >= len(scan.text):
        raise NeedMore
    first = scan.text[scan.pos]
    if first == "{":
        _container(scan, "{", "}", _member)
    elif first == "[":
        _container(scan, "[", "]", _json_value)
    elif first == '"':
        _string(scan)
    elif first == "-" or first in _DIGITS:
        _number(scan)
    elif first == "n":
        _word(scan, "null")
    elif first == "f":
        _word(scan, "false")
    else:
        _word(scan, "true")


# the calls

def _argument(scan: Scan, name: str, string: bool, tools: ToolFormat, arguments: _Arguments) -> None:
    # tool_arg(tool_arg_open(name prefix, name, name suffix) value prefix (string value | JSON value) close)
    for word in (tools.arg_name_prefix, name, tools.arg_name_suffix):
        scan.literal(word)  # atomic: a text ending inside the open writes nothing
    arguments.name(name)
    scan.literal(tools.arg_value_prefix)
    start = scan.pos
    if string:
        try:
            value = scan.until([tools.arg_value_suffix])
        except NeedMore:
            arguments.string(scan.text[start:])
            raise
        arguments.string(value)
    else:
        try:
            _json_value(scan)
        except NeedMore:
            arguments.json(scan.text[start:scan.pos])
            raise
        arguments.json(scan.text[start:scan.pos])
    scan.literal(tools.arg_value_suffix)  # atomic: a text ending inside it does not close the string
    arguments.close_argument()


def _optional_argument(scan: Scan, function: TaggedFunction, tools: ToolFormat,
                       arguments: _Arguments) -> None:
    # space, then the first of the optional arguments that matches
    scan.space()
    after_space = scan.pos
    for name, string in function.optional:
        mark = arguments.mark()
        try:
            _argument(scan, name, string, tools, arguments)
            return
        except ScanFail:
            scan.pos = after_space
            arguments.restore(mark)
    raise ScanFail


def _arguments(scan: Scan, function: TaggedFunction, tools: ToolFormat, arguments: _Arguments) -> None:
    scan.literal(tools.args_start)
    for at, (name, string) in enumerate(function.required):
        if at:
            scan.space()
        _argument(scan, name, string, tools, arguments)
    while function.optional and scan.pos < len(scan.text):  # zero or more, none tried at the text's end
        start, mark = scan.pos, arguments.mark()
        try:
            _optional_argument(scan, function, tools, arguments)
        except ScanFail:
            scan.pos = start
            arguments.restore(mark)
            break
    scan.literal(tools.args_end)


def _function(scan: Scan, function: TaggedFunction, tools: ToolFormat) -> None:
    # build_func_parser with no call id; `kept` says whether the mapper holds the call where the text ends
    arguments = _Arguments()
    peek = bool(tools.arg_name_prefix and function.required)
    kept = False
    try:
        for word in (tools.name_prefix, function.name, tools.name_suffix):
            scan.literal(word)  # tool_open: atomic
        # where the name has no suffix, the atomic part goes on to the look at the first argument's marker
        # (the whole function where no argument is required)
        kept = bool(tools.name_suffix)
        if tools.args_separator:
            scan.space()
            scan.literal(tools.args_separator)
        scan.space()
        if not tools.name_suffix and peek:
            before = scan.pos
            scan.literal(tools.arg_name_prefix)
            scan.pos = before
            kept = True
        _arguments(scan, function, tools, arguments)
        if tools.function_close:
            scan.space()
            scan.literal(tools.function_close)
        elif tools.per_call_end:
            before = scan.pos
            if tools.tolerate_intertag_whitespace:
                scan.space()
            scan.literal(tools.per_call_end)
            scan.pos = before
        else:
            scan.space()
    except NeedMore:
        if kept:
            scan.calls.append(ParsedToolCall(function.name, arguments.text))
        raise
    arguments.close_call()
    scan.calls.append(ParsedToolCall(function.name, arguments.text))


def _one_of(scan: Scan, functions: Sequence[TaggedFunction], tools: ToolFormat) -> None:
    for function in functions:
        start = scan.pos
        try:
            _function(scan, function, tools)
            return
        except ScanFail:
            scan.pos = start
    raise ScanFail


def _repeat(scan: Scan, read: Callable[[], None]) -> None:
    # zero_or_more(read): none tried at the text's end; a failed try reads nothing
    while scan.pos < len(scan.text):
        start, count = scan.pos, len(scan.calls)
        try:
            read()
        except ScanFail:
            scan.pos = start
            del scan.calls[count:]
            return


def _calls(scan: Scan, functions: Sequence[TaggedFunction], tools: ToolFormat, *, parallel: bool) -> None:
    if not tools.per_call_start:
        # the section holds the calls, more after ", "
        scan.literal(tools.section_start)
        scan.space()
        _one_of(scan, functions, tools)
        if parallel:
            def another() -> None:
                scan.literal(", ")
                _one_of(scan, functions, tools)
            _repeat(scan, another)
        scan.space()
        scan.literal(tools.section_end)
        return

    def wrapped() -> None:
        scan.literal(tools.per_call_start)
        scan.space()
        _one_of(scan, functions, tools)
        scan.space()
        scan.literal(tools.per_call_end)

    if tools.section_start:
        scan.literal(tools.section_start)
        scan.space()
    wrapped()
    if parallel:
        def spaced() -> None:
            scan.space()
            wrapped()
        _repeat(scan, spaced)
    scan.space()
    if tools.section_start:
        scan.space()
        if tools.section_end:
            scan.literal(tools.section_end)
            scan.space()
        else:
            scan.end()


def tagged_tool_calls(scan: Scan, functions: Sequence[TaggedFunction], tools: ToolFormat, *, parallel: bool,
                      required: bool) -> None:
    """Read the calls where the scan is (the module's contract), optional unless tool_choice is required.

    Raises:
        ScanFail: required calls that do not match.
        NeedMore: the text ends inside the calls; the calls read so far are in the scan.
    """
    def calls() -> None:
        _calls(scan, functions, tools, parallel=parallel)
    if required:
        calls()
    elif scan.pos < len(scan.text):  # optional(): nothing tried at the text's end
        scan.optional(calls)

