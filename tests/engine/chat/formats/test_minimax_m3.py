"""constraintd.engine.chat.formats.minimax_m3: the chat params of llama.cpp's hand-written minimax-m3 format
(MiniMax-M3, namespaced XML calls).

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them; the
oracle tests compare them with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template that
uses the format: every request of PARAMS_CASES and PARALLEL_CASES (tests/chat_oracle/params.py), and tools
whose arguments reach the format's other branches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.minimax_m3 import minimax_m3_params
from constraintd.engine.chat.params.chat_params import format_grammar
from constraintd.engine.chat.templates.prompt import template_source
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import (
    PARAMS_CASES,
    RESPONSE_SCHEMA,
    SEARCH_TOOL,
    WEATHER_TOOL,
    ParamsCase,
    template_paths,
)
from tests.chat_oracle.params import PARALLEL_CASES, ParamsComparison, format_fields
from tests.conftest import OracleReport

BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
SOURCE = "]<]minimax[>[ <tool_call> <invoke name="  # the marks of the format
PROMPT = "]~b]ai\n"
NS = "]<]minimax[>["
COUNT_TOOL = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {
        "n": {"type": "integer"}, "label": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "note": {"type": "string"}, "size": {"anyOf": [{"type": "integer"}, {"type": "boolean"}]},
        "where": {"anyOf": [{"type": "object", "properties": {"lat": {"type": "number"}}},
                            {"type": "null"}]}},
    "required": ["n", "label"]}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL, COUNT_TOOL]


def _grammar_text(made: FormatParams) -> str:
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = minimax_m3_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def _element(key: str, value: str) -> str:
    return f"{NS}<{key}>{value}{NS}</{key}>"


def _invoke(name: str, *elements: str) -> str:
    return f'{NS}<invoke name="{name}">\n' + "\n".join(elements) + f"\n{NS}</invoke>"


def _block(*invokes: str) -> str:
    return f"{NS}<tool_call>\n" + "\n".join(invokes) + f"\n{NS}</tool_call>"


WEATHER = _block(_invoke("get_weather", _element("city", "Paris")))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, PROMPT + WEATHER)
    assert _completes(matcher, PROMPT + "Let me look.\n" + WEATHER)
    assert _completes(matcher, PROMPT + _block(_invoke("get_weather", _element("city", "Saint-\n<Étienne>"))))
    assert not _completes(matcher, PROMPT)  # a call is required
    assert not _completes(matcher, PROMPT + "Paris is sunny.")
    # no such tool
    assert not _takes(matcher, PROMPT + _block(_invoke("get_time", _element("city", "Paris"))))
    assert not _takes(matcher, PROMPT + _block(_invoke("get_weather", _element("town", "Paris"))))
    assert not _completes(matcher, PROMPT + _block(_invoke("get_weather")))  # its required argument missing
    # a block without its namespace is text, not a call
    assert not _completes(matcher, PROMPT + WEATHER.replace(f"{NS}<tool_call>", "<tool_call>"))
    assert not _takes(matcher, PROMPT + WEATHER + "Done.")


def test_arguments_nest_as_elements_by_their_schemas_kind() -> None:
    matcher = _matcher()
    n, label = _element("n", "3"), _element("label", "three\nlines")
    assert _completes(matcher, PROMPT + _block(_invoke("count", n, label)))
    assert not _takes(matcher, PROMPT + _block(_invoke("count", _element("n", "three"))))  # an integer's JSON
    assert not _takes(matcher, PROMPT + _block(_invoke("count", label, n)))  # the required ones in order
    # an array's items are <item> elements, each its items' value
    tags = _element("tags", f"\n{NS}<item>1{NS}</item>\n{NS}<item>2{NS}</item>\n")
    assert _completes(matcher, PROMPT + _block(_invoke("count", n, label, tags)))
    assert not _takes(matcher, PROMPT + _block(_invoke("count", n, label, _element("tags", "[1, 2]"))))
    # an object's members are elements too; alternatives take either value
    filters = _element("filters", _element("max", "3") + "\n" + _element("site", "a.b"))
    assert _completes(matcher, PROMPT + _block(_invoke("search", _element("query", "q"), filters)))
    assert not _takes(matcher, PROMPT + _block(_invoke("search", _element("query", "q"),
                                                       _element("filters", '{"max": 3}'))))
    for size in ("4", "true"):
        assert _completes(matcher, PROMPT + _block(_invoke("count", n, label, _element("size", size))))
    assert not _takes(matcher, PROMPT + _block(_invoke("count", n, label, _element("size", "big"))))
    # an alternative that is an object with properties takes its members as elements, not its JSON
    where = _element("where", _element("lat", "1"))
    assert _completes(matcher, PROMPT + _block(_invoke("count", n, label, where)))
    assert _completes(matcher, PROMPT + _block(_invoke("count", n, label, _element("where", "null"))))
    assert not _takes(matcher, PROMPT + _block(_invoke("count", n, label, _element("where", '{"lat": 1}'))))
    # the optional ones in any order, again
    note = _element("note", "x")
    assert _completes(matcher, PROMPT + _block(_invoke("count", n, label, note, tags, note)))


def test_calls_repeat_in_the_block_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + _block(_invoke("get_weather", _element("city", "Paris")),
                          _invoke("search", _element("query", "Paris")))
    assert not _takes(_matcher(), two)
    assert _completes(_matcher(parallel_tool_calls=True), two)
    assert not _takes(_matcher(parallel_tool_calls=True), PROMPT + WEATHER + "\n" + WEATHER)  # one block


def test_a_thought_or_a_bare_close_comes_before_the_text() -> None:
    matcher = _matcher()
    assert _completes(matcher, PROMPT + "<mm:think>\nwhy</mm:think>" + WEATHER)
    assert _completes(matcher, PROMPT + "</mm:think>" + WEATHER)
    # a thought may hold the block's start, the text before the calls may not
    assert _completes(matcher, PROMPT + f"<mm:think>a {NS}<tool_call> in a thought</mm:think>" + WEATHER)
    assert not _takes(matcher, PROMPT + f"a {NS}<tool_call> in the text")
    # with reasoning not extracted, <mm:think> is text
    unreasoned = _matcher(reasoning_format="none")
    assert _completes(unreasoned, PROMPT + "<mm:think>why</mm:think>" + WEATHER)
    root = next(line for line in _grammar_text(minimax_m3_params(
        SOURCE, tools=TOOLS, tool_choice="required", reasoning_format="none")).splitlines()
        if line.startswith("root ::= "))
    assert root.startswith('root ::= "]~b]ai\\n" until-')


def test_tool_choice_auto_is_lazy_on_the_blocks_start() -> None:
    made = minimax_m3_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == (NS + "<tool_call>",)
    grammar = _grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert _completes(matcher, WEATHER)
    assert not _takes(matcher, "text")


def test_tool_choice_none_and_no_tools_give_no_grammar() -> None:
    for made in (minimax_m3_params(SOURCE, tools=TOOLS, tool_choice="none"), minimax_m3_params(SOURCE)):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()


def test_a_response_schema_is_json_in_a_fence_after_the_reasoning() -> None:
    made = minimax_m3_params(SOURCE, tools=TOOLS, json_schema=RESPONSE_SCHEMA)
    assert not made.grammar_lazy and made.trigger_words == (NS + "<tool_call>",)
    matcher = Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))
    assert _completes(matcher, PROMPT + '```json\n{"answer": "Paris"}\n```')
    assert _completes(matcher, PROMPT + '<mm:think>why</mm:think>```json{"answer": "Paris"}```')
    assert not _takes(matcher, PROMPT + '{"answer"')  # the fence is not optional
    assert not _takes(matcher, PROMPT + '```json\n{"confidence": 1}')  # the answer is required
    assert not _takes(matcher, PROMPT + WEATHER)  # no calls with a response format
    assert _completes(matcher, PROMPT + '</mm:think>```json{"answer": "Paris"}```')  # a bare thought's close
    assert minimax_m3_params(SOURCE, json_schema={}).writes_grammar  # an empty schema is one too


def test_thinking_tags_preserved_tokens_and_message_delimiters() -> None:
    made = minimax_m3_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<mm:think>", ("</mm:think>",))
    assert made.preserved_tokens == (NS, "<tool_call>", "</tool_call>", "<mm:think>", "</mm:think>")
    assert made.message_delimiters[0] == ("assistant", "]~b]ai") and made.additional_stops == ()


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"format": "date"}}},
    {"type": "object", "properties": {"a": {"type": "string", "allOf": [{"minLength": 1}]}}},
    {"type": "object", "properties": {"a": {"type": "decimal"}}},
], ids=["$ref", "format", "allOf", "unknown type"])
def test_arguments_not_ported_are_refused(parameters: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(NotImplementedError, match=r"^minimax-m3: tagged arguments "):
        minimax_m3_params(SOURCE, tools=[tool], tool_choice="required")


# --- against llama.cpp

FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "MiniMax-M3")


def _compare(binary: Path, path: Path, case: ParamsCase, *, parallel: bool) -> ParamsComparison:
    source = path.read_text()
    llama = run_harness(binary, case.request(source, now=int(time.time()), parallel_tool_calls=parallel))
    made = minimax_m3_params(
        template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
        parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
        reasoning_format=case.reasoning_format, enable_thinking=case.thinking)
    assert [list(pair) for pair in made.message_delimiters] == [
        [each["role"], each["delimiter"]] for each in llama["message_delimiters"]]
    return ParamsComparison(path.stem, case.name, format_fields(made), llama, None, made.preserved_tokens)


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["PARAMS_CASES", "PARALLEL_CASES"])
def test_minimax_m3_params_are_llama_cpps(
    path: Path, parallel: bool, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """Every request of PARAMS_CASES (PARALLEL_CASES: parallel calls on): grammar, lazy flag, triggers,
    stops, thinking tags, preserved tokens and message delimiters are llama.cpp's, byte for byte."""
    comparisons = [_compare(chat_oracle, path, case, parallel=parallel)
                   for case in (PARALLEL_CASES if parallel else PARAMS_CASES)]
    same = [c for c in comparisons if c.identical and c.same_preserved_tokens]
    oracle_report.add("chat params: minimax-m3", path.stem, identical=len(same), total=len(comparisons))
    assert [c.describe() for c in comparisons if not c.identical] == []
    assert [c.case for c in comparisons if not c.same_preserved_tokens] == []


