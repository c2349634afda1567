"""constraintd.engine.chat.formats.muse_glimmer: the chat params of llama.cpp's hand-written muse-glimmer
format.

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
from constraintd.engine.chat.formats.muse_glimmer import TRIGGER_PATTERN, muse_glimmer_params
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
START = "<|start|>assistant"
SOURCE = "<atem:function_calls><|eom|>"  # the marks llama.cpp picks the format by
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
THOUGHT = START + " to=self<|message|>the weather first<|eom|>"


def _grammar_text(made: FormatParams) -> str:
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = muse_glimmer_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def _call(name: str, *arguments: tuple[str, str], recipient: str = "functions") -> str:
    args = "".join(f'<atem:parameter name="{key}">{value}</atem:parameter>\n' for key, value in arguments)
    return (f' to={recipient}<|message|><atem:function_calls>\n<atem:invoke name="{name}">\n{args}'
            "</atem:invoke>\n</atem:function_calls>")


WEATHER = _call("get_weather", ("city", "Paris"))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, START + WEATHER)
    assert _completes(matcher, THOUGHT + THOUGHT + START + WEATHER)
    assert _completes(matcher, START + _call("search", ("query", "x <y> z"), ("filters", '{"max": 3}')))
    assert _completes(matcher, START + _call("search", ("filters", '{"site": "a"}'), ("query", "x")))
    assert _completes(matcher, START + _call("get_weather"))  # the arguments are not checked for presence
    assert not _completes(matcher, THOUGHT)  # a call is required
    assert not _takes(matcher, START + " to=user<|message|>Paris")  # no answer where a call is required
    assert not _takes(matcher, START + _call("get_time", ("city", "Paris")))  # no such tool
    assert not _takes(matcher, START + _call("get_weather", ("town", "Paris")))  # no such argument
    assert not _takes(matcher, START + _call("search", ("filters", '{"max": 0}')))  # not its schema
    assert not _takes(matcher, START + _call("search", ("filters", "anything")))


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = START + WEATHER + "<|eom|>" + START + _call("search", ("query", "Paris"))
    assert not _takes(_matcher(), two)
    assert _completes(_matcher(parallel_tool_calls=True), two)
    lazy = _matcher("auto", parallel_tool_calls=True)  # from the trigger on
    assert _completes(lazy, two.removeprefix(START))


def test_tool_choice_auto_is_lazy_on_a_message_to_a_tool() -> None:
    made = muse_glimmer_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == ()
    assert made.trigger_patterns == (TRIGGER_PATTERN,)
    grammar = _grammar_text(made)
    assert "root ::= tool-call\n" in grammar and "final ::=" not in grammar
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert _completes(matcher, WEATHER)
    assert not _takes(matcher, " to=user<|message|>Paris")
    assert not _takes(matcher, WEATHER + "<|eom|>")  # one call: parallel calls are off


@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
def test_a_schema_makes_the_answer_its_json_bare_or_fenced(reasoning_format: str) -> None:
    made = muse_glimmer_params(SOURCE, tools=TOOLS, json_schema=RESPONSE_SCHEMA,
                               reasoning_format=reasoning_format)
    assert not made.grammar_lazy and made.trigger_patterns == (TRIGGER_PATTERN,)
    matcher = Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))
    answer = '{"answer": "yes"}'
    assert _completes(matcher, THOUGHT + START + " to=user<|message|>" + answer)
    assert _completes(matcher, START + "<|message|>```json\n" + answer + "\n```")
    assert not _takes(matcher, START + "<|message|>free text")
    assert not _takes(matcher, START + WEATHER)  # the schema's answer, not a call


def test_an_empty_schema_is_a_response_format() -> None:
    made = muse_glimmer_params(SOURCE, json_schema={})
    assert made.writes_grammar and not made.grammar_lazy
    assert "response-format ::=" in _grammar_text(made)


def test_tool_choice_required_is_not_lazy_and_keeps_its_trigger() -> None:
    made = muse_glimmer_params(SOURCE, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_patterns == (TRIGGER_PATTERN,)
    assert "\nroot ::= (start analysis)* start tool-call\n" in _grammar_text(made)


@pytest.mark.parametrize(("tools", "tool_choice"), [(TOOLS, "none"), ([], "auto")], ids=["none", "no tools"])
def test_no_grammar_without_tools_to_call_or_a_schema(tools: list[dict[str, Any]], tool_choice: str) -> None:
    made = muse_glimmer_params(SOURCE, tools=tools, tool_choice=tool_choice)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_patterns == ()


def test_thinking_preserved_tokens_and_message_delimiters() -> None:
    made = muse_glimmer_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (True, "", ())
    assert made.preserved_tokens[:4] == ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>")
    assert len(made.preserved_tokens) == 10 and made.additional_stops == ()
    assert [role for role, _ in made.message_delimiters] == ["assistant", "user", "system", "tool"]


def test_an_answer_may_be_followed_by_a_call_where_tool_choice_is_auto() -> None:
    made = muse_glimmer_params(SOURCE, tools=TOOLS, tool_choice="auto")
    # the whole turn's grammar (the root of a lazy grammar is its trigger rules): rebuilt not lazy
    whole = FormatParams(made.arena, False, (), True, "", (), made.preserved_tokens)
    matcher = Matcher(Grammar.from_gbnf(_grammar_text(whole), BYTES))
    assert _completes(matcher, THOUGHT + START + " to=user<|message|>Paris, sunny.")
    assert _completes(matcher, START + "<|message|>Let me check.<|eom|>" + START + WEATHER)
    assert not _takes(matcher, START + "<|message|>Done.<|eot|>" + START)


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "muse-glimmer")


def test_the_format_has_its_reference_template() -> None:
    assert [path.stem for path in FORMAT_TEMPLATES] == ["muse-glimmer"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_muse_glimmer_params_are_llama_cpps(path: Path, chat_oracle: Path,
                                            oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags, preserved tokens and message delimiters, all llama.cpp's."""
    source = path.read_text()
    now = int(time.time())
    differing = {}
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = muse_glimmer_params(
            template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        differences = format_differences(made, llama)
        if differences:
            differing[f"{case.name}{' parallel' if parallel else ''}"] = differences
    oracle_report.add("chat params: muse-glimmer", path.stem, identical=len(requests) - len(differing),
                      total=len(requests))
    assert differing == {}


# Tools the cases do not reach: no parameters, a name the rule names clean, arguments of every JSON kind (a
# string-or-number enum is a string argument)
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "ns.move_to", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "mode": {"enum": ["fast", 1]}, "tags": {"type": "array", "items": {}},
        "on": {"type": "boolean"}, "any": {}, "n": {"type": ["integer", "null"]}}, "required": ["x"]}}},
    WEATHER_TOOL,
    SEARCH_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("schema", [None, RESPONSE_SCHEMA, {}], ids=["no schema", "schema", "empty schema"])
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required", "none"])
def test_muse_glimmer_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, parallel: bool, reasoning_format: str, schema: Any, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """OTHER_TOOLS, with reasoning extracted and not, with a response schema (empty too) and not."""
    source = FORMAT_TEMPLATES[0].read_text()
    request = ParamsCase(tool_choice, True, False, reasoning_format).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel)
    if schema is not None:
        request["json_schema"] = schema
    llama = run_harness(chat_oracle, request)
    made = muse_glimmer_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                               parallel_tool_calls=parallel, json_schema=schema,
                               reasoning_format=reasoning_format)
    differences = format_differences(made, llama)
    oracle_report.add("chat params: muse-glimmer, other tools", FORMAT_TEMPLATES[0].stem,
                      identical=int(not differences), total=1)
    assert differences == []
