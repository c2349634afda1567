# The chat params of llama.cpp's hand-written minicpm5 format (common/parsers/minicpm5.cpp:
# common_chat_params_init_minicpm5), the grammar side: MiniCPM5 writes `<think>...</think>`, then its calls
# as `<function name="foo"><param name="bar">value</param></function>`.
#
# Contract:
# - Whatever the request: thinking supported, tags `<think>` and (`</think>`), the six markers preserved, no
#   additional stops, and the messages' start delimiters per role.
# - A grammar where there is a response schema, or tools with tool_choice other than none; lazy exactly where
#   neither a schema nor tool_choice required is there, with the trigger word `<function` whatever the
#   grammar.
# - The parser is built for every request (the message parser runs it; with no schema nor tools to call, the
#   thought then the rest as content), its grammar written only where there is one. It is the arena's
#   (peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: the generation prompt, the think block where reasoning is extracted, then the schema's JSON (a
#   schema wins over tools), or the text up to `<function` and one call (more where parallel calls are on).
#   A call's arguments come in any order and number; one that may be a string is a CDATA section or any
#   text up to `</param>`, any other its schema's JSON.
# - Not done (NotImplementedError): parameters that hold a $ref, and argument schemas whose may-be-a-string
#   answer is not ported (tagged_tool_grammar.may_be_string says which).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import may_be_string, tagged_arguments
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["minicpm5_params"]

GENERATION_PROMPT: Final = "<|im_start|>assistant\n"
THINK_START: Final = "<think>"
THINK_END: Final = "</think>"
CALL_START: Final = "<function"
PARAM_END: Final = "</param>"
CDATA_START: Final = "<![CDATA["
CDATA_END: Final = "]]>"
PRESERVED_TOKENS: Final = ("<function", "<param", "</function>", "</param>", THINK_START, THINK_END)
MESSAGE_DELIMITERS: Final = (
    ("assistant", "<|im_start|>assistant"), ("tool", "<|im_start|>user\n<tool_response>"),
    ("user", "<|im_start|>user"), ("system", "<|im_start|>system"))


