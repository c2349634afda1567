# Prompt text to prompt tokens, as llama-server makes them.
#
# Contract:
# - A raw prompt (`/completion`) is tokenized with special tokens parsed (`<start_of_turn>` written in
#   the text is that token) and BOS added when the model's metadata says so: llama-server's
#   `tokenize_input_prompts(..., add_special=true, parse_special=true)`.
# - A chat prompt (`/v1/chat/completions`) is the GGUF's chat template, or llama.cpp's ChatML template when
#   the GGUF has none, rendered as llama.cpp's chat layer renders it: the variables and rewritten messages
#   of `constraintd.engine.chat.templates.template_inputs.template_context`, rendered by
#   `render_template`, a Jinja2 environment made to behave as llama.cpp's own Jinja engine (common/jinja)
#   does where chat templates meet the difference (constraintd.chat_templates, with the template's
#   capabilities); a leading BOS
#   text is cut when the tokenizer adds BOS itself (and a trailing EOS text when it adds EOS); then the
#   text is tokenized as a raw prompt.
# - A chat with tools (`tool_chat`) is the service's: a session made from a chat request (CreateSession's
#   `chat`), whose reply gives the prompt, the grammar's triggers and prefill, the preserved tokens, the
#   stops and the parser settings (constraintd.service.chat computes llama.cpp's chat params: there is no
#   other copy). The worker keeps what is its own: the prompt's tokens, the preserved tokens as token ids
#   (their text is written with the output), and reading the answer back with the reply's parser.
#   The session's prefill is the service's: the generation prompt as text. llama-server prefills with
#   that text's tokens, dropping a first token whose piece starts with a space the text does not have;
#   the two differ only where a tokenizer joins such a space to more of the text in one token.
# - A chat with tools that gets no grammar (tool_choice none, a template without tool-call syntax, auto
#   with no word to trigger on) is free text: the service holds no session for it and refuses it (the
#   proto's contract), so the worker resolves it with the same engine calls the service makes
#   (`_free_text`), and generates without a session, as llama-server does.
# - Not done: images, reasoning formats.

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from clients import ChatRequest, ChatSettings, Client, Session, VocabHandle
from constraintd.chat_templates import (
    TemplateError,
    chat_grammar_of,
    chat_prompt_of,
    known_caps,
    render_template,
    template_caps,
)
from constraintd.engine.chat.params.chat_params import TOOL_CHOICES, NotPorted, regex_escape
from constraintd.engine.chat.parsing.chat_format import chat_format
from constraintd.engine.chat.parsing.message_parser import MessageParseError, ParsedMessage
from constraintd.engine.chat.requests import JSON_OBJECT_SCHEMA, AnswerFormat, read_request, resolve_request
from constraintd.engine.chat.templates.prompt import CHATML_TEMPLATE, template_source
from constraintd.engine.chat.templates.template_inputs import C_SPACE, ChatMessage, ChatTool, TemplateCaps
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.errors import ChatTemplateError, FreeTextError, NotPortedError
from sampler_worker.reasoning_budget import ReasoningBudget, server_budget, utf8_complete

