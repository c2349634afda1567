"""constraintd.engine.chat.formats.gpt_oss: the chat params of llama.cpp's hand-written gpt-oss format.

The grammars are compiled over a byte vocabulary and run on messages written the way the format writes them;
the oracle tests compare the params with llama.cpp's (tests/chat_oracle/harness.cpp) on the reference template
that uses the format, on every request of PARAMS_CASES and PARALLEL_CASES, and on tools and options those
cases do not reach.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.gpt_oss import TRIGGER_PATTERNS, gpt_oss_params
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
SOURCE = "<|channel|>"  # the mark llama.cpp picks the format by
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]
START = "<|start|>assistant"
WEATHER_ARGS = '{"city": "Paris"}'


def _grammar_text(made: FormatParams) -> str:
    return format_grammar(made).grammar


def _matcher(tool_choice: str = "required", **options: Any) -> Matcher:
    made = gpt_oss_params(SOURCE, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def _in_role(name: str, arguments: str, *, channel: str = "commentary", constrain: str = " <|constrain|>json"
             ) -> str:
    return f"{START} to=functions.{name}<|channel|>{channel}{constrain}<|message|>{arguments}"


def _in_channel(name: str, arguments: str, *, channel: str = "commentary", constrain: str = "") -> str:
    return f"{START}<|channel|>{channel} to=functions.{name}{constrain}<|message|>{arguments}"


ANALYSIS = f"{START}<|channel|>analysis<|message|>The weather first.<|end|>"


def test_a_required_call_is_taken_in_either_header_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert _completes(matcher, _in_role("get_weather", WEATHER_ARGS))
    assert _completes(matcher, _in_role("get_weather", WEATHER_ARGS, channel="analysis", constrain=" json"))
    assert _completes(matcher, _in_role("get_weather", WEATHER_ARGS, constrain=""))
    assert _completes(matcher, _in_channel("search", '{"query": "x"}'))
    assert _completes(matcher, _in_channel("get_weather", WEATHER_ARGS, constrain="<|constrain|>json"))
    assert _completes(matcher, ANALYSIS + _in_channel("get_weather", WEATHER_ARGS))
    assert not _completes(matcher, START)  # a call is required
    assert not _takes(matcher, START + "<|channel|>final<|message|>Paris.")  # no answer where one is required
    assert not _takes(matcher, _in_role("get_time", WEATHER_ARGS))  # no such tool
    assert not _takes(matcher, _in_role("get_weather", '{"town": "Paris"}'))  # not its schema
    assert not _takes(matcher, _in_role("get_weather", '{"city": 3}'))
    assert not _takes(matcher, _in_role("get_weather", WEATHER_ARGS, channel="final"))
    assert not _takes(matcher, _in_role("get_weather", WEATHER_ARGS, constrain=" <|constrain|>"))  # no type
    assert not _takes(matcher, _in_role("get_weather", WEATHER_ARGS) + "<|call|>")  # nothing after the call


def test_messages_before_the_last_are_analysis_or_preambles() -> None:
    matcher = _matcher()
    preamble = f"{START}<|channel|>commentary<|message|>Looking it up.<|end|>"
    stray = f"{START}<|channel|>commentary to=assistant<|channel|>analysis<|message|>hm<|end|>"
    call = _in_role("get_weather", WEATHER_ARGS)
    assert _completes(matcher, ANALYSIS + preamble + ANALYSIS + call)
    assert _completes(matcher, stray + call)
    assert not _takes(matcher, f"{START}<|channel|>final<|message|>Paris.<|end|>" + call)
    # each message opens with its header
    assert not _takes(matcher, f"{START}<|channel|>analysis<|message|>a<|end|>b")


def test_tool_choice_auto_also_takes_the_final_answer_and_is_lazy_on_the_call_alone() -> None:
    made = gpt_oss_params(SOURCE, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == () and made.trigger_patterns == TRIGGER_PATTERNS
    grammar = _grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    lazy = Matcher(Grammar.from_gbnf(grammar, BYTES))
    call = _in_role("get_weather", WEATHER_ARGS).removeprefix(START)
    assert _completes(lazy, call)
    assert _completes(lazy, _in_channel("get_weather", WEATHER_ARGS).removeprefix(START))
    assert not _takes(lazy, START)
    assert not _takes(lazy, call + call)  # one call: the format does not read parallel_tool_calls
    # the patterns llama.cpp's lazy sampler matches the text against find a call's recipient in either header
    assert re.search(TRIGGER_PATTERNS[2], START + " to=functions.get_weather")
    assert re.search(TRIGGER_PATTERNS[3], START + "<|channel|>commentary to=functions.get_weather")
    answer = START + "<|channel|>final<|message|>to"
    assert not any(re.search(pattern, answer) for pattern in TRIGGER_PATTERNS)


def test_the_whole_grammar_of_tool_choice_auto_takes_an_answer_or_a_call() -> None:
    made = gpt_oss_params(SOURCE, tools=TOOLS, tool_choice="auto")
    whole = Matcher(Grammar.from_gbnf(_grammar_text(
        FormatParams(made.arena, False, (), True, "", (), ())), BYTES))
    assert _completes(whole, ANALYSIS + START + "<|channel|>final<|message|>It is sunny.")
    assert _completes(whole, START + "<|channel|>commentary<|channel|>final<|message|>It is sunny.")
    assert _completes(whole, _in_channel("get_weather", WEATHER_ARGS))


def test_a_response_schema_is_the_final_channel_s_json_tools_or_not() -> None:
    for tools in ([], TOOLS):
        made = gpt_oss_params(SOURCE, tools=tools, tool_choice="auto", json_schema=RESPONSE_SCHEMA)
        assert not made.grammar_lazy and made.trigger_patterns == TRIGGER_PATTERNS
        matcher = Matcher(Grammar.from_gbnf(_grammar_text(made), BYTES))
        for header in ("<|channel|>final", "<|channel|>final <|constrain|>json", "<|channel|>final json"):
            assert _completes(matcher, f"{ANALYSIS}{START}{header}<|message|>" + '{"answer": "yes"}')
        assert not _takes(matcher, START + "<|channel|>final<|message|>yes")
        assert not _takes(matcher, _in_role("get_weather", WEATHER_ARGS))


def test_reasoning_extracted_or_not_gives_the_same_grammar() -> None:
    extracted = _grammar_text(gpt_oss_params(SOURCE, tools=TOOLS, tool_choice="required"))
    unextracted = _grammar_text(gpt_oss_params(SOURCE, tools=TOOLS, tool_choice="required",
                                               reasoning_format="none"))
    assert extracted == unextracted
    assert 'analysis ::= ("<|channel|>commentary" " to=assistant"?)? "<|channel|>analysis<|message|>" ' \
        "message-content end\n" in extracted


@pytest.mark.parametrize(("tools", "tool_choice"), [(TOOLS, "none"), ([], "auto"), ([], "required")],
                         ids=["tool_choice none", "no tools", "no tools, required"])
def test_no_grammar_without_tools_to_call_or_a_schema(tools: list[dict[str, Any]], tool_choice: str) -> None:
    made = gpt_oss_params(SOURCE, tools=tools, tool_choice=tool_choice)
    assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
    assert not made.grammar_lazy and made.trigger_patterns == ()


def test_thinking_tags_preserved_tokens_and_message_delimiters() -> None:
    made = gpt_oss_params(SOURCE)
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<|channel|>analysis<|message|>", ("<|end|>",))
    assert made.preserved_tokens == ("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>")
    assert made.message_delimiters == (
        ("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>developer"),
        ("system", "<|start|>system"), ("tool", "<|start|>functions"))


def test_a_tool_without_parameters_takes_an_empty_object() -> None:
    ping = {"type": "function", "function": {"name": "ping"}}
    matcher = _matcher(tools=[ping])
    assert _completes(matcher, _in_role("ping", "{}"))
    assert not _takes(matcher, _in_role("ping", "[]"))


FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem == "openai-gpt-oss-120b")


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_gpt_oss_params_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every request of PARAMS_CASES and PARALLEL_CASES: the grammar byte for byte, the lazy flag, triggers,
    additional stops, thinking tags, preserved tokens and message delimiters, all llama.cpp's."""
    source = path.read_text()
    now = int(time.time())
    differing = {}
    requests = [(case, False) for case in PARAMS_CASES] + [(case, True) for case in PARALLEL_CASES]
    for case, parallel in requests:
        llama = run_harness(chat_oracle, case.request(source, now=now, parallel_tool_calls=parallel))
        made = gpt_oss_params(
            template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
            parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
            reasoning_format=case.reasoning_format)
        differences = format_differences(made, llama)
        if differences:
            differing[f"{case.name}{' parallel' if parallel else ''}"] = differences
    oracle_report.add("chat params: gpt-oss", path.stem, identical=len(requests) - len(differing),
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
@pytest.mark.parametrize("json_schema", [None, RESPONSE_SCHEMA], ids=["no schema", "schema"])
@pytest.mark.parametrize("reasoning_format", ["auto", "none"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_gpt_oss_grammars_of_other_tools_are_llama_cpps(
    tool_choice: str, reasoning_format: str, json_schema: Any, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """OTHER_TOOLS, with reasoning extracted and not, with a response schema and not, on the template."""
    source = FORMAT_TEMPLATES[0].read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, json_schema is not None, reasoning_format
                                                ).request(source, now=int(time.time()), tools=OTHER_TOOLS))
    made = gpt_oss_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                          json_schema=json_schema, reasoning_format=reasoning_format)
    differences = format_differences(made, llama)
    oracle_report.add("chat params: gpt-oss, other tools", FORMAT_TEMPLATES[0].stem,
                      identical=int(not differences), total=1)
    assert differences == []
