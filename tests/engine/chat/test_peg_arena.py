"""constraintd.engine.chat.peg_arena: llama.cpp's PEG arena, as far as the GBNF it writes.

The hand-written formats' oracle tests (formats/test_*.py) compare whole grammars with llama.cpp's; these
hold the writer's parts: the arena's numbering (which names the `until-N` and `ac-N` rules), the JSON value
rules, parentheses, repetitions, and which rules a lazy or non-lazy grammar writes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine.chat import formats
from constraintd.engine.chat.params.chat_params import _JSON_RULES
from constraintd.engine.chat.params.json_tool_grammar import (
    JSON_STRING_CONTENT,
    JSON_VALUE_AGAIN,
    JSON_VALUE_FIRST,
)
from constraintd.engine.chat.peg_arena import PegArena
from tests.chat_oracle.cases import RESPONSE_SCHEMA, SEARCH_TOOL, WEATHER_TOOL


def _rules(arena: PegArena, *, lazy: bool = False) -> dict[str, str]:
    rules: dict[str, str] = {}

    def add_rule(name: str, rule: str) -> str:
        rules[name] = rule
        return name

    def add_schema(name: str, schema: Any) -> str:
        rules[name] = f"<schema {sorted(schema)}>"
        return name

    def ac_grammar(prefix: str, strings: Any, including: bool) -> str:
        rules[prefix] = f"<{'including' if including else 'excluding'} {list(strings)}>"
        return prefix

    arena.build_grammar(add_rule, add_schema, ac_grammar, lazy=lazy)
    return rules


def test_json_is_llama_cpps_parsers_and_rules() -> None:
    arena = PegArena()
    arena.root = arena.json()
    assert len(arena._parsers) == JSON_VALUE_FIRST
    arena.json()
    assert len(arena._parsers) == JSON_VALUE_FIRST + JSON_VALUE_AGAIN  # a reference to the rule made
    assert _rules(arena) == {**_JSON_RULES, "root": "json-value"}


def test_until_and_ac_rules_are_named_by_their_parsers_number() -> None:
    arena = PegArena()
    first = arena.literal("a")
    until = arena.until("</p>")
    rest = arena.rest()
    ac = arena.ac(arena.literal("ignored"), ["x", "y"])
    arena.root = arena.sequence(first, until, rest, ac)
    rules = _rules(arena)
    assert rules["root"] == '"a" until-1 .* ac-4'
    assert rules["until-1"] == "<excluding ['</p>']>"
    assert rules["ac-4"] == "<including ['x', 'y']>"


def test_sequences_and_choices_flatten_and_group_as_llama_cpps_writer() -> None:
    arena = PegArena()
    a, b, c = arena.literal("a"), arena.literal("b"), arena.literal("c")
    inner = arena.sequence(a, b)
    flat = arena.sequence(inner, c)  # a nested sequence is flattened
    assert arena._parsers[flat].children == [a, b, c]
    either = arena.choice(a, b)
    tagged = arena.tag(either, "content")
    grouped = arena.sequence(c, tagged, arena.optional(arena.sequence(a, b)), arena.peek(a))
    arena.root = arena.choice(grouped, arena.atomic(arena.choice(a, c)), arena.eps())
    # the choice under a tag and the repeated sequence in parentheses, the lookahead written as nothing,
    # a choice under an atomic inside a choice in parentheses, an empty alternative left as it is
    assert _rules(arena)["root"] == '"c" ("a" | "b") ("a" "b")? | ("a" | "c") | '


@pytest.mark.parametrize(("low", "high", "suffix"), [
    (0, 1, "?"), (0, -1, "*"), (1, -1, "+"), (2, -1, "{2,}"), (1, 1, ""), (3, 3, "{3}"), (1, 4, "{1,4}")])
def test_repetitions_are_written_as_llama_cpps(low: int, high: int, suffix: str) -> None:
    arena = PegArena()
    arena.root = arena.sequence(arena.repeat(arena.literal("x"), low, high), arena.chars("[a-z]", low, high))
    assert _rules(arena)["root"] == f'"x"{suffix} [a-z]{suffix}'


def _two_rules(arena: PegArena) -> None:
    used = arena.rule("used", arena.literal("u"))
    arena.rule("unused", arena.literal("n"))
    arena.trigger_rule("call", arena.sequence(arena.literal("<call>"), used))
    arena.root = arena.sequence(arena.literal("p"), arena.rule("body", arena.literal("b")))


def test_a_lazy_grammar_writes_the_trigger_rules_and_what_they_reach() -> None:
    arena = PegArena()
    _two_rules(arena)
    assert _rules(arena, lazy=True) == {"used": '"u"', "call": '"<call>" used', "root": "call"}


def test_a_grammar_writes_what_its_root_reaches() -> None:
    arena = PegArena()
    _two_rules(arena)
    assert _rules(arena) == {"body": '"b"', "root": '"p" body'}


def test_a_rule_built_by_a_function_is_made_once_with_a_placeholder() -> None:
    arena = PegArena()
    made = arena.rule_of("r", lambda: arena.literal("x"))
    assert len(arena._parsers) == 5  # the placeholder, its rule, the body, the rule, the reference
    again = arena.rule_of("r", lambda: arena.literal("y"))
    assert len(arena._parsers) == 6 and arena._parsers[again].text == arena._parsers[made].text == "r"
    arena.root = again
    assert _rules(arena) == {"r": '"x"', "root": "r"}


def test_rule_names_are_cleaned_as_llama_cpps() -> None:
    arena = PegArena()
    arena.root = arena.rule("tool-get_weather.v2", arena.literal("x"))
    assert _rules(arena) == {"tool-get-weather-v2": '"x"', "root": "tool-get-weather-v2"}


def test_string_content_of_a_delimiter_is_the_arenas_with_that_quote() -> None:
    arena = PegArena()
    assert [arena.string_content('"'), arena.string_content("'")] == [0, 1]  # one parser each
    arena.root = arena.sequence(0, 1)
    rules: dict[str, str] = {}
    arena.build_grammar(lambda name, rule: rules.setdefault(name, rule), lambda name, schema: name,
                        lambda prefix, strings, including: prefix, lazy=False)
    single = r"""( [^'\\] | "\\" ( ['\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )*"""
    assert rules["root"] == JSON_STRING_CONTENT + " " + single


def test_a_tag_keeps_its_name_and_writes_its_parser_alone() -> None:
    arena = PegArena()
    name = arena.tag(arena.literal("get_weather"), "tool-name")
    opened = arena.tag(arena.sequence(arena.literal("<f="), arena.atomic(name)), "tool-open")
    arena.root = opened
    assert [arena.tag_name(name), arena.tag_name(opened)] == ["tool-name", "tool-open"]
    assert arena.kind(opened) == "tag" and arena.children(opened) == (opened - 1,)
    assert _rules(arena)["root"] == '"<f=" "get_weather"'  # the names write nothing
    with pytest.raises(ValueError, match="not a tag"):
        arena.tag_name(arena.root - 1)


# every hand-written format with a template source that reaches its reasoning and its tool calls
_COUNT_TOOL = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "required": ["n", "items", "when"], "properties": {
        "n": {"type": "integer"}, "items": {"type": "array", "items": {"type": "string"}},
        "when": {"type": "object", "properties": {"day": {"type": "string"}}},
        "flag": {"type": ["boolean", "string"]}}}}}
_FORMATS: dict[str, str] = {
    "cohere2moe": "<|START_TEXT|><|START_ACTION|>",
    "deepseek_v3_2": "dsml_token DSML function_calls",
    "functionary_v3_2": ">>>all >>>${recipient}",
    "gemma4": "",
    "gigachat_v3": "<|role_sep|> <|message_sep|> <|function_call|>",
    "gpt_oss": "<|channel|>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>",
    "kimi_k3": "<|open|><|close|><|end_of_msg|>",
    "lfm2": "List of tools: [<think>",
    "ling3": "",
    "minicpm5": "",
    "minimax_m3": "]<]minimax[>[ <tool_call> <invoke name=",
    "ministral3": "",
    "muse_glimmer": "<atem:function_calls><|eom|>",
    "qwen3_coder": "<tool_call><function=<parameter=<think>",
}
_REQUESTS: tuple[dict[str, Any], ...] = (
    {"tools": [WEATHER_TOOL, SEARCH_TOOL, _COUNT_TOOL], "parallel_tool_calls": True},
    {"tools": [WEATHER_TOOL], "tool_choice": "required", "reasoning_format": "none"},
    {"json_schema": RESPONSE_SCHEMA},
)


def _llama_cpp_tag_names(llama_cpp_dir: Path) -> set[str]:
    # the builder's tag constants and the minimax-m3 mapper's, as chat-peg-parser.h spells them
    header = (llama_cpp_dir / "common" / "chat-peg-parser.h").read_text()
    return set(re.findall(r'static constexpr const char \* [A-Z_]+ += "([a-z-]+)";', header))


@pytest.mark.parametrize("name", sorted(_FORMATS), ids=sorted(_FORMATS))
def test_every_tag_of_a_format_has_a_llama_cpp_name(name: str, llama_cpp_dir: Path) -> None:
    known = _llama_cpp_tag_names(llama_cpp_dir)
    assert {"reasoning", "tool-open", "tool-arg-string-value", "tool-arg-object"} <= known
    module = __import__(f"{formats.__name__}.{name}", fromlist=["_"])
    params: Callable[..., formats.FormatParams] = getattr(module, f"{name}_params")
    names: set[str] = set()
    for request in _REQUESTS:
        try:
            arena = params(_FORMATS[name], **request).arena
        except NotImplementedError:
            continue
        if arena is not None:
            names |= {arena.tag_name(at) for at in range(len(arena)) if arena.kind(at) == "tag"}
    assert names and names <= known, names - known
    assert "tool-name" in names  # every format names its tool calls
