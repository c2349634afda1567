# Prompt text to prompt tokens, as llama-server makes them.
#
# Contract:
# - A raw prompt (`/completion`) is tokenized with special tokens parsed (`<start_of_turn>` written in
#   the text is that token) and BOS added when the model's metadata says so: llama-server's
#   `tokenize_input_prompts(..., add_special=true, parse_special=true)`.
# - A chat prompt (`/v1/chat/completions`) is the GGUF's chat template, or llama.cpp's ChatML template when
#   the GGUF has none, rendered as llama.cpp's chat layer renders it: the variables and rewritten messages
#   of `constraintd.engine.chat.template_inputs.template_context`, rendered by `render_template`, a Jinja2
#   environment made to behave as llama.cpp's own Jinja engine (common/jinja) does where chat templates
#   meet the difference (constraintd.chat_templates, with the template's capabilities); a leading BOS
#   text is cut when the tokenizer adds BOS itself (and a trailing EOS text when it adds EOS); then the
#   text is tokenized as a raw prompt.
# - Not done: images, reasoning formats, and prefilling the grammar with the template's generation prompt.

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from constraintd.chat_templates import (
    TemplateError,
    chat_grammar_of,
    chat_prompt_of,
    known_caps,
    render_template,
    template_caps,
)
from constraintd.engine.chat.chat_params import TOOL_CHOICES, ChatGrammar, NotPorted, regex_escape
from constraintd.engine.chat.message_parser import MessageParseError, ParsedMessage, parse_message
from constraintd.engine.chat.prompt import CHATML_TEMPLATE, template_source
from constraintd.engine.chat.template_inputs import ChatMessage, ChatTool, TemplateCaps

# The renderer lives beside the engine (constraintd.chat_templates: the service renders with it too); its
# names are re-exported here, the worker's as they always were.
__all__ = [
    "CHATML_TEMPLATE", "Message", "TemplateError", "ToolChat", "chat_grammar_of", "chat_prompt_of",
    "chat_text", "prompt_tokens", "regex_escape", "render_template", "template_caps", "tool_chat",
]



@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: str
    content: str


class TemplateModel(Protocol):
    """What prompt building needs from a model (`sampler_worker.model.Model` has it)."""

    chat_template: str | None
    bos_text: str
    eos_text: str
    add_bos: bool
    add_eos: bool

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...


class ToolModel(TemplateModel, Protocol):
    """What a chat with tools needs from a model besides its template: the text of a token."""

    def piece(self, token: int, *, special: bool = True) -> bytes: ...


def chat_text(
    model: TemplateModel, messages: Sequence[Message | ChatMessage], *, now: float | None = None,
    caps: TemplateCaps | None = None, template: str | None = None,
) -> str:
    """The prompt text llama-server renders for these messages, ready to tokenize.

    `caps`: the template's capabilities, found in the template when not given (`template_caps`).
    `template`: a chat template that replaces the model's (llama-server's --chat-template-file).

    Raises:
        TemplateError: the template does not render.
    """
    chat = [m if isinstance(m, ChatMessage) else ChatMessage(m.role, m.content) for m in messages]
    return chat_prompt_of(
        model.chat_template or "" if template is None else template, chat, bos_text=model.bos_text,
        eos_text=model.eos_text, add_bos=model.add_bos, add_eos=model.add_eos, now=now, caps=caps).prompt


def prompt_tokens(model: TemplateModel, *, prompt: str | None = None, chat: str | None = None,
                  template: str | None = None) -> list[int]:
    """The tokens llama-server evaluates for a raw prompt or a one-message chat.

    `template`: a chat template that replaces the model's (llama-server's --chat-template-file).

    Raises:
        ValueError: not exactly one of prompt and chat.
        TemplateError: the chat template does not render.
    """
    if (prompt is None) == (chat is None):
        raise ValueError("give exactly one of prompt= and chat=")
    if prompt is not None:
        text = prompt
    else:
        messages = [ChatMessage("user", chat or "")]
        text = chat_prompt_of(
            model.chat_template or "" if template is None else template, messages, bos_text=model.bos_text,
            eos_text=model.eos_text, add_bos=model.add_bos, add_eos=model.add_eos).prompt
    return model.tokenize(text, add_special=True, parse_special=True)


def _single_token(model: TemplateModel, text: str) -> int | None:
    ids = model.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


