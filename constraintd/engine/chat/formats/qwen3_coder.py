# The chat params of llama.cpp's hand-written qwen3-coder format (common/parsers/qwen3-coder.cpp:
# common_chat_params_init_qwen3_coder), the grammar side: Qwen3-Coder, Qwen3.5, Nemotron Nano 3 and
# StepFun-3.5-Flash write calls as `<tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n
# </function>\n</tool_call>`.
#
# Contract:
# - A template "supports reasoning" where its source holds `<think>`: thinking tags `<think>` and
#   (`\n</think>`, `</think>`, `<tool_call>`), `<think>` and `</think>` preserved after `<tool_call>` and
#   `</tool_call>`; else it is Qwen3-Coder itself, whose calls may also open at `<function=name>` (a trigger
#   word per tool, and the first call's `<tool_call>\n` optional). No additional stops; the ChatML message
#   delimiters (MESSAGE_DELIMITERS: a tool's result in a user turn, or StepFun's own tool_response turn).
# - A grammar where there is a response schema, or tools with tool_choice other than none; lazy exactly where
#   there are tools and tool_choice is auto (a schema included: llama.cpp then writes the trigger rules alone,
#   and there are none), with the calls' start words as triggers.
# - The grammar is the arena's (chat/peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: the generation prompt, the reasoning where it is extracted, then the schema's JSON, or the text up
#   to a call's start and the calls (at least one where tool_choice is required, more where parallel calls
#   are on). A string argument is any text up to `\n</parameter>\n`; any other its schema's JSON; one that
#   may be both, the string rule. Required arguments in any order (as `tool-<name>-args-N` rules), then the
#   optional ones.
# - Not done (NotImplementedError): parameters that hold a $ref, arguments whose schema has allOf in a string
#   or an object without properties, a string format without a type, or a type llama.cpp does not know
#   (their value types, or llama.cpp's refusal, are not ported).
from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import tagged_arguments
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["qwen3_coder_params", "value_types"]

GENERATION_PREFIX: Final = "<|im_start|>assistant\n"
_ARG_CLOSE: Final = "\n</parameter>\n"
MESSAGE_DELIMITERS: Final = (
    ("assistant", "<|im_start|>assistant"),
    ("tool", "<|im_start|>user\n<tool_response>"),  # Qwen3-Coder, Qwen3.5, Nemotron Nano 3
    ("tool", "<|im_start|>tool_response"),  # StepFun-3.5-Flash
    ("user", "<|im_start|>user"), ("system", "<|im_start|>system"))
_ALL_TYPES: Final = frozenset({"null", "boolean", "number", "integer", "string", "array", "object"})


