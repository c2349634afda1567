"""constraintd.engine.chat.formats.kimi_k3: the chat params of llama.cpp's hand-written kimi-k3 format.

The grammars are compiled over a byte vocabulary and run on messages written the way the format writes them;
the oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template
that uses the format, on every request of PARAMS_CASES and PARALLEL_CASES, and on tools and options those
cases do not reach.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats.kimi_k3 import kimi_k3_params
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
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.chat_oracle.params import PARALLEL_CASES, format_differences
from tests.conftest import OracleReport

SOURCE = "<|open|><|close|><|end_of_msg|>"  # the marks llama.cpp picks the format by
MESSAGE = '<|open|>message role="assistant"<|sep|>'
THINK = "<|open|>think<|sep|>why<|close|>think<|sep|>"
CLOSE = "<|close|>message<|sep|><|end_of_msg|>"
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]



def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = kimi_k3_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _call(name: str, *arguments: tuple[str, str], attributes: str = ' index="0"') -> str:
    args = "".join(f'<|open|>argument key="{key}" type="string"<|sep|>{value}<|close|>argument<|sep|>'
                   for key, value in arguments)
    return f'<|open|>call tool="{name}"{attributes}<|sep|>{args}<|close|>call<|sep|>'


def _tools(*calls: str) -> str:
    return "<|open|>tools<|sep|>" + "".join(calls) + "<|close|>tools<|sep|>"


WEATHER = _call("get_weather", ("city", "Paris"))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, MESSAGE + THINK + _tools(WEATHER) + CLOSE)
    answer = "<|open|>response<|sep|>Let me look.<|close|>response<|sep|>"
    assert completes(matcher, MESSAGE + THINK + answer + _tools(WEATHER) + CLOSE)
    assert not completes(matcher, MESSAGE + THINK + answer + CLOSE)  # a call is required
    assert not takes(matcher, MESSAGE + THINK + _tools(_call("get_time", ("city", "Paris"))))  # no such tool
    assert not takes(matcher, MESSAGE + THINK + _tools(_call("get_weather", ("town", "Paris"))))  # nor key
    assert not completes(matcher, MESSAGE + THINK + _tools() + CLOSE)  # a section holds one call or more
    assert not completes(matcher, MESSAGE + THINK + "<|open|>tools<|sep|>" + WEATHER + CLOSE)
    assert not takes(matcher, MESSAGE + THINK + _tools(WEATHER) + CLOSE + "more")


def test_the_sections_openers_closers_and_trailer_are_optional() -> None:
    matcher = _matcher()
    assert completes(matcher, _tools(WEATHER))
    assert completes(matcher, "thinking, unopened<|close|>think<|sep|>" + _tools(WEATHER))
    assert completes(matcher, MESSAGE + "<|open|>think<|sep|>why" + _tools(WEATHER) + "<|end_of_msg|>")
    assert completes(matcher, MESSAGE + THINK + "<|open|>response<|sep|>unclosed" + _tools(WEATHER))


def test_the_think_section_ends_at_its_closer_or_at_the_responses_opener() -> None:
    matcher = _matcher()
    think, answer = "<|open|>think<|sep|>", "<|open|>response<|sep|>z<|close|>response<|sep|>"
    # unclosed, the thought runs to the response's opener, and may hold a response's closer
    assert completes(matcher, MESSAGE + think + "x<|close|>response<|sep|>y" + answer + _tools(WEATHER))
    # closed, it may not hold the response's opener
    inner = "a<|open|>response<|sep|>b<|close|>response<|sep|>c<|close|>think<|sep|>"
    assert not completes(matcher, MESSAGE + think + inner + _tools(WEATHER))


def test_arguments_come_in_any_order_and_number_their_values_any_text() -> None:
    matcher = _matcher()
    query, filters = ("query", "Paris"), ("filters", "not JSON at all")  # values are not checked
    for arguments in ((query,), (filters, query), (query, query), ()):
        assert completes(matcher, _tools(_call("search", *arguments)))
    assert completes(matcher, _tools(_call("search", ("query", "two\nlines <b>"))))
    # the tag's other attributes are skipped up to its separator
    assert completes(matcher, _tools(_call("search", query, attributes=' index="3" x="y"')))
    assert completes(matcher, _tools(_call("search", query, attributes="")))
    # (after a closed think section: an unclosed one would take any text, the calls' markers included)
    assert not takes(matcher, MESSAGE + THINK + _tools(_call("search", ("quer", "Paris"))))


def test_calls_repeat_in_the_section_whatever_parallel_calls_say() -> None:
    two = _tools(WEATHER, _call("search", ("query", "Paris")))
    assert completes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)


def test_a_tool_without_parameters_takes_no_argument() -> None:
    ping = {"type": "function", "function": {"name": "ping", "parameters": {"properties": {}}}}
    matcher = _matcher(tools=[ping])
    assert completes(matcher, _tools(_call("ping")))
    assert not takes(matcher, MESSAGE + THINK + _tools(_call("ping", ("city", "Paris"))))


def test_tool_choice_auto_is_lazy_on_the_tools_opener() -> None:
    made = kimi_k3_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ("<|open|>tools<|sep|>",)
    grammar = grammar_text(made)
    assert "root ::= kimi-k3-tool-call\n" in grammar
    # from the trigger on, the lazy grammar holds the tools section and the message's end, nothing else
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, _tools(WEATHER) + CLOSE)
    assert completes(matcher, _tools(WEATHER))
    assert not takes(matcher, "text")
    assert not takes(matcher, _tools(WEATHER) + "text")


def test_tool_choice_required_is_not_lazy_and_keeps_its_trigger_word() -> None:
    made = kimi_k3_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_words == ("<|open|>tools<|sep|>",)


@pytest.mark.parametrize(("tools", "tool_choice", "json_schema"), [
    (TOOLS, "none", None), ([], "auto", None), ([], "auto", RESPONSE_SCHEMA),
    (TOOLS, "none", RESPONSE_SCHEMA)],
    ids=["tool_choice none", "no tools", "response schema", "response schema, tool_choice none"])
def test_no_grammar_without_tools_to_call(tools: list[dict[str, Any]], tool_choice: str,
                                          json_schema: Any) -> None:
    made = kimi_k3_params(SOURCE, tools=tools, tool_choice=tool_choice, json_schema=json_schema)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_words == ()


def test_thinking_tags_preserved_tokens_and_message_delimiters() -> None:
    made = kimi_k3_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<|open|>think<|sep|>", ("<|close|>think<|sep|>",))
    assert made.preserved_tokens == ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
    assert made.message_delimiters == (
        ("assistant", '<|open|>message role="assistant"<|sep|>'),
        ("user", '<|open|>message role="user"<|sep|>'), ("tool", '<|open|>message role="tool"'),
        ("system", '<|open|>message role="system"'))


def test_properties_that_are_not_an_object_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"properties": ["a"]}}}
    with pytest.raises(NotImplementedError, match=r"^kimi-k3 tools whose parameters' properties are not an "):
        kimi_k3_params(SOURCE, tools=[tool], tool_choice="required")


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "Kimi-K3")


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_kimi_k3_params_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags, preserved tokens and message delimiters, all llama.cpp's."""
    source = path.read_text()
    now = int(time.time())
    differing = {}
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = kimi_k3_params(
            template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        differences = format_differences(made, llama)
        if differences:
            differing[f"{case.name}{' parallel' if parallel else ''}"] = differences
    oracle_report.add("chat params: kimi-k3", path.stem, identical=len(requests) - len(differing),
                      total=len(requests))
    assert differing == {}


# Tools the cases do not reach: no parameters, empty properties, a name and keys the rule names clean,
# arguments typed and not (a type list, no type, a property that is not an object)
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "ns.move_to", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "mode": {"enum": ["fast", 1]}, "tags": {"type": ["array", "null"]},
        "on.off": {"type": "boolean"}, "any": {}, "opts": {"type": "object", "properties": {
            "a": {"type": "string"}}}}, "required": ["x"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_kimi_k3_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, parallel: bool, reasoning_format: str, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """OTHER_TOOLS, with reasoning extracted and not."""
    source = FORMAT_TEMPLATES[0].read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, False, reasoning_format).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = kimi_k3_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                          parallel_tool_calls=parallel, reasoning_format=reasoning_format)
    differences = format_differences(made, llama)
    oracle_report.add("chat params: kimi-k3, other tools", FORMAT_TEMPLATES[0].stem,
                      identical=int(not differences), total=1)
    assert differences == []