# The renderer lives beside the engine (constraintd.chat_templates: the service renders with it too); its
# names are re-exported here, the worker's as they always were.
__all__ = [
    "CHATML_TEMPLATE", "Message", "TemplateError", "ToolChat", "chat_grammar_of", "chat_prompt_of",
    "chat_response_schema", "chat_settings", "chat_text", "generation_prefill", "prompt_tokens",
    "reasoning_budget", "regex_escape", "render_template", "template_caps", "tool_chat",
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


class PieceModel(TemplateModel, Protocol):
    """A model whose tokens' text can be read (`sampler_worker.model.Model` is one)."""

    def piece(self, token: int, *, special: bool = True) -> bytes: ...


def generation_prefill(model: PieceModel, generation_prompt: str) -> list[int]:
    """The generation prompt's tokens as common_sampler_init feeds them to the grammar and the reasoning
    budget: no BOS, special tokens parsed, and a first token dropped whose piece starts with a space the
    text does not start with (a tokenizer may put one before a leading special token)."""
    tokens = model.tokenize(generation_prompt, add_special=False, parse_special=True)
    leading_space = bool(generation_prompt) and generation_prompt[0] in C_SPACE
    if tokens and model.piece(tokens[0])[:1].isspace() and not leading_space:
        tokens = tokens[1:]
    return tokens


def reasoning_budget(
    settings: ChatSettings, model: PieceModel, tokens: int = -1, message: str = "", *, control: bool = False
) -> ReasoningBudget | None:
    """The reasoning budget llama-server runs for a chat with these settings (see `server_budget`), or None
    where it runs none: the template has no thinking tags, or the budget is unlimited, the grammar is not
    lazy, and no control was asked.

    `tokens`: the budget (-1: none, llama-server's default); `message`: written before the forced end tag
    (`reasoning_budget_message`); `control`: made even without a limit or a lazy grammar, so that the block
    can be ended while it runs (`reasoning_control`).
    """

    def tokenize(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=True)

    return server_budget(
        start_tag=settings.thinking_start_tag, end_tags=settings.thinking_end_tags, tokens=tokens,
        message=message, lazy=settings.grammar_lazy, tokenize=tokenize,
        complete=lambda token: utf8_complete(model.piece(token, special=False)),
        prefill=generation_prefill(model, settings.generation_prompt), control=control)


def chat_settings(
    model: TemplateModel, chat: str | Sequence[ChatMessage], *, template: str | None = None,
    now: float | None = None,
) -> ChatSettings:
    """What llama.cpp's chat params give a chat with neither tools nor a response schema (its thinking tags,
    stops, generation prompt), computed here by the engine's calls: it has no grammar for a session to hold.

    Raises:
        TemplateError: the template does not render the chat.
        NotPorted: the template's format is not ported.
    """
    source = model.chat_template or "" if template is None else template
    messages = [ChatMessage("user", chat)] if isinstance(chat, str) else list(chat)
    return _free_text(model, source, messages, [], "auto", False, time.time() if now is None else now)


def _single_token(model: TemplateModel, text: str) -> int | None:
    ids = model.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


@dataclass(frozen=True, slots=True)
class ToolChat:
    """A chat with tools, made by the service as llama-server prepares one; closing it closes its session.

    Attributes:
        prompt: the prompt's tokens (the reply's prompt, tokenized as llama-server tokenizes it).
        settings: what the service resolved the request to (`clients.ChatSettings`): the prompt, the stops,
            the preserved tokens, the triggers the session got, the parser settings.
        preserved: the preserved tokens that are one token here (their text is written with the output).
        session: the session that holds the grammar (its triggers or prefill in place), or None where the
            request gets no grammar (free text).
    """

    prompt: list[int]
    settings: ChatSettings
    preserved: frozenset[int]
    session: Session | None

    @property
    def stops(self) -> tuple[str, ...]:
        """The template's additional stop strings."""
        return self.settings.additional_stops

    def parse(self, text: str, *, partial: bool = False) -> ParsedMessage:
        """The message llama-server's chat parser reads in the whole generated text (`partial`: in a
        stream's text so far, ChatFormat.parse).

        Raises:
            MessageParseError: the text does not match the format.
            NotPorted: the format's parser is not ported.
        """
        return self.settings.parse(text, partial=partial)

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

    def reasoning_budget(
        self, model: PieceModel, tokens: int = -1, message: str = "", *, control: bool = False
    ) -> ReasoningBudget | None:
        """The reasoning budget llama-server runs for this chat (`reasoning_budget` of its settings)."""
        return reasoning_budget(self.settings, model, tokens, message, control=control)

    def close(self) -> None:
        """Close the session (nothing for free text). Does not raise for a session closed already."""
        if self.session is not None:
            self.session.close()

    def __enter__(self) -> ToolChat:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def chat_response_schema(constraint: Mapping[str, Any] | None) -> str | None:
    """The response schema of a chat completion with this constraint (`Client.session`'s keyword arguments),
    which llama-server makes the chat params' response-format grammar of (`tool_chat(json_schema=)`); None
    where the chat keeps the constraint's own grammar: no constraint, a GBNF grammar, an Ollama request
    (Ollama's server converts the schema alone), or the extended dialect (the project's, not llama-server's).

    Raises:
        SchemaError: a request body whose constraint fields are malformed or whose schema the converter
            refuses (the pointer in the body); with `strict`, a schema the grammar cannot enforce in full.
    """
    if constraint is None or constraint.get("dialect", "llama.cpp") != "llama.cpp":
        return None
    strict = bool(constraint.get("strict"))
    if constraint.get("json_object"):
        return JSON_OBJECT_SCHEMA
    schema = constraint.get("json_schema")
    if isinstance(schema, str):
        if strict:
            convert_json_schema(schema, strict=True)
        return schema
    request = constraint.get("openai_request")
    if not isinstance(request, str):
        return None
    requested = read_request(request)
    if requested.kind not in (AnswerFormat.JSON_OBJECT, AnswerFormat.JSON_SCHEMA) or requested.text is None:
        return None
    # a schema the converter refuses is refused here, at its place in the request's body
    resolve_request(request, strict=strict)
    return requested.text


def tool_chat(
    client: Client, vocab: VocabHandle, model: TemplateModel, chat: str | Sequence[ChatMessage],
    tools: Sequence[ChatTool], *, tool_choice: str = "auto", parallel_tool_calls: bool = False,
    template: str | None = None, now: float | None = None, json_schema: str | None = None,
) -> ToolChat:
    """llama-server's preparation of a chat with tools or a response schema, by the service: a session made
    from the chat request (the prompt rendered with the tools, the chat params' grammar with its lazy
    triggers or the generation prompt's prefill), and the reply's prompt tokenized here. Close the result
    when done.

    `vocab`: the model's vocabulary, registered with `client`.
    `chat`: one user message's text, or the messages (llama.cpp's, `template_inputs.parse_messages`).
    `tool_choice`: auto, required, none, or a tool's name (that tool alone, required).
    `template`: a chat template that replaces the model's.
    `json_schema`: the response's schema (JSON text; llama-server's `{"type":"object"}` for JSON mode): the
        grammar is then the chat params' response format (the generation prompt, space, the schema's JSON
        bare or in a ```json fence), as llama-server's for a chat completion's `response_format`.

    Raises:
        InputError: the service refuses the request, in words that name what: a tool_choice that names no
            tool, a trigger word that is one token and not preserved.
        TemplateError: the template does not render the request (the service's ChatTemplateError).
        NotPorted: the service says what is not ported yet: the template's format or its tool-call
            grammar.
        ConstraintdError: the service cannot make the session (limits, an unknown vocabulary, ...).
    """
    now = time.time() if now is None else now
    source = model.chat_template or "" if template is None else template
    messages = [ChatMessage("user", chat)] if isinstance(chat, str) else list(chat)
    request = ChatRequest(
        [message.to_json() for message in messages], template=source, tools=[t.to_json() for t in tools],
        tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, bos_text=model.bos_text,
        eos_text=model.eos_text, add_bos=model.add_bos, add_eos=model.add_eos, now=now,
        json_schema=json_schema)
    session: Session | None
    try:
        session = client.session(vocab, chat=request)
    except ChatTemplateError as exc:
        raise TemplateError(str(exc)) from None
    except NotPortedError as exc:
        raise NotPorted(exc.what) from None
    except FreeTextError:  # nothing to hold: the worker's own settings, with no session
        session, settings = None, _free_text(model, source, messages, tools, tool_choice, parallel_tool_calls,
                                             now)
    else:
        assert session.chat is not None  # a session made from a chat request has its settings
        settings = session.chat
    try:
        preserved = frozenset(token for text in settings.preserved_tokens
                              if (token := _single_token(model, text)) is not None)
        prompt = model.tokenize(settings.prompt, add_special=True, parse_special=True)
    except BaseException:
        if session is not None:
            session.close()
        raise
    return ToolChat(prompt, settings, preserved, session)


def _free_text(
    model: TemplateModel, source: str, messages: Sequence[ChatMessage], tools: Sequence[ChatTool],
    tool_choice: str, parallel_tool_calls: bool, now: float,
) -> ChatSettings:
    # The settings the service gives a chat request (constraintd.service.chat.resolve_chat), for the one it
    # refuses to hold: the same engine calls, on a request the service has checked already (a named tool is
    # among the tools), and no grammar.
    if tool_choice not in TOOL_CHOICES:
        tools, tool_choice = [tool for tool in tools if tool.name == tool_choice], "required"
    source = template_source(source)
    caps = known_caps(source)
    made = chat_prompt_of(source, messages, tools=tools, bos_text=model.bos_text, eos_text=model.eos_text,
                          add_bos=model.add_bos, add_eos=model.add_eos, now=now, caps=caps)
    params = chat_grammar_of(
        source, messages, tools=tools, tool_choice=tool_choice, bos_text=model.bos_text,
        eos_text=model.eos_text, now=now, caps=caps, parallel_tool_calls=parallel_tool_calls,
        generation_prompt=made.generation_prompt)
    # what the service refused: no grammar, on a template it has a parser for (an analysis, or the format's)
    assert not params.grammar and (params.analysis is not None or params.arena is not None)
    parser = chat_format(params, made.generation_prompt, tuple(tool.to_json() for tool in tools),
                         tool_choice, parallel_tool_calls, "auto", caps.supports_tool_calls, False)
    return ChatSettings(
        prompt=made.prompt, generation_prompt=made.generation_prompt, grammar="", grammar_lazy=False,
        trigger_patterns=(), trigger_tokens=(), preserved_tokens=tuple(params.preserved_tokens or ()),
        additional_stops=params.additional_stops, supports_thinking=params.supports_thinking,
        thinking_start_tag=params.thinking_start_tag, thinking_end_tags=params.thinking_end_tags,
        prefill=b"", format=parser)
