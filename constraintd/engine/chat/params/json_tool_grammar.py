# The tool-call grammar of llama.cpp's auto-parser for templates that write tool calls as JSON
# (analyze_tools::build_tool_parser_json_native and common_chat_peg_builder::standard_json_tools, with the
# PEG arena's GBNF writer): for tool_choice auto the lazy grammar a sampler switches on at the trigger word,
# for required its rules under the non-lazy root chat_params.py writes.
#
# Contract:
# - A lazy grammar holds the trigger rules only: `tool-call` (the section, or one call where the template
#   marks each call), `tool-calls` (one or more calls, where it marks each call), the rules they reach, and
#   `root` as the trigger rules' names joined by " | " in sorted order.
# - Each tool is a rule `tool-<name>` (llama.cpp's rule name: runs of other characters than letters, digits
#   and '-' become '-'), its arguments the converter's rules for its parameters named `tool-<name>-schema`;
#   the fields in the template's order (name, arguments, ids), or the name as the key of its arguments.
# - `json_tool_parsers` counts the parsers llama.cpp's arena holds once the tools parser is built: the
#   non-lazy grammar (tool_choice required) names its `until-N` rules by that count.
# - Not done: the fields nested under a function object.
#   Where llama.cpp would set the sequence of a field's parsers apart in parentheses, so does the text here.
# - `tag_json_tool_rules` writes the trigger rules of the tag formats with JSON arguments
#   (build_tool_parser_tag_json: `<function=name>{...}</function>`): each tool's rule is its name between the
#   function's name prefix and suffix, then its arguments' schema and the function's close. The lazy grammar
#   (tool_choice auto) is those rules; the non-lazy one (required) puts them under the root chat_params.py
#   writes, after the text before the calls, an `until-N` rule numbered by the arena's count that
#   `TagToolRules.next_parser` gives. A call id between the name and the arguments is an optional
#   `until-N` between its prefix and suffix; a function with neither a close nor a call's end marker ends
#   with space. Not done there (NotImplementedError): argument or separator markers (and with them a call
#   id with no suffix), a name without a suffix (the atomic forms), and calls marked by their section alone
#   (`tag_json_grammar_not_done`, which the message parser of these formats shares).
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from constraintd.engine.chat.analysis.template_analysis import CallIdPosition, ToolFormat

__all__ = [
    "JSON_STRING_CONTENT", "JSON_VALUE_AGAIN", "JSON_VALUE_FIRST", "StateGrammar", "TagToolRules",
    "call_id_before_arguments", "call_id_not_done", "call_keys", "function_parsers", "json_tool_parsers",
    "json_tool_rules", "rule_name", "tag_json_grammar_not_done", "tag_json_tool_rules", "tool_functions",
    "tool_parameters",
]

AddRule = Callable[[str, str], str]
AddSchema = Callable[[str, Any], str]
Literal = Callable[[str], str]
StateGrammar = Callable[[str, str], str]
"""(rule prefix, delimiter) -> the start rule of gbnf_excluding_grammar or gbnf_including_grammar."""

JSON_STRING_CONTENT = '( [^"\\\\] | "\\\\" ( ["\\\\/ bfnrt] | "u" [0-9a-fA-F]{4} ) )*'
"""The GBNF the arena writes for string_content('"') (a JSON string's characters)."""

_INVALID_RULE_CHARS = re.compile("[^a-zA-Z0-9-]+")


def rule_name(name: str) -> str:
    """A PEG rule's name as llama.cpp's builder cleans it."""
    return _INVALID_RULE_CHARS.sub("-", name)


def tool_functions(tool_defs: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, function object) of each tool definition that has a function object, in order
    (foreach_function)."""
    found = []
    for tool_def in tool_defs:
        function = tool_def.get("function")
        if isinstance(function, Mapping):
            found.append((str(function["name"]), function))
    return found


def tool_parameters(function: Mapping[str, Any]) -> Any:
    """common_chat_tool_parameters: the function's parameters, or an object schema with no properties."""
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


