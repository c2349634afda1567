"""constraintd.engine.chat.formats.deepseek_v3_2: the chat params of llama.cpp's hand-written deepseek-v3.2
format (DeepSeek V3.2 and V4, DSML markup).

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them; the
oracle tests compare them with llama.cpp's (tests/chat_oracle/harness.cpp) on the three reference templates
that use the format: every request of PARAMS_CASES and PARALLEL_CASES (tests/chat_oracle/params.py), and
tools whose arguments reach the format's other branches.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.deepseek_v3_2 import deepseek_v3_2_params
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
from tests.chat_oracle.params import PARALLEL_CASES, ParamsComparison, format_fields
from tests.conftest import OracleReport

V3_2 = "dsml_token DSML function_calls"  # the marks of the format: V3.2 names its call block function_calls
V4 = "dsml_token DSML tool_calls"  # V4 names it tool_calls
PROMPT = "<｜Assistant｜>"
D = "｜DSML｜"
COUNT_TOOL = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {
        "n": {"type": "integer"}, "label": {"type": "string"}, "unit": {"enum": ["m", 1]},
        "note": {"type": "string"}, "size": {"type": "array"}},
    "required": ["n", "label", "unit"]}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL, COUNT_TOOL]



def _matcher(source: str = V3_2, tool_choice: str = "required", **options: Any) -> Matcher:
    made = deepseek_v3_2_params(source, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _invoke(name: str, *arguments: tuple[str, str, bool]) -> str:
    args = "\n".join(f'<{D}parameter name="{key}" string="{"true" if string else "false"}">{value}'
                     f"</{D}parameter>" for key, value, string in arguments)
    return f'<{D}invoke name="{name}">\n{args}\n</{D}invoke>'


def _block(*invokes: str, block: str = "function_calls") -> str:
    return f"<{D}{block}>\n" + "\n".join(invokes) + f"\n</{D}{block}>"


PARIS = ("city", "Paris", True)
WEATHER = _block(_invoke("get_weather", PARIS))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + WEATHER)
    assert completes(matcher, PROMPT + "Let me look.\n\n" + WEATHER)
    assert completes(matcher, PROMPT + _block(_invoke("get_weather", ("city", "Saint-\nÉtienne", True))))
    assert not completes(matcher, PROMPT)  # a call is required
    assert not completes(matcher, PROMPT + "Paris is sunny.")
    assert not takes(matcher, PROMPT + _block(_invoke("get_time", PARIS)))  # no such tool
    assert not takes(matcher, PROMPT + _block(_invoke("get_weather", ("town", "Paris", True))))
    assert not completes(matcher, PROMPT + _block(_invoke("get_weather")))  # its required argument missing
    # a string argument says string="true"; its value is any text up to the parameter's close
    assert not takes(matcher, PROMPT + _block(_invoke("get_weather", ("city", "Paris", False))))
    assert not takes(matcher, PROMPT + WEATHER + "Done.")
    # V4's block is text to V3.2, before a call still to come
    assert not completes(matcher, PROMPT + _block(_invoke("get_weather", PARIS), block="tool_calls"))


def test_a_json_argument_is_its_schemas_and_marked_not_a_string() -> None:
    matcher = _matcher()
    query = ("query", "Paris", True)
    assert completes(matcher, PROMPT + _block(_invoke("search", query, ("filters", '{"max": 3}', False))))
    assert not takes(matcher, PROMPT + _block(_invoke("search", query, ("filters", '{"max": 0}', False))))
    assert not takes(matcher, PROMPT + _block(_invoke("search", query, ("filters", "{}", True))))


def test_required_arguments_come_in_order_then_the_optional_ones_in_any_order() -> None:
    matcher = _matcher()
    n, label, unit = ("n", "3", False), ("label", "three\nlines", True), ("unit", "m", True)
    assert completes(matcher, PROMPT + _block(_invoke("count", n, label, unit)))
    assert not takes(matcher, PROMPT + _block(_invoke("count", label, n, unit)))  # the parameters' order
    size, note = ("size", "[1, 2]", False), ("note", "x", True)
    assert completes(matcher, PROMPT + _block(_invoke("count", n, label, unit, size, note)))
    assert completes(matcher, PROMPT + _block(_invoke("count", n, label, unit, note, size, note)))
    assert not takes(matcher, PROMPT + _block(_invoke("count", note, n, label, unit)))  # optional ones last
    assert not takes(matcher, PROMPT + _block(_invoke("count", ("n", "three", False))))  # an integer
    # an argument that may be a string (the enum's "m") is any text, marked a string
    assert completes(matcher, PROMPT + _block(_invoke("count", n, label, ("unit", "anything", True))))


def test_calls_repeat_in_the_block_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + _block(_invoke("get_weather", PARIS), _invoke("search", ("query", "Paris", True)))
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    assert not takes(_matcher(parallel_tool_calls=True), PROMPT + WEATHER + "\n" + WEATHER)  # one block


def _root(made: FormatParams) -> str:
    return next(line for line in grammar_text(made).splitlines() if line.startswith("root ::= "))


def test_with_thinking_on_a_thought_ends_at_its_close_or_runs_into_the_calls() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + "<think>why</think>" + WEATHER)
    assert completes(matcher, PROMPT + "<think>first, the weather\n\n" + WEATHER)
    # the text before the calls holds no block start (the lookahead that refuses <think> there writes nothing)
    assert not takes(matcher, PROMPT + f"I will write <{D}function_calls> here")
    assert completes(matcher, PROMPT + "a <think> in the text" + WEATHER)
    root = _root(deepseek_v3_2_params(V3_2, tools=TOOLS, tool_choice="required"))
    assert root.startswith(f'root ::= "{PROMPT}" ("<think>" until-') and " space tool-call | (" in root
    unreasoned = _root(deepseek_v3_2_params(V3_2, tools=TOOLS, tool_choice="required",
                                            reasoning_format="none"))
    assert unreasoned.startswith(f'root ::= "{PROMPT}" until-') and unreasoned.endswith(" space tool-call")


@pytest.mark.parametrize(("source", "thinking_off"), [(V3_2, "<think></think>"), (V4, "</think>")],
                         ids=["V3.2", "V4"])
def test_with_thinking_off_the_generation_prompts_empty_thought_is_taken(
    source: str, thinking_off: str
) -> None:
    block = "tool_calls" if source == V4 else "function_calls"
    matcher = _matcher(source, enable_thinking=False)
    call = _block(_invoke("get_weather", PARIS), block=block)
    assert completes(matcher, PROMPT + thinking_off + call)
    assert completes(matcher, PROMPT + call)
    assert completes(matcher, PROMPT + thinking_off + "Let me look.\n\n" + call)
    root = _root(deepseek_v3_2_params(source, tools=TOOLS, tool_choice="required", enable_thinking=False))
    if source == V4:
        assert root.startswith(f'root ::= "{PROMPT}" "</think>"? until-')
    else:
        assert root.startswith(f'root ::= "{PROMPT}" ("<think>" until-') and '"</think>")? until-' in root
    assert " | " not in root  # no thought runs into the calls


@pytest.mark.parametrize(("source", "word"), [(V3_2, f"<{D}function_calls>"), (V4, f"<{D}tool_calls>")],
                         ids=["V3.2", "V4"])
def test_tool_choice_auto_is_lazy_on_the_blocks_start(source: str, word: str) -> None:
    made = deepseek_v3_2_params(source, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == (word,)
    grammar = grammar_text(made)
    assert "root ::= tool-call\n" in grammar
    # from the trigger on, the lazy grammar holds the block and nothing else
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    block = word[len(D) + 1:-1]
    assert completes(matcher, _block(_invoke("get_weather", PARIS), block=block))
    assert not takes(matcher, "text")


def test_tool_choice_required_is_not_lazy_and_keeps_its_trigger_word() -> None:
    made = deepseek_v3_2_params(V3_2, tools=TOOLS, tool_choice="required")
    assert not made.grammar_lazy and made.trigger_words == (f"<{D}function_calls>",)
    assert _root(made).startswith(f'root ::= "{PROMPT}" ')


def test_tool_choice_none_and_no_tools_give_no_grammar() -> None:
    for made in (deepseek_v3_2_params(V3_2, tools=TOOLS, tool_choice="none"), deepseek_v3_2_params(V4)):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()


def test_a_response_schema_is_json_in_a_fence_after_the_reasoning() -> None:
    made = deepseek_v3_2_params(V3_2, json_schema=RESPONSE_SCHEMA)
    assert not made.grammar_lazy and made.trigger_words == (f"<{D}function_calls>",)
    matcher = Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))
    assert completes(matcher, PROMPT + '```json\n{"answer": "Paris"}\n```')
    assert completes(matcher, PROMPT + '<think>why</think>```json{"answer": "Paris"}```')
    assert not takes(matcher, PROMPT + '{"answer"')  # the fence is not optional
    assert not takes(matcher, PROMPT + '```json\n{"confidence": 1}')  # the answer is required
    # an empty schema is a response format too
    assert deepseek_v3_2_params(V3_2, json_schema={}).writes_grammar


def test_a_response_schema_with_tools_auto_is_lazy_on_an_empty_block() -> None:
    # llama.cpp's own reading: the grammar is lazy where tools are offered and not required, and the
    # response-format parser is no trigger rule: the root is the call block, with tools or none
    made = deepseek_v3_2_params(V3_2, tools=[WEATHER_TOOL], tool_choice="none", json_schema=RESPONSE_SCHEMA)
    assert made.grammar_lazy
    grammar = grammar_text(made)
    assert f'tool-call ::= "<{D}function_calls>" space space "</{D}function_calls>"\n' in grammar
    assert "response-format" not in grammar


@pytest.mark.parametrize(("source", "block"), [(V3_2, "function_calls"), (V4, "tool_calls")],
                         ids=["V3.2", "V4"])
def test_thinking_tags_and_preserved_tokens(source: str, block: str) -> None:
    made = deepseek_v3_2_params(source)
    assert (made.supports_thinking, made.thinking_start_tag) == (True, "<think>")
    assert made.thinking_end_tags == ("</think>", f"<{D}{block}>")
    assert made.preserved_tokens == (D, "<think>", "</think>")


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"format": "date"}}},
    {"type": "object", "properties": {"a": {"type": "string", "allOf": [{"minLength": 1}]}}},
], ids=["$ref", "format", "allOf"])
def test_arguments_not_ported_are_refused(parameters: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(NotImplementedError, match=r"^deepseek-v3\.2: tagged arguments "):
        deepseek_v3_2_params(V3_2, tools=[tool], tool_choice="required")


# --- against llama.cpp

FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem in (
    "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4-Flash-0731", "deepseek-ai-DeepSeek-V4"))


def _compare(binary: Path, path: Path, case: ParamsCase, *, parallel: bool) -> ParamsComparison:
    source = path.read_text()
    llama = run_harness(binary, case.request(source, now=int(time.time()), parallel_tool_calls=parallel))
    made = deepseek_v3_2_params(
        template_source(source), tools=case.tool_list or [], tool_choice=case.llama_tool_choice,
        parallel_tool_calls=parallel, json_schema=RESPONSE_SCHEMA if case.schema else None,
        reasoning_format=case.reasoning_format, enable_thinking=case.thinking)
    return ParamsComparison(path.stem, case.name, format_fields(made), llama, None, made.preserved_tokens)


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["PARAMS_CASES", "PARALLEL_CASES"])
def test_deepseek_v3_2_params_are_llama_cpps(
    path: Path, parallel: bool, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """Every request of PARAMS_CASES (PARALLEL_CASES: parallel calls on): grammar, lazy flag, triggers,
    stops, thinking tags and preserved tokens are llama.cpp's, byte for byte."""
    comparisons = [_compare(chat_oracle, path, case, parallel=parallel)
                   for case in (PARALLEL_CASES if parallel else PARAMS_CASES)]
    same = [c for c in comparisons if c.identical and c.same_preserved_tokens]
    oracle_report.add("chat params: deepseek-v3.2", path.stem, identical=len(same), total=len(comparisons))
    assert [c.describe() for c in comparisons if not c.identical] == []
    assert [c.case for c in comparisons if not c.same_preserved_tokens] == []