def minicpm5_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_minicpm5's grammar side for a request (see the module's contract).

    `source` does not change the answer (llama.cpp's format does not read the template for the grammar); it
    is taken for the same call as the other formats'. Does not render the prompt nor handle a continued
    final message.

    Raises:
        NotImplementedError: parameters or an argument schema whose reading is not ported.
    """
    del source
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping) and bool(json_schema)
    wants_tools = has_tools and tool_choice != "none"
    include_grammar = has_schema or wants_tools
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function" and wants_tools])
    try:
        arena = _parser(functions, extract_reasoning=reasoning_format != "none",
                        json_schema=json_schema if has_schema else None, wants_tools=wants_tools,
                        parallel_tool_calls=parallel_tool_calls)
    except NotImplementedError as exc:
        raise NotImplementedError(f"minicpm5: {exc}") from exc
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(arena, lazy, (CALL_START,) if include_grammar else (), True, THINK_START,
                        (THINK_END,), PRESERVED_TOKENS, message_delimiters=MESSAGE_DELIMITERS,
                        writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool,
            json_schema: Mapping[str, Any] | None, wants_tools: bool, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` and `|` first, the left one of `<<` first)
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PROMPT)
    reasoning = p.eps()
    if extract_reasoning:
        # ("<think>" << reasoning(until("</think>")) << "</think>") + space()
        space = p.space()
        # `"text" << parser` makes the parser first, then the literal
        body = p.tag(p.until(THINK_END), "reasoning")
        thought = _then(p, p.literal(THINK_START), body)
        thought = _then(p, thought, p.literal(THINK_END))
        reasoning = p.sequence(thought, space)
    if json_schema is not None:
        content = p.tag(p.schema(p.json(), "response-format", json_schema), "content")
        p.root = p.sequence(p.sequence(generation_prompt, reasoning), content)
        return p
    if not wants_tools:
        # generation_prompt + reasoning + content(rest()) + end()
        end = p.end()
        content = p.tag(p.rest(), "content")
        p.root = p.sequence(p.sequence(p.sequence(generation_prompt, reasoning), content), end)
        return p
    string_value = _string_value(p)
    tool_choice = p.choice()
    for name, function in functions:
        arg_rules = [_argument(p, name, argument.name, argument.schema, string_value)
                     for argument in tagged_arguments(tool_parameters(function))]
        args = p.eps()
        if arg_rules:
            space = p.space()
            args = p.zero_or_more(p.sequence(p.choice(*arg_rules), space))
        tool_choice = p.choice(tool_choice, p.rule(f"tool-{name}", _call(p, name, args)))
    space = p.space()
    calls = p.repeat(p.sequence(tool_choice, space), 1, -1 if parallel_tool_calls else 1)
    tool_calls = p.trigger_rule("tool-call", calls)
    content = p.tag(p.until(CALL_START), "content")
    end = p.end()
    root = p.sequence(p.sequence(generation_prompt, reasoning), content)
    p.root = p.sequence(p.sequence(root, tool_calls), end)
    return p


def _then(p: PegArena, left: int, right: int) -> int:
    # left << right: a space between, made after both operands
    return p.sequence(left, p.space(), right)


def _string_value(p: PegArena) -> int:
    # choice({ "<![CDATA[" + ac(tool_arg_string_value(until("]]>")) + "]]>", "]]>")
    #              + tool_arg_close("</param>"),
    #          negate("<![CDATA[") + ac(tool_arg_string_value(until("</param>"))
    #              + tool_arg_close("</param>"), "</param>") }): the left alternative made first
    close = p.atomic(p.tag(p.literal(PARAM_END), "tool-arg-close"))
    cdata_end = p.literal(CDATA_END)
    inner = p.ac(p.sequence(p.tag(p.until(CDATA_END), "tool-arg-string-value"), cdata_end), [CDATA_END])
    cdata = p.sequence(p.sequence(p.literal(CDATA_START), inner), close)
    close = p.atomic(p.tag(p.literal(PARAM_END), "tool-arg-close"))
    raw = p.ac(p.sequence(p.tag(p.until(PARAM_END), "tool-arg-string-value"), close), [PARAM_END])
    raw = p.sequence(p.negate(p.literal(CDATA_START)), raw)
    return p.choice(cdata, raw)


def _argument(p: PegArena, name: str, key: str, schema: Mapping[str, Any], string_value: int) -> int:
    # tool_arg(tool_arg_open("<param name=\"" + tool_arg_name(key) + "\">") + value)
    p.eps()  # the value's first value, replaced before use
    if may_be_string(schema):
        value = string_value
    else:
        close = p.atomic(p.tag(p.literal(PARAM_END), "tool-arg-close"))
        value = p.sequence(p.tag(p.schema(p.json(), f"tool-{name}-arg-{key}-schema", schema),
                                 "tool-arg-value"), close)
    name_end = p.literal('">')
    named = p.atomic(p.tag(p.literal(key), "tool-arg-name"))
    arg_open = p.atomic(p.tag(p.sequence(p.sequence(p.literal('<param name="'), named), name_end),
                              "tool-arg-open"))
    return p.tag(p.sequence(arg_open, value), "tool-arg")


def _call(p: PegArena, name: str, args: int) -> int:
    # tool(tool_open("<function name=\"" + tool_name(name) + "\">") << tool_args(args)
    #      << tool_close("</function>"))
    name_end = p.literal('">')
    named = p.atomic(p.tag(p.literal(name), "tool-name"))
    tool_open = p.atomic(p.tag(p.sequence(p.sequence(p.literal('<function name="'), named), name_end),
                               "tool-open"))
    opened = _then(p, tool_open, p.tag(args, "tool-args"))
    return p.tag(_then(p, opened, p.atomic(p.tag(p.literal("</function>"), "tool-close"))), "tool")
