# A chat request resolved as llama-server resolves one: its prompt and llama.cpp's chat params (grammar,
# lazy triggers, preserved tokens, stops, thinking tags), and the parser settings that read its answer back.
#
# Invariants:
# - `ChatRequest` is a value: everything the resolution depends on, the request time included (a template
#   may print the date), so its text (`to_text`) is the constraint's text and the compile cache's key.
#   Two requests that resolve to the same grammar and triggers (the same tools on the same template, other
#   messages) share one compiled grammar: the registry's grammar cache is keyed by what `resolve_chat`
#   gives, not by the request.
# - This is the one resolution of a chat with tools: the worker (`sampler-worker generate --tools`, serve's
#   tools) makes its sessions here. The prompt and the chat params come through constraintd.chat_templates;
#   tool_choice naming a tool offers that tool alone, required. A lazy tool grammar on a thinking template
#   is the caller's to keep from the thinking block, as llama-server's reasoning-budget sampler keeps it
#   (the settings carry the tags; sampler_worker.reasoning_budget is that sampler). A request that gets
#   no grammar (no tools the template can call, tool_choice none, auto with no word to trigger on) is
#   refused first, as FreeTextError: there is nothing to hold (the worker generates free text then). Each
#   refusal a caller acts on has its own class (ChatTemplateError, FreeTextError, NotPortedError), which
#   every transport carries. A hand-written format's request carries its parser (the PEG arena its grammar
#   is written from) in place of the analysis; one whose chat params give no parser (no grammar either, in
#   the formats that build none then) is refused before that, as NotPortedError: the settings carry the
#   parser.
# - A refusal is the same for the same request (its key holds all it depends on): the registry remembers
#   it as it remembers a refused grammar, so asking again resolves nothing.
# - Trigger words become triggers over a vocabulary as llama-server makes them (server-schema.cpp): a word
#   that is one token triggers on that token when it is a preserved token (and is refused when it is not);
#   any other word triggers on its text, as an escaped pattern. `chat_triggers` needs the vocabulary, so
#   the registry calls it where it builds the grammar; the rest needs none and runs in `prepare`.
# - A non-lazy grammar starts with the generation prompt: the session takes it as already generated
#   (`ChatSettings.prefill`), as the worker does.
# - No grpc, no asyncio; every refusal is a ConstraintdError (INVALID_ARGUMENT), naming what is not ported.
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from constraintd.chat_templates import TemplateError, chat_grammar_of, chat_prompt_of, known_caps
from constraintd.engine.chat.params.chat_params import (
    TOOL_CHOICES,
    ChatGrammar,
    NotPorted,
    regex_escape,
    specialised_format,
)
from constraintd.engine.chat.parsing.chat_format import chat_format
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import ChatTool, parse_messages, parse_tools
from constraintd.engine.schema.json_text import parse_json
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import ChatTemplateError, FreeTextError, InputError, NotPortedError

__all__ = ["ChatRequest", "ChatSettings", "chat_triggers", "regex_escape", "resolve_chat"]

