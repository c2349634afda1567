# What a GBNF grammar is refused for, and where: the table of messages, the error they make, and the
# checks llama.cpp's `llama_grammar_init_impl` runs on a parsed grammar (after `parse` succeeded).
#
# Contract:
# - `ERRORS` holds every reason a grammar is refused with; the parser (grammar/gbnf.py), these checks and the
#   tests all read it. llama.cpp's messages are kept word for word, minus their " at <rest of the text>",
#   which becomes a 1-based line and column and an excerpt.
# - `check_grammar` refuses exactly what `llama_grammar_init_impl` refuses once parsing succeeded: no rules,
#   no root symbol, left recursion (llama_grammar_detect_left_recursion, with its notion of a rule that
#   "may be empty": one with an empty alternate). It also refuses malformed element vectors, which only a
#   hand-built `ParsedGrammar` can have (the parser's, `well_formed`, are not looked at again), with the
#   messages of llama.cpp's print_rule, and a root name
#   whose rule was dropped by a redefinition (`root ::= b` then `root ::= "a"`, root `b`), where llama.cpp
#   would read past its rules.
# - Linear time, no recursion: the left-recursion search is an iterative depth-first search that
#   finishes each rule once (llama.cpp re-explores rules, which can take exponential time; the answer,
#   the first rule index from which a left cycle is reachable, is the same).
# - `format_gbnf` writes the rules as llama.cpp's print_grammar does (a debugging dump, not GBNF).
# grammar/gbnf.py imports this module: it reads the element kinds from grammar/elements.py, not from gbnf.
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

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
)
from constraintd.errors import GrammarError

if TYPE_CHECKING:
    from constraintd.engine.grammar.gbnf import ParsedGrammar

__all__ = [
    "ERRORS",
    "MAX_NESTING",
    "MAX_REPEATED_ELEMENTS",
    "MAX_REPETITION_THRESHOLD",
    "check_grammar",
    "check_left_recursion",
    "first_cycle",
    "format_gbnf",
    "grammar_error",
]

# llama.cpp's limit on repetitions (`MAX_REPETITION_THRESHOLD` in llama-grammar.cpp).
MAX_REPETITION_THRESHOLD: Final = 2000
# Ours: deeper nesting of groups is refused (llama.cpp recurses on its C stack until it overflows).
MAX_NESTING: Final = 1000
# Ours: elements copied by repetitions, summed over a grammar (llama.cpp copies until memory runs out).
MAX_REPEATED_ELEMENTS: Final = 1 << 22

# Every reason a GBNF text is refused with (str.format templates). Tests reuse this table.
ERRORS: Final[Mapping[str, str]] = {
    # llama_grammar_parser::parse and its helpers
    "hex": "expecting {size} hex chars",
    "name": "expecting name",
    "integer": "expecting integer",
    "escape": "unknown escape",
    "end": "unexpected end of input",
    "token_open": "expecting '<'",
    "token_id_too_big": "parsed token id is too big",
    "token_id_range": "stoul",  # std::stoul's out_of_range: a number past 64 bits
    "token_bracket": "expecting ']'",
    "token_close": "expecting '>'",
    "no_vocab": "no vocab to parse token",
    "invalid_token": "invalid token '{text}'",
    "repeat_what": "expecting preceding item to */+/?/{{",
    "repeat_rules": "number of rules that are going to be repeated multiplied by the new repetition exceeds "
    "sane defaults, please reduce the number of repetitions or rule complexity",
    "group_close": "expecting ')'",
    "repeat_int": "expecting an int",
    "repeat_close": "expecting '}}'",
    "repeat_comma": "expecting ','",
    "repeat_range": "stoull",  # std::stoull's out_of_range: a number past 64 bits
    "repeat_many": "number of repetitions exceeds sane defaults, please reduce the number of repetitions",
    "assign": "expecting ::=",
    "newline": "expecting newline or end",
    "undefined": "Undefined rule",
    "undefined_name": "Undefined rule identifier '{name}'",
    # llama_grammar_init_impl ("failed to parse grammar" is all llama.cpp says for an empty grammar)
    "no_rules": "failed to parse grammar: the grammar has no rules",
    "no_root": "grammar does not contain a '{root}' symbol",
    "left_recursion": "unsupported grammar, left recursion detected for nonterminal at index {index}",
    "bad_reference": "invalid grammar: rule {rule} references undefined rule {ref}",
    # llama.cpp's print_rule, for element vectors no parse produces
    "malformed": "malformed rule, does not end with LLAMA_GRETYPE_END: {rule}",
    "end_inside": "unexpected end of rule: {rule},{index}",
    "char_modifier": "LLAMA_GRETYPE_{kind} without preceding char: {rule},{index}",
    "unknown_element": "unknown element type {kind}: {rule},{index}",  # ours
    # ours, where llama.cpp never returns (it loops or overflows)
    "repeat_reversed": "repetition {{{min},{max}}} has its maximum below its minimum",
    "nesting": f"groups nested deeper than {MAX_NESTING} levels",
    "too_large": f"repetitions would copy more than {MAX_REPEATED_ELEMENTS} grammar elements",
}

