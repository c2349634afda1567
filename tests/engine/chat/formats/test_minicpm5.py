"""constraintd.engine.chat.formats.minicpm5: the chat params of llama.cpp's hand-written minicpm5 format.

The grammars are compiled over a byte vocabulary and run on turns written the way the format writes them; the
oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template
that uses the format: every request of PARAMS_CASES and PARALLEL_CASES (tests/chat_oracle/params.py), and
tools whose arguments reach the format's other branches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Matcher
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.minicpm5 import minicpm5_params
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
from tests.chat_oracle.grammars import completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import PARALLEL_CASES, ParamsComparison, format_fields
from tests.conftest import OracleReport

PROMPT = "<|im_start|>assistant\n"
THINK = "<think>\nwhy\n</think>\n\n"
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    return format_matcher(minicpm5_params("", tools=options.pop("tools", TOOLS), tool_choice=tool_choice,
                                          **options))


def _call(name: str, *arguments: tuple[str, str]) -> str:
    args = "".join(f'<param name="{key}">{value}</param>\n' for key, value in arguments)
    return f'<function name="{name}">\n{args}</function>'


WEATHER = _call("get_weather", ("city", "Paris"))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + THINK + "Let me look." + WEATHER)
    assert completes(matcher, PROMPT + THINK + WEATHER + "\n")
    assert not completes(matcher, PROMPT + THINK + "Let me look.")  # a call is required
    assert not takes(matcher, PROMPT + THINK + _call("get_time", ("city", "Paris")))  # no such tool
    assert not takes(matcher, PROMPT + THINK + _call("get_weather", ("town", "Paris")))  # nor argument
    assert not takes(matcher, PROMPT + THINK + WEATHER + "text")  # nothing after the calls
    assert not takes(matcher, THINK + WEATHER)  # the generation prompt comes first


def test_string_values_are_cdata_or_any_text_up_to_the_closer() -> None:
    matcher = _matcher()
    for value in ("Paris", "two\nlines <b>", "<![CDATA[a </param> b]]>"):
        assert completes(matcher, PROMPT + THINK + _call("get_weather", ("city", value)))
    # outside a CDATA section the closer ends the value (the lookahead on `<![CDATA[` writes no GBNF)
    assert not takes(matcher, PROMPT + THINK + '<function name="get_weather">\n<param name="city">'
                     "a </param>b")


def test_other_values_are_their_schemas_json_and_arguments_any_order_and_number() -> None:
    matcher = _matcher()
    query, filters = ("query", "news"), ("filters", '{"max": 3}')
    for arguments in ((query,), (filters, query), (query, query), ()):
        assert completes(matcher, PROMPT + THINK + _call("search", *arguments))
    assert not takes(matcher, PROMPT + THINK + _call("search", ("filters", "not JSON")))
    assert not takes(matcher, PROMPT + THINK + _call("search", ("filters", '{"max": 0}')))


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + THINK + WEATHER + "\n" + _call("search", ("query", "news"))
    assert not completes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)


def test_the_think_block_is_in_the_grammar_only_where_reasoning_is_extracted() -> None:
    assert not takes(_matcher(), PROMPT + WEATHER)
    matcher = _matcher(reasoning_format="none")
    assert completes(matcher, PROMPT + WEATHER)
    assert completes(matcher, PROMPT + THINK + WEATHER)  # then it is content


def test_tool_choice_auto_is_lazy_on_the_call_start() -> None:
    made = minicpm5_params("", tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<function",)
    assert "root ::= tool-call\n" in grammar_text(made)
    matcher = format_matcher(made)
    assert completes(matcher, WEATHER)
    assert not takes(matcher, "text")


@pytest.mark.parametrize("tools", [[], TOOLS], ids=["no tools", "with tools"])
def test_a_response_schema_gives_its_json_after_the_reasoning_not_lazy(tools: list[dict[str, Any]]) -> None:
    made = minicpm5_params("", tools=tools, tool_choice="auto", json_schema=RESPONSE_SCHEMA)
    assert not made.grammar_lazy and made.trigger_words == ("<function",)
    matcher = format_matcher(made)
    assert completes(matcher, PROMPT + THINK + '{"answer": "Paris", "confidence": 1}')
    assert not takes(matcher, PROMPT + THINK + '{"confidence": 1}')
    assert not takes(matcher, PROMPT + THINK + WEATHER)


@pytest.mark.parametrize(("tools", "tool_choice", "json_schema"), [
    (TOOLS, "none", None), ([], "auto", None), ([], "auto", {})],
    ids=["tool_choice none", "no tools", "empty response schema"])
def test_no_grammar_without_tools_to_call_or_a_schema(tools: list[dict[str, Any]], tool_choice: str,
                                                      json_schema: Any) -> None:
    made = minicpm5_params("", tools=tools, tool_choice=tool_choice, json_schema=json_schema)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_preserved_tokens_and_message_delimiters() -> None:
    made = minicpm5_params("")
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<think>", ("</think>",))
    assert made.preserved_tokens == ("<function", "<param", "</function>", "</param>", "<think>", "</think>")
    assert made.additional_stops == ()
    assert made.message_delimiters == (
        ("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"),
        ("user", "<|im_start|>user"), ("system", "<|im_start|>system"))


def test_parameters_holding_a_ref_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}}}
    refused = r"^minicpm5: tagged arguments whose parameters hold a \$ref"
    with pytest.raises(NotImplementedError, match=refused):
        minicpm5_params("", tools=[tool], tool_choice="required")


# --- against llama.cpp

FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "openbmb-MiniCPM5-1B")


def _compare(binary: Path, path: Path, case: ParamsCase, *, parallel: bool,
             tools: list[dict[str, Any]] | None = None) -> tuple[ParamsComparison, FormatParams]:
    source = path.read_text()
    extra: dict[str, Any] = {"parallel_tool_calls": parallel}
    if tools is not None:
        extra["tools"] = tools
    llama = run_harness(binary, case.request(source, now=int(time.time()), **extra))
    made = minicpm5_params(
        template_source(source), tools=(case.tool_list if tools is None else tools) or [],
        tool_choice=case.llama_tool_choice, parallel_tool_calls=parallel,
        json_schema=RESPONSE_SCHEMA if case.schema else None, reasoning_format=case.reasoning_format)
    fields = format_fields(made)
    return ParamsComparison(path.stem, case.name, fields, llama, None, made.preserved_tokens), made


def _same_delimiters(comparison: ParamsComparison, made: FormatParams) -> bool:
    return [list(pair) for pair in made.message_delimiters] == [
        [d["role"], d["delimiter"]] for d in comparison.llama["message_delimiters"]]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["PARAMS_CASES", "PARALLEL_CASES"])
def test_minicpm5_params_are_llama_cpps(path: Path, parallel: bool, chat_oracle: Path,
                                        oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES (PARALLEL_CASES: parallel calls on): grammar, lazy flag, triggers,
    stops, thinking tags, preserved tokens and message delimiters are llama.cpp's, byte for byte."""
    compared = [_compare(chat_oracle, path, case, parallel=parallel)
                for case in (PARALLEL_CASES if parallel else PARAMS_CASES)]
    same = [c for c, made in compared
            if c.identical and c.same_preserved_tokens and _same_delimiters(c, made)]
    oracle_report.add("chat params: minicpm5", path.stem, identical=len(same), total=len(compared))
    assert [c.describe() for c, _ in compared if not c.identical] == []
    assert [c.case for c, _ in compared if not c.same_preserved_tokens] == []
    assert len(same) == len(compared)