REASONING_FORMATS = ("auto", "none")


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat request as CreateSession's `chat` field carries it (see the proto for each field)."""

    template: str = ""
    messages: str = "[]"
    tools: str = ""
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    json_schema: str = ""
    reasoning_format: str = "auto"
    enable_thinking: bool = True
    bos_text: str = ""
    eos_text: str = ""
    add_bos: bool = False
    add_eos: bool = False
    now: float = 0.0

    def to_text(self) -> str:
        """The request as JSON text, the same for equal requests."""
        return json.dumps(asdict(self), sort_keys=True, ensure_ascii=False)

    @classmethod
    def from_text(cls, text: str) -> ChatRequest:
        """The request `to_text` wrote."""
        values = json.loads(text)
        return cls(**{f.name: values[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class ChatSettings:
    """What a chat request resolved to, besides its grammar: what the caller needs to run the generation
    and read its answer back.

    Attributes:
        prompt: the prompt the template renders for the messages and tools.
        generation_prompt: the text the template adds for the assistant's turn.
        grammar: the grammar (GBNF).
        grammar_lazy: the grammar waits for a trigger.
        trigger_words: words to trigger on, made triggers over a vocabulary by `chat_triggers`.
        trigger_patterns: patterns to trigger on, as llama-server writes them (full patterns anchored).
        preserved_tokens: the template's tokens the answer keeps (llama.cpp's preserved_tokens).
        additional_stops: stop strings the template adds.
        supports_thinking: the template has a reasoning block; then its tags.
        thinking_start_tag: see supports_thinking.
        thinking_end_tags: see supports_thinking.
        parser: the parser settings, `ChatFormat.to_json()`.
        prefill: the text the session takes as generated before any token (a non-lazy grammar's
            generation prompt), UTF-8.
    """

    prompt: str
    generation_prompt: str
    grammar: str
    grammar_lazy: bool
    trigger_words: tuple[str, ...]
    trigger_patterns: tuple[str, ...]
    preserved_tokens: tuple[str, ...]
    additional_stops: tuple[str, ...]
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    parser: str
    prefill: bytes

    @property
    def nbytes(self) -> int:
        """An estimate of the bytes it holds (its texts)."""
        texts = [self.prompt, self.generation_prompt, self.grammar, self.thinking_start_tag, self.parser,
                 self.prefill, *self.trigger_words, *self.trigger_patterns, *self.preserved_tokens,
                 *self.additional_stops, *self.thinking_end_tags]
        return sys.getsizeof(self) + sum(map(sys.getsizeof, texts))


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputError(f"the chat request's {what} are not JSON: {exc}") from None


def _tools(request: ChatRequest) -> tuple[list[ChatTool], str]:
    tools = parse_tools(_json(request.tools, "tools") if request.tools else None)
    choice = request.tool_choice or "auto"
    if choice in TOOL_CHOICES:
        return tools, choice
    named = [tool for tool in tools if tool.name == choice]
    if not named:
        raise InputError(f"tool_choice {choice!r} names none of the tools")
    return named, "required"


def _patterns(params: ChatGrammar) -> tuple[tuple[str, ...], tuple[str, ...]]:
    words: list[str] = []
    patterns: list[str] = []
    for trigger in params.grammar_triggers:
        if trigger.kind == "word":
            words.append(trigger.value)
        else:
            patterns.append(trigger.pattern())
    return tuple(words), tuple(patterns)


def resolve_chat(request: ChatRequest) -> tuple[str, ChatSettings]:
    """The grammar (GBNF) and the settings of a chat request (see the module's invariants).

    Raises:
        InputError: messages or tools that are not JSON or that llama.cpp refuses, a tool_choice or
            reasoning format it does not take.
        ChatTemplateError: the template does not render the request.
        NotPortedError: a part of llama.cpp's chat layer the request needs is not ported (named).
        FreeTextError: the request gets no grammar.
        SchemaError: llama.cpp refuses the response schema.
    """
    if request.reasoning_format not in REASONING_FORMATS:
        raise InputError(f"reasoning_format {request.reasoning_format!r} is none of {REASONING_FORMATS}")
    messages = parse_messages(_json(request.messages, "messages"))
    tools, tool_choice = _tools(request)
    schema = parse_json(request.json_schema) if request.json_schema else None
    source = template_source(request.template)
    try:
        caps = known_caps(source)
        made = chat_prompt_of(
            source, messages, tools=tools, bos_text=request.bos_text, eos_text=request.eos_text,
            add_bos=request.add_bos, add_eos=request.add_eos, enable_thinking=request.enable_thinking,
            now=request.now, caps=caps)
        params = chat_grammar_of(
            source, messages, tools=tools, tool_choice=tool_choice, json_schema=schema,
            reasoning_format=request.reasoning_format, bos_text=request.bos_text, eos_text=request.eos_text,
            enable_thinking=request.enable_thinking, now=request.now, caps=caps,
            parallel_tool_calls=request.parallel_tool_calls, generation_prompt=made.generation_prompt)
    except TemplateError as exc:
        raise ChatTemplateError(str(exc)) from None
    except NotPorted as exc:
        raise NotPortedError(str(exc)) from None
    if params.analysis is None and params.arena is None:
        # a hand-written format's request without its parser: the parser settings (ChatFormat) carry one
        raise NotPortedError(f"the {specialised_format(source)} format's message parser without a grammar")
    if not params.grammar:
        raise FreeTextError("the chat request asks for free text (no tools the template can call, "
                            "tool_choice none, or auto with no word to trigger on): there is no constraint "
                            "to hold")
    words, patterns = _patterns(params)
    parser = chat_format(params, made.generation_prompt, tuple(tool.to_json() for tool in tools), tool_choice,
                         request.parallel_tool_calls, request.reasoning_format, caps.supports_tool_calls,
                         schema is not None)
    return params.grammar, ChatSettings(
        prompt=made.prompt,
        generation_prompt=made.generation_prompt,
        grammar=params.grammar,
        grammar_lazy=params.grammar_lazy,
        trigger_words=words,
        trigger_patterns=patterns,
        preserved_tokens=tuple(params.preserved_tokens or ()),
        additional_stops=params.additional_stops,
        supports_thinking=params.supports_thinking,
        thinking_start_tag=params.thinking_start_tag,
        thinking_end_tags=params.thinking_end_tags,
        parser=parser.to_json(),
        prefill=b"" if params.grammar_lazy else made.generation_prompt.encode("utf-8"),
    )


def chat_triggers(
    words: Sequence[str], preserved: Sequence[str], vocab: Vocab
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Trigger words as llama-server makes them triggers over `vocab`: (patterns, tokens).

    Raises:
        InputError: a word that is one token and not a preserved one (llama-server refuses it too).
    """
    patterns: list[str] = []
    tokens: list[int] = []
    for word in words:
        token = vocab.token_for_text(word)
        if token is None:
            patterns.append(regex_escape(word))
        elif word in preserved:
            tokens.append(token)
        else:
            raise InputError(f"Grammar trigger word should be marked as preserved token: {word}")
    return tuple(patterns), tuple(tokens)
