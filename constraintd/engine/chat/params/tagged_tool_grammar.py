# The tool-call rules of llama.cpp's auto-parser for the tag formats whose arguments are tagged one by one
# (analyze_tools::build_tool_parser_tag_tagged: `<arg_key>city</arg_key><arg_value>Paris</arg_value>`), with
# the PEG arena's GBNF writer (common_peg_arena::build_grammar).
#
# Contract:
# - The rules are the trigger rules: `tool-call` (the calls, each between the per-call markers, or the
#   section with its calls after ", " where the template marks no call), `tool-calls` (the section around
#   `tool-call`, where the template marks both), and the rules they reach. chat_params.py writes the root: the
#   trigger rules' names joined by " | " in sorted order for the lazy grammar (tool_choice auto), or for the
#   non-lazy one (required) the text before the calls, an `until-N` rule numbered by
#   `TagToolRules.next_parser`, then the outermost trigger rule.
# - Each tool is a rule `tool-<name>`: its name between the function's name prefix and suffix, its
#   required arguments in the order of the parameters' properties, then its optional ones in any order,
#   each a rule `tool-<name>-arg-<param>`: the parameter's name between the argument name markers, the value
#   prefix, then a value that may be a string as an `ac-N` rule (any text up to and including the value
#   suffix), any other value as the converter's rules for its schema (`tool-<name>-arg-<param>-schema`) and
#   the value suffix.
# - `until-suffix` (the text up to the value suffix, as an `until-N` rule) is written where a string
#   argument reaches it, the JSON value rules where a schema argument does.
# - The `N` of `ac-N` and `until-N` is the parser's number in llama.cpp's arena: the parsers made before it
#   are counted as the builder makes them, in the order the compiler llama.cpp is built with evaluates them
#   (the right operand of `+` first; json_tool_grammar.py counts the same way).
# - Not done (NotImplementedError): a call id before the arguments, an empty value suffix, parameters holding
#   a `$ref`, and the schemas whose may-be-a-string answer needs allOf or a string format.
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from constraintd.engine.chat.analysis.template_analysis import ToolFormat
from constraintd.engine.chat.params.json_tool_grammar import (
    JSON_VALUE_AGAIN,
    JSON_VALUE_FIRST,
    AddRule,
    AddSchema,
    Literal,
    StateGrammar,
    TagToolRules,
    call_id_not_done,
    function_parsers,
    rule_name,
    tool_functions,
    tool_parameters,
)

__all__ = ["TaggedArgument", "may_be_string", "tagged_arguments", "tagged_tool_rules"]


_STRING_VALUE: Final = 6  # ac(tool_arg_string_value(until-suffix) + tool_arg_close(literal(suffix)))
_ARGUMENT: Final = 15  # the rest of an argument: its open (9), the value prefix (2), the sequence, the tag,
# the rule and its reference


@dataclass(frozen=True, slots=True)
class TaggedArgument:
    """One property of a tool's parameters, as foreach_parameter gives it (common_chat_schema_property)."""

    name: str
    schema: Mapping[str, Any]
    required: bool


def _has_properties(schema: Mapping[str, Any]) -> bool:
    # the object's keywords, as build_node reads them
    additional = schema.get("additionalProperties", True)
    return "properties" in schema or additional is not True


