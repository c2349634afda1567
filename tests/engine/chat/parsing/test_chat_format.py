"""constraintd.engine.chat.parsing.chat_format: a request's parser settings written as JSON and read back to
an equal value, on every auto-parser template of the reference that gets an analysis, and parsing the same as
parse_message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from constraintd.chat_templates import chat_grammar_of, chat_prompt_of
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted, specialised_format
from constraintd.engine.chat.parsing.chat_format import ChatFormat, chat_format
from constraintd.engine.chat.parsing.message_parser import MessageParseError, parse_message
from constraintd.engine.chat.templates.template_inputs import ChatMessage, ChatTool
from tests.chat_oracle.cases import template_paths

# every template of the reference the auto-parser analyses (the hand-written formats have no analysis)
TEMPLATES = [path for path in template_paths() if specialised_format(path.read_text()) is None]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [ChatTool("get_weather", "The weather.", CITY)]
MESSAGES = [ChatMessage("user", "Weather in Paris?")]
TEXTS = [
    "Sunny.",
    "<think>It is warm.</think>Sunny.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}]',
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
]


def settings(source: str) -> tuple[ChatFormat, ChatGrammar]:
    # tool_choice none: the analysis of every template, the tag formats' too (whose tool grammars are not
    # ported); the parser is then asked to read tool calls
    made = chat_prompt_of(source, MESSAGES, tools=TOOLS, now=0.0)
    params = chat_grammar_of(source, MESSAGES, tools=TOOLS, tool_choice="none", now=0.0,
                             generation_prompt=made.generation_prompt)
    assert params.analysis is not None
    tools = tuple(tool.to_json() for tool in TOOLS)
    return ChatFormat(params.analysis, made.generation_prompt, tools), params


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_the_settings_read_back_equal_and_parse_the_same(path: Path) -> None:
    written, params = settings(path.read_text())
    read = ChatFormat.from_json(written.to_json())
    assert read == written
    for text in TEXTS:
        try:
            expected: object = parse_message(text, params, generation_prompt=written.generation_prompt,
                                             tools=list(written.tools))
        except (MessageParseError, NotPorted) as exc:
            expected = type(exc)
        try:
            got: object = read.parse(text)
        except (MessageParseError, NotPorted) as exc:
            got = type(exc)
        assert got == expected, text


@pytest.mark.parametrize(
    "text",
    ["", "{}", '{"version": 2}', json.dumps({"version": 3, "analysis": {}}),
     json.dumps({"version": 3, "analysis": None, "arena": {"root": 0, "rules": {}, "parsers": [["eps"]]}})],
    ids=["empty", "no-version", "other-version", "no-fields", "bad-parser"],
)
def test_what_to_json_does_not_write_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        ChatFormat.from_json(text)


# the hand-written formats' templates: their settings carry the request's PEG arena in place of an analysis
FORMAT_TEMPLATES = [path for path in template_paths() if specialised_format(path.read_text()) is not None]
FORMAT_TEXTS = [
    "Sunny.",
    "<think>It is warm.</think>Sunny.",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
]


@pytest.mark.parametrize("path", FORMAT_TEMPLATES, ids=lambda p: p.stem)
def test_a_hand_written_formats_settings_read_back_equal_and_parse_the_same(path: Path) -> None:
    source = path.read_text()
    made = chat_prompt_of(source, MESSAGES, tools=TOOLS, now=0.0)
    params = chat_grammar_of(source, MESSAGES, tools=TOOLS, tool_choice="auto", now=0.0,
                             generation_prompt=made.generation_prompt)
    assert params.analysis is None and params.arena is not None
    written = chat_format(params, made.generation_prompt, tuple(tool.to_json() for tool in TOOLS), "auto",
                          False, "auto", True, False)
    read = ChatFormat.from_json(written.to_json())
    assert read == written and read.arena is not params.arena
    for text in FORMAT_TEXTS:
        try:
            expected: object = parse_message(text, params, generation_prompt=made.generation_prompt,
                                             tools=list(written.tools))
        except (MessageParseError, NotPorted) as exc:
            expected = type(exc)
        try:
            got: object = read.parse(text)
        except (MessageParseError, NotPorted) as exc:
            got = type(exc)
        assert got == expected, text