@dataclass(frozen=True, slots=True)
class ToolChat:
    """A chat with tools, prepared as llama-server prepares it.

    Attributes:
        prompt: the prompt's tokens.
        generation_prompt: the text the template adds for the assistant's turn.
        params: the chat params' grammar side (constraintd.engine.chat.chat_params).
        session: the keyword arguments of `Client.session` (the grammar, its triggers or its prefill), or
            None where the request gets no grammar.
        stops: the template's additional stop strings.
        preserved: the preserved tokens that are one token here (their text is written with the output).
    """

    prompt: list[int]
    generation_prompt: str
    params: ChatGrammar
    tools: tuple[ChatTool, ...]
    tool_choice: str
    parallel_tool_calls: bool
    supports_tool_calls: bool
    session: dict[str, Any] | None
    stops: tuple[str, ...]
    preserved: frozenset[int]

    def parse(self, text: str) -> ParsedMessage:
        """The message llama-server's chat parser reads in the whole generated text.

        Raises:
            MessageParseError: the text does not match the format.
            NotPorted: the format's parser is not ported.
        """
        return parse_message(
            text, self.params, generation_prompt=self.generation_prompt,
            tools=[tool.to_json() for tool in self.tools], tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls, supports_tool_calls=self.supports_tool_calls)

    def read(self, text: str) -> tuple[ParsedMessage, str | None]:
        """The message in the whole generated text, and None; or, where the parser refuses the text, the
        text as content alone and the parser's words (what `generate --tools` reports, and `serve` answers).

        Raises:
            NotPorted: the format's parser is not ported.
        """
        try:
            return self.parse(text), None
        except MessageParseError as exc:
            return ParsedMessage(text), str(exc)

    def stop_strings(self, stop: Sequence[str]) -> list[str]:
        """The request's stop strings followed by the template's that are not among them."""
        return [*stop, *(s for s in self.stops if s not in stop)]


def _session_of(model: ToolModel, params: ChatGrammar, generation_prompt: str,
                preserved: frozenset[int]) -> dict[str, Any] | None:
    # what llama-server hands common_sampler_init (server-schema.cpp's grammar_triggers, sampling.cpp)
    if not params.grammar:
        return None
    if not params.grammar_lazy:
        # the grammar starts with the generation prompt: the sampler accepts its tokens first (prefill),
        # skipping a first token some tokenizers give a space the text does not have
        tokens = model.tokenize(generation_prompt, add_special=False, parse_special=True)
        pieces = [model.piece(token, special=True) for token in tokens]
        if pieces and pieces[0][:1].isspace() and not generation_prompt[:1].isspace():
            pieces = pieces[1:]
        return {"gbnf": params.grammar, "prefill": b"".join(pieces)}
    patterns: list[str] = []
    tokens = []
    for trigger in params.grammar_triggers:
        if trigger.kind == "word":
            token = _single_token(model, trigger.value)
            if token is None:
                patterns.append(trigger.pattern())
            elif token in preserved:
                tokens.append(token)
            else:
                raise TemplateError(
                    f"Grammar trigger word should be marked as preserved token: {trigger.value}")
        else:
            patterns.append(trigger.pattern())
    return {"gbnf": params.grammar, "trigger_patterns": patterns, "trigger_tokens": tokens}


def tool_chat(
    model: ToolModel, chat: str | Sequence[ChatMessage], tools: Sequence[ChatTool], *,
    tool_choice: str = "auto", parallel_tool_calls: bool = False, template: str | None = None,
    now: float | None = None,
) -> ToolChat:
    """llama-server's preparation of a chat with tools: the prompt rendered with the tools, the chat
    params' grammar, lazy triggers (a word that is one preserved token triggers on that token, any other
    word on its text) or the generation prompt's prefill, and the template's stops.

    `chat`: one user message's text, or the messages (llama.cpp's, `template_inputs.parse_messages`).
    `tool_choice`: auto, required, none, or a tool's name (that tool alone, required).
    `template`: a chat template that replaces the model's.

    Raises:
        ValueError: a tool_choice that names no tool.
        TemplateError: the template does not render the request, or a trigger word is one token that is
            not preserved (llama-server refuses it too).
        NotPorted: the template's format, or its tool-call grammar, is not ported yet; or tool_choice auto
            on a thinking template (the reasoning-budget sampler llama-server adds is not).
    """
    if tool_choice not in TOOL_CHOICES:
        named = [tool for tool in tools if tool.name == tool_choice]
        if not named:
            raise ValueError(f"tool_choice {tool_choice!r} names none of the tools")
        tools, tool_choice = named, "required"
    now = time.time() if now is None else now
    source = template_source(model.chat_template or "" if template is None else template)
    caps = known_caps(source)
    messages = [ChatMessage("user", chat)] if isinstance(chat, str) else list(chat)
    made = chat_prompt_of(source, messages, tools=tools, bos_text=model.bos_text, eos_text=model.eos_text,
                          add_bos=model.add_bos, add_eos=model.add_eos, now=now, caps=caps)
    params = chat_grammar_of(source, messages, tools=tools, tool_choice=tool_choice, bos_text=model.bos_text,
                             eos_text=model.eos_text, now=now, caps=caps,
                             parallel_tool_calls=parallel_tool_calls,
                             generation_prompt=made.generation_prompt)
    if params.grammar_lazy and params.thinking_end_tags:
        # llama-server then runs a reasoning-budget sampler that keeps the thinking block from the lazy
        # grammar (common/sampling.cpp grammar_should_apply): a trigger word inside it wakes nothing
        raise NotPorted("a lazy tool grammar on a thinking template (llama-server's reasoning-budget sampler "
                        "keeps the thinking block from it)")
    preserved = frozenset(token for text in params.preserved_tokens or ()
                          if (token := _single_token(model, text)) is not None)
    return ToolChat(
        prompt=model.tokenize(made.prompt, add_special=True, parse_special=True),
        generation_prompt=made.generation_prompt, params=params, tools=tuple(tools), tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls, supports_tool_calls=caps.supports_tool_calls,
        session=_session_of(model, params, made.generation_prompt, preserved), stops=params.additional_stops,
        preserved=preserved)
