"""The message of a chat with tools, whole and as the deltas of its successive readings
(sampler_worker/serve/tool_messages.py), on chats prepared as the server prepares them."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from sampler_worker.prompt import ToolChat
from sampler_worker.serve.tool_messages import ToolMessage
from tests.sampler_worker.test_cli import WEATHER_TOOLS, _template, text_chat

LLAMA_32 = "meta-llama-Llama-3.2-3B-Instruct"
QWEN_25 = "Qwen-Qwen2.5-7B-Instruct"

# (template, tool_choice, parallel, generated text)
TEXTS = [
    (LLAMA_32, "required", False,
     'Let me look.\n\n{"name": "get_weather", "parameters": {\n  "city": "New York "\n}}'),
    (LLAMA_32, "required", False, '{"name": "get_time", "parameters": {}}'),
    (QWEN_25, "auto", True,
     'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'),
    (QWEN_25, "auto", False, "No call here, only a <b>word</b>."),
]


def _chat(template: str, tool_choice: str, parallel: bool) -> ToolChat:
    # the parser reads with the reply's settings alone: the session may go
    with text_chat(_template(template), "Weather in New York?", WEATHER_TOOLS, tool_choice=tool_choice,
                   parallel_tool_calls=parallel) as chat:
        return chat


def _ids() -> Any:
    counter = itertools.count()
    return lambda: f"call{next(counter)}"


def _join(deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """The message the deltas make, as a client joins them; each call's first delta has its id, type and
    name, the next ones its arguments alone."""
    content, reasoning, calls = "", "", {}
    for delta in deltas:
        content += delta.get("content", "")
        reasoning += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", ()):
            if call["index"] not in calls:
                assert call["type"] == "function" and call["id"] and call["function"]["name"]
                calls[call["index"]] = {"id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
            calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


@pytest.mark.parametrize(("template", "choice", "parallel", "text"), TEXTS,
                         ids=["llama-3.2-spaces", "llama-3.2-empty", "qwen-2.5-parallel", "qwen-2.5-content"])
@pytest.mark.parametrize("step", [1, 2, 5], ids=["chars", "pairs", "fives"])
def test_the_deltas_make_the_whole_message(template: str, choice: str, parallel: bool, text: str,
                                           step: int) -> None:
    chat = _chat(template, choice, parallel)
    whole = ToolMessage(chat, new_id=_ids()).whole(text)
    streamed = ToolMessage(chat, new_id=_ids())
    deltas = []
    for at in range(0, len(text), step):
        deltas += streamed.push(text[at:at + step])
        # what was sent so far is a beginning of the whole answer: nothing sent is ever taken back
        sent = _join(deltas)
        assert whole["content"] is None or whole["content"].startswith(sent["content"] or "")
        for then, now in zip(sent.get("tool_calls", ()), whole.get("tool_calls", ()), strict=False):
            assert now["function"]["name"] == then["function"]["name"]
            assert now["function"]["arguments"].startswith(then["function"]["arguments"])
    deltas += streamed.finish()
    assert _join(deltas) == whole
    assert streamed.calls == ("tool_calls" in whole)


def test_the_whole_message_is_llama_servers() -> None:
    chat = _chat(LLAMA_32, "required", False)
    text = TEXTS[0][3]
    message = ToolMessage(chat, new_id=_ids()).whole(text)
    assert message == {"role": "assistant", "content": "Let me look.\n\n", "tool_calls": [{
        "id": "call0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{\n  "city": "New York "\n}'}}]}
    only_call = ToolMessage(chat).whole(TEXTS[1][3])
    assert only_call["content"] is None  # null beside tool calls, as llama-server
    [call] = only_call["tool_calls"]
    assert len(call["id"]) == 32 and call["id"].isalnum() and json.loads(call["function"]["arguments"]) == {}


def test_a_reading_that_would_take_back_is_held() -> None:
    # Llama 3.2's auto has no grammar: a model may write a call and then more text, which the parser refuses
    # as a whole; the call sent stays, nothing of it is taken back, and nothing contradicts it later
    chat = _chat(LLAMA_32, "auto", False)
    streamed = ToolMessage(chat, new_id=_ids())
    call = '{"name": "get_time", "parameters": {}}'
    deltas = streamed.push(call)
    assert _join(deltas)["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
    assert streamed.push(" and more") == []
    assert streamed.finish() == []  # the whole text read as content alone would drop the call: held
    assert streamed.calls
    # read whole, the same text is its content alone (the parser refuses it), as generate --tools reports
    whole = ToolMessage(chat).whole(call + " and more")
    assert whole == {"role": "assistant", "content": call + " and more"}
