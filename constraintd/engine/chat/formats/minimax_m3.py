# The chat params of llama.cpp's hand-written minimax-m3 format (common/parsers/minimax-m3.cpp:
# common_chat_params_init_minimax_m3), the grammar side: MiniMax-M3 writes calls as
# `]<]minimax[>[<tool_call>]<]minimax[>[<invoke name="f">]<]minimax[>[<key>value]<]minimax[>[</key>
# ]<]minimax[>[</invoke>]<]minimax[>[</tool_call>`, an object argument's members and an array's
# `]<]minimax[>[<item>` elements nested the same way.
#
# Contract:
# - Thinking supported, thinking tags `<mm:think>` and (`</mm:think>`,), the namespace token, `<tool_call>`,
#   `</tool_call>`, `<mm:think>` and `</mm:think>` preserved, the prompt's message delimiters
#   (MESSAGE_DELIMITERS). No additional stops.
# - A grammar where there is a response schema (any JSON object, an empty one too), or tools with tool_choice
#   other than none; lazy unless there is a schema or tool_choice is required. The call block's start is the
#   trigger word of every grammar, lazy or not.
# - The parser is built for every request (the message parser runs it; with neither a schema nor tools to
#   call, the thought then the rest as content), its grammar written only where there is one. It is the
#   arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its order: the generation
#   prompt, the reasoning where it is extracted (an optional thought, or a bare `</mm:think>`), then the
#   schema's JSON in a ```json fence, or the text up to the block and the block (at least one call where
#   tool_choice is required, more where parallel calls are on). An argument that may be a string is any text
#   up to its close; one of alternatives, each alternative's value; an object with properties, its members as
#   elements; an array, its items as `<item>` elements; any other its schema's JSON. Members: the required
#   ones in the properties' order, space between, then the optional ones in any order, space before each.
# - Not done (NotImplementedError): parameters that hold a $ref, and arguments whose may-be-a-string answer
#   needs allOf or a string format without a type (tagged_tool_grammar.may_be_string's refusals).
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import may_be_string
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["MESSAGE_DELIMITERS", "minimax_m3_params"]

NS: Final = "]<]minimax[>["
GENERATION_PROMPT: Final = "]~b]ai\n"
THINK_START: Final = "<mm:think>"
THINK_END: Final = "</mm:think>"
FC_START: Final = NS + "<tool_call>"
FC_END: Final = NS + "</tool_call>"
_INVOKE_END: Final = NS + "</invoke>"
_TYPES: Final = frozenset({"null", "boolean", "number", "integer", "string", "array", "object"})
PRESERVED_TOKENS: Final = (NS, "<tool_call>", "</tool_call>", THINK_START, THINK_END)
MESSAGE_DELIMITERS: Final = (("assistant", "]~b]ai"), ("user", "]~b]user"), ("tool", "]~b]tool"),
                             ("system", "]~b]developer"), ("system", "]~b]system"))


def minimax_m3_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
    enable_thinking: bool = True,
) -> FormatParams:
    """common_chat_params_init_minimax_m3's grammar side for a request (see the module's contract).

    Does not render the prompt nor read the messages (they change the prompt only); the template's source
    does not change the grammar.

    Raises:
        NotImplementedError: parameters or an argument schema whose reading is not ported.
    """
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    include_grammar = has_schema or (has_tools and tool_choice != "none")
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function"])
    wants_tools = has_tools and tool_choice != "none"
    try:
        arena = _parser(functions if wants_tools else None,
                        require_tools=tool_choice == "required", parallel_tool_calls=parallel_tool_calls,
                        extract_reasoning=reasoning_format != "none", enable_thinking=enable_thinking,
                        json_schema=json_schema if has_schema else None)
    except NotImplementedError as exc:
        raise NotImplementedError(f"minimax-m3: {exc}") from exc
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(arena, lazy, (FC_START,) if include_grammar else (), True, THINK_START, (THINK_END,),
                        PRESERVED_TOKENS, message_delimiters=MESSAGE_DELIMITERS,
                        writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]] | None, *, require_tools: bool,
            parallel_tool_calls: bool, extract_reasoning: bool, enable_thinking: bool,
            json_schema: Mapping[str, Any] | None) -> PegArena:
    # the parser of build_chat_peg_parser's function (functions None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of `+` and `|` first)
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PROMPT)  # prefix(GEN_PROMPT, THINK_START): no thought in it
    end = p.end()
    reasoning = p.eps()
    if extract_reasoning:
        if enable_thinking:
            # literal(THINK_START) + space() + ac(reasoning(until(THINK_END)) + literal(THINK_END), THINK_END)
            close = p.literal(THINK_END)
            thought = p.ac(p.sequence(p.tag(p.until(THINK_END), "reasoning"), close), [THINK_END])
            head = p.space()
            block = p.sequence(p.sequence(p.literal(THINK_START), head), thought)
        else:
            close = p.literal(THINK_END)
            thought = p.ac(p.sequence(p.until(THINK_END), close), [THINK_END])
            block = p.sequence(p.literal(THINK_START), thought)
        reasoning = p.optional(p.choice(block, p.literal(THINK_END)))
    if json_schema is not None:
        fence_close = p.literal("```")
        space = p.space()
        content = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
        head = p.space()
        head = p.sequence(p.literal("```json"), head)
        response_format = p.rule("response-format", _chain(p, head, content, space, fence_close))
        p.root = _chain(p, generation_prompt, reasoning, response_format, end)
        return p
    if functions is None:
        # generation_prompt + reasoning + content(rest()) + end
        p.root = _chain(p, generation_prompt, reasoning, p.tag(p.rest(), "content"), end)
        return p
    tool_choice = p.choice()
    for name, function in functions:
        parameters = tool_parameters(function)
        if "$ref" in json.dumps(parameters):
            raise NotImplementedError("tagged arguments whose parameters hold a $ref")
        body = p.eps()
        if _kind(parameters)[0] == "object":
            body = _members(p, parameters, f"tool-{name}-arg")
        close = p.atomic(p.tag(p.literal(_INVOKE_END), "tool-close"))
        space_after = p.space()
        space_before = p.space()
        name_end = p.literal('">')
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        tool_open = p.sequence(p.literal(NS + '<invoke name="'), tool_name)
        tool_open = p.atomic(p.tag(p.sequence(tool_open, name_end), "tool-open"))
        invoke = p.tag(_chain(p, tool_open, space_before, body, space_after, close), "tool")
        tool_choice = p.choice(tool_choice, p.rule(f"tool-{name}", invoke))
    p.eps()  # the calls' first value, replaced before use
    block_end = p.literal(FC_END)
    space = p.space()
    more = p.zero_or_more(p.sequence(p.space(), tool_choice)) if parallel_tool_calls else None
    head = p.space()
    head = p.sequence(p.literal(FC_START), head)
    calls = (tool_choice,) if more is None else (tool_choice, more)
    tool_calls = p.trigger_rule("tool-call", _chain(p, head, *calls, space, block_end))
    if not require_tools:
        tool_calls = p.optional(tool_calls)
    content = p.tag(p.until(FC_START), "content")
    p.root = _chain(p, generation_prompt, reasoning, content, tool_calls, end)
    return p


