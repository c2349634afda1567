# What each endpoint answers, whole or streamed: OpenAI's chat completion and completion objects (streamed
# as server-sent events ending in `data: [DONE]`), Ollama's chat and generate objects (streamed as
# newline-delimited JSON, the last one `"done": true`).
#
# Contract:
# - A chat answer whose constraint asks for JSON follows the content rule (constraintd.engine.chat.content):
#   the content is the JSON value alone (`json_message` whole; `ContentStream` streamed, so a stream's
#   deltas add up to what llama-server streams). An OpenAI chat with a response schema is read by its chat's
#   parser, as a chat with tools (below): the thinking block is `reasoning_content`, the value the content.
#   Completions and Ollama's generate give the text as it is.
# - `finish_reason` is "stop" (an end-of-generation token or a stop string) or "length" (the token budget);
#   `usage` counts the prompt's tokens and the generated ones (an end-of-generation token included, as
#   llama-server counts it).
# - A chat with tools (or a response schema) answers llama-server's message
#   (sampler_worker.serve.tool_messages): whole, its `tool_calls` and `reasoning_content`; streamed, the
#   deltas of the text's successive readings. Its
#   `finish_reason` is "tool_calls" when the message has calls and the generation stopped on its own (an
#   end-of-generation token or a stop string), as llama-server's.
# - With `return_tokens`, an answer carries the generated token ids (`tokens`); streamed, each chunk
#   carries the ids of the steps since the previous chunk and the last chunk the rest.
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from constraintd.engine.chat.content import ContentStream, json_message
from sampler_worker.generate import Generation
from sampler_worker.prompt import ToolChat
from sampler_worker.serve.tool_messages import ToolMessage

__all__ = ["Answer", "Usage", "answer_for"]

FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length"}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def openai(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(slots=True)
class Answer:
    """One request's answer, built whole or chunk by chunk.

    Attributes:
        endpoint: "chat", "completion", "ollama_chat" or "ollama_generate".
        model: the model's name as the server lists it.
        json_answer: the content rule applies (chat endpoints with a JSON constraint).
        return_tokens: answers carry the token ids.
        include_usage: a streamed OpenAI answer ends with a usage chunk.
        chat: a chat with tools or a response schema (OpenAI's chat endpoint): the answer is its message.
    """

    endpoint: str
    model: str
    json_answer: bool
    return_tokens: bool = False
    include_usage: bool = False
    chat: ToolChat | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _content: ContentStream | None = None
    _tokens: list[int] = field(default_factory=list)
    _started_ns: int = field(default_factory=time.perf_counter_ns)
    _message: ToolMessage | None = None

    def __post_init__(self) -> None:
        if self.json_answer and self.endpoint in ("chat", "ollama_chat"):
            self._content = ContentStream()
        if self.chat is not None and self.endpoint == "chat":
            self._message = ToolMessage(self.chat)

    @property
    def streams_ndjson(self) -> bool:
        return self.endpoint.startswith("ollama")

    @property
    def media_type(self) -> str:
        return "application/x-ndjson" if self.streams_ndjson else "text/event-stream"

    def _encode(self, obj: dict[str, Any]) -> bytes:
        text = json.dumps(obj, ensure_ascii=False)
        return f"{text}\n".encode() if self.streams_ndjson else f"data: {text}\n\n".encode()

    # Streaming.

    def opening(self) -> list[bytes]:
        """What a stream starts with (OpenAI's chat: the assistant's role)."""
        if self.endpoint == "chat":
            return [self._encode(self._chunk({"role": "assistant", "content": ""}, None))]
        return []

    def step(self, text: str, token: int | None) -> list[bytes]:
        """The chunk for one step's text (none when the step adds no content)."""
        if token is not None:
            self._tokens.append(token)
        if self._message is not None:
            return self._tool_chunks(self._message.push(text))
        if self._content is not None:
            text = self._content.push(text)
        if not text:
            return []
        return [self._encode(self._delta(text, None, done=False))]

    def closing(self, generation: Generation, usage: Usage) -> list[bytes]:
        """The stream's last chunks: the finish reason (and usage), then `[DONE]` for OpenAI."""
        finish = FINISH_REASONS[generation.stop_reason]
        if self.streams_ndjson:
            return [self._encode(self._ollama("", finish, usage, done=True))]
        chunks = []
        if self._message is not None:
            chunks = self._tool_chunks(self._message.finish())
            finish = self._finish_reason(generation, self._message.calls)
        chunks.append(self._encode(self._delta("", finish, done=True)))
        if self.include_usage:
            chunk = self._envelope("chat.completion.chunk" if self.endpoint == "chat" else "text_completion")
            chunk.update(choices=[], usage=usage.openai())
            chunks.append(self._encode(chunk))
        return [*chunks, b"data: [DONE]\n\n"]

    def failure(self, body: dict[str, Any]) -> list[bytes]:
        """An error after the stream has started: one error event (and `[DONE]` for OpenAI)."""
        return [self._encode(body)] if self.streams_ndjson else [self._encode(body), b"data: [DONE]\n\n"]

    # Whole.

    def whole(self, generation: Generation, usage: Usage) -> dict[str, Any]:
        """The answer of a request that does not stream."""
        finish = FINISH_REASONS[generation.stop_reason]
        self._tokens = list(generation.tokens)
        choice: dict[str, Any]
        if self._message is not None:  # the chat's parser reads the text (no content rule beside it)
            message = self._message.whole(generation.text)
            choice = {"index": 0, "message": message}
            finish = self._finish_reason(generation, "tool_calls" in message)
        else:
            text = json_message(generation.text) if self._content is not None else generation.text
            if self.streams_ndjson:
                return self._ollama(text, finish, usage, done=True)
            if self.endpoint == "chat":
                choice = {"index": 0, "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": 0, "text": text}
        body = self._envelope("chat.completion" if self.endpoint == "chat" else "text_completion")
        choice.update(finish_reason=finish, logprobs=None)
        body.update(choices=[choice], usage=usage.openai())
        self._take_tokens(body)
        return body

    @staticmethod
    def _finish_reason(generation: Generation, calls: bool) -> str:
        # llama-server's: tool_calls when the generation ended on its own with calls made
        finish = FINISH_REASONS[generation.stop_reason]
        return "tool_calls" if calls and finish == "stop" else finish

    # Shapes.

    def _envelope(self, kind: str) -> dict[str, Any]:
        prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
        return {"id": f"{prefix}-{self.id}", "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk")
        body["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        return body

    def _tool_chunks(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        chunks = []
        for delta in deltas:
            body = self._chunk(delta, None)
            self._take_tokens(body)
            chunks.append(self._encode(body))
        return chunks

    def _delta(self, text: str, finish: str | None, *, done: bool) -> dict[str, Any]:
        if self.streams_ndjson:
            return self._ollama(text, None, None, done=False)
        if self.endpoint == "chat":
            body = self._chunk({"content": text} if text else {}, finish)
        else:
            body = self._envelope("text_completion")
            body["choices"] = [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]
        self._take_tokens(body)
        return body

    def _take_tokens(self, body: dict[str, Any]) -> None:
        if self.return_tokens:
            body["tokens"] = self._tokens
            self._tokens = []

    def _ollama(self, text: str, finish: str | None, usage: Usage | None, *, done: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": datetime.now(UTC).isoformat()}
        if self.endpoint == "ollama_chat":
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        body["done"] = done
        if done and usage is not None:
            body.update(
                done_reason=finish,
                total_duration=time.perf_counter_ns() - self._started_ns,
                prompt_eval_count=usage.prompt_tokens,
                eval_count=usage.completion_tokens,
            )
        self._take_tokens(body)
        return body


def answer_for(endpoint: str, model: str, *, json_answer: bool, return_tokens: bool = False,
               include_usage: bool = False, chat: ToolChat | None = None, id: str | None = None) -> Answer:
    """A new answer for one request to `endpoint` (`chat`: a chat with tools or a response schema, as it was
    prepared; `id`: the answer's, a new one when None)."""
    answer = Answer(endpoint, model, json_answer, return_tokens, include_usage, chat)
    if id is not None:
        answer.id = id
    return answer
