"""constraintd.engine.chat.formats.qwen3_coder: the chat params of llama.cpp's hand-written qwen3-coder
format.

The grammars are compiled over a byte vocabulary and run on calls written the way the format writes them; the
oracle test compares them with llama.cpp's (tests/chat_oracle/harness.cpp) on the four reference templates
that use the format, with tools whose arguments reach every branch (test_chat_params.py compares the cases of
PARAMS_CASES).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine import Grammar, Matcher
from constraintd.engine.chat.formats.qwen3_coder import qwen3_coder_params, value_types
from constraintd.engine.chat.templates.prompt import template_source
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import SEARCH_TOOL, WEATHER_TOOL, ParamsCase, template_paths
from tests.chat_oracle.grammars import BYTES, completes, format_matcher, grammar_text, takes
from tests.conftest import OracleReport

CODER = "<tool_call><function=<parameter="  # the marks of the format, no <think>: Qwen3-Coder itself
THINKING = CODER + "<think>"  # Qwen3.5, Nemotron Nano 3, StepFun-3.5-Flash
PROMPT = "<|im_start|>assistant\n"
COUNT_TOOL = {"type": "function", "function": {"name": "count", "parameters": {
    "type": "object", "properties": {
        "n": {"type": "integer"}, "label": {"type": "string"}, "unit": {"enum": ["m", 1]},
        "note": {"type": "string"}, "size": {"type": "array"}},
    "required": ["n", "label", "unit"]}}}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL, COUNT_TOOL]



def _matcher(source: str = CODER, tool_choice: str = "required", **options: Any) -> Matcher:
    made = qwen3_coder_params(source, tools=options.pop("tools", TOOLS), tool_choice=tool_choice, **options)
    return format_matcher(made)




def _call(name: str, *arguments: tuple[str, str], opened: bool = True) -> str:
    args = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments)
    return ("<tool_call>\n" if opened else "") + f"<function={name}>\n{args}</function>\n</tool_call>"


WEATHER = _call("get_weather", ("city", "Paris"))


def test_a_required_call_is_taken_and_a_malformed_one_refused() -> None:
    matcher = _matcher()
    assert completes(matcher, PROMPT + WEATHER)
    assert completes(matcher, PROMPT + "Let me look.\n" + _call("get_weather", ("city", "Saint-\nÉtienne")))
    assert not completes(matcher, PROMPT)  # a call is required
    assert not takes(matcher, PROMPT + _call("get_time", ("city", "Paris")))  # no such tool
    assert not takes(matcher, PROMPT + _call("get_weather", ("town", "Paris")))  # no such argument
    assert not completes(matcher, PROMPT + _call("get_weather"))  # its required argument missing
    # a string value ends at "\n</parameter>\n" alone: without its newline the rest is still the value
    assert not completes(matcher, PROMPT + WEATHER.replace("\n</parameter>", "</parameter>"))
    assert not takes(matcher, PROMPT + WEATHER + "Done.")


def test_required_arguments_come_in_any_order_then_the_optional_ones() -> None:
    matcher = _matcher()
    n, label, unit = ("n", "3"), ("label", "three\nlines"), ("unit", "m")
    for order in ((n, label, unit), (unit, label, n), (label, n, unit)):
        assert completes(matcher, PROMPT + _call("count", *order))
    assert completes(matcher, PROMPT + _call("count", n, label, unit, ("size", "[1, 2]"), ("note", "x")))
    assert not takes(matcher, PROMPT + _call("count", ("note", "x"), n, label, unit))  # optional ones last
    assert not takes(matcher, PROMPT + _call("count", ("n", "three")))  # an integer is JSON
    assert not takes(matcher, PROMPT + _call("count", n, label, unit, ("size", "big")))
    # an argument that may be a string or not (the enum's "m" and 1) is any text
    assert completes(matcher, PROMPT + _call("count", n, label, ("unit", "anything at all")))
    # a JSON object argument, its schema's
    query = ("query", "Paris")
    assert completes(matcher, PROMPT + _call("search", query, ("filters", '{"max": 3}')))
    assert not takes(matcher, PROMPT + _call("search", query, ("filters", '{"max": 0}')))


def test_qwen3_coder_may_omit_the_first_calls_opening_tag_and_a_thinking_template_may_not() -> None:
    bare = PROMPT + _call("get_weather", ("city", "Paris"), opened=False)
    assert completes(_matcher(CODER), bare)
    assert not completes(_matcher(THINKING), bare)
    assert completes(_matcher(THINKING), PROMPT + WEATHER)


def test_calls_repeat_only_where_parallel_calls_are_on() -> None:
    two = PROMPT + WEATHER + "\n" + _call("search", ("query", "Paris"))
    assert not takes(_matcher(), two)
    assert completes(_matcher(parallel_tool_calls=True), two)
    # only the first call may go without its opening tag
    bare_second = PROMPT + WEATHER + _call("search", ("query", "Paris"), opened=False)
    assert not takes(_matcher(parallel_tool_calls=True), bare_second)


def test_the_text_before_the_calls_holds_no_call_start() -> None:
    matcher = _matcher(CODER)
    assert not takes(matcher, PROMPT + "I will write <function=get_weather> now")
    assert completes(matcher, PROMPT + "<function=other> is fine\n" + WEATHER)
    thinking = _matcher(THINKING)
    assert completes(thinking, PROMPT + "<think>\nI could call <function=get_weather>.</think>" + WEATHER)
    assert completes(thinking, PROMPT + "<think>\nfirst, the weather" + WEATHER)  # the call ends the thought


@pytest.mark.parametrize(("source", "words"), [
    (CODER, ("<tool_call>", "<function=get_weather>", "<function=search>", "<function=count>")),
    (THINKING, ("<tool_call>",))], ids=["Qwen3-Coder", "thinking"])
def test_tool_choice_auto_is_lazy_on_the_calls_start_words(source: str, words: tuple[str, ...]) -> None:
    made = qwen3_coder_params(source, tools=TOOLS, tool_choice="auto")
    assert made.grammar_lazy and made.trigger_words == words
    grammar = grammar_text(made)
    assert "root ::= tool-call-root\n" in grammar
    # from the trigger on, the lazy grammar holds the calls and nothing else
    matcher = Matcher(Grammar.from_gbnf(grammar, BYTES))
    assert completes(matcher, WEATHER)
    assert not takes(matcher, "text")
    assert not takes(matcher, WEATHER + "\n<tool_call>")  # one call: parallel calls are off


def test_tool_choice_none_and_no_tools_give_no_grammar() -> None:
    for made in (qwen3_coder_params(CODER, tools=TOOLS, tool_choice="none"), qwen3_coder_params(CODER)):
        assert made.arena is not None and not made.writes_grammar  # the parser, no grammar
        assert not made.grammar_lazy and made.trigger_words == ()


def test_a_response_schema_gives_its_json_after_the_reasoning() -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    made = qwen3_coder_params(THINKING, json_schema=schema)
    assert not made.grammar_lazy and made.trigger_words == ()
    matcher = Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))
    assert completes(matcher, PROMPT + '{"answer": "Paris"}')
    assert completes(matcher, PROMPT + '<think>\nwhy</think>\n{"answer": "Paris"}')
    assert not takes(matcher, PROMPT + "Paris")
    unreasoned = qwen3_coder_params(THINKING, json_schema=schema, reasoning_format="none")
    assert not takes(Matcher(Grammar.from_gbnf(grammar_text(unreasoned), BYTES)), PROMPT + "<think>")


def test_a_response_schema_with_tools_auto_is_lazy_with_no_trigger_rule() -> None:
    # llama.cpp's own reading: the grammar is lazy where tools come with tool_choice auto, and the
    # response-format parser has no trigger rule, so the root is empty
    made = qwen3_coder_params(CODER, tools=[WEATHER_TOOL], json_schema={"type": "string"})
    assert made.grammar_lazy and made.trigger_words == ("<tool_call>", "<function=get_weather>")
    assert grammar_text(made).startswith("root ::= \n")


def test_thinking_tags_and_preserved_tokens() -> None:
    coder, thinking = qwen3_coder_params(CODER), qwen3_coder_params(THINKING)
    assert (coder.supports_thinking, coder.thinking_start_tag, coder.thinking_end_tags) == (False, "", ())
    assert coder.preserved_tokens == ("<tool_call>", "</tool_call>")
    assert (thinking.supports_thinking, thinking.thinking_start_tag, thinking.thinking_end_tags) == (
        True, "<think>", ("\n</think>", "</think>", "<tool_call>"))
    assert thinking.preserved_tokens == ("<tool_call>", "</tool_call>", "<think>", "</think>")
    assert coder.message_delimiters == thinking.message_delimiters == (
        ("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"),
        ("tool", "<|im_start|>tool_response"), ("user", "<|im_start|>user"), ("system", "<|im_start|>system"))


@pytest.mark.parametrize(("schema", "types"), [
    ({"type": "string"}, {"string"}),
    ({"type": "number"}, {"number", "integer"}),
    ({"type": ["boolean", "null"]}, {"boolean", "null"}),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, {"integer", "string"}),
    ({"enum": ["a", 1, 1.5, None, True]}, {"string", "integer", "number", "null", "boolean"}),
    ({"const": {"a": 1}}, {"object"}),
    ({"properties": {}}, {"object"}),
    ({"items": {}}, {"array"}),
    ({"pattern": "^a$"}, {"string"}),
    ({"description": "anything"}, {"null", "boolean", "number", "integer", "string", "array", "object"}),
], ids=["string", "number", "type list", "anyOf", "enum", "const", "properties", "items", "pattern", "any"])
def test_value_types_are_llama_cpps(schema: dict[str, Any], types: set[str]) -> None:
    assert value_types(schema) == types


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/a"}, {"type": "string", "allOf": [{"minLength": 1}]}, {"format": "date"},
    {"type": "text"}], ids=["$ref", "allOf", "format", "unknown type"])
def test_value_types_not_ported_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(NotImplementedError, match=r"^qwen3-coder arguments "):
        value_types(schema)


def test_parameters_holding_a_ref_are_refused() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}}}
    with pytest.raises(NotImplementedError, match=r"^qwen3-coder arguments whose parameters hold a \$ref$"):
        qwen3_coder_params(CODER, tools=[tool], tool_choice="required")


# Tools whose arguments reach the format's other branches: no arguments, optional ones only, values that may
# be a string or not (anyOf, type lists, enums, const, no schema), JSON values of each kind, and three
# required arguments (their permutation rules)
OTHER_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "string", "object", "array", "number", "boolean"]},
        "code": {"pattern": "^[a-z]+$"}}}}},
    {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "integer"}, "z": {"type": "string"}, "mode": {"const": "fast"},
        "scale": {"enum": [1, 2]}, "size": {"type": "array"}, "any": {}}, "required": ["x", "y", "z"]}}},
    WEATHER_TOOL,
]
FORMAT_TEMPLATES = sorted(path for path in template_paths() if path.stem in (
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen3-Coder", "Qwen3.5-4B", "StepFun3.5-Flash"))


@pytest.mark.oracle
@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=[path.stem for path in FORMAT_TEMPLATES])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_qwen3_coder_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """The format's grammar with OTHER_TOOLS, lazy (tool_choice auto) and not (required): llama.cpp's byte
    for byte, with its lazy flag, triggers, preserved tokens and message delimiters."""
    source = path.read_text()
    llama = run_harness(chat_oracle, ParamsCase(tool_choice, True, False).request(
        source, now=int(time.time()), tools=OTHER_TOOLS, parallel_tool_calls=parallel))
    made = qwen3_coder_params(template_source(source), tools=OTHER_TOOLS, tool_choice=tool_choice,
                              parallel_tool_calls=parallel)
    grammar = grammar_text(made)
    oracle_report.add("chat params: qwen3-coder, other tools", path.stem,
                      identical=int(grammar == llama["grammar"]), total=1)
    assert grammar == llama["grammar"]
    assert made.grammar_lazy is llama["grammar_lazy"]
    assert list(made.trigger_words) == [t["value"] for t in llama["grammar_triggers"]]
    assert all(t["type"] == "word" for t in llama["grammar_triggers"])
    assert list(made.preserved_tokens) == llama["preserved_tokens"]
    assert [list(pair) for pair in made.message_delimiters] == [
        [d["role"], d["delimiter"]] for d in llama["message_delimiters"]]