def _chain(p: PegArena, first: int, *rest: int) -> int:
    # first + rest[0] + rest[1] ...: a sequence per `+`, each flattening the one before
    for parser in rest:
        first = p.sequence(first, parser)
    return first


def _kind(schema: Any) -> tuple[str, Any]:
    # the kind of the node common_chat_schema_from_json builds (build_node), with what minimax-m3 reads of
    # it: an anyOf's alternatives, an object's properties, an array's items
    if not isinstance(schema, Mapping):
        raise NotImplementedError("tagged arguments whose schema is not an object")
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return "any_of", list(schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "any_of", [{**schema, "type": each} for each in kind]
    if "const" in schema or "enum" in schema:
        return "value", None
    additional = schema.get("additionalProperties", True)
    has_properties = "properties" in schema or additional is not True
    if kind in (None, "object") and has_properties:
        return "object", schema.get("properties", {})
    if kind in (None, "object", "string") and "allOf" in schema:
        return "value", None
    if kind == "object":
        return "object", schema.get("properties", {})
    if kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
        items = schema["items"] if "items" in schema else schema["prefixItems"]
        return ("value", None) if isinstance(items, list) else ("array", items)
    if kind == "array":
        return "array", {}
    if kind is not None and kind not in _TYPES:
        raise NotImplementedError("tagged arguments of an unknown type")  # llama.cpp refuses the tools
    return "value", None


def _members(p: PegArena, schema: Mapping[str, Any], prefix: str) -> int:
    # members_of: the required elements in the properties' order, then any number of optional ones
    required: list[int] = []
    optional: list[int] = []
    for key, child in schema.get("properties", {}).items():
        element = _element(p, str(key), child, f"{prefix}-{key}")
        (required if key in schema.get("required", []) else optional).append(element)
    members = p.eps()
    for at, element in enumerate(required):
        if at:
            members = p.sequence(members, p.space())
        members = p.sequence(members, element)
    if optional:
        any_optional = p.choice()
        for element in optional:
            any_optional = p.choice(any_optional, element)
        members = p.sequence(members, p.zero_or_more(p.sequence(p.space(), any_optional)))
    return members


def _element(p: PegArena, tag: str, schema: Any, rule: str) -> int:
    # tool_arg(tool_arg_open(NS + "<" + tool_arg_name(tag) + ">") + value_of(...)), as a rule
    value = _value(p, schema, rule, NS + "</" + tag + ">")
    name_end = p.literal(">")
    arg_name = p.atomic(p.tag(p.literal(tag), "tool-arg-name"))
    arg_open = p.sequence(p.literal(NS + "<"), arg_name)
    arg_open = p.atomic(p.tag(p.sequence(arg_open, name_end), "tool-arg-open"))
    return p.rule(rule, p.tag(p.sequence(arg_open, value), "tool-arg"))


def _value(p: PegArena, schema: Any, rule: str, close: str) -> int:
    # value_of: the argument's value up to its close, by the kind of its schema
    close_tag = p.atomic(p.tag(p.literal(close), "tool-arg-close"))
    if may_be_string(schema):
        return p.ac(p.sequence(p.tag(p.until(close), "tool-arg-string-value"), close_tag), [close])
    kind, held = _kind(schema)
    if kind == "any_of":
        return p.choice(*(_value(p, child, f"{rule}-{at}", close) for at, child in enumerate(held)))
    if kind == "object" and held:
        space = p.space()
        return _chain(p, p.tag(_members(p, schema, rule), "tool-arg-object"), space, close_tag)
    if kind == "array":
        item_close = NS + "</item>"
        value = _value(p, held, f"{rule}-item", item_close)
        item = p.rule(f"{rule}-item", p.tag(p.sequence(p.literal(NS + "<item>"), value), "tool-arg-item"))
        space = p.space()
        items = p.tag(p.zero_or_more(p.sequence(p.space(), item)), "tool-arg-array")
        return _chain(p, items, space, close_tag)
    return p.sequence(p.tag(p.schema(p.json(), f"{rule}-schema", schema), "tool-arg-value"), close_tag)
