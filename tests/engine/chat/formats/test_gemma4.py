"""constraintd.engine.chat.formats.gemma4: the chat params of llama.cpp's hand-written gemma4 format.

The oracle tests compare the format's params with llama.cpp's (tests/chat_oracle/harness.cpp) on the two
reference templates that use it: every request of PARAMS_CASES and PARALLEL_CASES, then requests that reach
the format's other branches. The grammars are compiled over a byte vocabulary and run on calls written the way
Gemma 4 writes them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats.gemma4 import gemma4_params
from tests.chat_oracle.cases import (
    SEARCH_TOOL,
    WEATHER_TOOL,
    ParamsCase,
    template_paths,
)
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import compare_case
from tests.conftest import OracleReport

TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
TURN = "<|turn>model\n"
QUOTE = '<|"|>'
FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem in (
    "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"))



# Requests PARAMS_CASES leave out: no reasoning extracted with tools (the thought rule as content), an empty
# response schema (an object all the same to this format), and tool names the rule names clean
ODD_TOOL = {"type": "function", "function": {"name": "do.it_now", "parameters": {}}}
OTHER_REQUESTS: list[tuple[ParamsCase, dict[str, Any]]] = [
    (ParamsCase("required", True, False, "none"), {}),
    (ParamsCase("auto", True, False, "none"), {}),
    (ParamsCase(None, True, False), {"json_schema": {}}),
    (ParamsCase("required", True, False), {"tools": [ODD_TOOL, WEATHER_TOOL], "parallel_tool_calls": True}),
    (ParamsCase("auto", True, False), {"tools": [ODD_TOOL]}),
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_gemma4_params_of_other_requests_are_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """Requests PARAMS_CASES leave out (every case of the format's templates is in test_chat_params.py)."""
    now = int(time.time())
    made = [compare_case(chat_oracle, path, case, now=now, **extra) for case, extra in OTHER_REQUESTS]
    same = [c for c in made if c.identical and c.same_preserved_tokens]
    oracle_report.add("chat params: gemma4, other requests", path.stem, identical=len(same), total=len(made))
    assert [c.describe() for c in made if c not in same] == []


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = gemma4_params("", tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _call(name: str, arguments: str) -> str:
    return f"<|tool_call>call:{name}{arguments}<tool_call|>"


WEATHER = _call("get_weather", "{city:" + QUOTE + "Paris" + QUOTE + "}")
THOUGHT = "<|channel>thought\nThe user wants the weather.<channel|>"


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, TURN + WEATHER)
    assert completes(matcher, WEATHER)  # the turn's opening is optional
    assert completes(matcher, TURN + THOUGHT + WEATHER)
    assert not completes(matcher, TURN)  # a call is required
    assert not takes(matcher, TURN + "Let me look." + WEATHER)  # no text before a required call
    assert not takes(matcher, TURN + _call("get_time", "{}"))  # no such tool
    assert not takes(matcher, TURN + '<|tool_call>call:get_weather("Paris")')  # arguments are a dict
    assert not takes(matcher, TURN + WEATHER + WEATHER)  # one call: parallel calls are off
    assert not takes(matcher, TURN + THOUGHT + THOUGHT)  # one thought


def test_arguments_are_any_gemma4_dict_whatever_the_tools_schema() -> None:
    matcher = _matcher()
    # llama.cpp does not constrain the arguments by the parameters' schema: any keys, any values
    nested = "{query:" + QUOTE + 'a "b" {c}' + QUOTE + ",filters:{max:3,site:null},tags:[true, -1.5e3]}"
    assert completes(matcher, TURN + _call("search", nested))
    assert completes(matcher, TURN + _call("get_weather", "{}"))
    assert completes(matcher, TURN + _call("get_weather", "{ town: 1 }"))
    assert not takes(matcher, TURN + _call("get_weather", "{city:Paris}"))  # a string has its marks
    assert not takes(matcher, TURN + _call("get_weather", "{city :1,}"))  # no trailing comma
    assert not takes(matcher, TURN + _call("get_weather", "{:1}"))  # a key is not empty
    assert not takes(matcher, TURN + _call("get_weather", "{a:1 ,b:2}"))  # no space before a comma
    # a string ends at its closing mark: one inside it closes it
    assert completes(matcher, TURN + _call("get_weather", "{city:" + QUOTE + '<|a|> "|>' + QUOTE + "}"))
    closed_early = "{city:" + QUOTE + "a" + QUOTE + "b" + QUOTE + "}"
    assert not completes(matcher, TURN + _call("get_weather", closed_early))


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = TURN + WEATHER + _call("search", "{query:" + QUOTE + "x" + QUOTE + "}")
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    assert completes(_matcher(parallel_tool_calls=True), TURN + WEATHER)


def test_tool_choice_auto_is_lazy_on_the_call_word_and_its_grammar_holds_the_calls_alone() -> None:
    made = gemma4_params("", tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<|tool_call>",)
    grammar = grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    calls = '("<|tool_call>call:" (tool-get-weather | tool-search) "<tool_call|>")?'
    assert f"\ntool-call ::= {calls}\n" in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, WEATHER)
    assert not takes(matcher, "text")
    assert not takes(matcher, WEATHER + WEATHER)


def test_no_grammar_without_tools_wanted_nor_a_schema() -> None:
    for made in (gemma4_params("", tools=TOOLS, tool_choice="none"), gemma4_params("")):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()


def test_a_response_schema_is_json_in_a_fence_after_an_optional_thought() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    made = gemma4_params("", tools=TOOLS, tool_choice="auto", json_schema=schema)
    # never lazy, and the call word still comes with the grammar, as llama.cpp gives it
    assert not made.grammar_lazy and made.trigger_words == ("<|tool_call>",)
    matcher = Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))
    assert completes(matcher, TURN + '```json\n{"answer": "Paris"}\n```')
    assert completes(matcher, THOUGHT + '```json{"answer": "Paris"}```')
    assert not takes(matcher, TURN + '{"answer": "Paris"}')  # the fence is not optional
    assert not completes(matcher, TURN + '```json{"answer": "Paris"}')  # nor its closing
    assert not takes(matcher, TURN + '```json\n{"city": "Paris"}')
    assert not takes(matcher, TURN + WEATHER)
    # an empty schema is a response format here too (llama.cpp tests it is an object, not that it holds keys)
    assert gemma4_params("", json_schema={}).writes_grammar
    assert not gemma4_params("", json_schema="text").writes_grammar


def test_a_thought_is_tagged_or_not_but_written_the_same() -> None:
    extracted = grammar_text(gemma4_params("", tools=TOOLS, tool_choice="required"))
    kept = grammar_text(gemma4_params("", tools=TOOLS, tool_choice="required", reasoning_format="none"))
    assert extracted == kept
    assert 'thought ::= "<|channel>thought" space until-5 "<channel|>"\n' in extracted


def test_thinking_tags_and_preserved_tokens() -> None:
    made = gemma4_params("")
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<|channel>thought", ("<channel|>",))
    assert made.preserved_tokens == ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>")
    assert made.additional_stops == ()
