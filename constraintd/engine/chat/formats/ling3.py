# The chat params of llama.cpp's hand-written ling-3 format (common/parsers/ling3.cpp:
# common_chat_params_init_ling3), the grammar side: Ling 3.0 (Bailing V3) writes an assistant turn as
# `<role>ASSISTANT</role>\n<think>...</think>content<tool_call>name<arg_key>k</arg_key>\n<arg_value>v
# </arg_value></tool_call><|role_end|>`.
#
# Contract:
# - Whatever the request: thinking supported, tags `<think>` and (`</think>`, `<tool_call>`), the nine
#   markers preserved, `<|role_end|>` an additional stop, and the messages' start delimiters per role.
# - A grammar exactly where there are tools and tool_choice is not none (a response schema is not read);
#   lazy where tool_choice is not required, with the trigger word `<tool_call>`.
# - The parser is built for every request (the message parser runs it; with no tools to call, the thought then
#   the rest of the turn as content), its grammar written only where there is one. It is the arena's
#   (peg_arena.py) of the parser llama.cpp builds, made call for call in its order: the optional role opener,
#   the think block (its tags optional; its body up to `</think>`, or up to a call's start too where the
#   generation prompt leaves `<think>` open, or, continuing a final message, where its content is not
#   continued), the content up to a call, then the calls' section (required
#   where tool_choice is required, else optional) and the turn's tail. A call is `<tool_call>name`, its
#   required arguments in any order (as `ling3-<name>-args-N` rules), then its optional ones in any order and
#   number. A string argument is any text up to `</arg_value>`; any other its schema's JSON; one that may be
#   both, the string rule.
# - Not done (NotImplementedError): parameters that hold a $ref, and argument schemas whose value types are
#   not ported (qwen3_coder.value_types says which).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.formats.qwen3_coder import value_types
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import tagged_arguments
from constraintd.engine.chat.peg_arena import PegArena
from constraintd.engine.chat.templates.continuation import Continuation

__all__ = ["ling3_params"]

ROLE: Final = "<role>ASSISTANT</role>"
THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
CALL_START: Final = "<tool_call>"
CALL_END: Final = "</tool_call>"
ARG_KEY: Final = "<arg_key>"
ARG_KEY_END: Final = "</arg_key>"
ARG_VAL: Final = "<arg_value>"
ARG_VAL_END: Final = "</arg_value>"
ROLE_END: Final = "<|role_end|>"
PRESERVED_TOKENS: Final = (THINK_START, THINK_END, CALL_START, CALL_END, ARG_KEY, ARG_KEY_END, ARG_VAL,
                           ARG_VAL_END, ROLE_END)
MESSAGE_DELIMITERS: Final = (
    ("assistant", ROLE), ("user", "<role>HUMAN</role>"), ("tool", "<role>OBSERVATION</role>"),
    ("system", "<role>SYSTEM</role>"))


