# The chat params of llama.cpp's hand-written kimi-k2 format (common/parsers/kimi-k2.cpp:
# common_chat_params_init_kimi_k2), the grammar side: Kimi K2 (Instruct and Thinking) writes its calls in one
# section, `<|tool_calls_section_begin|><|tool_call_begin|>functions.<name>:<n><|tool_call_argument_begin|>
# {json}<|tool_call_end|>...<|tool_calls_section_end|>`, the call id holding the function's name and a count.
#
# Contract:
# - Whatever the template: thinking supported, tags `<think>` and (`</think>`), the five call markers then
#   `<think>` and `</think>` preserved, no additional stops.
# - A grammar exactly where there are tools and tool_choice is not none (a response schema alone gives none:
#   llama.cpp's format does not read it); lazy where tool_choice is auto; the trigger word
#   `<|tool_call_begin|>` with every grammar, lazy or not (llama.cpp sets it for required too).
# - The parser is built for every request (the message parser runs it; with no tools to call, the thought then
#   the rest as content), its grammar written only where there is one. It is the arena's (peg_arena.py) of the
#   parser llama.cpp builds, made call for call in its order: the generation prompt, the reasoning where it is
#   extracted (it may stop at a call marker, its closing tag optional), the text up to the section's or a
#   call's marker, then the section: its opening marker optional, the calls (at least one where tool_choice is
#   required, any number where parallel calls are on, else at most one) each as
#   `<|tool_call_begin|>functions.<name>:<digits>` then `<|tool_call_argument_begin|>` and the arguments' JSON
#   by the parameters' schema, its `<|tool_call_end|>` optional, then the section's closing marker optional.
#   Lazy, the grammar is that section from the first call marker on.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["kimi_k2_params"]

GENERATION_PROMPT: Final = "<|im_assistant|>assistant<|im_middle|>"
SECTION_BEGIN: Final = "<|tool_calls_section_begin|>"
SECTION_END: Final = "<|tool_calls_section_end|>"
CALL_BEGIN: Final = "<|tool_call_begin|>"
ARGS_BEGIN: Final = "<|tool_call_argument_begin|>"
CALL_END: Final = "<|tool_call_end|>"
THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
PRESERVED_TOKENS: Final = (
    SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGS_BEGIN, CALL_END, THINK_START, THINK_END)


def kimi_k2_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_kimi_k2's grammar side for a request (see the module's contract).

    `source` (the template) and `json_schema` do not change the answer: llama.cpp's format reads neither; they
    are taken for the same call as the other formats'.
    """
    del source, json_schema  # the format is the same for every template, and has no response-format grammar
    include_grammar = bool(tools) and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function" and include_grammar])
    arena = _parser(functions, extract_reasoning=reasoning_format != "none",
                    tool_choice=tool_choice if include_grammar else None,
                    parallel_tool_calls=parallel_tool_calls)
    return FormatParams(
        arena, include_grammar and tool_choice == "auto", (CALL_BEGIN,) if include_grammar else (), True,
        THINK_START, (THINK_END,), PRESERVED_TOKENS, writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool,
            tool_choice: str | None, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function (tool_choice None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of + first)
    p = PegArena()
    at_end = p.end()
    if extract_reasoning:
        # optional(THINK_START + reasoning(until_one_of(...)) + optional(literal(THINK_END)))
        think_end = p.optional(p.literal(THINK_END))
        body = p.tag(p.until_one_of([THINK_END, SECTION_BEGIN, CALL_BEGIN]), "reasoning")
        body = p.sequence(p.literal(THINK_START), body)
        reasoning = p.optional(p.sequence(body, think_end))
    else:
        reasoning = p.eps()
    generation_prompt = p.literal(GENERATION_PROMPT)
    if tool_choice is None:
        # generation_prompt + reasoning + content(rest()) + end
        content = p.tag(p.rest(), "content")
        p.root = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), content), at_end)
        return p
    choice = p.choice()
    for name, function in functions:
        # tool_id(literal("functions.") + tool_name(literal(name)) + literal(":") + chars("[0-9]", 1, -1))
        digits = p.chars("[0-9]", 1, -1)
        colon = p.literal(":")
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        tool_id = p.sequence(p.literal("functions."), tool_name)
        tool_id = p.atomic(p.tag(p.sequence(p.sequence(tool_id, colon), digits), "tool-id"))
        # tool(tool_open(tool_id + literal(ARGS_BEGIN)) + tool_args(schema(json(), ...)) + tool_close(...))
        close = p.atomic(p.tag(p.optional(p.literal(CALL_END)), "tool-close"))
        args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
        tool_open = p.atomic(p.tag(p.sequence(tool_id, p.literal(ARGS_BEGIN)), "tool-open"))
        tool = p.tag(p.sequence(p.sequence(tool_open, args), close), "tool")
        choice = p.choice(choice, p.rule(f"tool-{name}", tool))
    section_end = p.optional(p.literal(SECTION_END))
    calls = p.repeat(p.sequence(p.literal(CALL_BEGIN), choice), 1 if tool_choice == "required" else 0,
                     -1 if parallel_tool_calls else 1)
    calls = p.trigger_rule("tool-call", p.sequence(calls, section_end))
    tool_calls = p.rule("tool-calls", p.sequence(p.optional(p.literal(SECTION_BEGIN)), calls))
    content = p.tag(p.until_one_of([SECTION_BEGIN, CALL_BEGIN]), "content")
    root = p.sequence(generation_prompt, reasoning)
    p.root = p.sequence(p.sequence(p.sequence(root, content), tool_calls), at_end)
    return p
