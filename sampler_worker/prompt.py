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
#   meet the difference (below); a leading BOS text is cut when the tokenizer adds BOS itself (and a
#   trailing EOS text when it adds EOS); then the text is tokenized as a raw prompt.
# - llama.cpp's Jinja, in this environment: trim_blocks and lstrip_blocks; {% break %} / {% continue %};
#   {% generation %} renders its body; `tojson` keeps key order, writes ", " and ": " and no HTML escapes,
#   and takes ensure_ascii / indent / separators; `{{ x }}` prints nothing for none, undefined and
#   mappings; `+` joins a string to none or undefined as to ""; map / select / reject / selectattr /
#   rejectattr / unique give lists; lists are mutable (append, pop); `safe` and `string` give text,
#   never Markup, and write lists and mappings as llama.cpp does; `strftime_now` formats the request's
#   time; `raise_exception(message)` fails the render with "Jinja Exception: message"; a list or mapping
#   holding a list or mapping equals nothing (llama.cpp compares only "hashable" ones); `~` joins none and
#   undefined as ""; `format` fills "{}" placeholders only.
# - The template's capabilities (which of llama.cpp's rewrites apply) are found as llama.cpp finds them,
#   by running the template on probe conversations (`template_caps`, constraintd.engine.chat.caps).
# - Not done: images, reasoning formats, and prefilling the grammar with the template's generation prompt.

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from constraintd.engine.chat.caps import detect_caps, quietly, touch
from constraintd.engine.chat.chat_params import TOOL_CHOICES, ChatGrammar, NotPorted, chat_params
from constraintd.engine.chat.jinja_values import (
    llama_json,
    llama_repr,
    llama_string,
    llama_values,
    output_text,
)
from constraintd.engine.chat.message_parser import MessageParseError, ParsedMessage, parse_message
from constraintd.engine.chat.prompt import CHATML_TEMPLATE, ChatPrompt, chat_prompt, template_source
from constraintd.engine.chat.template_inputs import ChatMessage, ChatTool, TemplateCaps, format_time

if TYPE_CHECKING:
    import jinja2

