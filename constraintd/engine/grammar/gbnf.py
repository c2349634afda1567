# The GBNF parser: llama.cpp's `llama_grammar_parser`, ported to Python.
#
# Contract:
# - `parse_gbnf(text)` accepts exactly the texts llama.cpp's `llama_grammar_parser::parse` accepts and
#   returns the same symbol ids and the same element vectors (generated rules `root_1`, ... included).
#   It refuses, with llama.cpp's message as `reason`, exactly where `parse` throws, plus three cases where
#   llama.cpp never returns (see below). The checks llama.cpp makes later, in `llama_grammar_init_impl`
#   (root symbol, left recursion), are `check_grammar`'s, in grammar/checks.py.
# - The text is read as llama.cpp reads a C string: it ends at the first NUL. A Python `str` is read code
#   point by code point, which is what llama.cpp's `decode_utf8` yields for the UTF-8 of that string.
# - Where llama.cpp does not refuse but exhausts memory or the stack, we refuse instead (messages marked
#   "ours" in `ERRORS`): `{m,n}` with n < m (llama.cpp loops generating rules without end), groups nested
#   deeper than `MAX_NESTING` (llama.cpp recurses on the C stack), and repetitions that would copy more
#   than `MAX_REPEATED_ELEMENTS` elements.
# - Nothing but `GrammarError` escapes, and the work is linear in the text plus the elements produced:
#   nesting is handled with an explicit stack, never with Python recursion.
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from constraintd.engine.grammar.checks import (
    ERRORS,
    MAX_NESTING,
    MAX_REPEATED_ELEMENTS,
    MAX_REPETITION_THRESHOLD,
    check_grammar,
    format_gbnf,
    grammar_error,
)
from constraintd.engine.grammar.elements import GreType
from constraintd.errors import GrammarError

__all__ = [
    "CHAR_ESCAPES",
    "ERRORS",
    "HEX_ESCAPES",
    "MAX_NESTING",
    "MAX_REPEATED_ELEMENTS",
    "MAX_REPETITION_THRESHOLD",
    "Element",
    "GreType",
    "ParsedGrammar",
    "check_grammar",
    "format_gbnf",
    "grammar_error",
    "parse_gbnf",
]


Element = tuple[int, int]


@dataclass(frozen=True, slots=True)
class ParsedGrammar:
    """A parsed grammar, as llama.cpp's parser holds it.

    Attributes:
        symbol_ids: every rule name (written or generated) to its id, llama.cpp's numbering.
        rules: `rules[rule_id]` is its elements, alternates separated by `(ALT, 0)`, ended by `(END, 0)`.
    """

    symbol_ids: Mapping[str, int]
    rules: tuple[tuple[Element, ...], ...]


# The escapes llama.cpp's `parse_char` reads: `\` + char -> code point, or -> number of hex digits.
CHAR_ESCAPES: Final[Mapping[str, int]] = {
    "t": 0x09,
    "r": 0x0D,
    "n": 0x0A,
    "\\": 0x5C,
    '"': 0x22,
    "[": 0x5B,
    "]": 0x5D,
    "-": 0x2D,
}
HEX_ESCAPES: Final[Mapping[str, int]] = {"x": 2, "u": 4, "U": 8}
_HEX_DIGITS: Final = {c: int(c, 16) for c in "0123456789abcdefABCDEF"}
_DIGITS: Final = frozenset("0123456789")
_UINT32_MAX: Final = (1 << 32) - 1
_UINT64_MAX: Final = (1 << 64) - 1

# llama.cpp's parse_space (with and without newlines), is_word_char, is_digit_char; ASCII only.
_SPACE_NL: Final = re.compile(r"(?:[ \t\r\n]++|#[^\r\n\0]*+)*+")
_SPACE: Final = re.compile(r"(?:[ \t]++|#[^\r\n\0]*+)*+")
_NAME: Final = re.compile(r"[a-zA-Z0-9-]+")
_INT: Final = re.compile(r"[0-9]+")
_PLAIN: Final = re.compile(r'[^"\\\0]+')  # literal chars that stand for themselves

# `*`, `+`, `?` as {min,max} (None: no maximum).
_OPERATORS: Final[Mapping[str, tuple[int, int | None]]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}

_END: Final = (GreType.END, 0)
_ALT: Final = (GreType.ALT, 0)
_ANY: Final = (GreType.CHAR_ANY, 0)


