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

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
from constraintd.engine.grammar.elements import (
    ALT,
    CHAR,
    CHAR_ALT,
    CHAR_ANY,
    CHAR_NOT,
    CHAR_RNG_UPPER,
    END,
    RULE_REF,
    TOKEN,
    TOKEN_NOT,
    GreType,
)
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
    "forget_kept_classes",
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
        well_formed: made by `parse_gbnf`, whose element vectors are well-formed by construction, so
            `check_grammar` does not check their shape again (a hand-built grammar leaves it False).
    """

    symbol_ids: Mapping[str, int]
    rules: tuple[tuple[Element, ...], ...]
    well_formed: bool = field(default=False, compare=False, repr=False)


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
_BLANKS_NL: Final = r"(?:[ \t\r\n]++|#[^\r\n\0]*+)*+"
_BLANKS: Final = r"(?:[ \t]++|#[^\r\n\0]*+)*+"
_SPACE_NL: Final = re.compile(_BLANKS_NL)
_SPACE: Final = re.compile(_BLANKS)
_NAME: Final = re.compile(r"[a-zA-Z0-9-]+")
_INT: Final = re.compile(r"[0-9]+")
_PLAIN: Final = re.compile(r'[^"\\\0]+')  # literal chars that stand for themselves

# `*`, `+`, `?` as {min,max} (None: no maximum).
_OPERATORS: Final[Mapping[str, tuple[int, int | None]]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}

# The kinds as names of this module, plain ints (`GreType`'s values): reading a member off the enum class
# costs ten times a global's look-up, and the parser makes one element per character. And an element of
# two plain ints leaves the cyclic collector's sight after its first pass, where one holding an enum
# member (an object with a `__dict__`) stays in it for as long as the grammar is held: 15,000 of them with
# 20 schemas' grammars cached.
_RULE_REF: Final = RULE_REF
_CHAR: Final = CHAR
_CHAR_NOT: Final = CHAR_NOT
_CHAR_ALT: Final = CHAR_ALT
_CHAR_RNG_UPPER: Final = CHAR_RNG_UPPER
_END: Final = (END, 0)
_ALT: Final = (ALT, 0)
_ANY: Final = (CHAR_ANY, 0)

# The items most sequences are made of, each read with the blanks after it in one match (the blanks as
# parse_space reads them, without and with newlines): a rule reference, a literal without escapes, and a
# rule's head (its name and `::=`). Where they do not match, the text is read piece by piece.
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_REFERENCE: Final = re.compile(r"([a-zA-Z0-9-]+)" + _BLANKS)
_REFERENCE_NL: Final = re.compile(r"([a-zA-Z0-9-]+)" + _BLANKS_NL)
_LITERAL: Final = re.compile(r'"([^"\\\0]*)"' + _BLANKS)
_LITERAL_NL: Final = re.compile(r'"([^"\\\0]*)"' + _BLANKS_NL)
_HEAD: Final = re.compile(r"([a-zA-Z0-9-]+)" + _BLANKS + "::=" + _BLANKS_NL)
# A char class whose escapes are all well formed, then its items one by one (a char or an escape).
_CLASS_ITEM: Final = r'[^\]\\\0]|\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[trn\\"\[\]-])'
_CLASS: Final = re.compile(r"\[(\^?)((?:" + _CLASS_ITEM + r")*)\]" + _BLANKS)
_CLASS_NL: Final = re.compile(r"\[(\^?)((?:" + _CLASS_ITEM + r")*)\]" + _BLANKS_NL)
_CLASS_ITEMS: Final = re.compile(_CLASS_ITEM)
# A rule whose body is references, literals and char classes only (all escapes well formed), with
# alternates and plain blanks between them: no group, no repetition, no token, no `.`, no comment. Most rules
# a converter writes are such: the rule is then matched whole by one pattern and its items found by another,
# without the sequence's bookkeeping (nothing in it can be repeated). Any other rule is read by the general
# loop, which also finds every refusal where llama.cpp does.
_LITERAL_ITEM: Final = r'[^"\\\0]|\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[trn\\"\[\]-])'
_LITERAL_TEXT: Final = r'"(?:' + _LITERAL_ITEM + r')*+"'
_CLASS_TEXT: Final = r"\[\^?(?:" + _CLASS_ITEM + r")*+\]"
# such a rule whole: its name, its body, and its line's end with the blanks after it (the next rule's start)
_SIMPLE_RULE: Final = re.compile(
    r"([a-zA-Z0-9-]+)" + _BLANKS + "::=" + _BLANKS_NL
    + r"((?:(?:[a-zA-Z0-9-]++|" + _LITERAL_TEXT + "|" + _CLASS_TEXT + r")[ \t]*+|\|[ \t\r\n]*+)*+)"
    + r"(?:\r\n?|\n|(?=\0))" + _BLANKS_NL
)
# the items of such a body, blanks skipped: a reference, a literal, a char class, or `|`
_ITEMS: Final = re.compile(r"([a-zA-Z0-9-]++)|(" + _LITERAL_TEXT + ")|(" + _CLASS_TEXT + r")|\|")
_LITERAL_ITEMS: Final = re.compile(_LITERAL_ITEM)
_Match = Callable[[str, int], "re.Match[str] | None"]
# by `nested` (newlines are blanks inside a group): the matchers of a reference, a literal, a char class
_MATCHERS: Final[Mapping[bool, tuple[_Match, _Match, _Match]]] = {
    False: (_REFERENCE.match, _LITERAL.match, _CLASS.match),
    True: (_REFERENCE_NL.match, _LITERAL_NL.match, _CLASS_NL.match),
}


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


# the element of each ASCII char, made once: a literal of ASCII chars without escapes (most are) takes its
# elements from here, without a tuple made per char
_ASCII_ELEMENTS: Final = tuple((_CHAR, code_point) for code_point in range(128))


def _literal_elements(literal: str) -> list[Element]:
    # a quoted literal's chars, its escapes well formed (as `_ITEMS` found it)
    chars = literal[1:-1]
    if "\\" in chars:
        # quotes escaped (a key's literal), no other escape: a `\"` in a well-formed literal is one, since an
        # escaped backslash before a quote would end it
        chars = chars.replace('\\"', '"')
        if "\\" in chars:
            items = _LITERAL_ITEMS.findall(literal, 1, len(literal) - 1)
            return [(_CHAR, _code_point(item)) for item in items]
    if chars.isascii():
        return list(map(_ASCII_ELEMENTS.__getitem__, chars.encode()))
    return [(_CHAR, ord(char)) for char in chars]


def _class_elements(char_class: str) -> tuple[Element, ...]:
    # a bracketed char class's elements, its escapes well formed (as `_ITEMS` found it)
    if char_class.startswith(_JSON_CLASS_OPEN):  # its first items read once (see below)
        rule = list(_JSON_CLASS_OPEN_ELEMENTS)
        _Parser.add_class(rule, _CHAR_ALT, char_class[len(_JSON_CLASS_OPEN) : -1])
        return tuple(rule)
    negated = char_class[1] == "^"
    rule = []
    _Parser.add_class(rule, _CHAR_NOT if negated else _CHAR, char_class[1 + negated : -1])
    return tuple(rule)


# The characters a JSON string holds only escaped, as the converters' classes of a string's characters open:
# `[^"\\\x7F\x00-\x1F]` (llama.cpp's `char`) and the extended dialect's keys, `[^"\\\x7F\x00-\x1Fa]`
# and so on. Those items are read once here; a class opening with them reads only the rest (which starts
# afresh: the last of them closes a range).
_JSON_CLASS_OPEN: Final = '[^"\\\\\\x7F\\x00-\\x1F'
_JSON_CLASS_OPEN_ELEMENTS: Final = (
    (_CHAR_NOT, 0x22), (_CHAR_ALT, 0x5C), (_CHAR_ALT, 0x7F), (_CHAR_ALT, 0x00), (_CHAR_RNG_UPPER, 0x1F),
)

# A converter writes the same few classes in every grammar (a string's characters, digits, a key's
# characters but a few): short ones keep their elements, shared by the grammars that write them.
_KEPT_CLASS_CHARS: Final = 64
_kept_class: Final = functools.lru_cache(maxsize=4096)(_class_elements)


def forget_kept_classes() -> None:
    """Forget the char classes kept between grammars: the next parse reads each class as a process's first
    parse does (a benchmark times compiles so, none helped by an earlier one)."""
    _kept_class.cache_clear()


def _code_point(item: str) -> int:
    # one item of `_CLASS_ITEMS`: a char, or a well-formed escape (parse_char's reading of it)
    if len(item) == 1:
        return ord(item)
    if item[1] in HEX_ESCAPES:
        return int(item[2:], 16)
    return CHAR_ESCAPES[item[1]]


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
    __slots__ = ("first_ref", "repeated", "rules", "simple", "src", "symbol_ids", "text", "token_id")

    def __init__(
        self, text: str, token_id: Callable[[str], int | None] | None, *, simple: bool = True
    ) -> None:
        self.text = text
        self.simple = simple  # whether simple rules are read at once (`simple_rule`), else all by the loop
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
        symbol_ids = self.symbol_ids
        simple = _SIMPLE_RULE.match if self.simple else None
        pos = self.space(0, True)
        while src[pos] != "\0":
            if simple is not None and (whole := simple(src, pos)) is not None:
                name, body = whole.group(1, 2)
                self.add_rule(symbol_ids.setdefault(name, len(symbol_ids)), self.simple_rule(body))
                pos = whole.end()
            else:
                pos = self.parse_rule(pos)
        if len(self.rules) != len(self.symbol_ids) or None in self.rules:  # a name without a rule
            if self.simple:
                # whether llama.cpp refuses it, and where its message points, depends on where each name is
                # first referenced, which only the general loop marks
                return _Parser(self.text, self.token_id, simple=False).parse()
            self.check_defined()
        rules = tuple(rule for rule in self.rules if rule is not None)  # none is None after the check
        return ParsedGrammar(symbol_ids=dict(self.symbol_ids), rules=rules, well_formed=True)

    def check_defined(self) -> None:
        # llama.cpp's validation at the end of parse(): every rule slot filled, every reference defined.
        rules = self.rules
        # Every reference is to a name of the text (`first_ref` has them all) or to a rule the parser
        # generated and defined; so with every slot filled and every name's id among them, all is defined.
        # Otherwise the walk below finds the first undefined one, as llama.cpp does.
        if None not in rules and (not self.first_ref or max(self.first_ref) < len(rules)):
            return
        for rule_id, rule in enumerate(rules):
            if rule is None:  # a name referenced only by a rule defined again without it
                raise self.error("undefined", self.first_ref.get(rule_id, -1))
            for kind, value in rule:
                if kind == RULE_REF and (value >= len(rules) or rules[value] is None):
                    name = next(name for name, symbol in self.symbol_ids.items() if symbol == value)
                    raise self.error("undefined_name", self.first_ref.get(value, -1), name=name)

    def parse_rule(self, start: int) -> int:
        src = self.src
        head = _HEAD.match(src, start)  # the name, `::=` and the blanks after each
        if head is None:
            name = _NAME.match(src, start)
            if name is None:
                raise self.error("name", start)
            raise self.error("assign", self.space(name.end(), False))
        rule_name = head.group(1)
        pos = self.parse_alternates(head.end(), rule_name, self.get_symbol_id(rule_name))
        if src[pos] == "\r":
            pos += 2 if src[pos + 1] == "\n" else 1
        elif src[pos] == "\n":
            pos += 1
        elif src[pos] != "\0":
            raise self.error("newline", pos)
        return self.space(pos, True)

    def simple_rule(self, body: str) -> list[Element]:
        # The elements of a body `_SIMPLE_RULE` matched: its items in order. Its references are not marked in
        # `first_ref`: a name left without a rule sends the whole text to the general loop (see `parse`).
        symbol_ids = self.symbol_ids
        rule: list[Element] = []
        append = rule.append
        for name, literal, char_class in _ITEMS.findall(body):
            if name:
                append((_RULE_REF, symbol_ids.setdefault(name, len(symbol_ids))))
            elif literal:
                if len(literal) == 3 and literal[1] < "\x80":  # one ASCII char (no escape is that short)
                    append(_ASCII_ELEMENTS[ord(literal[1])])
                else:
                    rule += _literal_elements(literal)
            elif char_class:
                rule += (_kept_class if len(char_class) <= _KEPT_CLASS_CHARS else _class_elements)(char_class)
            else:
                append(_ALT)
        append(_END)
        return rule

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int) -> int:
        # llama.cpp's parse_alternates / parse_sequence recursion, run on an explicit stack of frames, in one
        # loop: a group opens a frame and its end closes it, without a call. Returns at the first char that
        # continues no sequence once the rule's own frame is closed.
        src = self.src
        symbol_ids = self.symbol_ids
        first_ref = self.first_ref
        frame = _Frame(rule_name, rule_id, nested=False, before=0)
        frames = [frame]
        rule = frame.rule
        nested = False
        reference, literal, char_class = _MATCHERS[nested]
        while True:
            c = src[pos]
            if c in _NAME_CHARS:  # rule reference
                name = reference(src, pos)
                assert name is not None  # it starts with a name char
                ref_rule_id = symbol_ids.setdefault(name.group(1), len(symbol_ids))
                if ref_rule_id not in first_ref:
                    first_ref[ref_rule_id] = pos
                frame.last = len(rule)
                frame.n_prev = 1
                rule.append((_RULE_REF, ref_rule_id))
                pos = name.end()
            elif c == '"':  # literal string
                frame.last = len(rule)
                frame.n_prev = 1
                if (plain := literal(src, pos)) is not None:  # no escapes: at once
                    rule.extend([(_CHAR, ord(char)) for char in plain.group(1)])
                    pos = plain.end()
                    continue
                pos += 1
                while src[pos] != '"':
                    if (run := _PLAIN.match(src, pos)) is not None:  # a run without escapes, at once
                        rule.extend([(_CHAR, ord(char)) for char in run.group()])
                        pos = run.end()
                        continue
                    if src[pos] == "\0":
                        raise self.error("end", pos)
                    char, pos = self.parse_char(pos)
                    rule.append((_CHAR, char))
                pos = self.space(pos + 1, nested)
            elif c == "|":  # another alternate
                rule.append(_ALT)
                pos = self.space(pos + 1, True)
                frame.last = len(rule)
                frame.n_prev = 1
            elif c == "[":  # char class
                if (whole := char_class(src, pos)) is not None:  # well-formed escapes: items at once
                    frame.last = len(rule)
                    frame.n_prev = 1
                    self.add_class(rule, _CHAR_NOT if whole.group(1) else _CHAR, whole.group(2))
                    pos = whole.end()
                    continue
                pos += 1
                start_type = _CHAR
                if src[pos] == "^":
                    pos += 1
                    start_type = _CHAR_NOT
                frame.last = last = len(rule)
                frame.n_prev = 1
                while (c := src[pos]) != "]":
                    if c == "\\":
                        char, pos = self.parse_char(pos)
                    elif c == "\0":
                        raise self.error("end", pos)
                    else:
                        char = ord(c)
                        pos += 1
                    rule.append((_CHAR_ALT if last < len(rule) else start_type, char))
                    if src[pos] == "-" and src[pos + 1] != "]":
                        if src[pos + 1] == "\0":
                            raise self.error("end", pos + 1)
                        char, pos = self.parse_char(pos + 1)
                        rule.append((_CHAR_RNG_UPPER, char))
                pos = self.space(pos + 1, nested)
            elif c in "<!":  # token
                kind = TOKEN
                if c == "!":
                    kind = TOKEN_NOT
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
            elif c == "(":  # a group: a generated rule, its frame open until its `)`
                if len(frames) > MAX_NESTING:
                    raise self.error("nesting", pos)
                pos = self.space(pos + 1, True)
                before = len(symbol_ids)
                frame = _Frame(frame.rule_name, self.generate_symbol_id(frame.rule_name), nested=True,
                               before=before)
                frames.append(frame)
                rule = frame.rule
                nested = True
                reference, literal, char_class = _MATCHERS[nested]
            else:  # the end of this frame's alternates
                rule.append(_END)
                self.add_rule(frame.rule_id, rule)
                frames.pop()
                if not frames:
                    return pos
                group = frame
                frame = frames[-1]
                rule = frame.rule
                nested = frame.nested
                reference, literal, char_class = _MATCHERS[nested]
                frame.n_prev = max(1, len(symbol_ids) - group.before)
                frame.last = len(rule)
                rule.append((_RULE_REF, group.rule_id))
                if src[pos] != ")":
                    raise self.error("group_close", pos)
                pos = self.space(pos + 1, nested)

    def space(self, pos: int, newline_ok: bool) -> int:
        # llama.cpp's parse_space: blanks and comments, and newlines where newline_ok.
        spaces = (_SPACE_NL if newline_ok else _SPACE).match(self.src, pos)
        assert spaces is not None  # the patterns match the empty string
        return spaces.end()

    @staticmethod
    def add_class(rule: list[Element], start_type: int, body: str) -> None:
        # The elements of a char class's items (each a char or a well-formed escape), as the char by char
        # loop makes them: a raw `-` between two items makes a range, an escaped one is a char.
        items = _CLASS_ITEMS.findall(body)
        count = len(items)
        kind = start_type
        i = 0
        while i < count:
            rule.append((kind, _code_point(items[i])))
            kind = _CHAR_ALT
            if i + 2 < count and items[i + 1] == "-":
                rule.append((_CHAR_RNG_UPPER, _code_point(items[i + 2])))
                i += 3
            else:
                i += 1

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
                rec_rule.append((_RULE_REF, ref))
            rec_rule += (_ALT, _END)
            self.add_rule(rec_rule_id, rec_rule)
            last_rec_rule_id = rec_rule_id
        if n_opt > 0:
            rule.append((_RULE_REF, last_rec_rule_id))
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
