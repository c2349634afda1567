# The chat params of llama.cpp's hand-written kimi-k3 format (common/parsers/kimi-k3.cpp:
# common_chat_params_init_kimi_k3), the grammar side: Kimi K3 writes a message as tagged sections,
# `<|open|>name attrs<|sep|>...<|close|>name<|sep|>`: an optional think section, an optional response, then
# the calls in one tools section, `<|open|>call tool="name" index="N"<|sep|>` and one
# `<|open|>argument key="k" type="t"<|sep|>value<|close|>argument<|sep|>` per argument.
#
# Contract:
# - Whatever the template: thinking supported, tags `<|open|>think<|sep|>` and (`<|close|>think<|sep|>`), the
#   four markers preserved (never the tag names, which are ordinary words), no additional stops, and the
#   messages' start delimiters per role.
# - A grammar exactly where there are tools and tool_choice is not none (a response schema alone gives none:
#   llama.cpp's format does not read it); lazy where tool_choice is not required; the trigger word
#   `<|open|>tools<|sep|>` with every grammar, lazy or not.
# - The parser is built for every request (the message parser runs it; with no tools to call, no tools
#   section), its grammar written only where there is one. It is the arena's (peg_arena.py) of the parser
#   llama.cpp builds, made call for call in its order: the message opener, the think section and the response
#   (each opener and closer optional, the text up to the closer or the next section), then the tools section
#   (required where tool_choice is required, else optional) with one call or more, each of the function's
#   arguments any number of times in any order, every value any text up to the argument's closer (its JSON
#   type is not constrained), then the message's closer and end-of-message token, optional. Lazy, the grammar
#   is the tools section alone, with the message's closer and end-of-message token after it (optional;
#   llama.cpp's trigger rule holds them).
# - Not done (NotImplementedError): parameters whose properties are not an object (llama.cpp iterates them
#   as JSON; not ported).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["kimi_k3_params"]

SEP: Final = "<|sep|>"
MSG_START: Final = '<|open|>message role="assistant"<|sep|>'
THINK_START: Final = "<|open|>think<|sep|>"
THINK_END: Final = "<|close|>think<|sep|>"
RESP_START: Final = "<|open|>response<|sep|>"
RESP_END: Final = "<|close|>response<|sep|>"
TOOLS_START: Final = "<|open|>tools<|sep|>"
TOOLS_END: Final = "<|close|>tools<|sep|>"
CALL_START: Final = '<|open|>call tool="'
CALL_END: Final = "<|close|>call<|sep|>"
ARG_START: Final = '<|open|>argument key="'
ARG_END: Final = "<|close|>argument<|sep|>"
MSG_END: Final = "<|close|>message<|sep|>"
EOM_TOKEN: Final = "<|end_of_msg|>"
PRESERVED_TOKENS: Final = ("<|open|>", "<|close|>", SEP, EOM_TOKEN)
MESSAGE_DELIMITERS: Final = (
    ("assistant", MSG_START), ("user", '<|open|>message role="user"<|sep|>'),
    ("tool", '<|open|>message role="tool"'), ("system", '<|open|>message role="system"'))


