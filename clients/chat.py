# A session made from a chat request: the request as the client gives it, and what the service answers.
#
# Invariants:
# - `ChatRequest` is what CreateSession's `chat` field carries, with Python values for the JSON parts
#   (messages and tools as lists of mappings, or as JSON text); `to_proto` writes the message. Its time is
#   fixed when the request is made (`now`), so a session the client rebuilds resolves exactly as the first.
# - `ChatSettings` is the response's `chat`, read once: the prompt, the stops, the preserved tokens, the
#   triggers the session got, and the parser settings, with which `parse` reads a generated text back
#   through the engine's message parser (in this process: no round trip).
from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from constraintd.engine.chat.parsing.chat_format import ChatFormat
from constraintd.engine.chat.parsing.message_parser import ParsedMessage
from constraintd.v1 import constraintd_pb2 as pb

__all__ = ["ChatRequest", "ChatSettings"]

Json = str | Sequence[Mapping[str, Any]]


def _text(value: Json | Mapping[str, Any] | None) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request to make a session from, resolved by the service as llama-server resolves one.

    Attributes:
        messages: OpenAI chat messages (a list, or its JSON text).
        template: the chat template (Jinja, e.g. a GGUF's tokenizer.chat_template); "" is ChatML.
        tools: OpenAI function tools (a list, or its JSON text).
        tool_choice: "auto", "required", "none", or one tool's name (that tool alone, required).
        parallel_tool_calls: calls may repeat.
        json_schema: a response schema (a mapping, or its JSON text).
        reasoning_format: "auto" reads the thinking block apart, "none" leaves it in the content.
        enable_thinking: False asks the template not to think.
        bos_text, eos_text: the texts of the model's BOS and EOS tokens.
        add_bos, add_eos: the tokenizer adds BOS (EOS) itself.
        now: the request's time (seconds since the epoch), for templates that print the date; the time the
            request is made when not given.
    """

    messages: Json
    template: str = ""
    tools: Json | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    json_schema: str | Mapping[str, Any] | None = None
    reasoning_format: str = "auto"
    enable_thinking: bool = True
    bos_text: str = ""
    eos_text: str = ""
    add_bos: bool = False
    add_eos: bool = False
    now: float = field(default_factory=time.time)

    def to_proto(self) -> pb.ChatRequest:
        """The request as CreateSession's `chat` field."""
        return pb.ChatRequest(
            template=self.template, messages=_text(self.messages), tools=_text(self.tools),
            tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
            json_schema=_text(self.json_schema), reasoning_format=self.reasoning_format,
            enable_thinking=self.enable_thinking, bos_text=self.bos_text, eos_text=self.eos_text,
            add_bos=self.add_bos, add_eos=self.add_eos, now=self.now)


@dataclass(frozen=True, slots=True)
class ChatSettings:
    """What the service resolved a chat request to, besides the session's grammar (see the proto's
    ChatSettings for each field)."""

    prompt: str
    generation_prompt: str
    grammar: str
    grammar_lazy: bool
    trigger_patterns: tuple[str, ...]
    trigger_tokens: tuple[int, ...]
    preserved_tokens: tuple[str, ...]
    additional_stops: tuple[str, ...]
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    prefill: bytes
    format: ChatFormat

    @classmethod
    def from_proto(cls, chat: pb.ChatSettings) -> ChatSettings:
        """The settings of a CreateSession response.

        Raises:
            ValueError: parser settings this client cannot read.
        """
        return cls(
            prompt=chat.prompt, generation_prompt=chat.generation_prompt, grammar=chat.grammar,
            grammar_lazy=chat.grammar_lazy, trigger_patterns=tuple(chat.trigger_patterns),
            trigger_tokens=tuple(chat.trigger_tokens), preserved_tokens=tuple(chat.preserved_tokens),
            additional_stops=tuple(chat.additional_stops), supports_thinking=chat.supports_thinking,
            thinking_start_tag=chat.thinking_start_tag, thinking_end_tags=tuple(chat.thinking_end_tags),
            prefill=chat.prefill, format=ChatFormat.from_json(chat.parser))

    def parse(self, text: str, *, partial: bool = False) -> ParsedMessage:
        """The message (content, reasoning_content, tool_calls) llama-server's chat parser reads in the
        generated `text` (what the model wrote after the prompt); a text cut short keeps what was read.
        `partial`: the text so far of a stream, read as llama-server reads it (a text the format does not
        match yet is an empty message once the parse read past its start).

        Raises:
            MessageParseError: the text does not match the format.
            NotPorted: the format's parser is not ported.
        """
        return self.format.parse(text, partial=partial)
