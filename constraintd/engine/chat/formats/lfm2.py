# The chat params of llama.cpp's hand-written LFM2 / LFM2.5 format (common/parsers/lfm2.cpp:
# common_chat_params_init_lfm2), the grammar side: Liquid's models write their calls almost as Python,
# `<|tool_call_start|>[name(key="value", n=1)]<|tool_call_end|>`, after an optional `<think>` block.
#
# Contract:
# - One function for both formats, with llama.cpp's `tool_list_tokens` flag: on (LFM2: the template wraps its
#   tool list in `<|tool_list_start|>` / `<|tool_list_end|>`), those two markers are preserved too; off
#   (LFM2.5: a plain "List of tools: [" in the template) they are not. Left unset, the flag is chat.cpp's
#   pick for the source (common_chat_try_specialized_template: on exactly where both markers are in it).
# - Always: thinking supported, tags `<think>` and (`</think>`,); preserved `<|tool_call_start|>`,
#   `<|tool_call_end|>`, `<think>`, `</think>` (then the tool-list markers); no additional stops.
# - A grammar where there is a response schema (any JSON object, as llama.cpp's is_object) or tools with
#   tool_choice other than none; lazy unless there is a schema or tool_choice is required; the trigger word
#   `<|tool_call_start|>` whenever there is a grammar, lazy or not (llama.cpp sets it either way).
# - The parser is built for every request (the message parser runs it), the grammar written from it only where
#   there is one (FormatParams.writes_grammar); it is llama.cpp's, made call for call in its order: the
#   generation prompt, end(), the reasoning where it is extracted (reasoning_format other than none, and
#   `<think>` in the template), then: with tools wanted (tool_choice other than none, a schema or not), text
#   up to `<|tool_call_start|>` and one call block holding one call (more, comma-separated, where parallel
#   calls are on); else the schema's JSON, or with no schema the rest as content. A call's arguments are
#   `name=value`, comma-separated, in any order and number (at least one where the tool has properties;
#   `required` is not read); a property whose type is "string" takes a double- or single-quoted string with
#   JSON's escapes, any other a Python value where JSON's true / false / null are also taken
#   (python_or_json_value).
# - Every builder call is the arena's (peg_arena.py).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["lfm2_params", "lfm2_tool_list_tokens"]

GENERATION_PROMPT: Final = "<|im_start|>assistant\n"
TOOL_CALL_START: Final = "<|tool_call_start|>"
TOOL_CALL_END: Final = "<|tool_call_end|>"
TOOL_LIST_START: Final = "<|tool_list_start|>"
TOOL_LIST_END: Final = "<|tool_list_end|>"
THINK_START: Final = "<think>"
THINK_END: Final = "</think>"


def lfm2_tool_list_tokens(source: str) -> bool:
    """The tool_list_tokens flag chat.cpp passes for a template of the format: on for LFM2
    (is_lfm2_template: both tool-list markers in the source), off for LFM2.5."""
    return TOOL_LIST_START in source and TOOL_LIST_END in source