__all__ = [
    "CHATML_TEMPLATE", "Message", "ToolChat", "chat_prompt_of", "chat_text", "prompt_tokens", "regex_escape",
    "render_template", "template_caps", "tool_chat",
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


class TemplateError(ValueError):
    """A chat template that cannot be rendered (or raised an error on purpose)."""


# Jinja2's filters that give generators where llama.cpp's give arrays (tojson and indexing need a list).
LIST_FILTERS = ("map", "select", "reject", "selectattr", "rejectattr", "unique")


def _tojson(value: Any, ensure_ascii: Any = False, indent: Any = None, separators: Any = None,
            sort_keys: Any = False) -> str:
    if sort_keys:
        raise TemplateError("tojson sort_keys=true not implemented")  # as llama.cpp
    return llama_json(_plain(value), indent=indent if isinstance(indent, int) else None,
                      separators=separators if isinstance(separators, (list, tuple)) else None,
                      ensure_ascii=bool(ensure_ascii))


def _string(value: Any) -> str:
    # llama.cpp has no markup: `string` and `safe` give text, never Markup (which would HTML-escape what is
    # joined to it), and a list or mapping is written in llama.cpp's own way (no \x escapes)
    return llama_string(_plain(value))


def _concat(items: Sequence[Any]) -> str:
    import jinja2

    def text(item: Any) -> str:
        if item is None or isinstance(item, jinja2.Undefined):
            return ""
        if isinstance(item, (str, bool, int, float)):
            return str(item) if isinstance(item, str) else output_text(item)
        return llama_repr(item)

    return "".join(text(item) for item in items)


def _format(template: Any, *args: Any) -> str:
    # llama.cpp's format: only "{}" placeholders, each the next argument's text
    if not isinstance(template, str):
        raise TemplateError("format() first argument must be a string")
    pieces = template.split("{")
    out, arguments = [pieces[0]], iter(args)
    for piece in pieces[1:]:
        if not piece.startswith("}"):
            raise TemplateError("format() only supports simple '{}' placeholders")
        out.append(_concat([next(arguments, "")]) + piece[1:])
    return "".join(out)


def _plain(value: Any) -> Any:
    # a Jinja2 namespace or loop helper is no JSON value; anything else passes as it is
    import jinja2

    return None if isinstance(value, jinja2.Undefined) else value


def _listed(filter_function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(filter_function)  # keeps Jinja2's pass_context / pass_environment marks
    def listed(*args: Any, **kwargs: Any) -> Any:
        return list(filter_function(*args, **kwargs))

    return listed


def _tracking(function: Callable[..., Any], op: str) -> Callable[..., Any]:
    # a filter or test seen by the capability probes: its input is used, with its name as the operation;
    # what the function itself does to its input (iterating it) is not the template's access
    from jinja2.utils import _PassArg

    at = 0 if _PassArg.from_obj(function) is None else 1
    deep = op in ("tojson", "string")

    @functools.wraps(function)
    def seen(*args: Any, **kwargs: Any) -> Any:
        value = args[at] if len(args) > at else None
        touch(value, op, deep=deep)
        with quietly(value):
            return function(*args, **kwargs)

    return seen


def _access(container: Any, key: Any, value: Any) -> Any:
    # llama.cpp's member access: the value, and the container with how it was read
    touch(value)
    by_index = isinstance(key, int) and not isinstance(container, dict)
    touch(container, "array_access" if by_index else "object_access")
    return value


# The request's time, passed to a render as a variable so that one compiled template serves every request.
NOW_VARIABLE = "__request_time__"


@functools.lru_cache(maxsize=2)  # the two environments (rendering, and the capability probes), made once
def _environment(*, tracking: bool = False) -> jinja2.Environment:
    import jinja2
    import jinja2.compiler
    import jinja2.ext
    import jinja2.nodes
    import jinja2.sandbox

    class CodeGenerator(jinja2.compiler.CodeGenerator):
        # `a ~ b` joins as llama.cpp joins: none and undefined as "", values as llama.cpp writes them
        def visit_Concat(self, node: jinja2.nodes.Concat, frame: jinja2.compiler.Frame) -> None:
            self.write("environment.llama_concat((")
            for item in node.nodes:
                self.visit(item, frame)
                self.write(", ")
            self.write("))")

        def _output_child_to_const(self, node: jinja2.nodes.Expr, frame: jinja2.compiler.Frame,
                                   finalize: Any) -> str:
            # Jinja2 folds a constant `{{ 'a' ~ none }}` as Python would join it: leave joins to run
            if isinstance(node, jinja2.nodes.Concat) or any(True for _ in node.find_all(jinja2.nodes.Concat)):
                raise jinja2.nodes.Impossible()
            folded: str = super()._output_child_to_const(node, frame, finalize)
            return folded

    class Undefined(jinja2.ChainableUndefined):
        # llama.cpp: a string joined to undefined with + is the string
        def __add__(self, other: Any) -> Any:
            return other if isinstance(other, str) else super().__add__(other)

        def __radd__(self, other: Any) -> Any:
            return other if isinstance(other, str) else super().__radd__(other)

    class Generation(jinja2.ext.Extension):
        # transformers' {% generation %} marks the assistant's tokens; llama.cpp renders its body
        tags = {"generation"}  # noqa: RUF012 (Jinja2 declares it an instance attribute)

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    class Environment(jinja2.sandbox.SandboxedEnvironment):
        intercepted_binops = frozenset(["+"])
        code_generator_class = CodeGenerator
        llama_concat = staticmethod(_concat)

        def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
            # llama.cpp joins none to a string as ""
            joins_none = left is None or right is None
            if operator == "+" and joins_none and (isinstance(left, str) or isinstance(right, str)):
                return (left or "") + (right or "")
            return super().call_binop(context, operator, left, right)

    class Tracking(Environment):
        # the capability probes' environment: every read of a tracked value is reported (engine caps.py)
        def getitem(self, obj: Any, argument: Any) -> Any:
            return _access(obj, argument, super().getitem(obj, argument))

        def getattr(self, obj: Any, attribute: str) -> Any:
            return _access(obj, attribute, super().getattr(obj, attribute))

    def printed(value: Any) -> str:
        touch(value)
        return output_text(value)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"Jinja Exception: {message}")

    environment = (Tracking if tracking else Environment)(
        trim_blocks=True, lstrip_blocks=True, undefined=Undefined, optimized=False,  # no folding of ~
        finalize=printed if tracking else output_text, extensions=[jinja2.ext.loopcontrols, Generation],
    )
    environment.filters["tojson"] = _tojson
    environment.filters["safe"] = environment.filters["string"] = _string
    environment.filters["format"] = _format
    for name in LIST_FILTERS:
        environment.filters[name] = _listed(environment.filters[name])
    environment.globals["raise_exception"] = raise_exception
    @jinja2.pass_context
    def strftime_now(context: jinja2.runtime.Context, pattern: str) -> str:
        now = context.get(NOW_VARIABLE)
        return format_time(now if isinstance(now, (int, float)) else time.time(), pattern)

    environment.globals["strftime_now"] = strftime_now
    if tracking:
        for name, filter_function in list(environment.filters.items()):
            environment.filters[name] = _tracking(filter_function, name)
        tests: dict[str, Any] = environment.tests  # typed by Jinja2 as its own functions' type
        for name, test_function in list(tests.items()):
            tests[name] = _tracking(test_function, f"test_is_{name}")
    return environment


def template_caps(source: str, *, now: float | None = None) -> TemplateCaps:
    """The template's capabilities, found as llama.cpp finds them: by running it on probe conversations
    (constraintd.engine.chat.caps). A template that does not parse has llama.cpp's default capabilities.
    """
    import jinja2

    try:
        template = _environment(tracking=True).from_string(source)
    except jinja2.TemplateError:
        return TemplateCaps()
    now = time.time() if now is None else now

    def render(context: dict[str, Any]) -> tuple[bool, str]:
        try:
            return True, template.render(**context, **{NOW_VARIABLE: now})
        except Exception:  # a probe that fails is an answer, as in llama.cpp
            return False, ""

    return detect_caps(render)


def _errors() -> tuple[type[Exception], ...]:
    import jinja2

    return (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError,
            ArithmeticError, RecursionError)


def _failed(exc: Exception) -> TemplateError:
    return TemplateError(f"the chat template does not render: {type(exc).__name__}: {exc}")


# llama.cpp parses a template once, when it loads it; here once per template text (compiling a large
# template takes Jinja2 about a tenth of a second, rendering it well under a millisecond).
@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    return _environment().from_string(source)


def _renderer(source: str, now: float) -> Callable[[Mapping[str, Any]], str]:
    errors = _errors()
    try:
        template = _compiled(source)
    except errors as exc:
        raise _failed(exc) from exc

    def render(context: Mapping[str, Any]) -> str:
        values = {name: llama_values(value) for name, value in context.items()}
        try:
            text: str = template.render(**values, **{NOW_VARIABLE: now})
        except TemplateError:
            raise
        except errors as exc:
            raise _failed(exc) from exc
        return text

    return render


def render_template(source: str, context: Mapping[str, Any], *, now: float | None = None) -> str:
    """The template `source` rendered with `context` as llama.cpp's Jinja renders it (see the contract).

    Raises:
        TemplateError: the template does not parse, or raises while rendering.
    """
    return _renderer(source, time.time() if now is None else now)(context)


# llama.cpp finds a template's capabilities once, when it loads the template; here once per template text
# (a few templates per process: one per model), since finding them renders the template eight times.
_known_caps = functools.lru_cache(maxsize=16)(template_caps)


def chat_prompt_of(
    source: str, messages: Sequence[ChatMessage], *, tools: Sequence[ChatTool] = (), bos_text: str = "",
    eos_text: str = "", add_bos: bool = False, add_eos: bool = False, add_generation_prompt: bool = True,
    enable_thinking: bool = True, now: float | None = None, caps: TemplateCaps | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """llama.cpp's prompt and generation prompt for a chat on the template `source` (a model's template
    text; ChatML where it is empty), as constraintd.engine.chat.prompt.chat_prompt makes them, rendered here.

    `caps`: the template's capabilities, found in the template when not given (`template_caps`).
    `template_kwargs`: llama-server's chat_template_kwargs, variables given to the template.

    Raises:
        TemplateError: the template does not render.
        ChatRequestError: tool-call arguments that are not JSON, for a template that reads them as objects.
    """
    now = time.time() if now is None else now
    source = template_source(source)
    return chat_prompt(
        source, messages, _renderer(source, now), caps=_known_caps(source) if caps is None else caps,
        tools=tools, bos_token=bos_text, eos_token=eos_text, add_bos=add_bos, add_eos=add_eos,
        add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, now=now,
        template_kwargs=template_kwargs)


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


def regex_escape(word: str) -> str:
    """A word as a regular expression that matches it (llama.cpp's regex_escape)."""
    return re.sub(r"[.^$|()*+?\[\]{}\\]", lambda m: "\\" + m.group(0), word)


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
                patterns.append(regex_escape(trigger.value))
            elif token in preserved:
                tokens.append(token)
            else:
                raise TemplateError(
                    f"Grammar trigger word should be marked as preserved token: {trigger.value}")
        elif trigger.kind == "pattern_full":
            value = trigger.value
            patterns.append("^$" if not value else ("" if value.startswith("^") else "^") + value
                            + ("" if value.endswith("$") else "$"))
        else:
            patterns.append(trigger.value)
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
    caps = _known_caps(source)
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


def chat_grammar_of(
    source: str, messages: Sequence[ChatMessage], *, tools: Sequence[ChatTool] = (),
    tool_choice: str = "auto", json_schema: Any = None, reasoning_format: str = "auto", bos_text: str = "",
    eos_text: str = "", enable_thinking: bool = True, now: float | None = None,
    caps: TemplateCaps | None = None, parallel_tool_calls: bool = False, generation_prompt: str | None = None,
) -> ChatGrammar:
    """The grammar side of llama.cpp's chat params for a chat request on the template `source` (see
    constraintd.engine.chat.chat_params), with the generation prompt `chat_prompt_of` makes.

    `json_schema`: the response schema, parsed (constraintd.engine.schema.json_text.parse_json).
    `generation_prompt`: the request's, when the caller has rendered its prompt already (`chat_prompt_of`).

    Raises:
        TemplateError: the template does not render the request.
        NotPorted: the template's format, or a grammar of tool calls, is not ported yet.
        SchemaError: llama.cpp refuses the response schema.
    """
    now = time.time() if now is None else now
    if generation_prompt is None:
        generation_prompt = chat_prompt_of(
            source, messages, tools=tools, bos_text=bos_text, eos_text=eos_text,
            enable_thinking=enable_thinking, now=now, caps=caps).generation_prompt
    source = template_source(source)
    return chat_params(
        source, _renderer(source, now), _known_caps(source) if caps is None else caps,
        generation_prompt=generation_prompt, tools=[tool.to_json() for tool in tools],
        tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, json_schema=json_schema,
        reasoning_format=reasoning_format, bos_token=bos_text, eos_token=eos_text)
