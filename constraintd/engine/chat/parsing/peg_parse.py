# A PEG arena (chat/peg_arena.py) run on a generated text as llama.cpp runs its parser (common/peg-parser.cpp:
# parser_executor), and the tagged nodes it finds turned into a message (common/chat-peg-parser.cpp:
# common_chat_peg_mapper). A hand-written chat format's one parser is its grammar and, here, its message
# parser.
#
# Contract:
# - `run(arena, text)` gives parser_executor's answer for the arena's root at position 0: SUCCESS,
#   FAIL or NEED_MORE (the text ends where the parser could go on), the end it reached and, in the order
#   llama.cpp's AST visit meets them, the tagged nodes (tag, text). Lenient, as common_chat_peg_parse parses:
#   a literal, char class, JSON string or repetition cut by the end of the text needs more input; an
#   `until` that meets no delimiter runs to the end and needs more; one that meets a delimiter's start at the
#   end stops there, a success. A repetition tries nothing at the end of the text; a lookahead consumes
#   nothing and `not` of a parser that needs more input needs more input; an atomic parser that needs more
#   input drops the nodes it found. No memo: llama.cpp's executor has none either.
# - A tag's name is the arena's (PegArena.tag's, as the format's builder call spells it); an unnamed tag is
#   one llama.cpp's mapper ignores. end() matches only at the end of the text.
# - `message(nodes)` is common_chat_peg_mapper::from_ast over those nodes: content and reasoning concatenated,
#   tool calls opened, named and closed, tagged arguments written as JSON, whitespace-only reasoning dropped.
# - Positions are code points of a Python str: a str is whole UTF-8, so llama.cpp's byte positions and its
#   invalid-UTF-8 handling never differ from these.
# - A gbnf parser without a child is string_content of a delimiter other than '"' (the arena keeps its GBNF
#   alone): it parses as that. Not here: the start parser, any other childless gbnf parser
#   (NotImplementedError where met), and the Gemma 4 and MiniMax-M3 mappers (gemma4_message.py,
#   minimax_m3_message.py).
from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from constraintd.engine.chat.parsing.message_scan import ParsedToolCall, brace_depth
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["Outcome", "ParseResult", "message", "run"]

_SPACE = " \t\n\v\f\r"  # C isspace in the "C" locale
# the GBNF PegArena.string_content(d) writes for a delimiter d other than '"'
_STRING_CONTENT_GBNF = '( [^{d}\\\\] | "\\\\" ( [{d}\\\\/ bfnrt] | "u" [0-9a-fA-F]{{4}} ) )*'


class Outcome(enum.Enum):
    FAIL = "fail"
    SUCCESS = "success"
    NEED_MORE = "need_more_input"


@dataclass(frozen=True, slots=True)
class TaggedNode:
    """An AST node of a tag (its tag name) or of a rule (its rule name): its text, the nodes inside it in
    order, and whether the text ended inside it (common_peg_ast_node's is_partial)."""

    tag: str
    text: str
    children: tuple[TaggedNode, ...] = ()
    rule: str = ""
    partial: bool = False


@dataclass(frozen=True, slots=True)
class ParseResult:
    outcome: Outcome
    start: int
    end: int
    nodes: tuple[TaggedNode, ...] = ()

    def visit(self) -> list[TaggedNode]:
        """The nodes as common_peg_ast_arena::visit meets them: each before the nodes inside it."""
        order: list[TaggedNode] = []

        def walk(node: TaggedNode) -> None:
            order.append(node)
            for child in node.children:
                walk(child)

        for node in self.nodes:
            walk(node)
        return order


def _fail(start: int, end: int | None = None) -> ParseResult:
    return ParseResult(Outcome.FAIL, start, start if end is None else end)