def lfm2_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
    tool_list_tokens: bool | None = None,
) -> FormatParams:
    """common_chat_params_init_lfm2's grammar side for a request (see the module's contract).

    `tool_list_tokens`: llama.cpp's flag; None takes chat.cpp's pick for `source` (lfm2_tool_list_tokens).

    Raises:
        NotImplementedError: a tool whose parameters' properties are not an object (not ported).
    """
    if tool_list_tokens is None:
        tool_list_tokens = lfm2_tool_list_tokens(source)
    preserved: tuple[str, ...] = (TOOL_CALL_START, TOOL_CALL_END, THINK_START, THINK_END)
    if tool_list_tokens:
        preserved += (TOOL_LIST_START, TOOL_LIST_END)
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    wants_tools = has_tools and tool_choice != "none"
    include_grammar = has_schema or wants_tools
    arena = _parser(tool_functions(tools) if wants_tools else [],
                    extract_reasoning=reasoning_format != "none" and THINK_START in source,
                    json_schema=json_schema if has_schema else None, wants_tools=wants_tools,
                    parallel_tool_calls=parallel_tool_calls)
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(arena, lazy, (TOOL_CALL_START,) if include_grammar else (), True, THINK_START,
                        (THINK_END,), preserved, writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool, json_schema: Any,
            wants_tools: bool, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` first)
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PROMPT)
    end = p.end()
    reasoning = p.eps()
    if extract_reasoning:
        # optional(THINK_START + reasoning(until(THINK_END)) + THINK_END)
        body = p.tag(p.until(THINK_END), "reasoning")
        head = p.sequence(p.literal(THINK_START), body)
        reasoning = p.optional(p.sequence(head, p.literal(THINK_END)))
    if not wants_tools:
        if json_schema is None:
            content = p.tag(p.rest(), "content")
        else:
            content = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
        p.root = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), content), end)
        return p
    call_end = p.literal(TOOL_CALL_END)
    calls = _python_style_tool_calls(p, functions, parallel_tool_calls=parallel_tool_calls)
    call = p.sequence(p.sequence(p.literal(TOOL_CALL_START), calls), call_end)
    tool_calls = p.rule("tool-calls", p.trigger_rule("tool-call", call))
    content = p.tag(p.until(TOOL_CALL_START), "content")
    head = p.sequence(p.sequence(generation_prompt, reasoning), content)
    p.root = p.sequence(p.sequence(head, tool_calls), end)
    return p


def _python_style_tool_calls(p: PegArena, functions: list[tuple[str, Mapping[str, Any]]], *,
                             parallel_tool_calls: bool) -> int:
    # common_chat_peg_builder::python_style_tool_calls with allow_json_literals on
    if not functions:
        return p.eps()  # tools, none of them a function: llama.cpp's eps() for no tools
    tool_choices = p.choice()
    for name, function in functions:
        params = tool_parameters(function)
        properties = params.get("properties") if isinstance(params, Mapping) else None
        args = p.eps()
        if properties:
            if not isinstance(properties, Mapping):
                raise NotImplementedError("lfm2 tool parameters whose properties are not an object")
            arg_choice = p.choice()
            for prop_name, prop_def in properties.items():
                is_string = isinstance(prop_def, Mapping) and prop_def.get("type") == "string"
                arg_name = p.literal(prop_name)
                p.eps()  # arg_value_parser's first value, replaced below
                string_value = p.tag(p.choice(_quoted(p, '"'), _quoted(p, "'")), "tool-arg-value")
                value = string_value if is_string else p.tag(_python_or_json_value(p), "tool-arg-value")
                close = p.atomic(p.tag(p.eps(), "tool-arg-close"))
                equals = p.literal("=")
                arg_open = p.atomic(p.tag(p.sequence(p.atomic(p.tag(arg_name, "tool-arg-name")), equals),
                                          "tool-arg-open"))
                arg = p.tag(p.sequence(p.sequence(arg_open, value), close), "tool-arg")
                arg_choice = p.choice(arg_choice, arg)
            space = p.space()
            more = p.sequence(p.sequence(p.literal(","), space), arg_choice)
            args = p.sequence(arg_choice, p.zero_or_more(more))
        close = p.atomic(p.tag(p.literal(")"), "tool-close"))
        space_after = p.space()
        tool_args = p.tag(args, "tool-args")
        space_before = p.space()
        paren = p.literal("(")
        tool_open = p.atomic(p.tag(p.sequence(p.atomic(p.tag(p.literal(name), "tool-name")), paren),
                                   "tool-open"))
        tool = p.sequence(p.sequence(p.sequence(p.sequence(tool_open, space_before), tool_args), space_after),
                          close)
        tool_choices = p.choice(tool_choices, p.rule(f"tool-{name}", p.tag(tool, "tool")))
    if parallel_tool_calls:
        space_after = p.space()
        space = p.space()
        more = p.zero_or_more(p.sequence(p.sequence(p.literal(","), space), tool_choices))
        space = p.space()
        opened = p.sequence(p.sequence(p.literal("["), space), tool_choices)
        listed = p.sequence(p.sequence(opened, more), space_after)
    else:
        space_after = p.space()
        space = p.space()
        opened = p.sequence(p.sequence(p.literal("["), space), tool_choices)
        listed = p.sequence(opened, space_after)
    return p.sequence(listed, p.literal("]"))


def _quoted(p: PegArena, quote: str) -> int:
    # literal(quote) + string_content(quote) + literal(quote)
    close = p.literal(quote)
    content = p.string_content(quote)
    return p.sequence(p.sequence(p.literal(quote), content), close)


def _python_or_json_value(p: PegArena) -> int:
    # common_chat_peg_builder::python_or_json_value: python_value whose leaves also take JSON's literals
    def build() -> int:
        ws = p.space()
        value = _python_or_json_value(p)
        member = p.sequence(_python_string(p), ws, p.literal(":"), ws, value)
        members = p.sequence(member, p.zero_or_more(p.sequence(ws, p.literal(","), ws, member)))
        dict_ = p.rule_of("python-or-json-dict", lambda: _container(p, "{", "}", members, ws))
        elements = p.sequence(value, p.zero_or_more(p.sequence(p.literal(","), ws, value)))
        array = p.rule_of("python-or-json-array", lambda: _container(p, "[", "]", elements, ws))
        return p.choice(dict_, array, _python_string(p), p.json_number(), _python_bool(p), _python_null(p),
                        p.json_bool(), p.json_null())
    return p.rule_of("python-or-json-value", build)


def _container(p: PegArena, open_: str, close: str, items: int, ws: int) -> int:
    opened = p.literal(open_)
    empty = p.literal(close)
    full = p.sequence(items, ws, p.literal(close))
    return p.sequence(opened, ws, p.choice(empty, full), ws)


def _python_string(p: PegArena) -> int:
    return p.rule_of("python-string", lambda: p.choice(
        p.rule_of("double-quoted-string", lambda: _quoted_rule(p, '"')),
        p.rule_of("single-quoted-string", lambda: _quoted_rule(p, "'"))))


def _quoted_rule(p: PegArena, quote: str) -> int:
    # sequence({literal(quote), string_content(quote), literal(quote)}): made left to right
    opened = p.literal(quote)
    content = p.string_content(quote)
    return p.sequence(opened, content, p.literal(quote))


def _python_bool(p: PegArena) -> int:
    return p.rule_of("python-bool", lambda: p.choice(p.literal("True"), p.literal("False")))


def _python_null(p: PegArena) -> int:
    return p.rule_of("python-none", lambda: p.literal("None"))