_END_OF_SEQUENCE: Final = frozenset((END, ALT))
_CHAR_ELEMENTS: Final = frozenset((CHAR, CHAR_NOT, CHAR_ALT, CHAR_RNG_UPPER, CHAR_ANY))
_CHAR_MODIFIERS: Final = {CHAR_RNG_UPPER: "CHAR_RNG_UPPER", CHAR_ALT: "CHAR_ALT"}
_LINE_BREAK: Final = re.compile(r"\r\n?|\n")
_EXCERPT_REACH: Final = 30  # characters of context on each side of an error


def grammar_error(key: str, source: str = "", pos: int = -1, /, **fields: object) -> GrammarError:
    """The `GrammarError` with reason `ERRORS[key]`, at character offset `pos` of `source` (-1: no spot).

    Lines end at "\\n", "\\r\\n" or a lone "\\r", as llama.cpp ends rules; the excerpt is the part of that
    line around the spot.
    """
    reason = ERRORS[key].format(**fields)
    if pos < 0:
        return GrammarError(reason)
    line, line_start = 1, 0
    for line_break in _LINE_BREAK.finditer(source, 0, pos):
        line += 1
        line_start = line_break.end()
    line_end = _LINE_BREAK.search(source, pos)
    end = line_end.start() if line_end else len(source)
    excerpt = source[max(line_start, pos - _EXCERPT_REACH) : min(end, pos + _EXCERPT_REACH)]
    return GrammarError(reason, line=line, column=pos - line_start + 1, excerpt=excerpt)


def check_grammar(parsed: ParsedGrammar, root: str = "root", *, left_recursion: bool = True) -> int:
    """Run llama.cpp's `llama_grammar_init_impl` checks on a parsed grammar.

    Args:
        parsed: the output of `parse_gbnf` (or a hand-built grammar of the same shape).
        root: the name of the start rule.
        left_recursion: whether to look for left recursion too; False where `Rules(parsed)` is built next,
            which makes llama.cpp's check where its own finds a left cycle (grammar/stacks.py).

    Returns:
        The id of the root rule.

    Raises:
        GrammarError: no rules, no `root` symbol, a reference to an undefined rule, a malformed rule, or
            left recursion (reason names the first rule index from which it is reachable, as llama.cpp).
    """
    rules = parsed.rules
    if not rules:
        raise grammar_error("no_rules")
    if root not in parsed.symbol_ids or parsed.symbol_ids[root] >= len(rules):
        raise grammar_error("no_root", root=root)
    if not parsed.well_formed:  # the parser's own output needs no second look
        _check_shape(rules)
    if left_recursion:
        check_left_recursion(rules)
    return parsed.symbol_ids[root]


def check_left_recursion(rules: Sequence[Sequence[tuple[int, int]]]) -> None:
    """llama.cpp's left-recursion check alone (`llama_grammar_detect_left_recursion`, from each rule).

    Raises:
        GrammarError: left recursion, with the first rule index from which it is reachable.
    """
    index = _left_recursive_rule(rules)
    if index is not None:
        raise grammar_error("left_recursion", index=index)


