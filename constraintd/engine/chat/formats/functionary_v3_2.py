# The chat params of llama.cpp's hand-written functionary-v3.2 format (common/parsers/functionary-v3-2.cpp:
# common_chat_params_init_functionary_v3_2), the grammar side: MeetKai's Functionary v3.2 names each
# message's recipient after `>>>`, the generation prompt ending in it: `all\n` then text for the user,
# `<name>\n` then the arguments' JSON for a call.
#
# Contract:
# - Whatever the request: no thinking (no tags), `>>>all` preserved, no additional stops.
# - A grammar exactly where there are tools and tool_choice is not none (a response schema gives none:
#   llama.cpp's format does not read it); lazy where tool_choice is auto. Its trigger is the pattern
#   `>>>(?!all)` (TRIGGER_PATTERN, whenever there is a grammar, lazy or not).
# - The parser is built for every request (the message parser runs it; with no tools to call, `all` and the
#   rest as content), its grammar written only where there is one. It is the arena's (peg_arena.py) of the
#   parser llama.cpp builds, made call for call in its order: the generation prompt (up to its `>>>`), then
#   `all\n` and text up to the next `>>>` followed by the calls, or the calls alone, or (tool_choice auto)
#   `all\n` and any text. Calls are `<name>\n` and the parameters' JSON, written one after the other with
#   nothing between them: one or more where parallel calls are on (or after no text, whatever
#   parallel_tool_calls says: llama.cpp's `tools` rule), else one. Lazy, the grammar is the calls' rule alone,
#   one or more.
# - Every builder call is the arena's (peg_arena.py).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["TRIGGER_PATTERN", "functionary_v3_2_params"]

GENERATION_PROMPT: Final = "<|start_header_id|>assistant<|end_header_id|>\n\n>>>"
RECIPIENT: Final = ">>>"
CONTENT_RECIPIENT: Final = "all\n"
PRESERVED_TOKENS: Final = (">>>all",)
TRIGGER_PATTERN: Final = ">>>(?!all)"


def functionary_v3_2_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_functionary_v3_2's grammar side for a request (see the module's contract).

    `source` (the template), `json_schema` and `reasoning_format` do not change the answer: llama.cpp's format
    reads none of them; they are taken for the same call as the other formats'.
    """
    del source, json_schema, reasoning_format  # the same for every template, no response format, no thinking
    include_grammar = bool(tools) and tool_choice != "none"
    arena = _parser(tool_functions(tools) if include_grammar else [],
                    tool_choice=tool_choice if include_grammar else None,
                    parallel_tool_calls=parallel_tool_calls)
    return FormatParams(
        arena, include_grammar and tool_choice == "auto", (), False, "", (), PRESERVED_TOKENS,
        trigger_patterns=(TRIGGER_PATTERN,) if include_grammar else (), writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, tool_choice: str | None,
            parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function (tool_choice None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of `+` first, a braced list left to right)
    p = PegArena()
    text = p.tag(p.until(RECIPIENT), "content")
    content_until_tool = p.sequence(p.literal(CONTENT_RECIPIENT), text)
    rest = p.tag(p.rest(), "content")
    content_until_end = p.sequence(p.literal(CONTENT_RECIPIENT), rest)
    generation_prompt = p.literal(GENERATION_PROMPT)
    if tool_choice is None:
        # generation_prompt + content_until_end + end()
        p.root = p.sequence(p.sequence(generation_prompt, content_until_end), p.end())
        return p
    choice = p.choice()
    for name, function in functions:
        # tool(tool_open(tool_name(literal(name)) + literal("\n")) + tool_args(schema(json(), ...)))
        args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
        newline = p.literal("\n")
        tool_open = p.atomic(p.tag(p.sequence(p.atomic(p.tag(p.literal(name), "tool-name")), newline),
                                   "tool-open"))
        choice = p.choice(choice, p.rule(f"tool-{name}", p.tag(p.sequence(tool_open, args), "tool")))
    tools_only = p.trigger_rule("tools", p.repeat(choice, 1, -1))
    content_and_tools = p.sequence(content_until_tool, tools_only)
    p.eps()  # llama.cpp's first value of its result, replaced below
    if tool_choice == "required":
        end = p.end()
        if parallel_tool_calls:
            ret = p.sequence(p.choice(content_and_tools, tools_only), end)
        else:
            ret = p.sequence(p.choice(p.sequence(content_until_tool, choice), tools_only), end)
    elif parallel_tool_calls:
        end = p.end()
        ret = p.sequence(p.choice(content_and_tools, content_until_end, tools_only), end)
    else:
        content_and_tool = p.sequence(content_until_tool, choice)
        end = p.end()
        ret = p.sequence(p.choice(content_and_tool, content_until_end, choice), end)
    p.root = p.sequence(generation_prompt, ret)
    return p