def kimi_k3_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_kimi_k3's grammar side for a request (see the module's contract).

    `source` (the template), `parallel_tool_calls`, `json_schema` and `reasoning_format` do not change the
    answer: llama.cpp's format reads none of them for the grammar (a tools section always takes one call or
    more); they are taken for the same call as the other formats'.

    Raises:
        NotImplementedError: a tool whose parameters' properties are not an object.
    """
    # the think section's body is tagged reasoning or content as reasoning_format says: the same grammar
    del source, parallel_tool_calls, json_schema
    include_grammar = bool(tools) and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function" and include_grammar])
    arena = _parser(functions if include_grammar else None, extract_reasoning=reasoning_format != "none",
                    required=tool_choice == "required")
    return FormatParams(
        arena, include_grammar and tool_choice != "required", (TOOLS_START,) if include_grammar else (), True,
        THINK_START, (THINK_END,), PRESERVED_TOKENS, message_delimiters=MESSAGE_DELIMITERS,
        writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]] | None, *, extract_reasoning: bool,
            required: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function (functions None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of + first)
    p = PegArena()
    at_end = p.end()
    start = p.optional(p.literal(MSG_START))
    think_body = p.tag(p.until_one_of([THINK_END, RESP_START]),
                       "reasoning" if extract_reasoning else "content")
    think_end = p.optional(p.literal(THINK_END))
    reasoning = p.sequence(p.optional(p.literal(THINK_START)), think_body)
    reasoning = p.optional(p.sequence(reasoning, think_end))
    resp_end = p.optional(p.literal(RESP_END))
    content = p.tag(p.until_one_of([RESP_END, TOOLS_START, MSG_END]), "content")
    response = p.sequence(p.sequence(p.optional(p.literal(RESP_START)), content), resp_end)
    eom = p.optional(p.literal(EOM_TOKEN))
    trailer = p.sequence(p.optional(p.literal(MSG_END)), eom)
    if functions is None:
        # start + reasoning + response + trailer + end
        root = p.sequence(p.sequence(start, reasoning), response)
        p.root = p.sequence(p.sequence(root, trailer), at_end)
        return p
    choice = p.choice()
    for name, function in functions:
        args = p.eps()
        properties = _properties(tool_parameters(function))
        if properties:
            arg_choice = p.choice()
            for key, is_string in properties:
                argument = _argument(p, key, is_string=is_string)
                arg_choice = p.choice(arg_choice, p.rule(f"kimi-k3-arg-{name}-{key}", argument))
            args = p.zero_or_more(arg_choice)
        call_close = p.atomic(p.tag(p.literal(CALL_END), "tool-close"))
        tool_args = p.tag(args, "tool-args")
        call_open = p.atomic(p.tag(_tagged(p, CALL_START, name), "tool-open"))
        call = p.tag(p.sequence(p.sequence(call_open, tool_args), call_close), "tool")
        choice = p.choice(choice, p.rule(f"kimi-k3-tool-{name}", call))
    eom = p.optional(p.literal(EOM_TOKEN))
    msg_end = p.optional(p.literal(MSG_END))
    tools_end = p.literal(TOOLS_END)
    calls = p.repeat(choice, 1, -1)
    calls = p.sequence(p.literal(TOOLS_START), calls)
    section = p.trigger_rule("kimi-k3-tool-call", p.sequence(
        p.sequence(p.sequence(calls, tools_end), msg_end), eom))
    tools = section if required else p.optional(section)
    root = p.sequence(p.sequence(start, reasoning), response)
    p.root = p.sequence(p.sequence(p.sequence(root, tools), trailer), at_end)
    return p


def _properties(schema: Any) -> list[tuple[str, bool]]:
    # the keys llama.cpp iterates: schema.contains("properties") && !schema.at("properties").empty(), each
    # with whether its type is "string" (the type a property without a string "type" is taken to have)
    if not isinstance(schema, Mapping) or not schema.get("properties"):
        return []
    properties = schema["properties"]
    if not isinstance(properties, Mapping):
        raise NotImplementedError("kimi-k3 tools whose parameters' properties are not an object")
    return [(str(key), _type_of(value) == "string") for key, value in properties.items()]


def _type_of(schema: Any) -> str:
    typed = schema.get("type") if isinstance(schema, Mapping) else None
    return typed if isinstance(typed, str) else "string"


def _tagged(p: PegArena, opener: str, name: str) -> int:
    # literal(opener) + tool_name(literal(name)) + literal("\"") + until(SEP) + literal(SEP): the tag's
    # other attributes skipped up to its separator
    sep = p.literal(SEP)
    attributes = p.until(SEP)
    quote = p.literal('"')
    named = p.atomic(p.tag(p.literal(name), "tool-name"))
    opened = p.sequence(p.literal(opener), named)
    return p.sequence(p.sequence(p.sequence(opened, quote), attributes), sep)


def _argument(p: PegArena, key: str, *, is_string: bool) -> int:
    # tool_arg(tool_arg_open(literal(ARG_START)) + tool_arg_name(literal(key)) + literal("\"") + until(SEP)
    #          + literal(SEP) + value + tool_arg_close(literal(ARG_END))), the value made first
    # a string or a JSON value alike: the text up to the closer, a string's tool_arg_string_value
    value = p.tag(p.until(ARG_END), "tool-arg-string-value" if is_string else "tool-arg-value")
    close = p.atomic(p.tag(p.literal(ARG_END), "tool-arg-close"))
    sep = p.literal(SEP)
    attributes = p.until(SEP)
    quote = p.literal('"')
    named = p.atomic(p.tag(p.literal(key), "tool-arg-name"))
    opened = p.sequence(p.atomic(p.tag(p.literal(ARG_START), "tool-arg-open")), named)
    opened = p.sequence(p.sequence(p.sequence(opened, quote), attributes), sep)
    return p.tag(p.sequence(p.sequence(opened, value), close), "tool-arg")
