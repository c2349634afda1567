"""constraintd.engine.chat.formats.lfm2: the chat params of llama.cpp's hand-written LFM2 / LFM2.5 format.

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them
(`<|tool_call_start|>[name(key="value")]<|tool_call_end|>`); the oracle tests compare the params with
llama.cpp's (tests/chat_oracle/harness.cpp) on the three reference templates that use the format (one LFM2,
two LFM2.5), on every request of PARAMS_CASES and PARALLEL_CASES, and on tools and options those cases do not
reach.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.lfm2 import (
    lfm2_params,
    lfm2_tool_list_tokens,
)
from constraintd.engine.chat.params.chat_params import (
    specialised_format,
)
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import parse_tools
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import (
    PARAMS_CASES,
    RESPONSE_SCHEMA,
    SEARCH_TOOL,
    WEATHER_TOOL,
    ParamsCase,
    template_paths,
)
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import PARALLEL_CASES, ParamsComparison
from tests.conftest import OracleReport

PROMPT = "<|im_start|>assistant\n"
LFM2 = "<|tool_list_start|>[]<|tool_list_end|>"  # the marks llama.cpp picks each format by
LFM25 = "List of tools: ["
THINKING = LFM25 + "<think>"  # a template that writes <think> blocks: its reasoning is extracted
PING_TOOL = {"type": "function", "function": {"name": "ping"}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL, PING_TOOL]



def _matcher(source: str = THINKING, tool_choice: str = "required", **options: Any) -> Matcher:
    made = lfm2_params(source, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _block(*calls: str) -> str:
    return "<|tool_call_start|>[" + ", ".join(calls) + "]<|tool_call_end|>"


WEATHER = 'get_weather(city="Paris")'


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + _block(WEATHER))
    assert completes(matcher, PROMPT + "Let me look.\n" + _block("get_weather( city='Saint-\\'Étienne' )"))
    assert completes(matcher, PROMPT + _block("ping()"))  # a tool without parameters
    assert not completes(matcher, PROMPT + "Paris.")  # a call is required
    assert not takes(matcher, PROMPT + _block('get_time(city="Paris")'))  # no such tool
    assert not takes(matcher, PROMPT + _block('get_weather(town="Paris")'))  # no such argument
    assert not takes(matcher, PROMPT + _block("get_weather(city=Paris)"))  # a string argument is quoted
    assert not takes(matcher, PROMPT + "<|tool_call_start|>" + WEATHER)  # the calls are in a list
    assert not takes(matcher, PROMPT + _block(WEATHER) + "Done.")  # nothing after the calls


def test_string_arguments_take_either_quote_and_json_escapes() -> None:
    matcher = _matcher()
    for value in ('"a \\"b\\" c"', "'it\\'s'", "'say \"hi\"'", '"\\u00e9\\n"', "''"):
        assert completes(matcher, PROMPT + _block(f"get_weather(city={value})")), value
    for value in ("'it's'", '"a"b"', '"\\x41"', "'a\"", "\"a'", "1", "{}", "None"):
        assert not completes(matcher, PROMPT + _block(f"get_weather(city={value})")), value


def test_other_arguments_are_python_values_or_json_literals() -> None:
    matcher = _matcher()
    for filters in ("{'site': 'a.fr', \"max\": 3}", "{}", "[1, -2.5e3, 'x']", "True", "false", "None",
                    "null", "{'a': {'b': [None, true]}}", "'text'"):
        assert completes(matcher, PROMPT + _block(f"search(query='x', filters={filters})")), filters
    for filters in ("none", "{a: 1}", "{'a' 1}", "[1,, 2]", "01"):
        assert not completes(matcher, PROMPT + _block(f"search(query='x', filters={filters})")), filters


def test_arguments_come_in_any_order_and_number() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + _block("search(filters={}, query='x')"))
    assert completes(matcher, PROMPT + _block("search(filters={})"))  # required ones are not checked
    assert completes(matcher, PROMPT + _block("search(query='x',query='y')"))
    assert not takes(matcher, PROMPT + _block("search(query='x' filters={})"))  # a comma between
    assert not takes(matcher, PROMPT + _block("get_weather()"))  # at least one where the tool has some
    assert not takes(matcher, PROMPT + _block("ping(a=1)"))


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + _block(WEATHER, "search(query='Paris')")
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    assert completes(_matcher(parallel_tool_calls=True), PROMPT + _block(WEATHER))
    # one block of calls, never two
    assert not takes(_matcher(parallel_tool_calls=True), PROMPT + _block(WEATHER) + _block(WEATHER))


def test_the_text_before_the_calls_holds_no_call_start_and_the_reasoning_may() -> None:
    matcher = _matcher()
    assert not takes(matcher, PROMPT + "I will write <|tool_call_start|> now")
    assert completes(matcher, PROMPT + "<|tool_call_end|> is fine\n" + _block(WEATHER))
    thought = PROMPT + "<think>I could write <|tool_call_start|> next</think>" + _block(WEATHER)
    assert completes(matcher, thought)


@pytest.mark.parametrize(("source", "reasoning_format"), [
    (LFM25, "auto"), (THINKING, "none")], ids=["no <think> in the template", "reasoning_format none"])
def test_reasoning_is_in_the_grammar_only_where_it_is_extracted(source: str, reasoning_format: str) -> None:
    # seen in a schema's grammar (before calls, a <think> block is text up to the call start anyway)
    def matcher(source: str, reasoning_format: str) -> Matcher:
        made = lfm2_params(source, json_schema={"type": "string"}, reasoning_format=reasoning_format)
        return format_matcher(made)

    thought = PROMPT + '<think>why</think>"Paris"'
    assert completes(matcher(THINKING, "auto"), thought)
    assert not takes(matcher(source, reasoning_format), thought)
    assert completes(matcher(source, reasoning_format), PROMPT + '"Paris"')


def test_tool_choice_auto_is_lazy_on_the_call_start() -> None:
    made = lfm2_params(THINKING, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<|tool_call_start|>",)
    grammar = grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    # from the trigger on, the lazy grammar holds the call block and nothing else
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, _block(WEATHER))
    assert not takes(matcher, "text")
    assert not takes(matcher, PROMPT)


@pytest.mark.parametrize("options", [
    {"tool_choice": "required"}, {"json_schema": {"type": "string"}},
    {"tool_choice": "auto", "json_schema": {"type": "string"}}], ids=["required", "schema", "auto +schema"])
def test_required_calls_and_a_schema_are_not_lazy_and_keep_the_trigger_word(options: dict[str, Any]) -> None:
    made = lfm2_params(THINKING, tools=TOOLS if "tool_choice" in options else (), **options)
    assert not made.grammar_lazy and made.trigger_words == ("<|tool_call_start|>",)
    assert '\nroot ::= "<|im_start|>assistant\\n" (' in grammar_text(made)  # from the first token


def test_a_response_schema_gives_its_json_after_the_reasoning() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    matcher = Matcher(Grammar.from_gbnf(grammar_text(lfm2_params(THINKING, json_schema=schema)), BYTES))
    assert completes(matcher, PROMPT + '{"answer": "Paris"}')
    assert completes(matcher, PROMPT + '<think>why</think>{"answer": "Paris"}')
    assert not takes(matcher, PROMPT + "Paris")
    # any JSON object is a schema, an empty one too (llama.cpp's is_object)
    empty = lfm2_params(THINKING, json_schema={})
    assert completes(Matcher(Grammar.from_gbnf(grammar_text(empty), BYTES)), PROMPT + "[1, {}]")
    # with tool_choice none the tools are left out, the schema holds
    none = lfm2_params(THINKING, tools=TOOLS, tool_choice="none", json_schema=schema)
    assert completes(Matcher(Grammar.from_gbnf(grammar_text(none), BYTES)), PROMPT + '{"answer": "x"}')


def test_a_response_schema_with_tools_wanted_gives_the_calls_grammar() -> None:
    # llama.cpp's own reading: with tools (tool_choice auto included) the parser is the calls', not lazy, so
    # a call is then required and the schema is not in the grammar
    made = lfm2_params(THINKING, tools=TOOLS, json_schema={"type": "string"})
    matcher = Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))
    assert not completes(matcher, PROMPT + '"Paris"')
    assert completes(matcher, PROMPT + _block(WEATHER))


@pytest.mark.parametrize(("tools", "tool_choice"), [((), "auto"), ((), "required"), (TOOLS, "none")],
                         ids=["no tools", "no tools, required", "tool_choice none"])
def test_no_grammar_without_tools_to_call_or_a_schema(
    tools: Sequence[dict[str, Any]], tool_choice: str
) -> None:
    made = lfm2_params(THINKING, tools=tools, tool_choice=tool_choice)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_and_preserved_tokens_follow_the_tool_list_flag() -> None:
    calls_and_thinking = ("<|tool_call_start|>", "<|tool_call_end|>", "<think>", "</think>")
    tool_list = ("<|tool_list_start|>", "<|tool_list_end|>")
    for source, flag, preserved in (
            (LFM2, None, calls_and_thinking + tool_list), (LFM25, None, calls_and_thinking),
            (LFM25, True, calls_and_thinking + tool_list), (LFM2, False, calls_and_thinking)):
        made = lfm2_params(source, tool_list_tokens=flag)
        assert made.preserved_tokens == preserved
        assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
            True, "<think>", ("</think>",))


@pytest.mark.parametrize("path", sorted(path for path in template_paths() if path.stem.startswith("LFM2")),
                         ids=lambda path: path.stem)
def test_the_tool_list_flag_is_chat_cpps_pick(path: Path) -> None:
    source = template_source(path.read_text())
    assert lfm2_tool_list_tokens(source) is (specialised_format(source) == "lfm2")
    assert not lfm2_tool_list_tokens("<|tool_list_start|>") and not lfm2_tool_list_tokens("<|tool_list_end|>")


def test_properties_that_are_not_an_object_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": ["a"]}}}
    refused = r"^lfm2 tool parameters whose properties are not an object$"
    with pytest.raises(NotImplementedError, match=refused):
        lfm2_params(LFM25, tools=[tool], tool_choice="required")


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem.startswith("LFM2"))


def _comparison(path: Path, name: str, made: FormatParams, llama: dict[str, Any]) -> ParamsComparison:
    ours = {
        "grammar": grammar_text(made), "grammar_lazy": made.grammar_lazy,
        "grammar_triggers": [["word", word] for word in made.trigger_words], "additional_stops": [],
        "supports_thinking": made.supports_thinking, "thinking_start_tag": made.thinking_start_tag,
        "thinking_end_tags": list(made.thinking_end_tags),
    }
    return ParamsComparison(path.stem, name, ours, llama, preserved_tokens=made.preserved_tokens)


def _tools(tool_list: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    # as the chat layer hands them on (parse_tools, then to_json)
    return [tool.to_json() for tool in parse_tools(tool_list)]


def _differing(comparisons: list[ParamsComparison]) -> list[str]:
    return [c.describe() if not c.identical else f"{c.case}: preserved tokens "
            f"{c.preserved_tokens} llama.cpp {c.llama.get('preserved_tokens')}"
            for c in comparisons if not (c.identical and c.same_preserved_tokens)]


def _template_in_format(path: Path) -> None:
    assert specialised_format(template_source(path.read_text())) in ("lfm2", "lfm2.5")


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_lfm2_params_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags and preserved tokens, all llama.cpp's."""
    _template_in_format(path)
    source, now = path.read_text(), int(time.time())
    comparisons = []
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = lfm2_params(
            template_source(source), tools=_tools(case.tool_list), tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        comparisons.append(_comparison(path, f"{case.name}{' parallel' if parallel else ''}", made, llama))
    differing = _differing(comparisons)
    oracle_report.add("chat params: lfm2", path.stem, identical=len(comparisons) - len(differing),
                      total=len(comparisons))
    assert differing == []


# Tools the cases do not reach: no parameters at all or no properties, a name the rule names clean, argument
# types other than a string ("string" in a list of types, anyOf, const, enum, no schema), a string with more
# to its schema
OTHER_TOOLS = [
    PING_TOOL,
    {"type": "function", "function": {"name": "empty", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "ns.move-to", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "tag": {"type": ["string"]}, "note": {"anyOf": [{"type": "string"}]},
        "mode": {"const": "fast"}, "scale": {"enum": [1, 2]}, "any": {}, "on": {"type": "boolean"},
        "code": {"type": "string", "pattern": "^[a-z]+$"}}, "required": ["x"]}}},
    WEATHER_TOOL,
]
OTHER_REQUESTS = [(choice, parallel, reasoning, schema) for choice in ("auto", "required")
                  for parallel in (False, True) for reasoning in ("auto", "none")
                  for schema in (None, {}, {"type": "string"})]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_lfm2_grammars_of_other_tools_are_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """OTHER_TOOLS, tool_choice auto and required, parallel calls on and off, reasoning extracted and not,
    with no schema, an empty one and a string's."""
    source, now = path.read_text(), int(time.time())
    comparisons = []
    for tool_choice, parallel, reasoning_format, schema in OTHER_REQUESTS:
        request = ParamsCase(tool_choice, True, False, reasoning_format).request(
            source, now=now, tools=OTHER_TOOLS, parallel_tool_calls=parallel)
        if schema is not None:
            request["json_schema"] = schema
        llama = run_harness(chat_oracle, request)
        made = lfm2_params(
            template_source(source), tools=_tools(OTHER_TOOLS), tool_choice=tool_choice,
            parallel_tool_calls=parallel, json_schema=schema, reasoning_format=reasoning_format)
        name = f"{tool_choice}{' parallel' if parallel else ''} reasoning {reasoning_format} schema {schema}"
        comparisons.append(_comparison(path, name, made, llama))
    differing = _differing(comparisons)
    oracle_report.add("chat params: lfm2, other tools", path.stem,
                      identical=len(comparisons) - len(differing), total=len(comparisons))
    assert differing == []
