"""constraintd.engine.chat.message_parser: the assistant's message from a whole generated text, as llama.cpp's
chat parser reads it.

The oracle test runs tests/chat_oracle/messages.py's texts on every auto-parser template through
llama.cpp's common_chat_parse (the harness's "parse" mode) and through `parse_message`: content, reasoning
content and tool calls identical, or both sides refusing; requests whose tool grammar or parser is not ported
(the tag formats' grammars but the lazy one with JSON arguments, tagged arguments) are counted apart. A
response schema's answers are among the texts.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from constraintd.engine.chat.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.message_parser import MessageParseError, ParsedToolCall, parse_message
from constraintd.engine.chat.reasoning import ReasoningAnalysis, ReasoningMode
from constraintd.engine.chat.template_analysis import TemplateAnalysis, ToolFormat, ToolMode
from tests.chat_oracle.cases import template_paths
from tests.chat_oracle.messages import compare_messages
from tests.conftest import OracleReport
from tests.engine.chat.test_chat_params import SPECIALISED

TEMPLATES = [path for path in template_paths() if path.stem not in SPECIALISED]

# A template that writes each call as <tool_call>{"name": ..., "arguments": ...}</tool_call> (Qwen 2.5)
HERMES = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.JSON_NATIVE, per_call_start="<tool_call>\n", per_call_end="</tool_call>",
    parameter_order=["name", "arguments"])))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
PROMPT = "<|im_start|>assistant\n"


def test_a_call_after_content_is_read() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"} }\n</tool_call>'
    message = parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert message.content == "Let me look.\n"
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"city": "Paris"}'),)


def test_text_without_a_call_is_content() -> None:
    message = parse_message("It is mild.", HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert (message.content, message.tool_calls) == ("It is mild.", ())


def test_a_call_cut_short_keeps_what_was_read() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    message = parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"ci'),)


def test_an_unknown_tool_does_not_match() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)


# A thinking template (Qwen 3): a response schema's answer after the thinking block
THINKING = ChatGrammar(analysis=TemplateAnalysis(
    ReasoningAnalysis(ReasoningMode.TAG_BASED, "<think>", "</think>")))


def test_a_response_schemas_answer_is_read_after_the_thinking_block() -> None:
    text = '<think>\nThe city is Paris.\n</think>\n\n```json\n{"city": "Paris"}\n```'
    message = parse_message(text, THINKING, generation_prompt=PROMPT, has_response_format=True)
    assert (message.reasoning_content, message.content) == ("\nThe city is Paris.\n", '{"city": "Paris"}')
    cut = parse_message('<think>x</think>{"city": "Pa', THINKING, generation_prompt=PROMPT,
                        has_response_format=True)
    assert (cut.reasoning_content, cut.content) == ("x", '{"city": "Pa')


def test_a_response_schemas_answer_that_is_no_value_does_not_match() -> None:
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message('<think>x</think>{"city": "Paris"} and more', THINKING, generation_prompt=PROMPT,
                      has_response_format=True)


# A tag format with JSON arguments (Functionary 3.1): <function=name>{...}</function>
FUNCTIONARY = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.TAG_WITH_JSON, per_call_start="<function=", per_call_end="</function>", name_suffix=">")))


def test_a_tag_formats_call_after_content_is_read() -> None:
    text = 'Let me look.\n<function=get_weather>{"city": "Paris"}</function>'
    message = parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert message.content == "Let me look.\n"
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"city": "Paris"}'),)


def test_a_tag_formats_call_is_kept_once_its_open_is_read() -> None:
    cut = parse_message('<function=get_weather>{"ci', FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert cut.tool_calls == (ParsedToolCall("get_weather", '{"ci'),)
    opened = parse_message("<function=get_weather>", FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert opened.tool_calls == (ParsedToolCall("get_weather", "{"),)
    inside = parse_message("<function=get_weather", FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert inside.tool_calls == ()


def test_a_tag_formats_second_call_needs_parallel_calls() -> None:
    text = '<function=get_weather>{}</function>\n<function=get_weather>{"city": "Paris"}</function>'
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    message = parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS,
                            parallel_tool_calls=True)
    assert message.tool_calls == (ParsedToolCall("get_weather", "{}"),
                                  ParsedToolCall("get_weather", '{"city": "Paris"}'))


def test_a_tag_format_with_argument_markers_is_not_ported() -> None:
    analysis = TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
        ToolMode.TAG_WITH_JSON, per_call_start="<function=", per_call_end="</function>", name_suffix=">",
        args_start="<args>"))
    with pytest.raises(NotPorted, match="argument markers"):
        parse_message("x", ChatGrammar(analysis=analysis), generation_prompt=PROMPT, tools=TOOLS)


def test_tagged_arguments_are_not_ported() -> None:
    analysis = TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(ToolMode.TAG_WITH_TAGGED))
    with pytest.raises(NotPorted, match="tagged arguments"):
        parse_message("x", ChatGrammar(analysis=analysis), generation_prompt=PROMPT, tools=TOOLS)


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_messages_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every text the project parses gives llama.cpp's message."""
    comparisons = compare_messages(chat_oracle, path, now=int(time.time()))
    parsed = [c for c in comparisons if c.not_ported is None]
    oracle_report.add("chat parser: content, reasoning, tool calls", path.stem,
                      identical=sum(c.identical for c in parsed), total=len(comparisons))
    assert [c.describe() for c in parsed if not c.identical] == []
