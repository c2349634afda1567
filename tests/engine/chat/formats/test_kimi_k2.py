"""constraintd.engine.chat.formats.kimi_k2: the chat params of llama.cpp's hand-written kimi-k2 format.

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them; the
oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the three reference
templates that use the format, on every request of PARAMS_CASES and PARALLEL_CASES, and on tools and options
those cases do not reach.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats.kimi_k2 import kimi_k2_params
from tests.chat_oracle.cases import (
    RESPONSE_SCHEMA,
    SEARCH_TOOL,
    WEATHER_TOOL,
    ParamsCase,
    template_paths,
)
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import compare_case
from tests.conftest import OracleReport

PROMPT = "<|im_assistant|>assistant<|im_middle|>"
SOURCE = "<|tool_calls_section_begin|><|tool_call_begin|>"  # the marks llama.cpp picks the format by
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]



def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = kimi_k2_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _call(name: str, arguments: str, *, index: str = "0", end: bool = True) -> str:
    return (f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{arguments}"
            + ("<|tool_call_end|>" if end else ""))


def _section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "".join(calls) + "<|tool_calls_section_end|>"


WEATHER = _call("get_weather", '{"city": "Paris"}')


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + _section(WEATHER))
    search = _call("search", '{"query": "x"}', index="17")
    assert completes(matcher, PROMPT + "Let me look.\n" + _section(search))
    assert not completes(matcher, PROMPT)  # a call is required
    assert not completes(matcher, PROMPT + "Paris.")
    assert not takes(matcher, PROMPT + _section(_call("get_time", '{"city": "Paris"}')))  # no such tool
    assert not takes(matcher, PROMPT + _section(_call("get_weather", '{"town": "Paris"}')))  # not its schema
    assert not takes(matcher, PROMPT + _section(_call("get_weather", '{"city": 3}')))
    assert not takes(matcher, PROMPT + _section(_call("get_weather", '{"city": "Paris"}', index="x")))
    assert not takes(matcher, PROMPT + _section(_call("get_weather", '{"city": "Paris"}', index="")))
    assert not takes(matcher, PROMPT + _section(_call("search", '{"query": "x", "filters": {"max": 0}}')))
    assert not takes(matcher, PROMPT + _section(WEATHER) + "Done.")  # nothing after the section


def test_the_sections_markers_and_the_calls_end_are_optional() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + WEATHER)
    assert completes(matcher, PROMPT + _call("get_weather", '{"city": "Paris"}', end=False))
    assert completes(matcher, PROMPT + "<|tool_calls_section_begin|>" + WEATHER)
    assert completes(matcher, PROMPT + WEATHER + "<|tool_calls_section_end|>")
    # the call's own marker is not: the arguments' marker needs its call id before it
    assert not takes(matcher, PROMPT + "<|tool_calls_section_begin|>functions.get_weather:0")


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + _section(WEATHER, _call("search", '{"query": "Paris"}', index="1"))
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    assert not completes(_matcher(parallel_tool_calls=True), PROMPT)  # still at least one
    lazy = _matcher("auto", parallel_tool_calls=True)  # from the first call's marker on
    assert completes(lazy, two.removeprefix(PROMPT + "<|tool_calls_section_begin|>"))


def test_reasoning_may_end_at_a_call_without_its_closing_tag() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + "<think>the weather first</think>" + _section(WEATHER))
    assert completes(matcher, PROMPT + "<think>the weather first" + _section(WEATHER))
    assert completes(matcher, PROMPT + "<think>the weather first" + WEATHER)
    assert completes(matcher, PROMPT + "<think>why</think>Sure." + WEATHER)
    # the text before the calls holds no call marker
    assert not takes(matcher, PROMPT + "I will write <|tool_call_begin|>functions.other")


def test_reasoning_is_in_the_grammar_only_where_it_is_extracted() -> None:
    extracted = grammar_text(kimi_k2_params(SOURCE, tools=TOOLS, tool_choice="required"))
    unextracted = grammar_text(kimi_k2_params(SOURCE, tools=TOOLS, tool_choice="required",
                                               reasoning_format="none"))
    assert '("<think>" until-3 "</think>"?)?' in extracted
    assert "<think>" not in unextracted


def test_tool_choice_auto_is_lazy_on_the_call_marker() -> None:
    made = kimi_k2_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<|tool_call_begin|>",)
    grammar = grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    # from the trigger on, the lazy grammar holds the calls and nothing else; none is required there
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, WEATHER + "<|tool_calls_section_end|>")
    assert completes(matcher, "<|tool_calls_section_end|>")
    assert not takes(matcher, "text")
    assert not takes(matcher, WEATHER + WEATHER)  # one call: parallel calls are off


def test_tool_choice_required_is_not_lazy_and_keeps_its_trigger_word() -> None:
    made = kimi_k2_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_words == ("<|tool_call_begin|>",)
    assert grammar_text(made).count("root ::= \"<|im_assistant|>assistant<|im_middle|>\"") == 1


@pytest.mark.parametrize(("tools", "tool_choice", "json_schema"), [
    (TOOLS, "none", None), ([], "auto", None), ([], "auto", RESPONSE_SCHEMA),
    (TOOLS, "none", RESPONSE_SCHEMA)],
    ids=["tool_choice none", "no tools", "response schema", "response schema, tool_choice none"])
def test_no_grammar_without_tools_to_call(tools: list[dict[str, Any]], tool_choice: str,
                                          json_schema: Any) -> None:
    made = kimi_k2_params(SOURCE, tools=tools, tool_choice=tool_choice, json_schema=json_schema)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_and_preserved_tokens() -> None:
    made = kimi_k2_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<think>", ("</think>",))
    assert made.preserved_tokens == (
        "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>")


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    ping = {"type": "function", "function": {"name": "ping"}}
    matcher = _matcher(tools=[ping])
    assert completes(matcher, PROMPT + _call("ping", "{}"))
    assert not takes(matcher, PROMPT + _call("ping", "[]"))


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem in (
    "Kimi-K2-Instruct", "Kimi-K2-Thinking", "moonshotai-Kimi-K2"))


# Tools the cases do not reach: no parameters, a name the rule names clean, arguments of every JSON kind
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "ns.move_to", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "mode": {"enum": ["fast", 1]}, "tags": {"type": "array", "items": {}},
        "on": {"type": "boolean"}}, "required": ["x"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_kimi_k2_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, parallel: bool, reasoning_format: str, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """OTHER_TOOLS, with reasoning extracted and not, on the first template of the format (every case of
    its templates is in test_chat_params.py)."""
    case = ParamsCase(tool_choice, True, False, reasoning_format)
    made = compare_case(chat_oracle, FORMAT_TEMPLATES[0], case, now=int(time.time()), tools=OTHER_TOOLS,
                        parallel_tool_calls=parallel)
    same = made.identical and made.same_preserved_tokens
    oracle_report.add("chat params: kimi-k2, other tools", FORMAT_TEMPLATES[0].stem, identical=int(same),
                      total=1)
    assert same, made.describe()