def _check_shape(rules: Sequence[Sequence[tuple[int, int]]]) -> None:
    # What llama.cpp's element-vector init and print_rule check; a parsed grammar always passes.
    for rule_id, rule in enumerate(rules):
        if not rule or rule[-1][0] != END:
            raise grammar_error("malformed", rule=rule_id)
        previous = END
        for index, (kind, value) in enumerate(rule):
            if kind not in _ELEMENT_TEXT and kind != END:
                raise grammar_error("unknown_element", kind=kind, rule=rule_id, index=index)
            if kind == END and index != len(rule) - 1:
                raise grammar_error("end_inside", rule=rule_id, index=index)
            if kind in _CHAR_MODIFIERS and previous not in _CHAR_ELEMENTS:
                raise grammar_error("char_modifier", kind=_CHAR_MODIFIERS[kind], rule=rule_id, index=index)
            if kind == RULE_REF and not 0 <= value < len(rules):
                raise grammar_error("bad_reference", rule=rule_id, ref=value)
            previous = kind


def _left_recursive_rule(rules: Sequence[Sequence[tuple[int, int]]]) -> int | None:
    # llama_grammar_detect_left_recursion, run from each rule in index order. A rule "may be empty" when
    # one of its alternates is empty (llama.cpp looks no further); a reference is leftmost when every
    # reference before it in its alternate names a rule that may be empty.
    may_be_empty = [False] * len(rules)
    for rule_id, rule in enumerate(rules):
        at_rule_start = True
        for kind, _ in rule:
            if kind in _END_OF_SEQUENCE:
                if at_rule_start:
                    may_be_empty[rule_id] = True
                    break
                at_rule_start = True
            else:
                at_rule_start = False
    leftmost: list[list[int]] = []
    for rule in rules:
        refs: list[int] = []
        recurse = True
        for kind, value in rule:
            if kind == RULE_REF and recurse:
                refs.append(value)
                recurse = may_be_empty[value]
            else:
                recurse = kind in _END_OF_SEQUENCE
        leftmost.append(refs)
    return first_cycle(leftmost)


def first_cycle(edges: Sequence[Sequence[int]]) -> int | None:
    """The first node, in index order, from which a cycle of `edges` (node -> the nodes it leads to) is
    reachable, or None: an iterative depth-first search that finishes each node once."""
    new, in_progress, done = 0, 1, 2
    state = [new] * len(edges)
    for start in range(len(edges)):
        if state[start] == done:
            continue
        state[start] = in_progress
        path = [(start, iter(edges[start]))]
        while path:
            node, left = path[-1]
            target = next(left, None)
            if target is None:
                state[node] = done
                path.pop()
            elif state[target] == in_progress:
                return start
            elif state[target] == new:
                state[target] = in_progress
                path.append((target, iter(edges[target])))
    return None


def _print_char(code_point: int) -> str:
    return chr(code_point) if 0x20 <= code_point <= 0x7F else f"<U+{code_point:04X}>"


def format_gbnf(parsed: ParsedGrammar) -> str:
    """The rules as llama.cpp's `print_grammar` writes them (one line per rule; not meant to be re-parsed).

    Raises:
        GrammarError: a malformed rule (only a hand-built grammar has one).
    """
    _check_shape(parsed.rules)
    names: dict[int, str] = {}
    for name in sorted(parsed.symbol_ids):  # std::map order; a later name for the same id wins
        names[parsed.symbol_ids[name]] = name
    lines = []
    for rule_id, rule in enumerate(parsed.rules):
        out = [f"{names.get(rule_id, rule_id)} ::= "]
        for index in range(len(rule) - 1):
            kind, value = rule[index]
            out.append(_ELEMENT_TEXT[kind](value, names))
            if kind in _CHAR_ELEMENTS and rule[index + 1][0] not in (CHAR_ALT, CHAR_RNG_UPPER, CHAR_ANY):
                out.append("] ")
        lines.append("".join(out))
    return "".join(f"{line}\n" for line in lines)


_ELEMENT_TEXT: Final[Mapping[int, Callable[[int, Mapping[int, str]], str]]] = {
    ALT: lambda value, names: "| ",
    RULE_REF: lambda value, names: f"{names.get(value, value)} ",
    CHAR: lambda value, names: f"[{_print_char(value)}",
    CHAR_NOT: lambda value, names: f"[^{_print_char(value)}",
    CHAR_RNG_UPPER: lambda value, names: f"-{_print_char(value)}",
    CHAR_ALT: lambda value, names: _print_char(value),
    CHAR_ANY: lambda value, names: ".",
    TOKEN: lambda value, names: f"<[{value}]> ",
    TOKEN_NOT: lambda value, names: f"!<[{value}]> ",
}
