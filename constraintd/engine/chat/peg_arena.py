# llama.cpp's PEG parser arena as far as its GBNF goes (common/peg-parser.cpp: common_peg_parser_builder and
# common_peg_arena::build_grammar; chat-peg-parser.cpp's tags and permute): a hand-written chat format builds
# its parser here, with the same calls in the same order as llama.cpp, and the arena writes the same grammar.
#
# Contract:
# - Every builder call adds its parsers to the arena exactly as llama.cpp's does (a rule built by a function:
#   a placeholder, the rule, its body, the rule again, then a reference; a rule of a parser: the rule, then a
#   reference; sequences and choices flatten their nested sequences and choices), so a parser's number is
#   llama.cpp's: the `until-N` and `ac-N` rules are named by it. Handles are plain ints, and a caller makes
#   the parsers of an expression in the order the compiler llama.cpp is built with evaluates it (the right
#   operand of `+` and `|` first, the left one of `<<` first).
# - `build_grammar` is common_peg_arena::build_grammar: the rules reachable from the root (or, lazy, from the
#   trigger rules, the root then their names sorted and joined by " | "), each written by the arena's GBNF
#   writer into the caller's grammar (its add_rule, add_schema and the excluding / including automaton
#   grammars, which chat_params.py writes). Lookaheads write nothing; a sequence or choice inside a sequence
#   or repetition, and a choice inside a choice, is put in parentheses.
# - Not here: parsing text with the arena (peg_parse.py runs it, through the read-only views below), and
#   the raw schema parsers whose string values the child parses (schema_delegates with `raw`).
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from constraintd.engine.chat.params.json_tool_grammar import JSON_STRING_CONTENT, rule_name
from constraintd.engine.schema.rules import format_literal, to_bytes

__all__ = ["MAX_PERMUTE", "AcGrammar", "PegArena"]

MAX_PERMUTE: Final = 6  # COMMON_CHAT_MAX_PERMUTE: more parsers than this are a sequence

AcGrammar = Callable[[str, Sequence[str], bool], str]
"""(rule prefix, strings, including) -> the start rule of gbnf_including_grammar (including) or
gbnf_excluding_grammar, its rules added to the grammar being built."""


@dataclass(slots=True)
class _Parser:
    kind: str
    children: list[int] = field(default_factory=list)
    text: str = ""  # a literal, a char class, a rule's, schema's or tag's name, a gbnf parser's grammar
    min_count: int = 0
    max_count: int = -1
    delimiters: tuple[str, ...] = ()
    schema: Any = None
    trigger: bool = False

    @property
    def child(self) -> int:
        return self.children[0]


# parsers whose GBNF is their one child's (the tags and atomics) when deciding on parentheses
_TRANSPARENT = ("tag", "atomic")
_GROUPS = ("choice", "sequence")  # put in parentheses inside a sequence or a repetition


