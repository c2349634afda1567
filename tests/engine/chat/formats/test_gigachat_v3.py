"""constraintd.engine.chat.formats.gigachat_v3: the chat params of llama.cpp's hand-written gigachat-v3 format
(GigaChat 3, a call as a JSON message of its own).

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them; the
oracle tests compare them with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template that
uses the format: every request of PARAMS_CASES and PARALLEL_CASES (tests/chat_oracle/params.py), and tools
with other arguments.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.gigachat_v3 import TOOL_CALL_START, gigachat_v3_params
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
SOURCE = "<|role_sep|> <|message_sep|> <|function_call|>"  # the marks of the format
PROMPT = "assistant<|role_sep|>\n"
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
WEATHER = TOOL_CALL_START + '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def _grammar_text(made: FormatParams) -> str:
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = gigachat_v3_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, PROMPT + WEATHER)
    assert _completes(matcher, PROMPT + "Let me look." + WEATHER)
    assert _completes(matcher, PROMPT + TOOL_CALL_START + '{ "name" : "search" , "arguments" : '
                      '{"query": "q", "filters": {"max": 3}} }')
    assert not _completes(matcher, PROMPT)  # a call is required
    assert not _completes(matcher, PROMPT + "Paris is sunny.")
    assert not _takes(matcher, PROMPT + TOOL_CALL_START + '{"name": "get_time"')  # no such tool
    assert not _takes(matcher, PROMPT + TOOL_CALL_START + '{"arguments": {}')  # the name first
    assert not _takes(matcher, PROMPT + TOOL_CALL_START + '{"name": "get_weather", "arguments": {"town"')
    assert not _takes(matcher, PROMPT + TOOL_CALL_START + '{"name": "search", "arguments": {"query": "q", '
                      '"filters": {"max": 0}')  # the parameters' schema
    assert not _takes(matcher, PROMPT + WEATHER + "Done.")


def test_one_call_at_most_whatever_parallel_calls_say() -> None:
    two = PROMPT + WEATHER + WEATHER
    assert not _takes(_matcher(), two)
    assert not _takes(_matcher(parallel_tool_calls=True), two)
    assert _grammar_text(gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="required")) == _grammar_text(
        gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="required", parallel_tool_calls=True))


def test_tool_choice_auto_is_lazy_on_the_calls_start() -> None:
    made = gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == (TOOL_CALL_START,)
    grammar = _grammar_text(made)
    assert "root ::= tool-call-root\n" in grammar and "tool-call-root ::= tool-call?\n" in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert _completes(matcher, WEATHER)
    assert not _takes(matcher, "text")


def test_tool_choice_required_is_not_lazy() -> None:
    made = gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_words == (TOOL_CALL_START,)


def test_tool_choice_none_no_tools_and_a_response_schema_give_no_grammar() -> None:
    for made in (gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="none"), gigachat_v3_params(SOURCE),
                 gigachat_v3_params(SOURCE, json_schema=RESPONSE_SCHEMA)):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()
    # a response schema with tools is not read: the tools' grammar alone
    with_schema = gigachat_v3_params(SOURCE, tools=TOOLS, tool_choice="auto", json_schema=RESPONSE_SCHEMA)
    assert _grammar_text(with_schema) == _grammar_text(gigachat_v3_params(SOURCE, tools=TOOLS))


def test_no_thinking_and_the_preserved_tokens() -> None:
    made = gigachat_v3_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (False, "", ())
    assert made.preserved_tokens == ("<|message_sep|>\n\n", "<|role_sep|>\n")
    assert made.additional_stops == () and made.message_delimiters == ()


# --- against llama.cpp

FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "GigaChat3-10B-A1.8B")


def _compare(binary: Path, path: Path, case: ParamsCase, *, parallel: bool) -> ParamsComparison:
    source = path.read_text()
    llama = run_harness(binary, case.request(source, now=int(time.time()), parallel_tool_calls=parallel))
    made = gigachat_v3_params(
        template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
        parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
        reasoning_format=case.reasoning_format)
    assert llama["message_delimiters"] == []
    return ParamsComparison(path.stem, case.name, format_fields(made), llama, None, made.preserved_tokens)


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["PARAMS_CASES", "PARALLEL_CASES"])
def test_gigachat_v3_params_are_llama_cpps(
    path: Path, parallel: bool, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """Every request of PARAMS_CASES (PARALLEL_CASES: parallel calls on): grammar, lazy flag, triggers,
    stops, thinking tags and preserved tokens are llama.cpp's, byte for byte."""
    comparisons = [_compare(chat_oracle, path, case, parallel=parallel)
                   for case in (PARALLEL_CASES if parallel else PARAMS_CASES)]
    same = [c for c in comparisons if c.identical and c.same_preserved_tokens]
    oracle_report.add("chat params: gigachat-v3", path.stem, identical=len(same), total=len(comparisons))
    assert [c.describe() for c in comparisons if not c.identical] == []
    assert [c.case for c in comparisons if not c.same_preserved_tokens] == []


# Tools with other parameters: none, an empty object, alternatives and nested objects (the template cannot
# render a type list), and a name the rule names clean
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "move.fast", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "tag": {"anyOf": [{"type": "null"}, {"type": "string"}]},
        "pair": {"type": "array"},
        "box": {"type": "object", "properties": {"w": {"type": "integer"}}, "required": ["w"]}},
        "required": ["x"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_gigachat_v3_grammars_of_other_tools_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, chat_oracle: Path, oracle_report: OracleReport,
) -> None:
    """The format's grammar with OTHER_TOOLS, lazy (tool_choice auto) and not (required): llama.cpp's byte
    for byte, with its lazy flag, triggers and preserved tokens."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, False).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = gigachat_v3_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                              parallel_tool_calls=parallel)
    grammar = _grammar_text(made)
    oracle_report.add("chat params: gigachat-v3, other tools", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"]
    assert [["word", word] for word in made.trigger_words] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]
    assert list(made.preserved_tokens) == llama["preserved_tokens"]