# Tools whose arguments reach the format's other branches: no arguments, optional ones only, values that may
# be a string or not (anyOf, type lists, enums, const, no schema), arrays of objects and arrays without
# items, tuples, nested objects, objects without properties, JSON values of each kind, and a name the rule
# names clean
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "object", "array", "number"], "properties": {"k": {"type": "integer"}}},
        "code": {"pattern": "^[a-z]+$"}, "one": {"oneOf": [{"type": "integer"}, {"type": "array"}]}}}}},
    {"type": "function", "function": {"name": "move.fast", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer", "minimum": 2}, "z": {"type": "string"},
        "mode": {"const": "fast"}, "scale": {"enum": [1, 2]}, "size": {"type": "array"}, "any": {},
        "ok": {"type": "boolean"},
        "pair": {"type": "array", "items": [{"type": "integer"}, {"type": "string"}]},
        "points": {"type": "array", "items": {"type": "object", "properties": {
            "px": {"type": "number"}, "py": {"type": "number"}}, "required": ["px"]}},
        "box": {"type": "object", "properties": {"w": {"type": "integer"}, "inner": {"type": "object",
            "properties": {"d": {"type": "string"}}, "required": ["d"]}}, "required": ["w", "inner"]},
        "free": {"type": "object"}, "closed": {"type": "object", "additionalProperties": False},
        "rows": {"prefixItems": [{"type": "integer"}]}, "cols": {"items": {"type": "string"}}},
        "required": ["x", "y", "z"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no thinking"])
def test_minimax_m3_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, thinking: bool, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """The format's grammar with OTHER_TOOLS, lazy (tool_choice auto) and not (required): llama.cpp's byte
    for byte, with its lazy flag, triggers and preserved tokens."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, thinking, False).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = minimax_m3_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                             parallel_tool_calls=parallel, enable_thinking=thinking)
    grammar = _grammar_text(made)
    oracle_report.add("chat params: minimax-m3, other tools", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"]
    assert [["word", word] for word in made.trigger_words] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]
    assert list(made.preserved_tokens) == llama["preserved_tokens"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_an_empty_response_schema_is_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """An empty response schema is a response format to the format: llama.cpp's grammar byte for byte, not
    lazy, with the block's start as its trigger word."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(None, True, False).request(
        source, now=int(time.time()), json_schema={}))
    made = minimax_m3_params(template_source(source), json_schema={})
    grammar = _grammar_text(made)
    oracle_report.add("chat params: minimax-m3, empty schema", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"] is False
    assert [["word", word] for word in made.trigger_words] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]