def value_types(schema: Any) -> frozenset[str]:
    """common_chat_schema::value_types of the node common_chat_schema_from_json builds for `schema`.

    Raises:
        NotImplementedError: a `$ref`, allOf in a string or an object without properties, or a string
            format without a type (not ported).
    """
    if not isinstance(schema, Mapping):
        raise NotImplementedError("qwen3-coder arguments whose schema is not an object")
    if "$ref" in schema:
        raise NotImplementedError("qwen3-coder arguments whose schema holds a $ref")
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return frozenset().union(*(value_types(child) for child in schema[key]))
    kind = schema.get("type")
    if isinstance(kind, list):
        return frozenset().union(*(value_types({**schema, "type": each}) for each in kind))
    if "const" in schema:
        return frozenset({_json_type(schema["const"])})
    if "enum" in schema:
        return frozenset(map(_json_type, schema["enum"]))
    additional = schema.get("additionalProperties", True)
    has_properties = "properties" in schema or additional is not True
    if "allOf" in schema and (kind == "string" or (kind in (None, "object") and not has_properties)):
        raise NotImplementedError("qwen3-coder arguments whose schema's allOf decides their type")
    if kind is None:
        if has_properties:
            return frozenset({"object"})
        if "items" in schema or "prefixItems" in schema:
            return frozenset({"array"})
        if "format" in schema:
            raise NotImplementedError("qwen3-coder arguments whose schema has a format and no type")
        if "pattern" in schema or "minLength" in schema or "maxLength" in schema:
            return frozenset({"string"})
        return _ALL_TYPES
    if kind not in _ALL_TYPES:
        raise NotImplementedError("qwen3-coder arguments of an unknown type")  # llama.cpp refuses the tools
    return frozenset({"number", "integer"}) if kind == "number" else frozenset({str(kind)})


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def qwen3_coder_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_qwen3_coder's grammar side for a request (see the module's contract).

    Raises:
        NotImplementedError: an argument schema whose value types are not ported.
    """
    supports_reasoning = "<think>" in source
    is_qwen3_coder = not supports_reasoning
    preserved = ("<tool_call>", "</tool_call>") + (("<think>", "</think>") if supports_reasoning else ())
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function"])
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping) and bool(json_schema)
    wants_tools = has_tools and tool_choice != "none"
    starts = ["<tool_call>"] + ([f"<function={name}>" for name, _ in functions] if is_qwen3_coder else [])
    arena = _parser(functions, supports_reasoning=supports_reasoning, is_qwen3_coder=is_qwen3_coder,
                    extract_reasoning=reasoning_format != "none", json_schema=json_schema if has_schema
                    else None, tool_choice=tool_choice if wants_tools else None,
                    parallel_tool_calls=parallel_tool_calls, starts=starts)
    include_grammar = has_schema or wants_tools
    lazy = include_grammar and has_tools and tool_choice == "auto"
    return FormatParams(
        arena, lazy, tuple(starts) if lazy else (),
        supports_reasoning, "<think>" if supports_reasoning else "",
        ("\n</think>", "</think>", "<tool_call>") if supports_reasoning else (), preserved,
        message_delimiters=MESSAGE_DELIMITERS, writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, supports_reasoning: bool, is_qwen3_coder: bool,
            extract_reasoning: bool, json_schema: Any, tool_choice: str | None, parallel_tool_calls: bool,
            starts: list[str]) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PREFIX)
    reasoning = p.eps()
    if supports_reasoning and extract_reasoning:
        # optional("<think>" + space() + reasoning(until_one_of(...)) + (literal | peek(literal)))
        end = p.peek(p.literal("<tool_call>"))
        end = p.choice(p.literal("</think>"), end)
        body = p.tag(p.until_one_of(["</think>", "<tool_call>"]), "reasoning")
        head = p.space()
        head = p.sequence(p.literal("<think>"), head)
        reasoning = p.optional(p.sequence(p.sequence(head, body), end))
    if json_schema is not None:
        content = p.tag(p.schema(p.json(), "response-format", json_schema), "content")
        p.root = p.sequence(generation_prompt, _then(p, reasoning, content))
        return p
    if tool_choice is not None:
        calls = _calls(p, functions, is_qwen3_coder=is_qwen3_coder, tool_choice=tool_choice,
                       parallel_tool_calls=parallel_tool_calls)
        content = p.tag(p.until_one_of(starts), "content")
        p.root = p.sequence(generation_prompt, _then(p, _then(p, reasoning, content), calls))
        return p
    content = p.tag(p.rest(), "content")
    p.root = p.sequence(generation_prompt, _then(p, reasoning, content))
    return p


def _then(p: PegArena, left: int, right: int) -> int:
    # left << right: a space between
    return p.sequence(left, p.space(), right)


def _calls(p: PegArena, functions: list[tuple[str, Mapping[str, Any]]], *, is_qwen3_coder: bool,
           tool_choice: str, parallel_tool_calls: bool) -> int:
    arg_close = p.atomic(p.tag(p.literal(_ARG_CLOSE), "tool-arg-close"))
    string_value = p.tag(p.until(_ARG_CLOSE), "tool-arg-string-value")
    arg_string = p.rule("xml-arg-string", p.ac(p.sequence(string_value, arg_close), [_ARG_CLOSE]))
    choice = p.choice()
    for name, function in functions:
        required: list[int] = []
        optional: list[int] = []
        parameters = tool_parameters(function)
        if "$ref" in json.dumps(parameters):
            raise NotImplementedError("qwen3-coder arguments whose parameters hold a $ref")
        for argument in tagged_arguments(parameters):
            rule = f"tool-{name}-arg-{argument.name}"
            arg_name = p.atomic(p.tag(p.literal(argument.name), "tool-arg-name"))
            arg_open = p.sequence(p.literal("<parameter="), arg_name)
            arg_open = p.atomic(p.tag(p.sequence(arg_open, p.literal(">\n")), "tool-arg-open"))
            p.eps()
            types = value_types(argument.schema)
            if "string" not in types:
                value = p.sequence(p.tag(p.schema(p.json(), rule + "-schema", argument.schema),
                                         "tool-arg-value"), arg_close)
            elif types == {"string"}:
                value = arg_string
            else:
                value = _json_or_string(p, types, arg_close, arg_string)
            (required if argument.required else optional).append(
                p.rule(rule, p.tag(p.sequence(arg_open, value), "tool-arg")))
        args = p.permute(f"tool-{name}-args", required)
        if optional:
            args = p.sequence(args, p.zero_or_more(p.choice(*optional)))
        close = p.atomic(p.tag(p.literal("</function>\n"), "tool-close"))
        tool_args = p.tag(args, "tool-args")
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        tool_open = p.sequence(p.literal("<function="), tool_name)
        tool_open = p.atomic(p.tag(p.sequence(tool_open, p.literal(">\n")), "tool-open"))
        function_parser = p.tag(p.sequence(p.sequence(tool_open, tool_args), close), "tool")
        choice = p.choice(choice, p.rule(f"tool-{name}", function_parser))
    space = p.space()
    body = p.sequence(p.sequence(choice, p.literal("</tool_call>")), space)
    tool_call = p.rule("tool-call", p.sequence(p.literal("<tool_call>\n"), body))
    first = tool_call
    if is_qwen3_coder:
        first = p.rule("tool-call-first", p.sequence(p.optional(p.literal("<tool_call>\n")), body))
    calls = p.sequence(first, p.zero_or_more(tool_call)) if parallel_tool_calls else first
    return p.trigger_rule("tool-call-root", p.repeat(calls, 1 if tool_choice == "required" else 0, 1))


def _json_or_string(p: PegArena, types: frozenset[str], arg_close: int, arg_string: int) -> int:
    # the JSON alternatives type the parsed value; the grammar keeps the raw string rule alone
    json_value = p.choice()
    makers: tuple[tuple[Callable[[], int], bool], ...] = (
        (p.json_object, "object" in types), (p.json_array, "array" in types),
        (p.json_number, "number" in types or "integer" in types), (p.json_bool, "boolean" in types),
        (p.json_null, "null" in types))
    for make, wanted in makers:
        if wanted:
            json_value = p.choice(json_value, make())
    typed = p.atomic(p.sequence(p.tag(json_value, "tool-arg-value"), arg_close))
    return p.gbnf(p.choice(typed, arg_string), "xml-arg-string")



