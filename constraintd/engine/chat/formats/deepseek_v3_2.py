# The chat params of llama.cpp's hand-written deepseek-v3.2 format (common/parsers/deepseek.cpp:
# common_chat_params_init_deepseek_v3_2), the grammar side: DeepSeek V3.2 and V4 write calls in DSML markup,
# `<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="k" string="true">v
# </｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>` (V4: `tool_calls` for the block).
#
# Contract:
# - V4 is a template whose source has no `function_calls`. Both: thinking supported, thinking tags `<think>`
#   and (`</think>`, the block's start), `｜DSML｜`, `<think>` and `</think>` preserved. No additional stops.
# - A grammar where there is a response schema (any JSON object, an empty one too), or tools with tool_choice
#   other than none; lazy exactly where there are tools and tool_choice is not required (a schema included:
#   the lazy grammar is then the call block alone, whose choice of tools is empty). The block's start is the
#   trigger word of every grammar, lazy or not.
# - The parser is built for every request (the message parser runs it; with neither a schema nor tools to
#   call, the thought then the rest as content), its grammar written only where there is one. It is the
#   arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its order: the generation
#   prompt, the reasoning where it is extracted (with thinking on, a thought may also run into the call
#   block with no `</think>`; with thinking off, the empty `<think></think>` of V3.2 or the bare
#   `</think>` of V4), then the schema's JSON in a ```json fence, or the text up to the block and the
#   block (at least one call where tool_choice is required, more after space where parallel calls are on).
#   An argument that may be a string is any text up to `</｜DSML｜parameter>`, any other its schema's JSON;
#   the required arguments in the parameters' order, space between, then the optional ones in any order,
#   space before each.
# - Not done (NotImplementedError): parameters that hold a $ref, and arguments whose may-be-a-string answer
#   needs allOf or a string format without a type (tagged_tool_grammar.may_be_string's refusals).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import may_be_string, tagged_arguments
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["deepseek_v3_2_params"]

DSML: Final = "｜DSML｜"
GENERATION_PROMPT: Final = "<｜Assistant｜>"
THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
_INVOKE_START: Final = "<" + DSML + "invoke"
_INVOKE_END: Final = "</" + DSML + "invoke>"
_PARAM_START: Final = "<" + DSML + "parameter"
_PARAM_END: Final = "</" + DSML + "parameter>"
_TC_SEPARATOR: Final = "\n\n"


def deepseek_v3_2_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
    enable_thinking: bool = True,
) -> FormatParams:
    """common_chat_params_init_deepseek_v3_2's grammar side for a request (see the module's contract).

    Does not render the prompt nor read the messages (they change the prompt only).

    Raises:
        NotImplementedError: parameters or an argument schema whose reading is not ported.
    """
    is_v4 = "function_calls" not in source
    block_start = "<" + DSML + ("tool_calls" if is_v4 else "function_calls") + ">"
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    include_grammar = has_schema or (has_tools and tool_choice != "none")
    wants_tools = has_tools and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function" and wants_tools])
    try:
        arena = _parser(functions if wants_tools else None, is_v4=is_v4,
                        block_start=block_start, require_tools=tool_choice == "required",
                        parallel_tool_calls=parallel_tool_calls, extract_reasoning=reasoning_format != "none",
                        enable_thinking=enable_thinking, json_schema=json_schema if has_schema else None)
    except NotImplementedError as exc:
        raise NotImplementedError(f"deepseek-v3.2: {exc}") from exc
    if not include_grammar:
        return _params(arena, False, (), block_start, writes_grammar=False)
    lazy = has_tools and tool_choice != "required"
    return _params(arena, lazy, (block_start,), block_start, writes_grammar=True)