def parse_gbnf(text: str, *, token_id: Callable[[str], int | None] | None = None) -> ParsedGrammar:
    """Parse a GBNF grammar as llama.cpp does, with its symbol ids and element vectors.

    Args:
        text: the grammar; it ends at its first NUL, as the C string llama.cpp reads.
        token_id: resolves a `<text>` terminal, brackets included, to its single token id (None when the
            text is not exactly one token). Without it `<text>` is refused as llama.cpp refuses it with no
            vocabulary; `<[id]>` needs no vocabulary.

    Returns:
        The rules. Does not check for a root rule or left recursion: that is `check_grammar`.

    Raises:
        GrammarError: where llama.cpp's parser refuses the text (reason, line, column, excerpt), or where
            llama.cpp would never return (`{m,n}` with n < m, too deep nesting, too large repetitions).
    """
    return _Parser(text, token_id).parse()


class _Frame:
    # One open `parse_alternates` call of llama.cpp (a rule body or a parenthesized group), with the state
    # of the sequence being parsed in it: where the last item starts, and how many rules it stands for.
    __slots__ = ("before", "last", "n_prev", "nested", "rule", "rule_id", "rule_name")

    def __init__(self, rule_name: str, rule_id: int, *, nested: bool, before: int) -> None:
        self.rule_name = rule_name
        self.rule_id = rule_id
        self.nested = nested
        self.before = before  # number of symbols before this group was opened
        self.rule: list[Element] = []
        self.last = 0
        self.n_prev = 1