@dataclass(slots=True)
class _Executor:
    arena: PegArena
    text: str
    lenient: bool = True
    _classes: dict[int, tuple[bool, list[tuple[str, str]]]] = field(default_factory=dict)

    def parse(self, parser: int, pos: int) -> ParseResult:
        return getattr(self, "_" + self.arena.kind(parser))(parser, pos)  # type: ignore[no-any-return]

    def _short(self, start: int, pos: int) -> ParseResult:
        # the text ends inside a parser: it needs more input, or fails where parsing is not lenient
        return ParseResult(Outcome.NEED_MORE, start, pos) if self.lenient else _fail(start)

    def _eps(self, _: int, pos: int) -> ParseResult:
        return ParseResult(Outcome.SUCCESS, pos, pos)

    def _end(self, _: int, pos: int) -> ParseResult:
        return ParseResult(Outcome.SUCCESS, pos, pos) if pos >= len(self.text) else _fail(pos)

    def _literal(self, parser: int, pos: int) -> ParseResult:
        start = pos
        for char in self.arena.text(parser):
            if pos >= len(self.text):
                return self._short(start, pos)
            if self.text[pos] != char:
                return _fail(start)
            pos += 1
        return ParseResult(Outcome.SUCCESS, start, pos)

    def _sequence(self, parser: int, start: int) -> ParseResult:
        pos = start
        nodes: list[TaggedNode] = []
        for child in self.arena.children(parser):
            result = self.parse(child, pos)
            if result.outcome is Outcome.FAIL:
                return _fail(start, result.end)
            nodes.extend(result.nodes)
            if result.outcome is Outcome.NEED_MORE:
                return ParseResult(Outcome.NEED_MORE, start, result.end, tuple(nodes))
            pos = result.end
        return ParseResult(Outcome.SUCCESS, start, pos, tuple(nodes))

    def _choice(self, parser: int, start: int) -> ParseResult:
        for child in self.arena.children(parser):
            result = self.parse(child, start)
            if result.outcome is not Outcome.FAIL:
                return result
        return _fail(start)

    def _repeat(self, parser: int, start: int) -> ParseResult:
        low, high = self.arena.counts(parser)
        (child,) = self.arena.children(parser)
        pos, count = start, 0
        nodes: list[TaggedNode] = []
        while high == -1 or count < high:
            if pos >= len(self.text):
                break
            result = self.parse(child, pos)
            if result.outcome is Outcome.SUCCESS:
                if result.end == pos:
                    break  # an empty match ends the repetition
                nodes.extend(result.nodes)
                pos, count = result.end, count + 1
                continue
            if result.outcome is Outcome.NEED_MORE:
                nodes.extend(result.nodes)
                return ParseResult(Outcome.NEED_MORE, start, result.end, tuple(nodes))
            break
        if low > 0 and count < low:
            if pos >= len(self.text) and self.lenient:
                return ParseResult(Outcome.NEED_MORE, start, pos, tuple(nodes))
            return _fail(start, pos)
        return ParseResult(Outcome.SUCCESS, start, pos, tuple(nodes))

    def _and(self, parser: int, start: int) -> ParseResult:
        return ParseResult(self.parse(self.arena.children(parser)[0], start).outcome, start, start)

    def _not(self, parser: int, start: int) -> ParseResult:
        outcome = self.parse(self.arena.children(parser)[0], start).outcome
        if outcome is Outcome.SUCCESS:
            return _fail(start)
        more = outcome is Outcome.NEED_MORE  # what the child would match is not known yet
        return ParseResult(Outcome.NEED_MORE if more else Outcome.SUCCESS, start, start)

    def _any(self, _: int, start: int) -> ParseResult:
        if start >= len(self.text):
            return ParseResult(Outcome.NEED_MORE, start, start) if self.lenient else _fail(start)
        return ParseResult(Outcome.SUCCESS, start, start + 1)

    def _space(self, _: int, start: int) -> ParseResult:
        pos = start
        while pos < len(self.text) and self.text[pos] in _SPACE:
            pos += 1
        return ParseResult(Outcome.SUCCESS, start, pos)

    def _chars(self, parser: int, start: int) -> ParseResult:
        low, high = self.arena.counts(parser)
        negated, ranges = self._char_class(parser)
        pos, count = start, 0
        while high == -1 or count < high:
            if pos >= len(self.text):  # common_parse_utf8_codepoint: INCOMPLETE at the end
                if count >= low:
                    return ParseResult(Outcome.SUCCESS, start, pos)
                return self._short(start, pos)
            char = self.text[pos]
            if any(first <= char <= last for first, last in ranges) == negated:
                break
            pos, count = pos + 1, count + 1
        if count < low:
            if pos >= len(self.text) and self.lenient:
                return ParseResult(Outcome.NEED_MORE, start, pos)
            return _fail(start, pos)
        return ParseResult(Outcome.SUCCESS, start, pos)

    def _char_class(self, parser: int) -> tuple[bool, list[tuple[str, str]]]:
        # a class as the builder's chars() gets it: "[...]" with ranges, "^" to negate, backslash escapes
        if parser not in self._classes:
            body = self.arena.text(parser)[1:-1]
            negated = body.startswith("^")
            chars: list[str] = []
            at = 1 if negated else 0
            while at < len(body):
                if body[at] == "\\" and at + 1 < len(body):
                    chars.append({"n": "\n", "t": "\t", "r": "\r"}.get(body[at + 1], body[at + 1]))
                    at += 2
                else:
                    chars.append(body[at])
                    at += 1
            ranges: list[tuple[str, str]] = []
            at = 0
            while at < len(chars):
                if at + 2 < len(chars) and chars[at + 1] == "-":
                    ranges.append((chars[at], chars[at + 2]))
                    at += 3
                else:
                    ranges.append((chars[at], chars[at]))
                    at += 1
            self._classes[parser] = (negated, ranges)
        return self._classes[parser]

    def _string(self, _: int, start: int, delimiter: str = '"') -> ParseResult:
        # string_content(delimiter): up to the closing delimiter, not consumed; JSON's escapes and the
        # delimiter's
        pos = start
        text = self.text
        while pos < len(text):
            char = text[pos]
            if char == delimiter:
                return ParseResult(Outcome.SUCCESS, start, pos)
            if char != "\\":
                pos += 1
                continue
            if pos + 1 >= len(text):
                return self._short(start, pos)  # the backslash is not taken
            escaped = text[pos + 1]
            if escaped == delimiter or escaped in '\\/bfnrt':
                pos += 2
            elif escaped == "u":
                digits = text[pos + 2:pos + 6]
                if any(d not in "0123456789abcdefABCDEF" for d in digits):
                    return _fail(start)
                if len(digits) < 4:
                    return self._short(start, pos)  # the incomplete escape is not taken
                pos += 6
            else:
                return _fail(start)
        return self._short(start, pos) if self.lenient else _fail(start, pos)

    def _until(self, parser: int, start: int) -> ParseResult:
        delimiters = self.arena.delimiters(parser)
        text = self.text
        for pos in range(start, len(text)):
            rest = text[pos:pos + max(map(len, delimiters), default=0)]
            # a delimiter here, or the text ending inside one's start: both stop the scan, a success
            if any(text.startswith(d, pos) or d.startswith(rest) for d in delimiters):
                return ParseResult(Outcome.SUCCESS, start, pos)
        return ParseResult(Outcome.NEED_MORE if self.lenient else Outcome.SUCCESS, start, len(text))

    def _through(self, parser: int, start: int) -> ParseResult:
        # schema, ac and gbnf parsers parse as their child does
        children = self.arena.children(parser)
        if children:
            return self.parse(children[0], start)
        # string_content of a delimiter other than '"', which the arena keeps as its GBNF alone
        text = self.arena.text(parser)
        delimiter = text[4:5]
        if not delimiter or text != _STRING_CONTENT_GBNF.format(d=delimiter):
            raise NotImplementedError("the parse of a gbnf parser without a child")
        return self._string(parser, start, delimiter)

    _schema = _through
    _ac = _through
    _gbnf = _through

    def _ref(self, parser: int, start: int) -> ParseResult:
        return self.parse(self.arena.rule_parser(self.arena.text(parser)), start)

    def _rule(self, parser: int, start: int) -> ParseResult:
        return self._node(parser, start, "", self.arena.text(parser))

    def _tag(self, parser: int, start: int) -> ParseResult:
        return self._node(parser, start, self.arena.text(parser), "")

    def _node(self, parser: int, start: int, tag: str, rule: str) -> ParseResult:
        # a rule's or tag's AST node around what its child found
        result = self.parse(self.arena.children(parser)[0], start)
        if result.outcome is Outcome.FAIL:
            return result
        node = TaggedNode(tag, self.text[result.start:result.end], result.nodes, rule,
                          result.outcome is Outcome.NEED_MORE)
        return ParseResult(result.outcome, result.start, result.end, (node,))

    def _atomic(self, parser: int, start: int) -> ParseResult:
        result = self.parse(self.arena.children(parser)[0], start)
        if result.outcome is Outcome.NEED_MORE:
            return ParseResult(result.outcome, result.start, result.end)
        return result


