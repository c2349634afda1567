"""constraintd.engine.chat.formats.cohere2moe: the chat params of llama.cpp's hand-written cohere2-moe format.

The grammars are compiled over a byte vocabulary and run on turns written the way the format writes them; the
oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template
that uses the format, on every request of PARAMS_CASES and PARALLEL_CASES, and on tools and options those
cases do not reach.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.cohere2moe import cohere2moe_params
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
PROMPT = "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
SOURCE = "<|START_TEXT|><|START_ACTION|>"  # the marks llama.cpp picks the format by
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
THOUGHT = "<|START_THINKING|>the weather first<|END_THINKING|>"


def _grammar_text(made: FormatParams) -> str:
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = cohere2moe_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def _call(name: str, arguments: str, *, call_id: str | None = '"0"') -> str:
    head = "" if call_id is None else f'"tool_call_id": {call_id}, '
    return f'{{{head}"tool_name": "{name}", "parameters": {arguments}}}'


def _action(*calls: str) -> str:
    return "<|START_ACTION|>[" + ", ".join(calls) + "]<|END_ACTION|>"


WEATHER = _call("get_weather", '{"city": "Paris"}')


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, PROMPT + THOUGHT + _action(WEATHER) + "<|END_OF_TURN_TOKEN|>")
    assert _completes(matcher, PROMPT + THOUGHT + _action(WEATHER))
    assert _completes(matcher, PROMPT + _action(_call("search", '{"query": "x"}', call_id="7")))
    # without its id, the comma after it stays (llama.cpp's grammar puts it outside the optional id)
    assert _completes(matcher, PROMPT + _action("{, " + _call("search", '{"query": "x"}', call_id=None)[1:]))
    assert not _takes(matcher, PROMPT + _action(_call("search", '{"query": "x"}', call_id=None)))
    assert not _completes(matcher, PROMPT + THOUGHT)  # a call is required
    assert not _takes(matcher, PROMPT + THOUGHT + "<|START_TEXT|>")  # no text where a call is required
    assert not _takes(matcher, PROMPT + _action(_call("get_time", '{"city": "Paris"}')))  # no such tool
    assert not _takes(matcher, PROMPT + _action(_call("get_weather", '{"town": "Paris"}')))  # not its schema
    assert not _takes(matcher, PROMPT + _action(_call("get_weather", '{"city": 3}')))
    assert not _takes(matcher, PROMPT + _action(_call("get_weather", '{"city": "Paris"}', call_id="true")))
    # the fields in their order: the id first, then the name, then the parameters
    assert not _takes(matcher, PROMPT + '<|START_ACTION|>[{"tool_name": "get_weather", "tool_call_id": "0"')
    assert not _takes(matcher, PROMPT + '<|START_ACTION|>{"tool_name": "get_weather"')  # the array's bracket


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + _action(WEATHER, _call("search", '{"query": "Paris"}', call_id='"1"'))
    assert not _takes(_matcher(), two)
    assert _completes(_matcher(parallel_tool_calls=True), two)
    assert not _completes(_matcher(parallel_tool_calls=True), PROMPT + "<|START_ACTION|>[]<|END_ACTION|>")


def test_the_thought_may_end_at_the_text_or_the_action_without_its_closing_tag() -> None:
    matcher = _matcher("auto", json_schema=RESPONSE_SCHEMA)  # not lazy: the whole turn
    assert _completes(matcher, PROMPT + "<|START_THINKING|>hm" + _action(WEATHER))
    assert _completes(matcher, PROMPT + "<|START_THINKING|>hm<|START_TEXT|>" + '{"answer": "yes"}')
    assert not _takes(matcher, PROMPT + "<|START_THINKING|>hm<|START_ACTION|>[{\"x")  # the action's JSON
    assert not _takes(matcher, PROMPT + "no marker")  # the text is between its markers


@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
def test_text_or_a_call_where_tool_choice_is_auto_and_a_schema_makes_it_whole(reasoning_format: str) -> None:
    matcher = _matcher("auto", json_schema=RESPONSE_SCHEMA, reasoning_format=reasoning_format)
    answer = '<|START_TEXT|>{"answer": "yes"}<|END_TEXT|>'
    assert _completes(matcher, PROMPT + THOUGHT + answer + "<|END_OF_TURN_TOKEN|>")
    assert _completes(matcher, PROMPT + THOUGHT + _action(WEATHER))
    assert not _takes(matcher, PROMPT + THOUGHT + "<|START_TEXT|>free text")  # the schema's JSON
    assert not _takes(matcher, PROMPT + THOUGHT + answer + _action(WEATHER))  # either, not both


def test_a_schema_alone_takes_its_json_as_the_text() -> None:
    made = cohere2moe_params(SOURCE, json_schema=RESPONSE_SCHEMA)
    assert not made.grammar_lazy and made.trigger_words == ("<|START_ACTION|>",)
    matcher = Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))
    assert _completes(matcher, PROMPT + THOUGHT + '<|START_TEXT|>{"answer": "no"}')
    assert not _takes(matcher, PROMPT + THOUGHT + "<|START_ACTION|>")


def test_tool_choice_auto_is_lazy_on_the_action_marker() -> None:
    made = cohere2moe_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<|START_ACTION|>",)
    grammar = _grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert _completes(matcher, _action(WEATHER))
    assert not _takes(matcher, "<|START_TEXT|>")
    assert not _takes(matcher, _action(WEATHER, WEATHER))  # one call: parallel calls are off


def test_tool_choice_required_is_not_lazy_and_keeps_its_trigger_word() -> None:
    made = cohere2moe_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_words == ("<|START_ACTION|>",)
    assert '\nroot ::= "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"' in _grammar_text(made)


@pytest.mark.parametrize(("tools", "tool_choice"), [(TOOLS, "none"), ([], "auto")], ids=["none", "no tools"])
def test_no_grammar_without_tools_to_call_or_a_schema(tools: list[dict[str, Any]], tool_choice: str) -> None:
    made = cohere2moe_params(SOURCE, tools=tools, tool_choice=tool_choice)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_preserved_tokens_and_message_delimiters() -> None:
    made = cohere2moe_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<|START_THINKING|>", ("<|END_THINKING|>",))
    assert len(made.preserved_tokens) == 13 and made.preserved_tokens[:2] == (
        "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
    assert made.additional_stops == ()
    roles = [role for role, _ in made.message_delimiters]
    assert roles == ["assistant", "user", "tool", "system"]  # the tool's first: the system's is its prefix


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    ping = {"type": "function", "function": {"name": "ping"}}
    matcher = _matcher(tools=[ping])
    assert _completes(matcher, PROMPT + _action(_call("ping", "{}")))
    assert not _takes(matcher, PROMPT + _action(_call("ping", "[]")))


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "Cohere2MoE")


def test_the_format_has_its_reference_template() -> None:
    assert [path.stem for path in FORMAT_TEMPLATES] == ["Cohere2MoE"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_cohere2moe_params_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags, preserved tokens and message delimiters, all llama.cpp's."""
    source = path.read_text()
    now = int(time.time())
    differing = {}
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = cohere2moe_params(
            template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        differences = format_differences(made, llama)
        if differences:
            differing[f"{case.name}{' parallel' if parallel else ''}"] = differences
    oracle_report.add("chat params: cohere2-moe", path.stem, identical=len(requests) - len(differing),
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
@pytest.mark.parametrize("schema", [False, True], ids=["no schema", "schema"])
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required", "none"])
def test_cohere2moe_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, parallel: bool, reasoning_format: str, schema: bool, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """OTHER_TOOLS, with reasoning extracted and not, with a response schema and not, on the template."""
    source = FORMAT_TEMPLATES[0].read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, schema, reasoning_format).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = cohere2moe_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                             parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if schema else None,
                             reasoning_format=reasoning_format)
    differences = format_differences(made, llama)
    oracle_report.add("chat params: cohere2-moe, other tools", FORMAT_TEMPLATES[0].stem,
                      identical=int(not differences), total=1)
    assert differences == []
