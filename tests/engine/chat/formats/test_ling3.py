"""constraintd.engine.chat.formats.ling3: the chat params of llama.cpp's hand-written ling-3 format.

The grammars are compiled over a byte vocabulary and run on turns written the way the format writes them; the
oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template
that uses the format: every request of PARAMS_CASES and PARALLEL_CASES (tests/chat_oracle/params.py), and
tools whose arguments reach the format's other branches.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.chat_templates import chat_prompt_of
from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.ling3 import ling3_params
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import parse_messages, parse_tools
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import (
    BOS_TOKEN,
    EOS_TOKEN,
    MESSAGE_SETS,
    PARAMS_CASES,
    RESPONSE_SCHEMA,
    SEARCH_TOOL,
    WEATHER_TOOL,
    ParamsCase,
    template_paths,
)
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import PARALLEL_CASES, ParamsComparison, format_fields
from tests.conftest import OracleReport

THINKING = "<role>ASSISTANT</role>\n<think>"  # the template's generation prompt, thinking on
NOT_THINKING = "<role>ASSISTANT</role>\n<think></think>"  # and off
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
WEATHER = "<tool_call>get_weather<arg_key>city</arg_key>\n<arg_value>Paris</arg_value></tool_call>"
SEARCH = "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>news</arg_value>\n</tool_call>"


def _matcher(tool_choice: str = "required", generation_prompt: str = THINKING, **options: Any) -> Matcher:
    made = ling3_params("", tools=options.pop("tools", TOOLS), tool_choice=tool_choice,
                        generation_prompt=generation_prompt, **options)
    return format_matcher(made)


def _call(name: str, *arguments: tuple[str, str]) -> str:
    args = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>" for key, value in arguments)
    return f"<tool_call>{name}{args}</tool_call>"


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, "<role>ASSISTANT</role>\nwhy</think>Let me look." + WEATHER + "<|role_end|>")
    assert completes(matcher, "why</think>" + WEATHER)
    assert not completes(matcher, "why</think>Let me look.<|role_end|>")  # a call is required
    assert not takes(matcher, "why</think>" + _call("get_time", ("city", "Paris")))  # no such tool
    assert not takes(matcher, "why</think>" + _call("get_weather", ("town", "Paris")))  # nor argument
    assert not completes(matcher, "why</think>" + _call("get_weather"))  # city is required
    assert not completes(matcher, "why</think><tool_call>get_weather<arg_key>city</arg_key>"
                                  "<arg_value>Paris</tool_call>")  # the value's closer is missing


def test_required_arguments_in_any_order_then_optional_ones_in_any_number() -> None:
    tool = {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}, "note": {"type": "string"}},
        "required": ["x", "y"]}}}
    matcher = _matcher(tools=[tool])
    x, y, note = ("x", "1"), ("y", "2"), ("note", "a")
    taken: list[tuple[tuple[str, str], ...]] = [(x, y), (y, x), (x, y, note, note), (y, x, note)]
    for arguments in taken:
        assert completes(matcher, "</think>" + _call("move", *arguments))
    refused: list[tuple[tuple[str, str], ...]] = [(x,), (x, note, y), (x, x, y)]
    for arguments in refused:
        assert not completes(matcher, "</think>" + _call("move", *arguments))


def test_string_arguments_are_any_text_and_others_their_schemas_json() -> None:
    matcher = _matcher()
    search = "</think>" + _call("search", ("query", "two\nlines <b>"), ("filters", '{"max": 3}'))
    assert completes(matcher, search)
    assert not takes(matcher, "</think>" + _call("search", ("query", "q"), ("filters", "not JSON")))
    assert not takes(matcher, "</think>" + _call("search", ("query", "q"), ("filters", '{"max": 0}')))


def test_an_argument_that_may_be_a_string_or_not_takes_either() -> None:
    tool = {"type": "function", "function": {"name": "tag", "parameters": {"type": "object", "properties": {
        "value": {"type": ["integer", "string"]}}, "required": ["value"]}}}
    matcher = _matcher(tools=[tool])
    for value in ("12", "twelve", "[1"):
        assert completes(matcher, "</think>" + _call("tag", ("value", value)))


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = "</think>" + WEATHER + "\n" + SEARCH
    # the text after the calls is free content up to the turn's end (llama.cpp's grammar), a call included
    assert completes(_matcher(), two) and completes(_matcher(parallel_tool_calls=True), two)
    one = grammar_text(ling3_params("", tools=TOOLS, tool_choice="required"))
    parallel = grammar_text(ling3_params("", tools=TOOLS, tool_choice="required", parallel_tool_calls=True))
    assert "ling3-tool-call ::= (ling3-tool-get-weather | ling3-tool-search) space " in one
    assert "ling3-tool-call ::= (ling3-tool-get-weather | ling3-tool-search) (space (ling3-tool-get-weather" \
        " | ling3-tool-search))* space " in parallel


def test_an_unclosed_thought_ends_at_a_call_only_where_the_prompt_leaves_it_open() -> None:
    assert completes(_matcher(), "thinking" + WEATHER)
    assert completes(_matcher(generation_prompt=NOT_THINKING), "thinking</think>" + WEATHER)

    def thought(generation_prompt: str) -> Matcher:
        # the grammar's thought rule alone: the root's text between `"<think>"?` and `"</think>"?`
        made = ling3_params("", tools=TOOLS, tool_choice="required", generation_prompt=generation_prompt)
        text = grammar_text(made)
        name = re.search(r'^root ::= .*?\("<think>"\? (until-\d+) "</think>"\?\)\?', text, re.M)
        assert name is not None
        root = re.sub(r"^root ::= .*$", f"root ::= {name[1]}", text, flags=re.M)
        return Matcher(Grammar.from_gbnf(root, BYTES))

    # open, the thought holds no call's start; closed by the prompt, it may hold one (up to `</think>`)
    assert not completes(thought(THINKING), "x<tool_call>y")
    assert completes(thought(NOT_THINKING), "x<tool_call>y")
    assert not completes(thought(NOT_THINKING), "x</think>y")


def test_tool_choice_auto_is_lazy_on_the_call_start() -> None:
    made = ling3_params("", tools=TOOLS, tool_choice="auto", generation_prompt=THINKING)
    assert made.grammar_lazy and made.trigger_words == ("<tool_call>",)
    grammar = grammar_text(made)
    assert "root ::= ling3-tool-call\n" in grammar
    matcher = format_matcher(made)
    assert completes(matcher, WEATHER + " done<|role_end|>")
    assert not takes(matcher, "text")


@pytest.mark.parametrize(("tools", "tool_choice", "json_schema"), [
    (TOOLS, "none", None), ([], "auto", None), ([], "auto", RESPONSE_SCHEMA)],
    ids=["tool_choice none", "no tools", "response schema"])
def test_no_grammar_without_tools_to_call(tools: list[dict[str, Any]], tool_choice: str,
                                          json_schema: Any) -> None:
    made = ling3_params("", tools=tools, tool_choice=tool_choice, json_schema=json_schema)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_stops_preserved_tokens_and_message_delimiters() -> None:
    made = ling3_params("")
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<think>", ("</think>", "<tool_call>"))
    assert made.additional_stops == ("<|role_end|>",)
    assert made.preserved_tokens == ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                     "</arg_key>", "<arg_value>", "</arg_value>", "<|role_end|>")
    assert made.message_delimiters == (
        ("assistant", "<role>ASSISTANT</role>"), ("user", "<role>HUMAN</role>"),
        ("tool", "<role>OBSERVATION</role>"), ("system", "<role>SYSTEM</role>"))


def test_parameters_holding_a_ref_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}}}
    with pytest.raises(NotImplementedError, match=r"^ling-3: tagged arguments whose parameters hold a \$ref"):
        ling3_params("", tools=[tool], tool_choice="required")


# --- against llama.cpp

FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "inclusionai-ling-3.0-flash")


def _generation_prompt(source: str, case: ParamsCase, tools: list[dict[str, Any]] | None, now: int) -> str:
    # the project's generation prompt for the request (prompt.chat_prompt), as chat_params.py gets it
    return chat_prompt_of(
        source, parse_messages(MESSAGE_SETS["system+user"]), tools=parse_tools(tools), bos_text=BOS_TOKEN,
        eos_text=EOS_TOKEN, enable_thinking=case.thinking, now=now).generation_prompt


def _compare(binary: Path, path: Path, case: ParamsCase, *, parallel: bool,
             tools: list[dict[str, Any]] | None = None) -> tuple[ParamsComparison, FormatParams]:
    source = path.read_text()
    now = int(time.time())
    tool_list = case.tool_list if tools is None else tools
    llama = run_harness(binary, case.request(source, now=now, parallel_tool_calls=parallel, tools=tool_list)
                        if tools is not None else case.request(source, now=now, parallel_tool_calls=parallel))
    made = ling3_params(
        template_source(source), tools=tool_list or [], tool_choice=case.llama_tool_choice,
        parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
        reasoning_format=case.reasoning_format,
        generation_prompt=_generation_prompt(source, case, tool_list, now))
    fields = format_fields(made)
    return ParamsComparison(path.stem, case.name, fields, llama, None, made.preserved_tokens), made


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["PARAMS_CASES", "PARALLEL_CASES"])
def test_ling3_params_are_llama_cpps(path: Path, parallel: bool, chat_oracle: Path,
                                     oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES (PARALLEL_CASES: parallel calls on): grammar, lazy flag, triggers,
    stops, thinking tags, preserved tokens and message delimiters are llama.cpp's, byte for byte."""
    compared = [_compare(chat_oracle, path, case, parallel=parallel)
                for case in (PARALLEL_CASES if parallel else PARAMS_CASES)]
    same = [c for c, made in compared if c.identical and c.same_preserved_tokens
            and [list(pair) for pair in made.message_delimiters] == [
                [d["role"], d["delimiter"]] for d in c.llama["message_delimiters"]]]
    oracle_report.add("chat params: ling-3", path.stem, identical=len(same), total=len(compared))
    assert [c.describe() for c, _ in compared if not c.identical] == []
    assert [c.case for c, _ in compared if not c.same_preserved_tokens] == []
    assert len(same) == len(compared)


