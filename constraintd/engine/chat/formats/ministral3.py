# The chat params of llama.cpp's hand-written ministral-3 format (common/parsers/ministral3.cpp:
# common_chat_params_init_ministral_3), the grammar side: Ministral 3, Magistral and Devstral write a call as
# `[TOOL_CALLS]name[ARGS]{...}` (the arguments the parameters' JSON) and think in `[THINK]...[/THINK]`.
#
# Contract:
# - Every template of the format supports thinking: thinking tags `[THINK]` and (`[/THINK]`); preserved
#   tokens `[THINK]`, `[/THINK]`, `[TOOL_CALLS]`, `[ARGS]`; no additional stops. The grammar does not depend
#   on the template's source nor on the rendered prompt (the format's generation prompt in the parser is
#   nothing).
# - A grammar where there is a response schema (a non-empty JSON object), or tools with tool_choice other
#   than none; lazy exactly where there are tools and tool_choice is auto (a schema included: llama.cpp then
#   writes the trigger rules alone, and the response-format parser has none, so the root is empty).
#   Wherever there is a grammar, the trigger word `[TOOL_CALLS]` comes with it, lazy or not.
# - The grammar is the arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: the optional `[THINK]...[/THINK]` block where reasoning is extracted, then the schema's JSON in a
#   ```json fence, or any text up to `[TOOL_CALLS]` and the calls (each `[TOOL_CALLS]` then one function's
#   name, `[ARGS]` and its parameters' JSON, as the schema converter writes it), at least one where
#   tool_choice is required, more where parallel calls are on.
# - Not here: the message rewrites (reasoning and content as typed blocks of the system and assistant
#   messages) and the continuation of a final message: they shape the prompt, not the grammar.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["ministral3_params"]

TRIGGER: Final = "[TOOL_CALLS]"
THINKING_START: Final = "[THINK]"
THINKING_END: Final = "[/THINK]"
PRESERVED_TOKENS: Final = ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]")


def ministral3_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_ministral_3's grammar side for a request (see the module's contract).

    `source` is the template's; the format's grammar does not depend on it. Does not validate tool_choice
    (one of auto, required, none).
    """
    del source  # the same arguments as every format's; this one's grammar reads nothing of the template
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping) and bool(json_schema)
    wants_tools = has_tools and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function"])
    arena = _parser(functions, extract_reasoning=reasoning_format != "none",
                    json_schema=json_schema if has_schema else None,
                    tool_choice=tool_choice if wants_tools else None, parallel_tool_calls=parallel_tool_calls)
    include_grammar = has_schema or wants_tools
    lazy = include_grammar and has_tools and tool_choice == "auto"
    return FormatParams(
        arena, lazy, (TRIGGER,) if include_grammar else (), True,
        THINKING_START, (THINKING_END,), PRESERVED_TOKENS, writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool, json_schema: Any,
            tool_choice: str | None, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` and `|` first, the left one of `<<` first)
    p = PegArena()
    generation_prompt = p.eps()
    if extract_reasoning:
        # optional("[THINK]" + reasoning(until("[/THINK]")) + "[/THINK]")
        # "[THINK]" + parser: the parser first, then the literal
        body = p.tag(p.until(THINKING_END), "reasoning")
        block = p.sequence(p.literal(THINKING_START), body)
        reasoning = p.optional(p.sequence(block, p.literal(THINKING_END)))
    else:
        reasoning = p.eps()
    if json_schema is not None:
        # reasoning << "```json" << content(schema(json(), "response-format", ...)) << "```"
        fenced = _then(p, reasoning, p.literal("```json"))
        fenced = _then(p, fenced, p.tag(p.schema(p.json(), "response-format", json_schema), "content"))
        fenced = _then(p, fenced, p.literal("```"))
        p.root = p.sequence(generation_prompt, fenced)
        return p
    if tool_choice is not None:
        choice = p.choice()
        for name, function in functions:
            # tool_open(tool_name(literal(name)) + "[ARGS]") + tool_args(schema(json(), ...)), right first
            args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
            tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
            tool_open = p.atomic(p.tag(p.sequence(tool_name, p.literal("[ARGS]")), "tool-open"))
            choice = p.choice(choice, p.rule(f"tool-{name}", p.sequence(tool_open, args)))
        calls = p.repeat(p.sequence(p.literal(TRIGGER), choice), 1 if tool_choice == "required" else 0,
                         -1 if parallel_tool_calls else 1)
        tool_calls = p.trigger_rule("tool-call", calls)
        # reasoning << content(until("[TOOL_CALLS]")) << tool_calls
        body = _then(p, _then(p, reasoning, p.tag(p.until(TRIGGER), "content")), tool_calls)
        p.root = p.sequence(generation_prompt, body)
        return p
    p.root = p.sequence(generation_prompt, _then(p, reasoning, p.tag(p.rest(), "content")))
    return p


def _then(p: PegArena, left: int, right: int) -> int:
    # left << right: a space between, made after both operands
    return p.sequence(left, p.space(), right)
