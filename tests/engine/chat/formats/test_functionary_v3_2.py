"""constraintd.engine.chat.formats.functionary_v3_2: the chat params of llama.cpp's hand-written
functionary-v3.2 format.

The grammars are compiled over a byte vocabulary and run on replies written the way the format's grammar
takes them; the oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the
reference template that uses the format, on every request of PARAMS_CASES and PARALLEL_CASES, and on tools
and options those cases do not reach.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.functionary_v3_2 import TRIGGER_PATTERN, functionary_v3_2_params
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
from tests.chat_oracle.params import PARALLEL_CASES, format_differences
from tests.conftest import OracleReport

BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
PROMPT = "<|start_header_id|>assistant<|end_header_id|>\n\n>>>"
SOURCE = ">>>all >>>${recipient}"  # the marks llama.cpp picks the format by
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
WEATHER = 'get_weather\n{"city": "Paris"}'
SEARCH = 'search\n{"query": "x"}'


def _grammar_text(made: FormatParams, *, whole: bool = False) -> str:
    if whole:  # the grammar as a whole, lazy or not
        made = FormatParams(made.arena, False, (), False, "", (), ())
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", *, whole: bool = False, **options: Any) -> Matcher:
    tools = options.pop("tools", TOOLS)
    made = functionary_v3_2_params(SOURCE, tools=tools, tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made, whole=whole), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, PROMPT + WEATHER)
    assert _completes(matcher, PROMPT + SEARCH)
    # text for the user first, up to (not through) the next recipient mark: llama.cpp's grammar takes the call
    # right after it
    assert _completes(matcher, PROMPT + "all\nLet me look." + WEATHER)
    assert not _completes(matcher, PROMPT)  # a call is required
    assert not _completes(matcher, PROMPT + "all\nParis.")
    assert not _takes(matcher, PROMPT + "all\nI >>>")
    assert not _takes(matcher, PROMPT + 'get_time\n{"city": "Paris"}')  # no such tool
    assert not _takes(matcher, PROMPT + 'get_weather\n{"town": "Paris"}')  # not its schema
    assert not _takes(matcher, PROMPT + 'get_weather {"city": "Paris"}')  # the name ends the line
    assert not _takes(matcher, PROMPT + WEATHER + "\nDone.")  # nothing after the calls


def test_calls_after_text_repeat_only_where_parallel_calls_are_on() -> None:
    # a first call whose arguments hold the recipient mark, so that the text before the calls cannot hold it
    after_text = PROMPT + "all\nBoth." + 'search\n{"query": ">>>"}' + WEATHER
    assert not _takes(_matcher(), after_text)
    assert _completes(_matcher(parallel_tool_calls=True), after_text)
    # calls alone are llama.cpp's one-or-more `tools` rule, parallel calls on or off
    assert _completes(_matcher(), PROMPT + WEATHER + SEARCH)
    assert not _completes(_matcher(parallel_tool_calls=True), PROMPT + "all\nBoth.")


def test_tool_choice_auto_is_lazy_on_its_pattern_and_takes_any_text_as_a_whole() -> None:
    made = functionary_v3_2_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == () and made.trigger_patterns == (TRIGGER_PATTERN,)
    assert re.search(TRIGGER_PATTERN, "all\nLet me look.>>>get_weather")
    assert not re.search(TRIGGER_PATTERN, PROMPT + "all\n")
    grammar = _grammar_text(made)
    assert "root ::= tools\n" in grammar
    lazy = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert _completes(lazy, WEATHER + SEARCH)
    assert not _takes(lazy, "all\n")
    for parallel in (False, True):
        whole = _matcher("auto", whole=True, parallel_tool_calls=parallel)
        assert _completes(whole, PROMPT + "all\nIt is sunny >>> in Paris.")
        assert _completes(whole, PROMPT + WEATHER)
        assert _completes(whole, PROMPT + "all\nLet me look." + WEATHER)
        assert not _takes(whole, PROMPT + "Sunny.")  # a recipient first, `all` or a tool


def test_tool_choice_required_is_not_lazy_and_keeps_its_pattern() -> None:
    made = functionary_v3_2_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_patterns == (TRIGGER_PATTERN,)
    assert _grammar_text(made).count(r'root ::= "<|start_header_id|>assistant<|end_header_id|>\n\n>>>"') == 1


@pytest.mark.parametrize(("tools", "tool_choice", "json_schema"), [
    (TOOLS, "none", None), ([], "auto", None), ([], "auto", RESPONSE_SCHEMA),
    (TOOLS, "none", RESPONSE_SCHEMA)],
    ids=["tool_choice none", "no tools", "response schema", "response schema, tool_choice none"])
def test_no_grammar_without_tools_to_call(tools: list[dict[str, Any]], tool_choice: str,
                                          json_schema: Any) -> None:
    made = functionary_v3_2_params(SOURCE, tools=tools, tool_choice=tool_choice, json_schema=json_schema)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_patterns == ()


def test_no_thinking_and_one_preserved_token() -> None:
    made = functionary_v3_2_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (False, "", ())
    assert made.preserved_tokens == (">>>all",)
    assert (made.additional_stops, made.message_delimiters) == ((), ())


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    ping = {"type": "function", "function": {"name": "ping"}}
    matcher = _matcher(tools=[ping])
    assert _completes(matcher, PROMPT + "ping\n{}")
    assert not _takes(matcher, PROMPT + "ping\n[]")


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "meetkai-functionary-medium-v3.2")


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_functionary_v3_2_params_are_llama_cpps(path: Path, chat_oracle: Path,
                                                oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags, preserved tokens and message delimiters, all llama.cpp's."""
    source = path.read_text()
    now = int(time.time())
    differing = {}
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = functionary_v3_2_params(
            template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        differences = format_differences(made, llama)
        if differences:
            differing[f"{case.name}{' parallel' if parallel else ''}"] = differences
    oracle_report.add("chat params: functionary-v3.2", path.stem, identical=len(requests) - len(differing),
                      total=len(requests))
    assert differing == {}


# Tools the cases do not reach: no parameters, a name the rule names clean, arguments of every JSON kind
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "ns.move_to", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "mode": {"enum": ["fast", 1]}, "tags": {"type": "array", "items": {}},
        "on": {"type": "boolean"}}, "required": ["x"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_functionary_v3_2_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, parallel: bool, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """OTHER_TOOLS, parallel calls on and off, on the template."""
    source = FORMAT_TEMPLATES[0].read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, False).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = functionary_v3_2_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                                   parallel_tool_calls=parallel)
    differences = format_differences(made, llama)
    oracle_report.add("chat params: functionary-v3.2, other tools", FORMAT_TEMPLATES[0].stem,
                      identical=int(not differences), total=1)
    assert differences == []