def ling3_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
    generation_prompt: str = "", continuation: Continuation = Continuation.NONE,
) -> FormatParams:
    """common_chat_params_init_ling3's grammar side for a request (see the module's contract).

    `generation_prompt` is the request's (prompt.chat_prompt's): where it leaves `<think>` open (the
    template's with thinking on), the thought also ends at a call's start. `source`, `json_schema` and
    `reasoning_format` do not change the answer (llama.cpp's format reads none of them for the grammar: the
    think body is tagged reasoning or content alike); they are taken for the same call as the other formats'.
    `continuation`: what of a final message is continued (continuation.continued_chat's; NONE: nothing),
    which, where something is, says whether the thought is open instead of the generation prompt. Does not
    render the prompt.

    Raises:
        NotImplementedError: parameters or an argument schema whose reading is not ported.
    """
    del source, json_schema
    include_grammar = bool(tools) and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function" and include_grammar])
    last_open, last_close = generation_prompt.rfind(THINK_START), generation_prompt.rfind(THINK_END)
    think_open = last_open != -1 and (last_close == -1 or last_open > last_close)
    if continuation is not Continuation.NONE:
        think_open = continuation is not Continuation.CONTENT
    try:
        arena = _parser(functions if include_grammar else None, think_open=think_open,
                        extract_reasoning=reasoning_format != "none", required=tool_choice == "required",
                        parallel_tool_calls=parallel_tool_calls)
    except NotImplementedError as exc:
        raise NotImplementedError(f"ling-3: {exc}") from exc
    return FormatParams(
        arena, include_grammar and tool_choice != "required", (CALL_START,) if include_grammar else (), True,
        THINK_START, (THINK_END, CALL_START), PRESERVED_TOKENS, (ROLE_END,), MESSAGE_DELIMITERS,
        writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]] | None, *, think_open: bool,
            extract_reasoning: bool, required: bool, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function (functions None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of `+` and `|` first)
    p = PegArena()
    end = p.end()
    space = p.optional(p.space())
    opener = p.optional(p.sequence(p.literal(ROLE), space))
    think_body = p.tag(p.until_one_of([THINK_END, CALL_START] if think_open else [THINK_END]),
                       "reasoning" if extract_reasoning else "content")
    think_end = p.optional(p.literal(THINK_END))
    reasoning = p.sequence(p.optional(p.literal(THINK_START)), think_body)
    reasoning = p.optional(p.sequence(reasoning, think_end))
    content = p.optional(p.tag(p.until_one_of([CALL_START]), "content"))
    tail = _tail(p)
    if functions is None:
        # opener + reasoning + tail + end
        p.root = p.sequence(p.sequence(p.sequence(opener, reasoning), tail), end)
        return p
    tool_choices = p.choice()
    arg_close = p.atomic(p.tag(p.literal(ARG_VAL_END), "tool-arg-close"))
    arg_string = p.rule("ling3-arg-string", p.sequence(p.tag(p.until(ARG_VAL_END),
                                                             "tool-arg-string-value"), arg_close))
    for name, function in functions:
        required_args: list[int] = []
        optional_args: list[int] = []
        for argument in tagged_arguments(tool_parameters(function)):
            rule = f"ling3-arg-{name}-{argument.name}"
            types = value_types(argument.schema)
            p.eps()  # the value's first value, replaced before use
            if "string" not in types:
                value = p.sequence(p.tag(p.schema(p.json(), rule + "-schema", argument.schema),
                                         "tool-arg-value"), arg_close)
            elif types == {"string"}:
                value = arg_string
            else:
                typed = p.sequence(p.tag(p.schema(p.json(), rule + "-schema", argument.schema),
                                         "tool-arg-value"), arg_close)
                value = p.gbnf(p.choice(p.atomic(typed), arg_string), "ling3-arg-string")
            (required_args if argument.required else optional_args).append(
                p.rule(rule, _argument(p, argument.name, value)))
        args = p.permute(f"ling3-{name}-args", required_args)
        if optional_args:
            args = p.sequence(args, p.zero_or_more(p.choice(*optional_args)))
        tool_choices = p.choice(tool_choices, p.rule(f"ling3-tool-{name}", _call(p, name, args)))
    calls = tool_choices
    if parallel_tool_calls:
        calls = p.sequence(tool_choices, p.zero_or_more(p.sequence(p.space(), tool_choices)))
    # calls + space() + optional(content(until(ROLE_END))) + optional(literal(ROLE_END))
    role_end = p.optional(p.literal(ROLE_END))
    trailing = p.optional(p.tag(p.until(ROLE_END), "content"))
    section = p.sequence(p.sequence(p.sequence(calls, p.space()), trailing), role_end)
    tools_section = p.trigger_rule("ling3-tool-call", section)
    tools = tools_section if required else p.optional(tools_section)
    root = p.sequence(p.sequence(p.sequence(opener, reasoning), content), tools)
    p.root = p.sequence(p.sequence(root, tail), end)
    return p


def _tail(p: PegArena) -> int:
    # optional(content(until(ROLE_END))) + optional(literal(ROLE_END)): the turn's end-of-turn token consumed
    role_end = p.optional(p.literal(ROLE_END))
    return p.sequence(p.optional(p.tag(p.until(ROLE_END), "content")), role_end)


def _argument(p: PegArena, key: str, value: int) -> int:
    # optional(space()) + tool_arg(tool_arg_open(ARG_KEY + tool_arg_name(key) + ARG_KEY_END)
    #                              + optional(space()) + ARG_VAL + value)
    val_open = p.literal(ARG_VAL)
    space = p.optional(p.space())
    key_end = p.literal(ARG_KEY_END)
    named = p.atomic(p.tag(p.literal(key), "tool-arg-name"))
    arg_open = p.atomic(p.tag(p.sequence(p.sequence(p.literal(ARG_KEY), named), key_end), "tool-arg-open"))
    arg = p.tag(p.sequence(p.sequence(p.sequence(arg_open, space), val_open), value), "tool-arg")
    return p.sequence(p.optional(p.space()), arg)


def _call(p: PegArena, name: str, args: int) -> int:
    # tool(tool_open(CALL_START + tool_name(name) + optional(space())) + tool_args(args)
    #      + tool_close(optional(space()) + CALL_END))
    call_end = p.literal(CALL_END)
    close = p.atomic(p.tag(p.sequence(p.optional(p.space()), call_end), "tool-close"))
    tool_args = p.tag(args, "tool-args")
    space = p.optional(p.space())
    named = p.atomic(p.tag(p.literal(name), "tool-name"))
    tool_open = p.atomic(p.tag(p.sequence(p.sequence(p.literal(CALL_START), named), space), "tool-open"))
    return p.tag(p.sequence(p.sequence(tool_open, tool_args), close), "tool")

