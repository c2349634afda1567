# Chat templates rendered as llama.cpp renders them: a Jinja2 environment made to behave as llama.cpp's own
# Jinja engine (common/jinja) does where chat templates meet the difference, the capabilities llama.cpp
# finds in a template, and its chat prompt and chat params through that renderer.
#
# Contract:
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
#   by running the template on probe conversations (`template_caps`,
#   constraintd.engine.chat.templates.caps).
# - A template's analysis (the auto-parser's, constraintd.engine.chat.analysis.template_analysis), which
#   llama.cpp makes again for every request by rendering probe conversations (4-9 ms on common templates,
#   README), is remembered per template, caps and special tokens (`known_analysis`), with every reading of the
#   clock its renders made (`strftime_now`'s pattern and text): a request whose time gives those same
#   texts gets the analysis it would make again, for the renders are the same; another day's (or
#   minute's, for a template that prints one) makes it afresh. Each request gets a copy of its own.
# - The engine's chat layer is sans-IO and renders nothing itself: this module is its renderer. It sits
#   beside the engine, below the service core (which resolves chat requests with it) and the sampler
#   worker (which renders its prompts with it). Jinja2 is imported on first use, not with the module.
from __future__ import annotations

import copy
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from constraintd.engine.chat.analysis.template_analysis import TemplateAnalysis, analyze_template
from constraintd.engine.chat.params.chat_params import ChatGrammar, chat_params
from constraintd.engine.chat.templates.caps import detect_caps, quietly, touch
from constraintd.engine.chat.templates.continuation import Continuation
from constraintd.engine.chat.templates.jinja_values import (
    llama_json,
    llama_repr,
    llama_string,
    llama_values,
    output_text,
)
from constraintd.engine.chat.templates.prompt import ChatPrompt, chat_prompt, template_source
from constraintd.engine.chat.templates.template_inputs import ChatMessage, ChatTool, TemplateCaps, format_time

if TYPE_CHECKING:
    import jinja2

__all__ = [
    "NOW_VARIABLE", "TemplateError", "chat_grammar_of", "chat_prompt_of", "known_caps", "render_template",
    "renderer", "template_caps",
]


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


class Clock:
    """A request's time as a render reads it (`strftime_now`), keeping each text it gave by pattern."""

    __slots__ = ("now", "reads")

    def __init__(self, now: float) -> None:
        self.now = now
        self.reads: dict[str, str] = {}

    def format(self, pattern: str) -> str:
        text = self.reads[pattern] = format_time(self.now, pattern)
        return text


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
        if isinstance(now, Clock):
            return now.format(pattern)
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
    (constraintd.engine.chat.templates.caps). A template that does not parse has llama.cpp's default
    capabilities.
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


def renderer(source: str, now: float | Clock) -> Callable[[Mapping[str, Any]], str]:
    """A render function of the template `source` in llama.cpp's Jinja dialect, at the request time `now`
    (what the engine's chat layer calls `Render`); a `Clock` keeps what the renders read of it.

    Raises:
        TemplateError: the template does not parse (its render function raises it too, for a render that
            fails).
    """
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
    return renderer(source, time.time() if now is None else now)(context)


# llama.cpp finds a template's capabilities once, when it loads the template; here once per template text
# (a few templates per process: one per model), since finding them renders the template eight times.
known_caps = functools.lru_cache(maxsize=16)(template_caps)

_KEPT_ANALYSES = 16  # a few templates per process, as for the capabilities
_AnalysisKey = tuple[str, TemplateCaps, str, str]  # source, caps, bos and eos tokens
_ClockReads = tuple[tuple[str, str], ...]  # each (pattern, text) the analysis's renders read of the clock
_analyses: OrderedDict[_AnalysisKey, tuple[TemplateAnalysis, _ClockReads]] = OrderedDict()
_analyses_lock = threading.Lock()