class PegArena:
    """A common_peg_arena being built by common_chat_peg_builder's calls, then written as GBNF."""

    __slots__ = ("_parsers", "_rules", "root")

    def __init__(self) -> None:
        self._parsers: list[_Parser] = []
        self._rules: dict[str, int] = {}
        self.root = -1

    def to_data(self) -> dict[str, Any]:
        """The arena as JSON data (`from_data` reads it back): a parser is data, so the request's parser
        travels with its settings (chat_format.py) to whoever reads the generated text."""
        return {
            "root": self.root, "rules": dict(self._rules),
            "parsers": [[held.kind, held.children, held.text, held.min_count, held.max_count,
                         list(held.delimiters), held.schema, held.trigger] for held in self._parsers],
        }

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> PegArena:
        """The arena `to_data` wrote.

        Raises:
            ValueError: not such data (a field missing or of the wrong type, a child or rule out of range).
        """
        arena = cls()
        try:
            for kind, children, text, low, high, delimiters, schema, trigger in data["parsers"]:
                if not (isinstance(kind, str) and isinstance(text, str) and isinstance(low, int)
                        and isinstance(high, int) and isinstance(trigger, bool)
                        and all(isinstance(child, int) for child in children)
                        and all(isinstance(delimiter, str) for delimiter in delimiters)):
                    raise TypeError(f"a parser of the wrong shape: {kind!r}")
                arena._add(_Parser(kind, list(children), text, low, high, tuple(delimiters), schema, trigger))
            count = len(arena._parsers)
            arena._rules = {str(name): int(at) for name, at in data["rules"].items()}
            arena.root = int(data["root"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a PEG arena: {type(exc).__name__}: {exc}") from None
        held = [child for parser in arena._parsers for child in parser.children]
        if any(not 0 <= at < count for at in (*held, *arena._rules.values())) or not -1 <= arena.root < count:
            raise ValueError("not a PEG arena: a parser out of range")
        return arena

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PegArena):
            return NotImplemented
        return self.to_data() == other.to_data()

    __hash__ = None  # type: ignore[assignment]  # built call by call: no hash

    def _add(self, parser: _Parser) -> int:
        self._parsers.append(parser)
        return len(self._parsers) - 1

    # -- common_peg_parser_builder's primitives
    def eps(self) -> int:
        return self._add(_Parser("eps"))

    def end(self) -> int:
        """common_peg_parser_builder::end(): the end of the text, which the grammar writes as nothing (an
        epsilon), one parser of the arena like llama.cpp's."""
        return self._add(_Parser("end"))

    def literal(self, text: str) -> int:
        return self._add(_Parser("literal", text=text))

    def space(self) -> int:
        return self._add(_Parser("space"))

    def any(self) -> int:
        return self._add(_Parser("any"))

    def chars(self, pattern: str, min_count: int = 1, max_count: int = -1) -> int:
        return self._add(_Parser("chars", text=pattern, min_count=min_count, max_count=max_count))

    def string_content(self, delimiter: str = '"') -> int:
        """string_content(delimiter): a string's characters up to `delimiter`, JSON's escapes and the
        delimiter's; a double quote's is JSON's own string content."""
        if delimiter == '"':
            return self._add(_Parser("string"))
        gbnf = f'( [^{delimiter}\\\\] | "\\\\" ( [{delimiter}\\\\/ bfnrt] | "u" [0-9a-fA-F]{{4}} ) )*'
        return self._add(_Parser("gbnf", text=gbnf))

    def until_one_of(self, delimiters: Sequence[str]) -> int:
        return self._add(_Parser("until", delimiters=tuple(delimiters)))

    def until(self, delimiter: str) -> int:
        return self.until_one_of([delimiter])

    def rest(self) -> int:
        return self.until_one_of([])

    def sequence(self, *parsers: int) -> int:
        return self._add(_Parser("sequence", self._flatten("sequence", parsers)))

    def choice(self, *parsers: int) -> int:
        return self._add(_Parser("choice", self._flatten("choice", parsers)))

    def _flatten(self, kind: str, parsers: Sequence[int]) -> list[int]:
        flat: list[int] = []
        for parser in parsers:
            held = self._parsers[parser]
            flat.extend(held.children if held.kind == kind else [parser])
        return flat

    def repeat(self, parser: int, min_count: int, max_count: int) -> int:
        return self._add(_Parser("repeat", [parser], min_count=min_count, max_count=max_count))

    def optional(self, parser: int) -> int:
        return self.repeat(parser, 0, 1)

    def zero_or_more(self, parser: int) -> int:
        return self.repeat(parser, 0, -1)

    def peek(self, parser: int) -> int:
        return self._add(_Parser("and", [parser]))

    def negate(self, parser: int) -> int:
        return self._add(_Parser("not", [parser]))

    def atomic(self, parser: int) -> int:
        return self._add(_Parser("atomic", [parser]))

    def tag(self, parser: int, name: str = "") -> int:
        """tag(name, parser): the parser, its match named for the parse; the grammar is the parser's alone.

        `name` is spelled as common_chat_peg_builder's tag constants are, hyphenated ("reasoning",
        "content", "tool", "tool-open", "tool-arg-string-value", ..., and the minimax-m3 mapper's
        "tool-arg-object"): the name of the builder call a format ports, so p.tool_open(x) is
        `atomic(tag(x, "tool-open"))` and p.tool_arg_json_value(x) is `tag(x, "tool-arg-value")`. The name
        is optional only for parsers made outside the formats (a tag without one is named ""); it does not
        change the grammar.
        """
        return self._add(_Parser("tag", [parser], text=name))

    def gbnf(self, parser: int, grammar: str) -> int:
        return self._add(_Parser("gbnf", [parser], text=grammar))

    def ac(self, parser: int, delimiters: Sequence[str]) -> int:
        return self._add(_Parser("ac", [parser], delimiters=tuple(delimiters)))

    def schema(self, parser: int, name: str, schema: Mapping[str, Any]) -> int:
        return self._add(_Parser("schema", [parser], text=name, schema=schema))

    def ref(self, name: str) -> int:
        return self._add(_Parser("ref", text=name))

    def rule(self, name: str, parser: int, *, trigger: bool = False) -> int:
        clean = rule_name(name)
        self._rules[clean] = self._add(_Parser("rule", [parser], text=clean, trigger=trigger))
        return self.ref(clean)

    def trigger_rule(self, name: str, parser: int) -> int:
        return self.rule(name, parser, trigger=True)

    def rule_of(self, name: str, build: Callable[[], int]) -> int:
        """rule(name, builder_fn): a reference alone where the rule is made already."""
        clean = rule_name(name)
        if clean in self._rules:
            return self.ref(clean)
        placeholder = self.any()
        self._rules[clean] = self._add(_Parser("rule", [placeholder], text=clean))
        body = build()
        self._rules[clean] = self._add(_Parser("rule", [body], text=clean))
        return self.ref(clean)

    def permute(self, prefix: str, parsers: Sequence[int]) -> int:
        """common_chat_peg_builder::permute: the parsers in any order, a rule `<prefix>-<set>` per set of
        those still to come (a sequence where there is one, or more than llama.cpp permutes)."""
        if not parsers:
            return self.eps()
        if len(parsers) == 1 or len(parsers) > MAX_PERMUTE:
            return self.sequence(*parsers)
        rules: dict[int, int] = {}

        def remaining_of(remaining: int) -> int:
            if remaining == 0:
                return self.eps()
            if remaining in rules:
                return rules[remaining]
            alternatives = self.choice()
            for at, parser in enumerate(parsers):
                bit = 1 << at
                if remaining & bit:
                    rest = remaining_of(remaining & ~bit)
                    alternatives = self.choice(alternatives, self.sequence(parser, rest))
            rules[remaining] = self.rule(f"{prefix}-{remaining}", alternatives)
            return rules[remaining]

        return remaining_of((1 << len(parsers)) - 1)

    # -- the JSON value parsers (peg-parser.cpp json() and its parts)
    def json(self) -> int:
        return self.rule_of("json-value", lambda: self.choice(
            self.json_object(), self.json_array(), self.json_string(), self.json_number(), self.json_bool(),
            self.json_null()))

    def json_string(self) -> int:
        return self.rule_of("json-string", lambda: self.sequence(
            self.literal('"'), self.string_content(), self.literal('"')))

    def json_number(self) -> int:
        def build() -> int:
            digit1_9 = self.chars("[1-9]", 1, 1)
            digits = self.chars("[0-9]")
            int_part = self.choice(self.literal("0"), self.sequence(digit1_9, self.chars("[0-9]", 0, -1)))
            frac = self.sequence(self.literal("."), digits)
            exp = self.sequence(self.choice(self.literal("e"), self.literal("E")),
                                self.optional(self.chars("[+-]", 1, 1)), digits)
            not_continued = self.negate(self.chars("[0-9.eE+-]", 1, 1))
            return self.sequence(self.optional(self.literal("-")), int_part, self.optional(frac),
                                 self.optional(exp), not_continued)
        return self.rule_of("json-number", build)

    def json_bool(self) -> int:
        return self.rule_of("json-bool", lambda: self.choice(self.literal("true"), self.literal("false")))

    def json_null(self) -> int:
        return self.rule_of("json-null", lambda: self.literal("null"))

    def _json_container(self, name: str, open_: str, close: str, items: Callable[[int], int]) -> int:
        def build() -> int:
            ws = self.space()
            inner = items(ws)
            return self.sequence(self.literal(open_), ws, self.choice(
                self.literal(close), self.sequence(inner, ws, self.literal(close))))
        return self.rule_of(name, build)

    def json_object(self) -> int:
        def members(ws: int) -> int:
            member = self.sequence(self.json_string(), ws, self.literal(":"), ws, self.json())
            return self.sequence(member, self.zero_or_more(self.sequence(ws, self.literal(","), ws, member)))
        return self._json_container("json-object", "{", "}", members)

    def json_array(self) -> int:
        def elements(ws: int) -> int:
            return self.sequence(self.json(), self.zero_or_more(
                self.sequence(ws, self.literal(","), ws, self.json())))
        return self._json_container("json-array", "[", "]", elements)

    # -- read-only views for the parse (chat/parsing/peg_parse.py): a parser's kind and parts, a rule's parser
    def kind(self, parser: int) -> str:
        """The parser's kind ("literal", "sequence", "tag", "until", "end", ...)."""
        return self._parsers[parser].kind

    def children(self, parser: int) -> tuple[int, ...]:
        return tuple(self._parsers[parser].children)

    def text(self, parser: int) -> str:
        """A literal's text, a char class, a rule's, reference's, schema's or tag's name, a gbnf parser's
        grammar."""
        return self._parsers[parser].text

    def tag_name(self, parser: int) -> str:
        """A tag's name, as llama.cpp's builder gives it ("tool-open"); "" for a tag made without one.

        Raises:
            ValueError: the parser is not a tag.
        """
        held = self._parsers[parser]
        if held.kind != "tag":
            raise ValueError(f"parser {parser} is a {held.kind}, not a tag")
        return held.text

    def counts(self, parser: int) -> tuple[int, int]:
        """A repetition's or char class's (min, max); max -1 for no bound."""
        held = self._parsers[parser]
        return held.min_count, held.max_count

    def delimiters(self, parser: int) -> tuple[str, ...]:
        return self._parsers[parser].delimiters

    def rule_parser(self, name: str) -> int:
        """The rule parser a reference by this name stands for.

        Raises:
            KeyError: no rule of that name.
        """
        return self._rules[name]

    def __len__(self) -> int:
        return len(self._parsers)

    # -- the arena's GBNF writer
    def _resolved(self, parser: int) -> int:
        # resolve_refs: a reference stands for its rule as the rule is once the arena is built
        held = self._parsers[parser]
        return self._rules[held.text] if held.kind == "ref" else parser

    def _is(self, parser: int, kinds: tuple[str, ...]) -> bool:
        # whether the parser, under its tags and atomics, is one of these kinds (effective_parser)
        held = self._parsers[self._resolved(parser)]
        while held.kind in _TRANSPARENT:
            held = self._parsers[self._resolved(held.child)]
        return held.kind in kinds

    def build_grammar(self, add_rule: Callable[[str, str], str], add_schema: Callable[[str, Any], str],
                      ac_grammar: AcGrammar, *, lazy: bool) -> None:
        """common_peg_arena::build_grammar into the caller's grammar (see the module's contract)."""
        writer = _Writer(self, add_schema, ac_grammar)
        triggers = sorted(name for name, at in self._rules.items() if self._parsers[at].trigger)
        reachable: set[str] = set()
        for start in ([self._rules[name] for name in triggers] if lazy else [self.root]):
            self._reach(start, reachable)
        for name, at in self._rules.items():
            if name in reachable:
                add_rule(name, writer.write(self._parsers[at].child))
        if lazy:
            add_rule("root", " | ".join(triggers))
        elif self.root >= 0:
            add_rule("root", writer.write(self.root))

    def _reach(self, parser: int, reachable: set[str]) -> None:
        # collect_reachable_rules: every rule a parser reaches, through the lookaheads and gbnf parsers too
        parser = self._resolved(parser)
        held = self._parsers[parser]
        if held.kind == "rule":
            if held.text in reachable:
                return
            reachable.add(held.text)
        for child in held.children:
            self._reach(child, reachable)


@dataclass(frozen=True, slots=True)
class _Writer:
    """The arena's to_gbnf: a parser's GBNF text, by its kind (_WRITERS)."""

    arena: PegArena
    add_schema: Callable[[str, Any], str]
    ac_grammar: AcGrammar

    def write(self, parser: int) -> str:
        parser = self.arena._resolved(parser)
        held = self.arena._parsers[parser]
        return _WRITERS[held.kind](self, parser, held)

    def sequence(self, _: int, held: _Parser) -> str:
        parts = []
        for child in held.children:
            text = self.write(child)
            if text:
                parts.append(f"({text})" if self.arena._is(child, _GROUPS) else text)
        return " ".join(parts)

    def choice(self, _: int, held: _Parser) -> str:
        return " | ".join(
            f"({self.write(child)})" if self.arena._is(child, ("choice",)) else self.write(child)
            for child in held.children)

    def repeat(self, _: int, held: _Parser) -> str:
        text = self.write(held.child)
        if self.arena._is(held.child, _GROUPS):
            text = f"({text})"
        return text + _repetition(held.min_count, held.max_count)

    def until(self, parser: int, held: _Parser) -> str:
        return self.ac_grammar(f"until-{parser}", held.delimiters, False) if held.delimiters else ".*"


_WRITERS: dict[str, Callable[[_Writer, int, _Parser], str]] = {
    "eps": lambda w, at, p: "",
    "end": lambda w, at, p: "",
    "and": lambda w, at, p: "",  # lookaheads have no GBNF
    "not": lambda w, at, p: "",
    "literal": lambda w, at, p: format_literal(to_bytes(p.text)),
    "sequence": _Writer.sequence,
    "choice": _Writer.choice,
    "repeat": _Writer.repeat,
    "chars": lambda w, at, p: p.text + _repetition(p.min_count, p.max_count),
    "any": lambda w, at, p: ".",
    "space": lambda w, at, p: "space",
    "string": lambda w, at, p: JSON_STRING_CONTENT,
    "until": _Writer.until,
    "ac": lambda w, at, p: w.ac_grammar(f"ac-{at}", p.delimiters, True),
    "schema": lambda w, at, p: w.add_schema(p.text, p.schema),
    "rule": lambda w, at, p: p.text,
    "gbnf": lambda w, at, p: p.text,
    "tag": lambda w, at, p: w.write(p.child),
    "atomic": lambda w, at, p: w.write(p.child),
}


def _repetition(min_count: int, max_count: int) -> str:
    if max_count == -1:
        return {0: "*", 1: "+"}.get(min_count, f"{{{min_count},}}")
    if min_count == 0 and max_count == 1:
        return "?"
    if min_count == max_count:
        return "" if min_count == 1 else f"{{{min_count}}}"
    return f"{{{min_count},{max_count}}}"