def may_be_string(schema: Any) -> bool:
    """common_chat_schema::may_be_string of the node common_chat_schema_from_json builds for `schema`.

    Raises:
        NotImplementedError: a `$ref`, allOf, or a string format without a type decides (not ported).
    """
    if not isinstance(schema, Mapping):
        raise NotImplementedError("tagged arguments whose schema is not an object")
    if "$ref" in schema:
        raise NotImplementedError("tagged arguments whose schema holds a $ref")
    for key in ("oneOf", "anyOf"):  # oneOf first, as build_node reads them
        if key in schema:
            return any(may_be_string(child) for child in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(may_be_string({**schema, "type": each}) for each in kind)
    if "const" in schema:
        return isinstance(schema["const"], str)
    if "enum" in schema:
        return any(isinstance(value, str) for value in schema["enum"])
    if "allOf" in schema and (kind == "string" or (kind in (None, "object") and not _has_properties(schema))):
        raise NotImplementedError("tagged arguments whose schema's allOf decides if it is a string")
    if kind is None:
        if _has_properties(schema) or "items" in schema or "prefixItems" in schema:
            return False
        if "format" in schema:
            raise NotImplementedError("tagged arguments whose schema has a format and no type")
        return "pattern" in schema or "minLength" in schema or "maxLength" in schema
    return bool(kind == "string")


def tagged_arguments(parameters: Mapping[str, Any]) -> list[TaggedArgument]:
    """foreach_parameter: the properties of the parameters' schema where it is an object, in their order.

    Raises:
        NotImplementedError: parameters holding a `$ref` (not ported).
    """
    if "$ref" in json.dumps(parameters):
        raise NotImplementedError("tagged arguments whose parameters hold a $ref")
    kind = parameters.get("type")
    alternatives = "oneOf" in parameters or "anyOf" in parameters or isinstance(kind, list)
    is_object = (kind == "object" and (_has_properties(parameters) or "allOf" not in parameters)) or \
        (kind is None and _has_properties(parameters))
    if alternatives or "const" in parameters or "enum" in parameters or not is_object:
        return []
    required = parameters.get("required", [])
    return [TaggedArgument(str(name), schema, name in required)
            for name, schema in parameters.get("properties", {}).items()]


def _not_done(tools: ToolFormat) -> str:
    if call_id_not_done(tools):
        return call_id_not_done(tools)
    if not tools.arg_value_suffix:
        return "tagged arguments with no value suffix"
    return ""


def tagged_tool_rules(
    tool_defs: Sequence[Mapping[str, Any]], tools: ToolFormat, *, add_rule: AddRule, add_schema: AddSchema,
    literal: Literal, until: StateGrammar, ac: StateGrammar, first_parser: int,
    parallel_tool_calls: bool = False, force: bool = False,
) -> TagToolRules:
    """Add the tool-call rules of a tag format with tagged arguments.

    `first_parser` is the number of parsers llama.cpp's arena holds before the tools parser; `until` and `ac`
    write the excluding and including grammars; `force` is tool_choice required (the other arguments as for
    json_tool_rules).

    Raises:
        NotImplementedError: a part of build_tool_parser_tag_tagged not ported (the module's contract).
    """
    missing = _not_done(tools)
    if missing:
        raise NotImplementedError(missing)
    suffix = tools.arg_value_suffix
    until_id = first_parser
    arena = first_parser + 1 + 2 + 1  # until(suffix), its rule and reference, the empty choice of tools
    json_made = string_made = False
    choices = []
    for name, function in tool_functions(tool_defs):
        arguments = tagged_arguments(tool_parameters(function))
        required: list[str] = []
        optional: list[str] = []
        for argument in arguments:
            open_text = (f"({literal(tools.arg_name_prefix)} {literal(argument.name)} "
                         f"{literal(tools.arg_name_suffix)}) {literal(tools.arg_value_prefix)}")
            if may_be_string(argument.schema):
                value = ac(f"ac-{arena + _STRING_VALUE - 1}", suffix)
                arena += _STRING_VALUE
                string_made = True
            else:
                schema = add_schema(f"tool-{name}-arg-{argument.name}-schema", argument.schema)
                value = f"{schema} {literal(suffix)}"
                arena += 6 + (JSON_VALUE_AGAIN if json_made else JSON_VALUE_FIRST)
                json_made = True
            arena += _ARGUMENT
            rule = add_rule(rule_name(f"tool-{name}-arg-{argument.name}"), f"{open_text} {value}")
            (required if argument.required else optional).append(rule)
        # the arguments: required in order (space between), then optional ones in any order
        args = [part for at, rule in enumerate(required) for part in (["space"] if at else []) + [rule]]
        arena += 1 + len(required) + 2 * max(len(required) - 1, 0)
        if optional:
            args.append(f"(space ({' | '.join(optional)}))*")
            arena += 1 + len(optional) + 4
        if tools.args_start:
            args.insert(0, literal(tools.args_start))
            arena += 2
        if tools.args_end:
            args.append(literal(tools.args_end))
            arena += 2
        body = _function(tools, name, args, literal, peek=bool(tools.arg_name_prefix and required))
        arena += function_parsers(tools, peek=bool(tools.arg_name_prefix and required))
        choices.append(add_rule(rule_name(f"tool-{name}"), body))
    if string_made:
        add_rule("until-suffix", until(f"until-{until_id}", suffix))
    triggers = _calls(tools, choices, add_rule, literal, parallel_tool_calls=parallel_tool_calls)
    arena += _calls_parsers(tools, parallel_tool_calls=parallel_tool_calls)
    return TagToolRules(triggers, json_made, arena + (0 if force else 1))  # optional(calls) where not forced


def _function(tools: ToolFormat, name: str, args: list[str], literal: Literal, *, peek: bool) -> str:
    # build_func_parser with no call id: the open, space, the arguments, then the function's close (after
    # space), nothing where the call's end closes it (a peek), else space; where the name has no suffix and an
    # argument must follow, the open and the space are one atomic group (a peek at the argument's marker)
    head = [f"({literal(tools.name_prefix)} {literal(name)} {literal(tools.name_suffix)})"]
    if tools.args_separator:
        head += ["space", literal(tools.args_separator)]
    if not tools.name_suffix and peek:
        body = ["(" + " ".join([*head, "space"]) + ")", *args]
    else:
        body = [*head, "space", *args]
    if tools.function_close:
        body += ["space", literal(tools.function_close)]
    elif not tools.per_call_end:
        body.append("space")
    return " ".join(body)


def _calls_parsers(tools: ToolFormat, *, parallel_tool_calls: bool) -> int:
    # the parsers build_tool_parser_tag_tagged adds after the choice of tools, as _calls writes them: eps(),
    # the calls and their trigger rule, the section and its trigger rule
    if not tools.per_call_start:
        # start + space + choice (+ zero_or_more(", " + choice)) + space + end
        return 1 + (12 if parallel_tool_calls else 8) + 2
    # start + space + choice + space + end, then (zero_or_more(space + call)) + space
    count = 1 + 8 + (6 if parallel_tool_calls else 2) + 2
    if tools.section_start:
        # start + space + calls + space + (end + space, or end())
        count += 7 + (3 if tools.section_end else 1) + 2
    return count


def _calls(tools: ToolFormat, choices: list[str], add_rule: AddRule, literal: Literal, *,
           parallel_tool_calls: bool) -> tuple[str, ...]:
    # the trigger rules: calls between the per-call markers (repeated after space where parallel calls are
    # on), in the section where there is one; else the section's calls, repeated after ", "
    alternatives = f"({' | '.join(choices)})"
    if not tools.per_call_start:
        repeat = f' ({literal(", ")} {alternatives})*' if parallel_tool_calls else ""
        add_rule("tool-call", f"{literal(tools.section_start)} space {alternatives}{repeat} space "
                              f"{literal(tools.section_end)}")
        return ("tool-call",)
    wrapped = f"{literal(tools.per_call_start)} space {alternatives} space {literal(tools.per_call_end)}"
    calls = f"{wrapped} (space {wrapped})* space" if parallel_tool_calls else f"{wrapped} space"
    add_rule("tool-call", calls)
    if not tools.section_start:
        return ("tool-call",)
    end = f" {literal(tools.section_end)} space" if tools.section_end else ""
    add_rule("tool-calls", f"{literal(tools.section_start)} space tool-call space{end}")
    return ("tool-call", "tool-calls")