def run(arena: PegArena, text: str, *, lenient: bool = True) -> ParseResult:
    """The arena's root parsed on `text` from its start, as parser_executor parses (see the contract).

    Raises:
        NotImplementedError: the parse meets a parser kind not ported.
    """
    return _Executor(arena, text, lenient).parse(arena.root, 0)


# -- common_chat_peg_mapper
def _trim_trailing(text: str) -> str:
    return text.rstrip(_SPACE)


def _trim(text: str) -> str:
    # trim_trailing_space(trim_leading_space(text, 1))
    if text and text[0] in _SPACE:
        text = text[1:]
    return _trim_trailing(text)


def _dump(text: str) -> str:
    # nlohmann's dump of a string: UTF-8 kept, control characters as \u00xx, as json.dumps writes them
    return json.dumps(text, ensure_ascii=False)


_PY_LITERALS = (("True", "true"), ("False", "false"), ("None", "null"))


def normalize_quotes_to_json(text: str) -> str:
    """normalize_quotes_to_json: Python's single-quoted strings and literals written as JSON."""
    out: list[str] = []
    single = double = False
    at = 0
    while at < len(text):
        char = text[at]
        if char == "\\" and at + 1 < len(text):
            after = text[at + 1]
            if single:
                out.append({"'": "'", '"': '\\"'}.get(after, char + after))
                at += 2
            elif double:
                out.append(char + after)
                at += 2
            else:
                out.append(char)
                at += 1
            continue
        if char == '"':
            if single:
                out.append('\\"')
            else:
                double = not double
                out.append(char)
        elif char == "'":
            if double:
                out.append(char)
            else:
                single = not single
                out.append('"')
        elif not single and not double and char in "TFN" and (at == 0 or not _word_char(text[at - 1])):
            end = at
            while end < len(text) and _word_char(text[end]):
                end += 1
            word = text[at:end]
            for python, written in _PY_LITERALS:
                if python.startswith(word):
                    out.append(written[:len(word)])
                    at = end - 1
                    break
            else:
                out.append(char)
        else:
            out.append(char)
        at += 1
    return "".join(out)


