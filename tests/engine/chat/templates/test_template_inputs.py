"""constraintd.engine.chat: the messages, tools and variables llama.cpp gives a chat template
(template_inputs), the prompt and generation prompt made from them (prompt), and values as its Jinja writes
them (jinja_values).

The whole of it is compared with llama.cpp's own prompt on every template of the reference in
test_chat_oracle.py; here each rewrite alone, on small cases whose answer llama.cpp's chat.cpp states.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from constraintd.engine.chat.templates.jinja_values import llama_json, llama_string, llama_values, output_text
from constraintd.engine.chat.templates.prompt import (
    CHATML_TEMPLATE,
    chat_prompt,
    cut_special,
    finish_prompt,
    template_source,
)
from constraintd.engine.chat.templates.template_inputs import (
    ChatRequestError,
    TemplateCaps,
    parse_messages,
    parse_tools,
    template_context,
)

NOW = 1_700_000_000.0
CALL = {"id": "call00001", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


DEFAULTS = TemplateCaps()


def _messages(source: str, messages: list[dict[str, Any]], caps: TemplateCaps = DEFAULTS,
              **options: Any) -> list[dict[str, Any]]:
    context = template_context(source, parse_messages(messages), caps=caps, now=NOW, **options)
    result: list[dict[str, Any]] = context["messages"]
    return result


def test_messages_as_llama_cpp_writes_them() -> None:
    assert _messages("", [{"role": "assistant", "content": None, "tool_calls": [CALL]}]) == [{
        "role": "assistant", "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'},
                        "id": "call00001"}],
    }]
    assert _messages("", [{"role": "tool", "content": "r", "tool_call_id": "c", "name": "f"}]) == [
        {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c"}]


def test_content_parts_are_joined_for_a_string_only_template() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert _messages("", [{"role": "user", "content": parts}])[0]["content"] == "a\nb"
    typed = TemplateCaps(supports_typed_content=True)
    assert _messages("", [{"role": "user", "content": parts}], typed)[0]["content"] == parts
    only_typed = TemplateCaps(supports_string_content=False, supports_typed_content=True)
    assert _messages("", [{"role": "user", "content": "x"}], only_typed)[0]["content"] == [
        {"type": "text", "text": "x"}]


def test_system_message_folded_for_a_template_without_a_system_role() -> None:
    no_system = TemplateCaps(supports_system_role=False)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert _messages("", messages, no_system) == [{"role": "user", "content": "S\nU"}]
    assert _messages("", messages[:1], no_system) == []
    assert _messages("", messages) == messages


def test_arguments_as_objects_for_a_template_that_reads_them_so() -> None:
    message = [{"role": "assistant", "content": "", "tool_calls": [CALL]}]
    objects = TemplateCaps(supports_object_arguments=True)
    assert _messages("", message, objects)[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    broken = [{"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{"}}]}]
    with pytest.raises(ChatRequestError, match="Failed to parse tool call arguments as JSON"):
        _messages("", broken, objects)


def test_developer_is_system_except_for_channel_templates() -> None:
    developer = [{"role": "developer", "content": "D"}]
    assert _messages("", developer)[0]["role"] == "system"
    assert _messages("<|channel|>", developer)[0]["role"] == "developer"


def test_variables() -> None:
    context = template_context("", [], caps=TemplateCaps(), now=NOW, bos_token="<s>",
                               tools=parse_tools([{"type": "function", "function": {"name": "f"}}]),
                               template_kwargs={"x": 1})
    assert context["enable_thinking"] is True and context["add_generation_prompt"] is True
    assert context["tools"] == [{"type": "function", "function": {"name": "f", "description": "",
                                                                  "parameters": {}}}]
    assert context["bos_token"] == "<s>" and context["x"] == 1
    assert len(context["date_string"].split()) == 3 and len(context["datetime"].split()) == 3
    bare = template_context("", [], caps=TemplateCaps(), now=NOW, add_generation_prompt=False)
    assert "add_generation_prompt" not in bare and "tools" not in bare  # undefined to the template


def test_gemma4_tool_turns() -> None:
    source = "'<|tool_call>call:'"
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": '{"t": 18}', "tool_call_id": "call00001"},
        {"role": "assistant", "content": "Done."},
    ]
    [turn] = _messages(source, messages)
    assert turn["tool_responses"] == [{"name": "f", "response": {"t": 18}}]
    assert turn["content"] == "Done."
    assert finish_prompt(source, "x<turn|>\n") == "x<turn|>\n<|turn>model\n"
    assert finish_prompt("", "x<turn|>\n") == "x<turn|>\n"


@pytest.mark.parametrize(("messages", "error"), [
    (5, "Expected 'messages' to be an array, got 5"),
    ([{"content": "x"}], "Missing 'role' in message"),
    ([{"role": "user"}], "Expected 'content' or 'tool_calls'"),
    ([{"role": "user", "content": 3}], "Invalid 'content' type"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "Unsupported content part type"),
], ids=["not-a-list", "no-role", "no-content", "number-content", "image-part"])
def test_messages_llama_cpp_refuses(messages: Any, error: str) -> None:
    with pytest.raises(ChatRequestError, match=f"^Failed to parse messages: {error}"):
        parse_messages(messages)


def test_llama_json() -> None:
    value = {"b": [1, 2.5, None, True], "a": "é\n\"", "c": {}}
    assert llama_json(value) == '{"b": [1, 2.5, null, true], "a": "é\\n\\"", "c": {}}'
    assert llama_json(value, ensure_ascii=True) == \
        '{"b": [1, 2.5, null, true], "a": "\\u00e9\\n\\"", "c": {}}'
    assert llama_json(value, indent=2) == json.dumps(value, indent=2, ensure_ascii=False)
    assert llama_json(value, separators=(",", ":")) == json.dumps(value, separators=(",", ":"),
                                                                   ensure_ascii=False)
    assert llama_json("😀", ensure_ascii=True) == '"\\ud83d\\ude00"'


def test_output_text() -> None:
    assert [output_text(v) for v in (None, {"a": 1}, ["a", 1, [True]], 2.5, 3.0, "s")] == [
        "", "", "a1True", "2.5", "3.0", "s"]


def test_cut_special() -> None:
    tokens = {"bos_token": "<s>", "eos_token": "</s>"}
    assert cut_special("<s>x</s>", **tokens, add_bos=True, add_eos=True) == "x"
    assert cut_special("<s>x</s>", **tokens, add_bos=False, add_eos=False) == "<s>x</s>"


def test_llama_string() -> None:
    value = {"a": "it's", "b": ["x\xa0y", 1, 2.5, None, True]}
    assert llama_string(value) == """{'a': "it's", 'b': ['x\xa0y', 1, 2.5, None, True]}"""
    assert [llama_string(v) for v in (None, True, 3, 2.5, "s")] == ["None", "True", "3", "2.5", "s"]


def test_chat_prompt_and_generation_prompt() -> None:
    def render(context: Any) -> str:
        text = "<s>" + "".join(f"[{m['role']}:{m['content']}]" for m in context["messages"])
        return text + ("[assistant:" if context.get("add_generation_prompt") else "") + "</s>"

    messages = parse_messages([{"role": "user", "content": "hi"}])
    made = chat_prompt("", messages, render, caps=DEFAULTS, bos_token="<s>", eos_token="</s>", add_bos=True,
                       now=NOW)
    assert made.prompt == "[user:hi][assistant:</s>"
    assert made.generation_prompt == "[assistant:</s>"
    made = chat_prompt("", messages, render, caps=DEFAULTS, add_generation_prompt=False, now=NOW)
    assert made.prompt == "<s>[user:hi]</s>" and made.generation_prompt == "[assistant:</s>"


def test_template_source() -> None:
    assert template_source(None) == template_source("") == template_source("chatml") == CHATML_TEMPLATE
    refusal = ('{%- if "<|channel|>analysis<|message|>" in message.content or '
               '"<|channel|>final<|message|>" in message.content %}')
    assert template_source("<|channel|>" + refusal) == "<|channel|>{%- if false %}"
    assert template_source("{{ x }}") == "{{ x }}"


def test_llama_equality() -> None:
    flat = llama_values({"role": "user", "content": "x"})
    nested = llama_values({"role": "user", "content": [{"type": "text", "text": "x"}]})
    assert flat == {"role": "user", "content": "x"} and flat != {"content": "x", "role": "user"}
    assert nested != nested  # llama.cpp: a mapping holding a list equals nothing, itself included
    assert llama_values([1, "a"]) == [1, "a"] and llama_values([[1]]) != [[1]]


def test_reasoning_settings_under_every_name() -> None:
    def variables(**kwargs: Any) -> dict[str, Any]:
        return template_context("", [], caps=DEFAULTS, now=NOW, template_kwargs=kwargs)

    context = variables(preserve_reasoning=True, reasoning_effort="low")
    flags = (context["preserve_thinking"], context["clear_thinking"], context["drop_thinking"])
    assert flags == (True, False, False)
    assert context["reasoning_strength"] == "low"
    assert variables(preserve_reasoning=False, clear_thinking="mine")["clear_thinking"] == "mine"
    assert "reasoning_strength" not in variables(reasoning_effort="")
