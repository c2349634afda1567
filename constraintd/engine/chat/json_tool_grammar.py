# The lazy tool-call grammar of llama.cpp's auto-parser for templates that write tool calls as JSON
# (analyze_tools::build_tool_parser_json_native and common_chat_peg_builder::standard_json_tools, with the
# PEG arena's GBNF writer), for tool_choice auto: the grammar a sampler switches on at the trigger word.
#
# Contract:
# - A lazy grammar holds the trigger rules only: `tool-call` (the section, or one call where the template
#   marks each call), `tool-calls` (one or more calls, where it marks each call), the rules they reach, and
#   `root` as the trigger rules' names joined by " | " in sorted order.
# - Each tool is a rule `tool-<name>` (llama.cpp's rule name: runs of other characters than letters, digits
#   and '-' become '-'), its arguments the converter's rules for its parameters named `tool-<name>-schema`;
#   the fields in the template's order (name, arguments, ids), or the name as the key of its arguments.
# - Not done: the non-lazy grammar (tool_choice required) and the fields nested under a function object.
#   Where llama.cpp would set the sequence of a field's parsers apart in parentheses, so does the text here.
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from constraintd.engine.chat.template_analysis import ToolFormat

__all__ = ["JSON_STRING_CONTENT", "json_tool_rules", "rule_name"]

AddRule = Callable[[str, str], str]
AddSchema = Callable[[str, Any], str]
Literal = Callable[[str], str]

JSON_STRING_CONTENT = '( [^"\\\\] | "\\\\" ( ["\\\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )*'
"""The GBNF the arena writes for string_content('"') (a JSON string's characters)."""

_INVALID_RULE_CHARS = re.compile("[^a-zA-Z0-9-]+")


def rule_name(name: str) -> str:
    """A PEG rule's name as llama.cpp's builder cleans it."""
    return _INVALID_RULE_CHARS.sub("-", name)


def _parameters(function: Mapping[str, Any]) -> Any:
    # common_chat_tool_parameters: the parameters, or an object schema with no properties
    params = function.get("parameters")
    if params is not None and params != {}:
        return params
    return {"type": "object", "properties": {}}


def _id_field(literal: Literal, key: str) -> str:
    # atomic(key : ("\"" string "\"" | json-number)), inside a sequence: the choice in parentheses
    return (f'({literal(chr(34) + key + chr(34))} space {literal(":")} space '
            f'({literal(chr(34))} {JSON_STRING_CONTENT} {literal(chr(34))} | json-number))')


def _flat_tool(literal: Literal, add_schema: AddSchema, name: str, params: Any, tools: ToolFormat,
               name_key: str, args_key: str) -> str:
    quote = literal('"')
    tool_name = (f'{literal(chr(34) + name_key + chr(34))} space {literal(":")} space '
                 f'({quote} {literal(name)} {quote})')
    schema = add_schema(f"tool-{name}-schema", params)
    tool_args = f'{literal(chr(34) + args_key + chr(34))} space {literal(":")} space {schema}'
    pairs = [(tool_name, name_key), (tool_args, args_key)]
    if tools.id_field:
        pairs.append((_id_field(literal, tools.id_field) + "?", tools.id_field))
    if tools.gen_id_field:
        pairs.append((_id_field(literal, tools.gen_id_field) + "?", tools.gen_id_field))
    order = tools.parameter_order
    pairs.sort(key=lambda pair: order.index(pair[1]) if pair[1] in order else len(order))
    body = [literal("{"), "space"]
    if tools.openai_wrapper_trigger:
        body.append(f'({literal(chr(34) + "type" + chr(34))} space {literal(":")} space '
                    f'{literal(chr(34) + "function" + chr(34))} space {literal(",")} space)?')
    for at, (parser, _) in enumerate(pairs):
        body.append(parser)
        if at < len(pairs) - 1:
            body += ["space", literal(","), "space"]
    body += ["space", literal("}")]
    return " ".join(body)


def _keyed_tool(literal: Literal, add_schema: AddSchema, name: str, params: Any, tools: ToolFormat,
                args_key: str, effective_args: str) -> str:
    # build_json_tools_function_is_key: {"<name>": <arguments>} or {"<name>": {ids, "<args>": <arguments>}}
    quote = literal('"')
    comma = f'({literal(",")} space)?'
    fields: list[list[str]] = []
    if tools.id_field:
        key = literal(f'"{tools.id_field}"')
        value = f"{quote} {JSON_STRING_CONTENT} {quote}"
        fields.append([f'(({key} space {literal(":")} space {value}) space {comma})?'])
    if tools.gen_id_field:
        key = literal(f'"{tools.gen_id_field}"')
        value = f"({quote} {JSON_STRING_CONTENT} {quote} | json-number)"
        fields.append([f'(({key} space {literal(":")} space {value}) space {comma})?'])
    schema = add_schema(f"tool-{name}-schema", params)
    if args_key:
        fields.append([literal(f'"{effective_args}"'), "space", literal(":"), "space", schema])
    else:
        fields.append([schema])
    if not args_key and len(fields) == 1:
        inner = fields[0]
    else:
        inner = [literal("{"), "space"]
        for at, parts in enumerate(fields):
            inner += parts
            if at < len(fields) - 1:
                inner.append("space")
        inner += ["space", literal("}")]
    return " ".join([literal("{"), "space", quote, literal(name), quote, "space", literal(":"), "space",
                     *inner, "space", literal("}")])


def json_tool_rules(
    tool_defs: Sequence[Mapping[str, Any]], tools: ToolFormat, *, add_rule: AddRule, add_schema: AddSchema,
    literal: Literal, parallel_tool_calls: bool = False,
) -> list[str]:
    """Add the lazy JSON tool-call grammar's rules; give the trigger rules' names.

    `add_rule(name, rhs)` and `add_schema(name, schema)` add to the grammar being built (the schema
    converter's), `literal(text)` writes a GBNF string literal.

    Raises:
        NotImplementedError: fields nested under a function object, or the name as the key (not ported).
    """
    name_key, args_key = tools.name_field, tools.args_field
    if tools.function_field and tools.function_field != "function" and "." not in name_key:
        name_key, args_key = f"{tools.function_field}.{name_key}", f"{tools.function_field}.{args_key}"
    effective_name, effective_args = name_key or "name", args_key or "arguments"
    if not tools.fun_name_is_key and ("." in effective_name or "." in effective_args):
        raise NotImplementedError("JSON tool calls nested under a function object")
    choices = []
    for tool_def in tool_defs:
        function = tool_def.get("function")
        if not isinstance(function, Mapping):
            continue
        name = str(function["name"])
        if tools.fun_name_is_key:
            body = _keyed_tool(literal, add_schema, name, _parameters(function), tools, args_key,
                               effective_args)
        else:
            body = _flat_tool(literal, add_schema, name, _parameters(function), tools, effective_name,
                              effective_args)
        choices.append(add_rule(rule_name(f"tool-{name}"), body))
    calls = "(" + " | ".join(choices) + ")"
    if parallel_tool_calls:
        calls += f' (space {literal(",")} space ({" | ".join(choices)}))*'
    if tools.tools_array_wrapped:
        calls = f'{literal("[")} space {calls} space {literal("]")}'
    per_call = not tools.section_start and bool(tools.per_call_start)
    start, end = (tools.per_call_start, tools.per_call_end) if per_call else \
        (tools.section_start, tools.section_end)
    add_rule("tool-call", f"{literal(start)} space {calls} space {literal(end)}")
    if not per_call:
        return ["tool-call"]
    add_rule("tool-calls", "(tool-call? space)+")
    return ["tool-call", "tool-calls"]