def _word_char(char: str) -> bool:
    # C isalnum in the "C" locale, or an underscore
    return char == "_" or ("0" <= char <= "9") or ("a" <= char.lower() <= "z" and char.isascii())


@dataclass(slots=True)
class _Call:
    name: str = ""
    arguments: str = ""
    id: str = ""

    def done(self) -> ParsedToolCall:
        return ParsedToolCall(self.name, self.arguments, self.id)


@dataclass(slots=True)
class _Mapper:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)
    pending: _Call | None = None
    current: _Call | None = None
    arg_count: int = 0
    args_buffer: str = ""
    quote_pending: bool = False

    def _add_args(self, text: str) -> None:
        # args_target(): the current call's arguments once it is named, else the buffer
        if self.current is not None and self.current.name:
            self.current.arguments += text
        else:
            self.args_buffer += text

    def _set_args(self, text: str) -> None:
        if self.current is not None and self.current.name:
            self.current.arguments = text
        else:
            self.args_buffer = text

    def _target(self) -> str:
        return self.current.arguments if self.current is not None and self.current.name else self.args_buffer

    def map(self, node: TaggedNode) -> None:
        tag, text = node.tag, node.text
        if tag == "reasoning":
            self.reasoning.append(text)
        elif tag == "content":
            self.content.append(text)
        elif tag == "tool-open":
            self.pending = self.current = _Call()
            self.arg_count, self.args_buffer, self.quote_pending = 0, "", False
        elif tag == "tool-id" and self.current is not None:
            trimmed = _trim_trailing(text)
            if len(trimmed) >= 2 and trimmed[0] == '"' and trimmed[-1] == '"':
                trimmed = trimmed[1:-1]
            self.current.id = trimmed
        elif tag == "tool-name" and self.current is not None:
            self._name(text)
        elif tag == "tool-args" and self.current is not None:
            trimmed = _trim_trailing(text)
            if trimmed.startswith("{"):
                self._set_args(trimmed)
        elif tag == "tool-arg-open":
            self.quote_pending = False
        elif tag == "tool-arg-name" and self.current is not None:
            entry = ("," if self.arg_count > 0 else "") + _dump(_trim(text)) + ":"
            self.arg_count += 1
            if not self._target():
                self._set_args("{")
            self._add_args(entry)
        elif tag in ("tool-arg-value", "tool-arg-string-value") and self.current is not None:
            self._value(text, string=tag == "tool-arg-string-value")
        elif tag == "tool-arg-close" and self.current is not None:
            if self.quote_pending:
                self._add_args('"')
                self.quote_pending = False
        elif tag == "tool-close" and self.current is not None:
            self._close(self.current)

    def _name(self, text: str) -> None:
        assert self.current is not None
        self.current.name = _trim_trailing(text)
        if self.args_buffer:
            self.current.arguments, self.args_buffer = self.args_buffer, ""
        elif not self.current.arguments:
            self.current.arguments = "{"
        if self.pending is not None:  # the call is listed as soon as it is named
            self.calls.append(self.pending)
            self.pending = None

    def _value(self, text: str, *, string: bool) -> None:
        added = ""
        if string and not text:  # an empty string: its closing quote comes with the argument's close
            added, self.quote_pending = '"', True
        elif string:
            if not self.quote_pending:
                added, self.quote_pending = '"', True
            added += _dump(text)[1:-1]
        elif text:
            added = normalize_quotes_to_json(text)
        self._add_args(added)

    def _close(self, call: _Call) -> None:
        if not call.name and self.args_buffer:
            call.arguments, self.args_buffer = self.args_buffer, ""
        if self.quote_pending:
            call.arguments += '"'
            self.quote_pending = False
        call.arguments += "}" * max(0, brace_depth(call.arguments))
        if self.pending is not None:
            if call.name:
                self.calls.append(self.pending)
            self.pending = None

    def finish(self) -> tuple[str, str, tuple[ParsedToolCall, ...]]:
        if self.pending is not None and self.pending.name:
            if self.args_buffer:
                self.pending.arguments = self.args_buffer
            if self.quote_pending and self.pending.arguments:
                self.pending.arguments += '"'
            self.calls.append(self.pending)
            self.pending = None
        reasoning = "".join(self.reasoning)
        if not reasoning.strip(" \n\r\t"):
            reasoning = ""
        return "".join(self.content), reasoning, tuple(call.done() for call in self.calls)


def message(nodes: Sequence[TaggedNode]) -> tuple[str, str, tuple[ParsedToolCall, ...]]:
    """common_chat_peg_mapper::from_ast: (content, reasoning_content, tool calls) of the nodes in the order
    ParseResult.visit gives them."""
    mapper = _Mapper()
    for node in nodes:
        mapper.map(node)
    return mapper.finish()