def _params(arena: PegArena, lazy: bool, trigger_words: tuple[str, ...], block_start: str, *,
            writes_grammar: bool) -> FormatParams:
    return FormatParams(arena, lazy, trigger_words, True, THINK_START, (THINK_END, block_start),
                        (DSML, THINK_START, THINK_END), writes_grammar=writes_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]] | None, *, is_v4: bool, block_start: str,
            require_tools: bool, parallel_tool_calls: bool, extract_reasoning: bool, enable_thinking: bool,
            json_schema: Mapping[str, Any] | None) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` and `|` first)
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PROMPT)
    end = p.end()
    tool_choice = p.choice()
    for name, function in functions or ():
        tool_choice = p.choice(tool_choice, p.rule(f"tool-{name}", _function(p, name, function)))
    block_end = "</" + block_start[1:]
    p.eps()  # the calls' first value, replaced before use
    if parallel_tool_calls:
        close = p.literal(block_end)
        space = p.space()
        more = p.zero_or_more(p.sequence(p.space(), tool_choice))
        head = p.space()
        head = p.sequence(p.literal(block_start), head)
        body = p.sequence(p.sequence(p.sequence(head, tool_choice), more), space)
    else:
        close = p.literal(block_end)
        space = p.space()
        head = p.space()
        head = p.sequence(p.literal(block_start), head)
        body = p.sequence(p.sequence(head, tool_choice), space)
    tool_calls = p.trigger_rule("tool-call", p.sequence(body, close))
    reasoning = p.eps()
    reasoning_with_calls = p.eps()
    obligatory_calls = tool_calls
    if not require_tools:
        tool_calls = p.optional(tool_calls)
    if extract_reasoning and enable_thinking:
        # optional(THINK_START + reasoning(until(THINK_END)) + THINK_END)
        thought = p.tag(p.until(THINK_END), "reasoning")
        thought = p.sequence(p.literal(THINK_START), thought)
        reasoning = p.optional(p.sequence(thought, p.literal(THINK_END)))
        # THINK_START + reasoning(until_one_of(...)) + space() + obligatory_calls
        space = p.space()
        thought = p.tag(p.until_one_of([_TC_SEPARATOR + block_start, block_start, THINK_END]), "reasoning")
        thought = p.sequence(p.literal(THINK_START), thought)
        reasoning_with_calls = p.sequence(p.sequence(thought, space), obligatory_calls)
    elif extract_reasoning and is_v4:
        reasoning = p.optional(p.literal(THINK_END))
    elif extract_reasoning:
        # optional(literal(THINK_START) + until(THINK_END) + literal(THINK_END))
        think_end = p.literal(THINK_END)
        until = p.until(THINK_END)
        thought = p.sequence(p.literal(THINK_START), until)
        reasoning = p.optional(p.sequence(thought, think_end))
    if json_schema is not None:
        fence_close = p.literal("```")
        space = p.space()
        content = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
        head = p.space()
        head = p.sequence(p.literal("```json"), head)
        response_format = p.rule("response-format", p.sequence(p.sequence(p.sequence(head, content), space),
                                                               fence_close))
        p.root = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), response_format), end)
        return p
    if functions is None:
        # generation_prompt + reasoning + content(rest()) + end: no tools to call, no grammar
        p.root = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), p.tag(p.rest(), "content")),
                            end)
        return p
    # negate(THINK_START) + content(until_one_of(...)) + space()
    space = p.space()
    before = p.tag(p.until_one_of([_TC_SEPARATOR + block_start, block_start]), "content")
    before = p.sequence(p.negate(p.literal(THINK_START)), before)
    before = p.sequence(before, space)
    if extract_reasoning and enable_thinking:
        plain = p.sequence(p.sequence(reasoning, before), tool_calls)
        body = p.choice(reasoning_with_calls, plain)
        p.root = p.sequence(p.sequence(generation_prompt, body), end)
    else:
        body = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), before), tool_calls)
        p.root = p.sequence(body, end)
    return p


def _function(p: PegArena, name: str, function: Mapping[str, Any]) -> int:
    # tool(tool_open(INVOKE_START name="<name>">\n) + arguments + space() + tool_close(INVOKE_END))
    required: list[int] = []
    optional: list[int] = []
    for argument in tagged_arguments(tool_parameters(function)):
        is_string = may_be_string(argument.schema)
        close = p.atomic(p.tag(p.literal(_PARAM_END), "tool-arg-close"))
        if is_string:
            value = p.tag(p.until(_PARAM_END), "tool-arg-string-value")
        else:
            value = p.tag(p.schema(p.json(), f"tool-{name}-arg-{argument.name}-schema", argument.schema),
                          "tool-arg-value")
        marker = p.literal(f'" string="{"true" if is_string else "false"}">')
        arg_name = p.atomic(p.tag(p.literal(argument.name), "tool-arg-name"))
        arg_open = p.sequence(p.literal(_PARAM_START + ' name="'), arg_name)
        arg_open = p.atomic(p.tag(p.sequence(arg_open, marker), "tool-arg-open"))
        arg = p.tag(p.sequence(p.sequence(arg_open, value), close), "tool-arg")
        (required if argument.required else optional).append(p.rule(f"tool-{name}-arg-{argument.name}", arg))
    args = p.eps()
    for at, parser in enumerate(required):
        if at:
            args = p.sequence(args, p.space())
        args = p.sequence(args, parser)
    if optional:
        any_optional = p.choice()
        for parser in optional:
            any_optional = p.choice(any_optional, parser)
        args = p.sequence(args, p.zero_or_more(p.sequence(p.space(), any_optional)))
    close = p.atomic(p.tag(p.literal(_INVOKE_END), "tool-close"))
    space = p.space()
    name_end = p.literal('">\n')
    tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
    tool_open = p.sequence(p.literal(_INVOKE_START + ' name="'), tool_name)
    tool_open = p.atomic(p.tag(p.sequence(tool_open, name_end), "tool-open"))
    return p.tag(p.sequence(p.sequence(p.sequence(tool_open, args), space), close), "tool")