# Tools whose arguments reach the format's other branches: no arguments, optional ones only, values that may
# be a string or not (anyOf, type lists, enums, const, no schema), JSON values of each kind, three required
# arguments, and a name the rule names clean
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "string", "object", "array", "number", "boolean"]},
        "code": {"pattern": "^[a-z]+$"}}}}},
    {"type": "function", "function": {"name": "move.fast", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer"}, "z": {"type": "string"}, "mode": {"const": "fast"},
        "scale": {"enum": [1, 2]}, "size": {"type": "array"}, "any": {}, "ok": {"type": "boolean"}},
        "required": ["x", "y", "z"]}}},
    WEATHER_TOOL,
]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no thinking"])
def test_deepseek_v3_2_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, thinking: bool, chat_oracle: Path,
    oracle_report: OracleReport,
) -> None:
    """The format's grammar with OTHER_TOOLS, lazy (tool_choice auto) and not (required): llama.cpp's byte
    for byte, with its lazy flag, triggers and preserved tokens."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, thinking, False).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = deepseek_v3_2_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                                parallel_tool_calls=parallel, enable_thinking=thinking)
    grammar = grammar_text(made)
    oracle_report.add("chat params: deepseek-v3.2, other tools", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"]
    assert [["word", word] for word in made.trigger_words] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]
    assert list(made.preserved_tokens) == llama["preserved_tokens"]


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
def test_an_empty_response_schema_is_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """An empty response schema is a response format to the format (not to qwen3-coder): llama.cpp's grammar
    byte for byte, not lazy, with the block's start as its trigger word."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(None, True, False).request(
        source, now=int(time.time()), json_schema={}))
    made = deepseek_v3_2_params(template_source(source), json_schema={})
    grammar = grammar_text(made)
    oracle_report.add("chat params: deepseek-v3.2, empty schema", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"] is False
    assert [["word", word] for word in made.trigger_words] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]