def known_analysis(source: str, now: float, caps: TemplateCaps, *, bos_token: str = "",
                   eos_token: str = "") -> TemplateAnalysis:
    """`analyze_template` of the template `source` at the request time `now`, remembered (see the contract):
    the same analysis as a new one, as a copy of its own.

    Raises:
        TemplateError: the template does not parse.
        ValueError: llama.cpp refuses the template (analyze_template's; not remembered).
    """
    key = (source, caps, bos_token, eos_token)
    with _analyses_lock:
        kept = _analyses.get(key)
        if kept is not None:
            _analyses.move_to_end(key)
    if kept is not None:
        analysis, reads = kept
        if all(format_time(now, pattern) == text for pattern, text in reads):
            return copy.deepcopy(analysis)
    clock = Clock(now)
    analysis = analyze_template(source, renderer(source, clock), caps, bos_token=bos_token,
                                eos_token=eos_token)
    with _analyses_lock:
        _analyses[key] = (copy.deepcopy(analysis), tuple(clock.reads.items()))
        _analyses.move_to_end(key)
        while len(_analyses) > _KEPT_ANALYSES:
            _analyses.popitem(last=False)
    return analysis


def chat_prompt_of(
    source: str, messages: Sequence[ChatMessage], *, tools: Sequence[ChatTool] = (), bos_text: str = "",
    eos_text: str = "", add_bos: bool = False, add_eos: bool = False, add_generation_prompt: bool = True,
    enable_thinking: bool = True, now: float | None = None, caps: TemplateCaps | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """llama.cpp's prompt and generation prompt for a chat on the template `source` (a model's template
    text; ChatML where it is empty), as constraintd.engine.chat.templates.prompt.chat_prompt makes them,
    rendered here.

    `caps`: the template's capabilities, found in the template when not given (`template_caps`).
    `template_kwargs`: llama-server's chat_template_kwargs, variables given to the template.

    Raises:
        TemplateError: the template does not render.
        ChatRequestError: tool-call arguments that are not JSON, for a template that reads them as objects.
    """
    now = time.time() if now is None else now
    source = template_source(source)
    return chat_prompt(
        source, messages, renderer(source, now), caps=known_caps(source) if caps is None else caps,
        tools=tools, bos_token=bos_text, eos_token=eos_text, add_bos=add_bos, add_eos=add_eos,
        add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, now=now,
        template_kwargs=template_kwargs)



def chat_grammar_of(
    source: str, messages: Sequence[ChatMessage], *, tools: Sequence[ChatTool] = (),
    tool_choice: str = "auto", json_schema: Any = None, reasoning_format: str = "auto", bos_text: str = "",
    eos_text: str = "", enable_thinking: bool = True, now: float | None = None,
    caps: TemplateCaps | None = None, parallel_tool_calls: bool = False, generation_prompt: str | None = None,
    continuation: Continuation = Continuation.NONE,
) -> ChatGrammar:
    """The grammar side of llama.cpp's chat params for a chat request on the template `source` (see
    constraintd.engine.chat.params.chat_params), with the generation prompt `chat_prompt_of` makes.

    `json_schema`: the response schema, parsed (constraintd.engine.schema.json_text.parse_json).
    `generation_prompt`: the request's, when the caller has rendered its prompt already (`chat_prompt_of`).
    `continuation`: what of a final message is continued (continued_chat's, of
    constraintd.engine.chat.templates.continuation; `messages` then those rendered, without it).

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
    caps = known_caps(source) if caps is None else caps
    return chat_params(
        source, renderer(source, now), caps,
        generation_prompt=generation_prompt, tools=[tool.to_json() for tool in tools],
        tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, json_schema=json_schema,
        reasoning_format=reasoning_format, enable_thinking=enable_thinking, bos_token=bos_text,
        eos_token=eos_text,
        analyze=lambda: known_analysis(source, now, caps, bos_token=bos_text, eos_token=eos_text),
        continuation=continuation)
