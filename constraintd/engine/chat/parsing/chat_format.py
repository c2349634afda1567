# What reading a generated text back needs, as one value that travels: the request's parser settings.
#
# Contract:
# - A `ChatFormat` holds every input of `parse_message` that is not the text: the template's analysis
#   (reasoning tags, content wrapping, the tool-call format's markers and fields) or, for a hand-written
#   format, the request's parser (its PEG arena) and the format's name, the generation prompt, the tools,
#   tool_choice, parallel_tool_calls, the reasoning format, the template's tool-call capability and whether
#   a response schema was asked. `parse(text)` is `parse_message` on them.
# - `to_json()` writes it as JSON text and `from_json` reads that text back to an equal value, so the
#   service that resolved a chat request can hand it to a client that parses the generation (the client has
#   no template renderer, and needs none: the analysis and the parser are data). `from_json` refuses what
#   `to_json` does not write (a missing or mistyped field) with ValueError.
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from constraintd.engine.chat.analysis.reasoning import ReasoningAnalysis, ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import (
    CallIdPosition,
    ContentMode,
    TemplateAnalysis,
    ToolFormat,
    ToolMode,
)
from constraintd.engine.chat.params.chat_params import ChatGrammar
from constraintd.engine.chat.parsing.message_parser import ParsedMessage, parse_message
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["ChatFormat", "chat_format"]

# The version of the JSON layout: a reader refuses another. 2: the tag formats' markers. 3: a hand-written
# format's parser in place of the analysis.
_VERSION = 3


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """A chat request's parser settings: how its answer is read back (see the module's contract)."""

    analysis: TemplateAnalysis | None  # None: a hand-written format's, read with `arena`
    generation_prompt: str
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    reasoning_format: str = "auto"
    supports_tool_calls: bool = True
    has_response_format: bool = False
    arena: PegArena | None = None  # a hand-written format's parser
    format_name: str = ""  # a hand-written format's (its parser's mapper)

    def parse(self, text: str, *, partial: bool = False) -> ParsedMessage:
        """The message (content, reasoning content, tool calls) llama.cpp's chat parser reads in the whole
        generated `text`; a text cut short keeps what was read, as its lenient parser does. `partial`
        reads a stream's text so far as llama-server does: a text the format does not match (yet) is an
        empty message once the parse read past its start (message_parser.parse_message).

        Raises:
            MessageParseError: the text does not match the format.
            NotPorted: the format's parser is not ported.
        """
        grammar = ChatGrammar(analysis=self.analysis) if self.analysis is not None else \
            ChatGrammar(arena=self.arena, format_name=self.format_name)
        return parse_message(
            text, grammar, generation_prompt=self.generation_prompt,
            tools=self.tools, tool_choice=self.tool_choice, parallel_tool_calls=self.parallel_tool_calls,
            reasoning_format=self.reasoning_format, supports_tool_calls=self.supports_tool_calls,
            has_response_format=self.has_response_format, partial=partial)

    def to_json(self) -> str:
        """The settings as JSON text (`from_json` reads it back)."""
        analysis = self.analysis
        written: dict[str, Any] | None = None
        if analysis is not None:
            reasoning = analysis.reasoning
            written = {
                "reasoning": {"mode": reasoning.mode.value, "start": reasoning.start, "end": reasoning.end},
                "content_mode": analysis.content_mode.value,
                "content_start": analysis.content_start,
                "content_end": analysis.content_end,
                "tools": {f.name: _plain(getattr(analysis.tools, f.name)) for f in fields(ToolFormat)},
                "preserved_tokens": analysis.preserved_tokens,
                "additional_stops": analysis.additional_stops,
            }
        return json.dumps({
            "version": _VERSION,
            "analysis": written,
            "arena": None if self.arena is None else self.arena.to_data(),
            "format_name": self.format_name,
            "generation_prompt": self.generation_prompt,
            "tools": list(self.tools),
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning_format": self.reasoning_format,
            "supports_tool_calls": self.supports_tool_calls,
            "has_response_format": self.has_response_format,
        }, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ChatFormat:
        """The settings `to_json` wrote.

        Raises:
            ValueError: not JSON, another layout's version, or a field missing or of the wrong type.
        """
        try:
            data = json.loads(text)
            if data.get("version") != _VERSION:
                raise ValueError(f"chat format version {data.get('version')!r}, not {_VERSION}")
            found = data["analysis"]
            analysis = None if found is None else _analysis(found)
            arena = None if data["arena"] is None else PegArena.from_data(data["arena"])
            if (analysis is None) == (arena is None):
                raise ValueError("a chat format reads with an analysis or a parser, one of them")
            return cls(
                analysis, _text(data["generation_prompt"]), tuple(_objects(data["tools"])),
                _text(data["tool_choice"]), bool(data["parallel_tool_calls"]),
                _text(data["reasoning_format"]), bool(data["supports_tool_calls"]),
                bool(data["has_response_format"]), arena, _text(data["format_name"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a chat format: {type(exc).__name__}: {exc}") from None


def chat_format(params: ChatGrammar, generation_prompt: str, tools: tuple[Mapping[str, Any], ...],
                tool_choice: str, parallel_tool_calls: bool, reasoning_format: str, supports_tool_calls: bool,
                has_response_format: bool) -> ChatFormat:
    """The parser settings of a request whose chat params are `params`: its analysis, or a hand-written
    format's parser and name."""
    if params.analysis is not None:
        return ChatFormat(params.analysis, generation_prompt, tools, tool_choice, parallel_tool_calls,
                          reasoning_format, supports_tool_calls, has_response_format)
    return ChatFormat(None, generation_prompt, tools, tool_choice, parallel_tool_calls, reasoning_format,
                      supports_tool_calls, has_response_format, params.arena, params.format_name)


def _analysis(found: Any) -> TemplateAnalysis:
    tool_fields = dict(found["tools"])
    tool_fields["mode"] = ToolMode(tool_fields["mode"])
    tool_fields["call_id_position"] = CallIdPosition(tool_fields["call_id_position"])
    reasoning = found["reasoning"]
    return TemplateAnalysis(
        reasoning=ReasoningAnalysis(ReasoningMode(reasoning["mode"]), _text(reasoning["start"]),
                                    _text(reasoning["end"])),
        content_mode=ContentMode(found["content_mode"]),
        content_start=_text(found["content_start"]),
        content_end=_text(found["content_end"]),
        tools=ToolFormat(**tool_fields),
        preserved_tokens=_texts(found["preserved_tokens"]),
        additional_stops=_texts(found["additional_stops"]),
    )


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, (ToolMode, CallIdPosition)) else value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


def _texts(values: Any) -> list[str]:
    if not isinstance(values, list):
        raise TypeError(f"{values!r} is not a list")
    return [_text(value) for value in values]


def _objects(values: Sequence[Any]) -> list[Mapping[str, Any]]:
    if not isinstance(values, list) or not all(isinstance(value, dict) for value in values):
        raise TypeError("the tools are not a list of objects")
    return values