def call_keys(tools: ToolFormat) -> tuple[str, str, str] | None:
    """The keys of a JSON call, as llama.cpp's builder reads the format: the arguments' key as the format
    names it (dotted under the function field when that is not "function"), and the name's and the
    arguments' keys with their defaults; None where they are nested under a function object (not ported),
    which the grammar and the parser of calls both refuse."""
    name_key, args_key = tools.name_field, tools.args_field
    if tools.function_field and tools.function_field != "function" and "." not in name_key:
        name_key, args_key = f"{tools.function_field}.{name_key}", f"{tools.function_field}.{args_key}"
    effective_name, effective_args = name_key or "name", args_key or "arguments"
    if not tools.fun_name_is_key and ("." in effective_name or "." in effective_args):
        return None
    return args_key, effective_name, effective_args


def json_tool_rules(
    tool_defs: Sequence[Mapping[str, Any]], tools: ToolFormat, *, add_rule: AddRule, add_schema: AddSchema,
    literal: Literal, parallel_tool_calls: bool = False, force: bool = False,
) -> list[str]:
    """Add the JSON tool-call grammar's rules; give the trigger rules' names (`force`: tool_choice required,
    at least one call).

    `add_rule(name, rhs)` and `add_schema(name, schema)` add to the grammar being built (the schema
    converter's), `literal(text)` writes a GBNF string literal.

    Raises:
        NotImplementedError: fields nested under a function object, or the name as the key (not ported).
    """
    keys = call_keys(tools)
    if keys is None:
        raise NotImplementedError("JSON tool calls nested under a function object")
    args_key, effective_name, effective_args = keys
    choices = []
    for name, function in tool_functions(tool_defs):
        if tools.fun_name_is_key:
            body = _keyed_tool(literal, add_schema, name, tool_parameters(function), tools, args_key,
                               effective_args)
        else:
            body = _flat_tool(literal, add_schema, name, tool_parameters(function), tools, effective_name,
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
    add_rule("tool-calls", "(tool-call space)+" if force else "(tool-call? space)+")
    return ["tool-call", "tool-calls"]


def call_id_before_arguments(tools: ToolFormat) -> bool:
    """Whether a call's id sits between the function's name and its arguments, in llama.cpp's parser of
    either tag format (build_tool_parser_tag_json / _tagged's `have_call_id`)."""
    return (tools.call_id_position is CallIdPosition.BETWEEN_FUNC_AND_ARGS and bool(tools.call_id_prefix)
            and bool(tools.call_id_suffix or tools.args_start))


def call_id_not_done(tools: ToolFormat) -> str:
    """"the tag formats' call ids" where the format writes a call id between the function's name and its
    arguments (not ported in the tagged-argument format), else ""."""
    return "the tag formats' call ids" if call_id_before_arguments(tools) else ""


def tag_json_grammar_not_done(tools: ToolFormat) -> str:
    """What of build_tool_parser_tag_json a tag format with JSON arguments needs and the grammar does not
    port (the module's contract), or "" when nothing is."""
    if tools.args_separator or tools.args_start or tools.args_end:
        return "the tag formats' argument markers"
    if not tools.name_suffix and not call_id_before_arguments(tools):
        return "the tag formats' atomic function names"
    if not tools.per_call_start or (tools.section_start and not tools.section_end):
        return "tag-format calls marked by their section alone"
    return ""


@dataclass(frozen=True, slots=True)
class TagToolRules:
    """What a tag format's tool-call rules give the grammar written around them."""

    triggers: tuple[str, ...]
    """The trigger rules' names, the outermost (the one a non-lazy root reaches) last."""
    json_values: bool
    """Whether an argument's schema reaches the JSON value rules (p.json())."""
    next_parser: int
    """The arena's count once the calls are built (and made optional where they are not forced): the
    number of the parser the tools parser makes next, the `until` of the text before the calls."""


def tag_json_tool_rules(
    tool_defs: Sequence[Mapping[str, Any]], tools: ToolFormat, *, add_rule: AddRule, add_schema: AddSchema,
    literal: Literal, until: StateGrammar, first_parser: int, parallel_tool_calls: bool = False,
    force: bool = False,
) -> TagToolRules:
    """Add the tool-call rules of a tag format with JSON arguments (the arguments as for `json_tool_rules`;
    `until` writes an excluding grammar, `first_parser` is the arena's count before the tools parser, `force`
    tool_choice required).

    Raises:
        NotImplementedError: a part of build_tool_parser_tag_json not ported (the module's contract).
    """
    missing = tag_json_grammar_not_done(tools)
    if missing:
        raise NotImplementedError(missing)
    # a call id between the name and the arguments: here always closed by its suffix (an empty one comes
    # with the arguments' start marker, not ported); without a name suffix, the open and the call id are
    # one atomic parser (the grammar is the same)
    call_id = call_id_before_arguments(tools)
    arena = first_parser + 1  # the empty choice of tools
    choices = []
    for at, (name, function) in enumerate(tool_functions(tool_defs)):
        # build_func_parser: open (name prefix, name, name suffix), the call id, space, the arguments, then
        # the close: the function's (after space), nothing where the call's end closes it (a peek), else space
        head = f"({literal(tools.name_prefix)} {literal(name)} {literal(tools.name_suffix)})"
        if call_id:
            # optional(prefix + tool_id(until(suffix))) + suffix, after the section's eps()
            text = until(f"until-{arena + 1}", tools.call_id_suffix)
            head += f" ({literal(tools.call_id_prefix)} {text})? {literal(tools.call_id_suffix)}"
            arena += _CALL_ID
            if not tools.name_suffix:
                head = f"({head})"  # atomic(open + call id): a sequence of its own
        schema = add_schema(f"tool-{name}-schema", tool_parameters(function))
        body = f"{head} space {schema}"
        if tools.function_close:
            body += f" space {literal(tools.function_close)}"
        elif not tools.per_call_end:
            body += " space"
        choices.append(add_rule(rule_name(f"tool-{name}"), body))
        # tool_args(schema(json())), then the function
        arena += (JSON_VALUE_AGAIN if at else JSON_VALUE_FIRST) + 2 + function_parsers(tools, peek=False,
                                                                                       call_id=call_id)
    wrapped = f"{literal(tools.per_call_start)} ({' | '.join(choices)}) {literal(tools.per_call_end)}"
    add_rule("tool-call", f"{wrapped} (space {wrapped})*" if parallel_tool_calls else wrapped)
    # eps(), start + choice + end, zero_or_more(space + call) and its sequence, the trigger rule
    arena += 1 + 4 + (4 if parallel_tool_calls else 0) + 2
    triggers: tuple[str, ...] = ("tool-call",)
    if tools.section_start:
        section = f"{literal(tools.section_start)} space tool-call space {literal(tools.section_end)}"
        add_rule("tool-calls", section)
        arena += 8 + 2  # start space calls space end, the trigger rule
        triggers = ("tool-call", "tool-calls")
    return TagToolRules(triggers, True, arena + (0 if force else 1))  # optional(calls) where not forced


# How many parsers llama.cpp's PEG builder adds to its arena for each construct (peg-parser.cpp,
# chat-peg-parser.cpp): a rule of the non-lazy grammar is named by its parser's number in the arena
# (`until-N`), so the number of parsers made before it must be llama.cpp's. Each count follows the builder's
# code, in the order the compiler llama.cpp is built with evaluates it (the right operand of `+` first).
JSON_VALUE_FIRST: Final = 86  # p.json() the first time: json-value and its json-object / array / string /
# number / bool / null rules (each rule: a placeholder, the rule, its body, the rule again, a reference)
JSON_VALUE_AGAIN: Final = 1  # a reference to the json-value rule
_ID_FIELD: Final = 20  # atomic("\"id\"" space ":" space ("\"" string "\"" | json-number))
_KEYED_ID_FIELD: Final = 24  # optional(id + space + optional("," space)), the string-only id
_KEYED_GEN_ID_FIELD: Final = 28  # the same with the string-or-number id
_OPEN: Final = 9  # tool_open(prefix + tool_name(literal(name)) + suffix)
_CALL_ID: Final = 8  # optional(prefix + tool_id(until(suffix))) + suffix


def function_parsers(tools: ToolFormat, *, peek: bool, call_id: bool = False) -> int:
    """The parsers a tag format's tools parser adds for one function from its call id section (its eps();
    a call id's own parsers are the caller's) to the choice of tools, its arguments apart
    (build_func_parser; `peek`: the atomic peek at the first argument's marker; `call_id`: a call id before
    the arguments)."""
    count = 1 + (2 if peek else 0)  # eps() for the call id section, peek(literal(arg name prefix))
    count += _OPEN + 1 + (4 if tools.args_separator else 0)  # the open, eps(), space + separator
    atomic = not tools.name_suffix and not call_id  # the whole function atomic, at its end
    if tools.name_suffix:
        count += 4  # open + call id + space + args
    elif call_id:
        count += 5  # atomic(open + call id) + space + args
    elif not peek:
        count += 4
    else:
        count += 6  # atomic(open + call id + space + peek) + args
        atomic = False
    if tools.function_close:
        count += 6  # space + tool_close(literal(close))
    elif tools.per_call_end:
        count += (4 if tools.tolerate_intertag_whitespace else 2) + 3  # tool_close(peek(...))
    else:
        count += 4  # tool_close(space())
    if atomic:
        count += 1  # atomic(the whole function)
    return count + 2 + 1  # the rule and its reference, the choice


def _flat_parsers(tool_count: int, tools: ToolFormat) -> int:
    count = 3  # choice(), the name key's and the arguments key's literals
    for at in range(tool_count):
        json_value = JSON_VALUE_FIRST if at == 0 else JSON_VALUE_AGAIN
        pairs = 2 + bool(tools.id_field) + bool(tools.gen_id_field)
        count += 15  # "name" space ":" space atomic("\"" name "\"")
        count += json_value + 2 + 7  # "arguments" space ":" space tool_args(schema(json()))
        count += 1 + (_ID_FIELD + 1 if tools.id_field else 0)  # eps(), then the id parser and its optional
        count += 1 + (_ID_FIELD + 1 if tools.gen_id_field else 0)
        count += 1 + (16 if tools.openai_wrapper_trigger else 0)  # the "type": "function" field
        count += 6 + pairs + 6 * (pairs - 1) + 6  # "{" space, the fields and separators, space "}"
        count += 4  # tool(), the rule (and its reference), the choice
    return count


def _keyed_parsers(tool_count: int, tools: ToolFormat, args_key: str) -> int:
    count = 1  # choice()
    for at in range(tool_count):
        json_value = JSON_VALUE_FIRST if at == 0 else JSON_VALUE_AGAIN
        fields = 1 + bool(tools.id_field) + bool(tools.gen_id_field)
        count += _KEYED_ID_FIELD if tools.id_field else 0
        count += _KEYED_GEN_ID_FIELD if tools.gen_id_field else 0
        count += 1 + json_value + 2 + (8 if args_key else 0)  # eps(), tool_args(schema(json())), the key
        count += 1  # eps() for the inner object
        if args_key or fields > 1:
            count += 3 + fields + 2 * (fields - 1) + 4  # "{" space, the fields, space "}"
        count += 26 + 4  # "{" space "\"" name "\"" space ":" space inner space "}", tool(), rule, choice
    return count


def json_tool_parsers(tool_count: int, tools: ToolFormat, *, force: bool,
                      parallel_tool_calls: bool = False) -> int:
    """How many parsers build_tool_parser_json_native adds to llama.cpp's arena up to its tools parser.

    Raises:
        NotImplementedError: fields nested under a function object (not ported).
    """
    name_key, args_key = tools.name_field, tools.args_field
    if tools.function_field and tools.function_field != "function" and "." not in name_key:
        name_key, args_key = f"{tools.function_field}.{name_key}", f"{tools.function_field}.{args_key}"
    if not tools.fun_name_is_key and ("." in (name_key or "name") or "." in (args_key or "arguments")):
        raise NotImplementedError("JSON tool calls nested under a function object")
    count = 1 + 1  # the tools parser's eps(), standard_json_tools' eps()
    count += _keyed_parsers(tool_count, tools, args_key) if tools.fun_name_is_key else \
        _flat_parsers(tool_count, tools)
    count += 8 if parallel_tool_calls else 0  # zero_or_more(space "," space choices)
    count += 8 if tools.tools_array_wrapped else 0  # "[" space ... space "]"
    count += 10  # the section: start space calls space end, as the trigger rule tool-call
    count += 0 if force else 1  # optional(section)
    if not tools.section_start and tools.per_call_start:
        count += 5  # trigger rule tool-calls: one_or_more(call space)
    return count