class _Parser:
    __slots__ = ("first_ref", "repeated", "rules", "src", "symbol_ids", "text", "token_id")

    def __init__(self, text: str, token_id: Callable[[str], int | None] | None) -> None:
        self.text = text
        # llama.cpp stops at the NUL ending its C string; three NULs let us look two chars ahead anywhere.
        self.src = text.split("\0", 1)[0] + "\0\0\0"
        self.token_id = token_id
        self.symbol_ids: dict[str, int] = {}
        self.rules: list[tuple[Element, ...] | None] = []
        self.first_ref: dict[int, int] = {}  # symbol id -> offset of its first reference
        self.repeated = 0

    def error(self, key: str, pos: int = -1, **fields: object) -> GrammarError:
        return grammar_error(key, self.text, pos, **fields)

    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base_name: str) -> int:
        # Always a new name: `_` is not a word char, so no rule written in a grammar is called `root_1`.
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base_name}_{next_id}"] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list[Element]) -> None:
        if len(self.rules) <= rule_id:
            self.rules.extend([None] * (rule_id + 1 - len(self.rules)))
        self.rules[rule_id] = tuple(rule)

    def parse(self) -> ParsedGrammar:
        src = self.src
        pos = self.space(0, True)
        while src[pos] != "\0":
            pos = self.parse_rule(pos)
        self.check_defined()
        rules = tuple(rule for rule in self.rules if rule is not None)  # none is None after the check
        return ParsedGrammar(symbol_ids=dict(self.symbol_ids), rules=rules)

    def check_defined(self) -> None:
        # llama.cpp's validation at the end of parse(): every rule slot filled, every reference defined.
        rules = self.rules
        for rule_id, rule in enumerate(rules):
            if rule is None:  # a name referenced only by a rule defined again without it
                raise self.error("undefined", self.first_ref.get(rule_id, -1))
            for kind, value in rule:
                if kind == GreType.RULE_REF and (value >= len(rules) or rules[value] is None):
                    name = next(name for name, symbol in self.symbol_ids.items() if symbol == value)
                    raise self.error("undefined_name", self.first_ref.get(value, -1), name=name)

    def parse_rule(self, start: int) -> int:
        src = self.src
        name = _NAME.match(src, start)
        if name is None:
            raise self.error("name", start)
        pos = self.space(name.end(), False)
        rule_id = self.get_symbol_id(name.group())
        if src[pos : pos + 3] != "::=":
            raise self.error("assign", pos)
        pos = self.space(pos + 3, True)
        pos = self.parse_alternates(pos, name.group(), rule_id)
        if src[pos] == "\r":
            pos += 2 if src[pos + 1] == "\n" else 1
        elif src[pos] == "\n":
            pos += 1
        elif src[pos] != "\0":
            raise self.error("newline", pos)
        return self.space(pos, True)

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int) -> int:
        # llama.cpp's parse_alternates / parse_sequence recursion, run on an explicit stack of frames.
        src = self.src
        frames = [_Frame(rule_name, rule_id, nested=False, before=0)]
        while True:
            frame = frames[-1]
            pos = self.parse_sequence(pos, frame)
            if src[pos] == "(":
                if len(frames) > MAX_NESTING:
                    raise self.error("nesting", pos)
                pos = self.space(pos + 1, True)
                before = len(self.symbol_ids)
                sub_rule_id = self.generate_symbol_id(frame.rule_name)
                frames.append(_Frame(frame.rule_name, sub_rule_id, nested=True, before=before))
                continue
            if src[pos] == "|":
                frame.rule.append(_ALT)
                pos = self.space(pos + 1, True)
                frame.last = len(frame.rule)
                frame.n_prev = 1
                continue
            frame.rule.append(_END)
            self.add_rule(frame.rule_id, frame.rule)
            frames.pop()
            if not frames:
                return pos
            outer = frames[-1]
            outer.n_prev = max(1, len(self.symbol_ids) - frame.before)
            outer.last = len(outer.rule)
            outer.rule.append((GreType.RULE_REF, frame.rule_id))
            if src[pos] != ")":
                raise self.error("group_close", pos)
            pos = self.space(pos + 1, outer.nested)

    def space(self, pos: int, newline_ok: bool) -> int:
        # llama.cpp's parse_space: blanks and comments, and newlines where newline_ok.
        spaces = (_SPACE_NL if newline_ok else _SPACE).match(self.src, pos)
        assert spaces is not None  # the patterns match the empty string
        return spaces.end()

    def parse_sequence(self, pos: int, frame: _Frame) -> int:
        # Returns at the first char that does not continue the sequence; `(` is left to parse_alternates.
        src = self.src
        rule = frame.rule
        nested = frame.nested
        while True:
            c = src[pos]
            if c == '"':  # literal string
                pos += 1
                frame.last = len(rule)
                frame.n_prev = 1
                while src[pos] != '"':
                    if (plain := _PLAIN.match(src, pos)) is not None:  # a run without escapes, at once
                        rule.extend([(GreType.CHAR, ord(char)) for char in plain.group()])
                        pos = plain.end()
                        continue
                    if src[pos] == "\0":
                        raise self.error("end", pos)
                    char, pos = self.parse_char(pos)
                    rule.append((GreType.CHAR, char))
                pos = self.space(pos + 1, nested)
            elif c == "[":  # char class
                pos += 1
                start_type = GreType.CHAR
                if src[pos] == "^":
                    pos += 1
                    start_type = GreType.CHAR_NOT
                frame.last = len(rule)
                frame.n_prev = 1
                while src[pos] != "]":
                    if src[pos] == "\0":
                        raise self.error("end", pos)
                    char, pos = self.parse_char(pos)
                    rule.append((GreType.CHAR_ALT if frame.last < len(rule) else start_type, char))
                    if src[pos] == "-" and src[pos + 1] != "]":
                        if src[pos + 1] == "\0":
                            raise self.error("end", pos + 1)
                        char, pos = self.parse_char(pos + 1)
                        rule.append((GreType.CHAR_RNG_UPPER, char))
                pos = self.space(pos + 1, nested)
            elif c in "<!":  # token
                kind = GreType.TOKEN
                if c == "!":
                    kind = GreType.TOKEN_NOT
                    pos += 1
                token, pos = self.parse_token(pos)
                frame.last = len(rule)
                frame.n_prev = 1
                rule.append((kind, token))
                pos = self.space(pos, nested)
            elif c == ".":  # any char
                frame.last = len(rule)
                frame.n_prev = 1
                rule.append(_ANY)
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                at = pos
                pos = self.space(pos + 1, nested)
                self.repeat(frame, *_OPERATORS[c], at=at)
            elif c == "{":
                at = pos
                pos, min_times, max_times = self.parse_braces(pos, nested)
                self.repeat(frame, min_times, max_times, at=at)
            elif (name := _NAME.match(src, pos)) is not None:  # rule reference
                ref_rule_id = self.get_symbol_id(name.group())
                self.first_ref.setdefault(ref_rule_id, pos)
                pos = self.space(name.end(), nested)
                frame.last = len(rule)
                frame.n_prev = 1
                rule.append((GreType.RULE_REF, ref_rule_id))
            else:  # `(` (handled by the caller), or the end of the sequence
                return pos

    def parse_braces(self, start: int, nested: bool) -> tuple[int, int, int | None]:
        # `{m}`, `{m,}`, `{m,n}`: returns the position after it, m, and n (None: no maximum).
        src = self.src
        pos = self.space(start + 1, nested)
        if src[pos] not in _DIGITS:
            raise self.error("repeat_int", pos)
        min_times, pos = self.parse_uint(pos, "repeat_range")
        pos = self.space(pos, nested)
        max_times: int | None = None
        if src[pos] == "}":
            max_times = min_times
            pos = self.space(pos + 1, nested)
        elif src[pos] == ",":
            pos = self.space(pos + 1, nested)
            if src[pos] in _DIGITS:
                max_times, pos = self.parse_uint(pos, "repeat_range")
                pos = self.space(pos, nested)
            if src[pos] != "}":
                raise self.error("repeat_close", pos)
            pos = self.space(pos + 1, nested)
        else:
            raise self.error("repeat_comma", pos)
        if min_times > MAX_REPETITION_THRESHOLD:
            raise self.error("repeat_many", start)
        if max_times is not None and max_times > MAX_REPETITION_THRESHOLD:
            max_times = None  # as llama.cpp: a maximum above the threshold means no maximum
        return pos, min_times, max_times

    def parse_uint(self, pos: int, overflow: str) -> tuple[int, int]:
        # llama.cpp's parse_int then std::stoul/stoull, which throw out_of_range past 64 bits.
        digits = _INT.match(self.src, pos)
        if digits is None:
            raise self.error("integer", pos)
        text = digits.group().lstrip("0")
        if len(text) > 20 or int(text or "0") > _UINT64_MAX:  # never converts a huge digit string
            raise self.error(overflow, pos)
        return int(text or "0"), digits.end()

    def repeat(self, frame: _Frame, min_times: int, max_times: int | None, *, at: int) -> None:
        # llama.cpp's handle_repetitions: rewrite the last item S of the sequence as
        #   S{m,n} -> S S ... S (m times) S'(n-m),  S'(x) ::= S S'(x-1) |  ...  S'(1) ::= S |
        #   S{m,}  -> S S ... S (m times) S',       S' ::= S S' |
        rule = frame.rule
        if frame.last == len(rule):
            raise self.error("repeat_what", at)
        prev = rule[frame.last :]
        total_rules = 1
        if max_times is not None and max_times > 0:
            total_rules = max_times
        elif min_times > 0:
            total_rules = min_times
        if frame.n_prev * total_rules > MAX_REPETITION_THRESHOLD:
            raise self.error("repeat_rules", at)
        if max_times is not None and max_times < min_times:
            raise self.error("repeat_reversed", at, min=min_times, max=max_times)
        n_opt = 1 if max_times is None else max_times - min_times
        self.repeated += max(min_times - 1, 0) * len(prev) + n_opt * (len(prev) + 3)
        if self.repeated > MAX_REPEATED_ELEMENTS:
            raise self.error("too_large", at)

        if min_times == 0:
            del rule[frame.last :]
        else:
            rule.extend(prev * (min_times - 1))
        last_rec_rule_id = 0
        for i in range(n_opt):
            rec_rule = prev.copy()
            rec_rule_id = self.generate_symbol_id(frame.rule_name)
            if i > 0 or max_times is None:
                ref = rec_rule_id if max_times is None else last_rec_rule_id
                rec_rule.append((GreType.RULE_REF, ref))
            rec_rule += (_ALT, _END)
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            rule.append((GreType.RULE_REF, last_rec_rule_id))
        frame.n_prev *= total_rules

    def parse_char(self, pos: int) -> tuple[int, int]:
        # One code point of a literal or a char class, escapes included; returns it and the next offset.
        src = self.src
        c = src[pos]
        if c == "\\":
            escape = src[pos + 1]
            if escape in HEX_ESCAPES:
                return self.parse_hex(pos + 2, HEX_ESCAPES[escape])
            if escape in CHAR_ESCAPES:
                return CHAR_ESCAPES[escape], pos + 2
            raise self.error("escape", pos)
        if c != "\0":
            return ord(c), pos + 1
        raise self.error("end", pos)

    def parse_hex(self, start: int, size: int) -> tuple[int, int]:
        src = self.src
        value = 0
        pos = start
        end = start + size
        while pos < end and (digit := _HEX_DIGITS.get(src[pos])) is not None:
            value = (value << 4) + digit
            pos += 1
        if pos != end:
            raise self.error("hex", start, size=size)
        return value, pos

    def parse_token(self, start: int) -> tuple[int, int]:
        # `<[id]>` (a token id) or `<text>` (the one token the text is); returns it and the next offset.
        src = self.src
        if src[start] != "<":
            raise self.error("token_open", start)
        pos = start + 1
        if src[pos] == "[":
            token, pos = self.parse_uint(pos + 1, "token_id_range")
            if token > _UINT32_MAX:
                raise self.error("token_id_too_big", start + 2)
            if src[pos] != "]":
                raise self.error("token_bracket", pos)
            if src[pos + 1] != ">":
                raise self.error("token_close", pos + 1)
            return token, pos + 2
        if self.token_id is None:
            raise self.error("no_vocab", start)
        close = src.find(">", pos)
        if close < 0:
            raise self.error("token_close", len(src) - 3)
        text = src[start : close + 1]
        resolved = self.token_id(text)
        if resolved is None:
            raise self.error("invalid_token", start, text=text)
        return resolved, close + 1
