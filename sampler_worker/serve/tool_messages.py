# The assistant's message of a chat with tools, as llama-server answers it: whole (`message` with its
# `tool_calls`), or streamed as the differences between successive readings of the text so far
# (server-task.cpp's update_chat_msg and common_chat_msg_diff::compute_diffs in common/chat.cpp).
#
# Contract:
# - The message is what the chat's parser reads (sampler_worker.prompt.ToolChat): content, reasoning
#   content, tool calls. A whole text the parser refuses is its content alone, as `generate --tools` reports
#   it; a cut-short text (the token budget) is read as far as it goes, as llama.cpp reads a partial one.
# - Streamed, the text so far is read again at each step as llama-server reads it (common_chat_parse with
#   is_partial: a text the format does not match yet reads as an empty message); an empty reading is
#   skipped, as llama-server skips one, and so is one the parser refuses (it failed at the text's very
#   start, where llama.cpp throws). A reading is sent only as
#   what it adds to the last one sent: the content, reasoning content and the last call's arguments grow,
#   calls are only added, a call's name and id never change. A reading that would take back anything sent
#   (a shorter text, a call gone, arguments that are no longer a continuation) is held back, never sent, and
#   the next reading is compared with the last one sent: the pieces a client joins are always a prefix of
#   the whole answer's.
# - Ids: a call keeps the id it was first read with; a call read without one gets a random one then, as
#   llama-server's gen_tool_call_id (32 letters and digits). The whole answer and the stream give each call
#   its id once.
# - Deltas are llama.cpp's common_chat_msg_diff_to_json_oaicompat: `reasoning_content`, `content`, or one
#   `tool_calls` entry with its `index`; a call's first entry has its `id`, `type` and `function.name`, the
#   next ones its `function.arguments` pieces alone.
from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from typing import Any

from constraintd.engine.chat.parsing.message_parser import MessageParseError, ParsedMessage, ParsedToolCall
from sampler_worker.prompt import ToolChat

__all__ = ["ToolMessage", "tool_call_id"]

_ID_ALPHABET = string.ascii_letters + string.digits


def tool_call_id() -> str:
    """A new tool call id, as llama-server makes one (random_string: 32 letters and digits)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(32))


def _extends(shown: ParsedMessage, new: ParsedMessage) -> bool:
    # whether `new` only adds to what was sent of `shown`
    if not new.content.startswith(shown.content):
        return False
    if not new.reasoning_content.startswith(shown.reasoning_content):
        return False
    if len(new.tool_calls) < len(shown.tool_calls):
        return False
    # only the last call sent may still grow (llama.cpp diffs that one alone)
    last = len(shown.tool_calls) - 1
    return all(
        now.name == then.name
        and (now.arguments.startswith(then.arguments) if index == last else now.arguments == then.arguments)
        for index, (then, now) in enumerate(zip(shown.tool_calls, new.tool_calls, strict=False))
    )


def call_json(call: ParsedToolCall) -> dict[str, Any]:
    """A tool call in OpenAI's shape (arguments as JSON text)."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class ToolMessage:
    """One answer's message in a chat with tools, read whole or step by step (see the contract).

    Args:
        chat: the chat as it was prepared (its parser reads the text).
        new_id: makes the id of a call read without one.
    """

    __slots__ = ("_chat", "_ids", "_new_id", "_shown", "_text")

    def __init__(self, chat: ToolChat, *, new_id: Callable[[], str] = tool_call_id) -> None:
        self._chat = chat
        self._new_id = new_id
        self._text = ""
        self._shown = ParsedMessage()
        self._ids: list[str] = []

    def _with_ids(self, message: ParsedMessage) -> ParsedMessage:
        # server_task_result_state::update_chat_msg's set_tool_call_ids: the first id a call is read with
        calls = []
        for index, call in enumerate(message.tool_calls):
            if index == len(self._ids):
                self._ids.append(call.id or self._new_id())
            calls.append(ParsedToolCall(call.name, call.arguments, self._ids[index]))
        return ParsedMessage(message.content, message.reasoning_content, tuple(calls))

    def push(self, text: str) -> list[dict[str, Any]]:
        """The deltas a step's text adds to the message sent so far (none while nothing is new).

        Raises:
            NotPorted: the format's parser is not ported.
        """
        self._text += text
        if not text:
            return []
        try:
            message = self._chat.parse(self._text, partial=True)
        except MessageParseError:
            return []  # the text cannot be read yet: the next step's may be
        if message == ParsedMessage():
            return []  # update_chat_msg keeps the last reading when the new one is empty
        return self._advance(message)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas the whole text's reading adds, at the end of the generation.

        Raises:
            NotPorted: the format's parser is not ported.
        """
        message, _ = self._chat.read(self._text)
        return self._advance(message)

    @property
    def calls(self) -> bool:
        """Whether the message sent so far has tool calls."""
        return bool(self._shown.tool_calls)

    def whole(self, text: str) -> dict[str, Any]:
        """The message of a whole answer: `role`, `content` (null when empty beside tool calls),
        `reasoning_content` when there is some, `tool_calls` when there are some.

        Raises:
            NotPorted: the format's parser is not ported.
        """
        self._text = text
        message, _ = self._chat.read(text)
        self._shown = message = self._with_ids(message)
        body: dict[str, Any] = {"role": "assistant",
                                "content": message.content or (None if message.tool_calls else "")}
        if message.reasoning_content:
            body["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            body["tool_calls"] = [call_json(call) for call in message.tool_calls]
        return body

    def _advance(self, message: ParsedMessage) -> list[dict[str, Any]]:
        # common_chat_msg_diff::compute_diffs against the last reading sent, one delta per difference
        shown = self._shown
        if not _extends(shown, message):
            return []  # it would take back what was sent: held back
        new = self._with_ids(message)
        deltas: list[dict[str, Any]] = []
        if new.reasoning_content != shown.reasoning_content:
            deltas.append({"reasoning_content": new.reasoning_content[len(shown.reasoning_content):]})
        if new.content != shown.content:
            deltas.append({"content": new.content[len(shown.content):]})
        if shown.tool_calls:
            index = len(shown.tool_calls) - 1
            then, now = shown.tool_calls[index], new.tool_calls[index]
            if now.arguments != then.arguments:
                piece = now.arguments[len(then.arguments):]
                deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        for index in range(len(shown.tool_calls), len(new.tool_calls)):
            call = new.tool_calls[index]
            entry = call_json(call)
            deltas.append({"tool_calls": [{"index": index, **entry}]})
        self._shown = new
        return deltas