# Tools whose arguments reach the format's other branches: no arguments, optional ones only, values that may
# be a string or not (type lists, enums, const, no schema), JSON values of each kind, three required
# arguments (permuted), seven (in order), and names the rules name clean
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "string", "object", "array", "number", "boolean"]},
        "code": {"pattern": "^[a-z]+$"}}}}},
    {"type": "function", "function": {"name": "move.fast", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer"}, "z": {"type": "string"}, "mode": {"const": "fast"},
        "scale": {"enum": [1, "2"]}, "size": {"type": "array"}, "any": {}, "on.off": {"type": "boolean"}},
        "required": ["x", "y", "z"]}}},
    {"type": "function", "function": {"name": "seven", "parameters": {"type": "object", "properties": {
        key: {"type": "integer"} for key in "abcdefg"}, "required": list("abcdefg")}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no thinking"])
def test_ling3_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, thinking: bool, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """The format's params with OTHER_TOOLS, lazy (tool_choice auto) and not (required): llama.cpp's."""
    comparison, _ = _compare(chat_oracle, path, ParamsCase(tool_choice, thinking, False), parallel=parallel,
                             tools=OTHER_TOOLS)
    oracle_report.add("chat params: ling-3, other tools", path.stem,
                      identical=int(comparison.identical and comparison.same_preserved_tokens), total=1)
    assert comparison.identical, comparison.describe()
    assert comparison.same_preserved_tokens