# Tools whose arguments reach the format's other branches: no arguments, values that may be a string or not
# (anyOf, type lists, enums, const, a pattern, no schema), JSON values of each kind, and names the rules name
# clean
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "string", "object", "array", "number", "boolean"]},
        "code": {"pattern": "^[a-z]+$"}}}}},
    {"type": "function", "function": {"name": "move.fast", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer"}, "z": {"type": "string"}, "mode": {"const": "fast"},
        "scale": {"enum": [1, 2]}, "size": {"type": "array"}, "any": {}, "on.off": {"type": "boolean"}},
        "required": ["x", "y", "z"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
def test_minicpm5_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, reasoning_format: str, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """The format's params with OTHER_TOOLS, lazy (tool_choice auto) and not (required), reasoning extracted
    and not: llama.cpp's."""
    comparison, made = _compare(chat_oracle, path, ParamsCase(tool_choice, True, False, reasoning_format),
                                parallel=parallel, tools=OTHER_TOOLS)
    same = comparison.identical and comparison.same_preserved_tokens and _same_delimiters(comparison, made)
    oracle_report.add("chat params: minicpm5, other tools", path.stem, identical=int(same), total=1)
    assert comparison.identical, comparison.describe()
    assert same


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("json_schema", [{}, RESPONSE_SCHEMA], ids=["empty schema", "schema"])
@pytest.mark.parametrize("tool_choice", [None, "auto", "required", "none"])
def test_minicpm5_response_schemas_are_llama_cpps(
    path: Path, json_schema: Any, tool_choice: str | None, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """A response schema, empty or not, with tools offered or not: llama.cpp's params (a schema wins over
    tools; an empty one is none)."""
    source = path.read_text()
    case = ParamsCase(tool_choice, True, False)
    llama = run_harness(chat_oracle, case.request(source, now=int(time.time()), json_schema=json_schema))
    made = minicpm5_params(template_source(source), tools=case.tool_list or [],
                           tool_choice=case.llama_tool_choice, json_schema=json_schema)
    fields = format_fields(made)
    comparison = ParamsComparison(path.stem, case.name, fields, llama, None, made.preserved_tokens)
    oracle_report.add("chat params: minicpm5, response schemas", path.stem,
                      identical=int(comparison.identical), total=1)
    assert comparison.identical, comparison.describe()
