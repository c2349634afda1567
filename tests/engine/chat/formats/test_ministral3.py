"""constraintd.engine.chat.formats.ministral3: the chat params of llama.cpp's hand-written ministral-3 format.

The oracle tests compare the format's params with llama.cpp's (tests/chat_oracle/harness.cpp) on the two
reference templates that use it: every request of PARAMS_CASES and PARALLEL_CASES, then requests that reach
the format's other branches. The grammars are compiled over a byte vocabulary and run on calls written the way
Ministral 3 writes them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats.ministral3 import ministral3_params
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
FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem in (
    "mistralai-Ministral-3-14B-Reasoning-2512", "unsloth-mistral-Devstral-Small-2507"))



# Requests PARAMS_CASES leave out: no reasoning extracted with tools, an empty response schema (none at all to
# this format), a tool without parameters (an empty object's schema) and tool names the rule names clean
BARE_TOOL = {"type": "function", "function": {"name": "do.it_now"}}
OTHER_REQUESTS: list[tuple[ParamsCase, dict[str, Any]]] = [
    (ParamsCase("required", True, False, "none"), {}),
    (ParamsCase("auto", True, False, "none"), {}),
    (ParamsCase(None, True, False), {"json_schema": {}}),
    (ParamsCase("required", True, False), {"tools": [BARE_TOOL, WEATHER_TOOL], "parallel_tool_calls": True}),
    (ParamsCase("auto", True, False), {"tools": [BARE_TOOL]}),
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_ministral3_params_of_other_requests_are_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """Requests PARAMS_CASES leave out (every case of the format's templates is in test_chat_params.py)."""
    now = int(time.time())
    made = [compare_case(chat_oracle, path, case, now=now, **extra) for case, extra in OTHER_REQUESTS]
    same = [c for c in made if c.identical and c.same_preserved_tokens]
    oracle_report.add("chat params: ministral-3, other requests", path.stem, identical=len(same),
                      total=len(made))
    assert [c.describe() for c in made if c not in same] == []


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = ministral3_params("", tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _call(name: str, arguments: str) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{arguments}"


WEATHER = _call("get_weather", '{"city": "Paris"}')
THOUGHT = "[THINK]The user wants the weather.[/THINK]"


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, WEATHER)
    assert completes(matcher, THOUGHT + "\nLet me look. " + WEATHER)  # thought and text before the call
    assert not completes(matcher, "Let me look.")  # a call is required
    assert not takes(matcher, _call("get_time", "{}"))  # no such tool
    assert not takes(matcher, "[TOOL_CALLS]get_weather{")  # the arguments follow [ARGS]
    assert not takes(matcher, _call("get_weather", '{"town": "Paris"}'))  # the parameters' schema
    assert not takes(matcher, _call("get_weather", '{"city": 1}'))
    assert not completes(matcher, _call("get_weather", "{}"))  # its required parameter
    assert completes(matcher, _call("search", '{"query": "x", "filters": {"max": 3}}'))
    assert not takes(matcher, _call("search", '{"query": "x", "filters": {"max": 0}}'))
    assert not takes(matcher, WEATHER + " Done.")


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = WEATHER + _call("search", '{"query": "x"}')
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    assert not takes(_matcher(parallel_tool_calls=True), WEATHER + " " + WEATHER)  # back to back


def test_tool_choice_auto_is_lazy_on_the_call_word_and_its_grammar_holds_the_calls_alone() -> None:
    made = ministral3_params("", tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("[TOOL_CALLS]",)
    grammar = grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    assert '\ntool-call ::= ("[TOOL_CALLS]" (tool-get-weather | tool-search))?\n' in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, WEATHER)
    assert not takes(matcher, "text")
    assert not takes(matcher, WEATHER + WEATHER)


def test_no_grammar_without_tools_wanted_nor_a_schema() -> None:
    for made in (ministral3_params("", tools=TOOLS, tool_choice="none"), ministral3_params(""),
                 ministral3_params("", json_schema={})):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()


def test_a_response_schema_is_json_in_a_fence_after_an_optional_thought() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    made = ministral3_params("", json_schema=schema)
    # not lazy, and the call word still comes with the grammar, as llama.cpp gives it
    assert not made.grammar_lazy and made.trigger_words == ("[TOOL_CALLS]",)
    matcher = Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))
    assert completes(matcher, '```json\n{"answer": "Paris"}\n```')
    assert completes(matcher, THOUGHT + '\n```json{"answer": "Paris"}```')
    assert not takes(matcher, '{"answer": "Paris"}')  # the fence is not optional
    assert not completes(matcher, '```json{"answer": "Paris"}')  # nor its closing
    assert not takes(matcher, '```json\n{"city": "Paris"}')
    unreasoned = ministral3_params("", json_schema=schema, reasoning_format="none")
    assert not takes(Matcher(Grammar.from_gbnf(grammar_text(unreasoned), BYTES)), THOUGHT)


def test_a_response_schema_with_tools_auto_is_lazy_with_no_trigger_rule() -> None:
    # llama.cpp's own reading: lazy where tools come with tool_choice auto, and the response-format parser
    # has no trigger rule, so the root is empty
    made = ministral3_params("", tools=TOOLS, json_schema={"type": "string"})
    assert made.grammar_lazy and made.trigger_words == ("[TOOL_CALLS]",)
    assert grammar_text(made).startswith("root ::= \n")


def test_thinking_tags_and_preserved_tokens() -> None:
    made = ministral3_params("")
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "[THINK]", ("[/THINK]",))
    assert made.preserved_tokens == ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]")
    assert made.additional_stops == ()
