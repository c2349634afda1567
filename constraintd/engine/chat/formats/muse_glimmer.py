# The chat params of llama.cpp's hand-written muse-glimmer format (common/parsers/muse-glimmer.cpp:
# common_chat_params_init_muse_glimmer), the grammar side: the assistant's turn is messages
# `<|start|>assistant to=<recipient><|message|>{text}` each ended by `<|eom|>` (more follow) or `<|eot|>`:
# the thought to=self, the answer to=user, a call to=<tool> as `<atem:function_calls><atem:invoke name="f">
# <atem:parameter name="k">value</atem:parameter>...</atem:invoke></atem:function_calls>`.
#
# Contract:
# - Whatever the template: thinking supported with no tags, the ten markers of the format preserved, no
#   additional stops, the prompt's message delimiters.
# - A grammar where there is a response schema (any JSON object, empty or not), or tools with tool_choice
#   other than none; lazy exactly where there is no response schema and tool_choice is not required. With
#   every grammar, lazy or not, one trigger pattern (TRIGGER_PATTERN: a message to a recipient other than
#   self and user) and no trigger word.
# - The parser is built for every request (the message parser runs it), its grammar written only where there
#   is one; with neither, the final message after any thoughts, or (reasoning not extracted) all the text
#   after `start` as content. It is the arena's (peg_arena.py) of the parser llama.cpp builds, made call for
#   call in its order: any number of thoughts (`start` then `analysis`), then `start` and either the response
#   schema's JSON (bare or in a json code fence), or the calls (tool_choice required), or the calls or the
#   answer optionally followed by calls (auto). A call names its recipient up to `<|message|>`, then the
#   invoke of one tool, its arguments in any order and number: a string argument (one whose schema may be a
#   string) any text up to its close, any other its schema's JSON. With parallel calls, more calls follow,
#   each after `<|eom|>` and `start`. Lazy, the grammar is the calls from the trigger on.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.params.tagged_tool_grammar import may_be_string, tagged_arguments
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["TRIGGER_PATTERN", "muse_glimmer_params"]

GENERATION_PROMPT: Final = "<|start|>assistant"
PRESERVED_TOKENS: Final = (
    "<|start|>", "<|message|>", "<|eom|>", "<|eot|>", "<atem:function_calls>", "<atem:invoke",
    "<atem:parameter", "</atem:parameter>", "</atem:invoke>", "</atem:function_calls>")
MESSAGE_DELIMITERS: Final = (
    ("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>system"),
    ("tool", "<|start|>tool"))
TRIGGER_PATTERN: Final = (
    "(?:^|<\\|start\\|>assistant)( to=(?!self<\\|message\\|>)(?!user<\\|message\\|>)[^<]*?<\\|message\\|>)")
"""The grammar's trigger (a pattern, llama.cpp's COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN): a message to a tool."""

_ARG_CLOSE: Final = "</atem:parameter>"
_MESSAGE: Final = "<|message|>"
_EOM: Final = "<|eom|>"


def muse_glimmer_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_muse_glimmer's grammar side for a request (see the module's contract).

    `source` (the template) does not change the answer: llama.cpp's format does not read it; it is taken for
    the same call as the other formats'. `reasoning_format` does not change the grammar either (the thought
    is the same text whether it is extracted or kept as content).

    Raises:
        NotImplementedError: a tool's parameters or an argument's schema whose reading is not ported
            (tagged_tool_grammar.tagged_arguments' and may_be_string's refusals).
    """
    del source  # the same grammar for every template and reasoning format
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    wants_tools = has_tools and tool_choice != "none"
    include_grammar = has_schema or wants_tools
    arena = _parser(tools, json_schema if has_schema else None,
                    tool_choice=tool_choice if wants_tools else None, parallel_tool_calls=parallel_tool_calls,
                    extract_reasoning=reasoning_format != "none")
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(
        arena, lazy, (), True, "", (), PRESERVED_TOKENS, message_delimiters=MESSAGE_DELIMITERS,
        trigger_patterns=(TRIGGER_PATTERN,) if include_grammar else (), writes_grammar=include_grammar)


def _parser(tools: Sequence[Mapping[str, Any]], json_schema: Any, *, tool_choice: str | None,
            parallel_tool_calls: bool, extract_reasoning: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function (tool_choice None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of + first, the left one of << first)
    p = PegArena()
    start = p.rule("start", p.literal(GENERATION_PROMPT))
    if not extract_reasoning and json_schema is None and tool_choice is None:
        # start + content(rest()): no grammar, nothing to tell apart
        p.root = p.sequence(start, p.tag(p.rest(), "content"))
        return p
    # rule("analysis", " to=self<|message|>" + reasoning-or-content(until(eom)) + eom), then a reference
    eom = p.literal(_EOM)
    thought = p.tag(p.until(_EOM), "reasoning" if extract_reasoning else "content")
    p.rule("analysis", _chain(p, p.literal(" to=self<|message|>"), thought, eom))
    analysis = p.ref("analysis")
    recipient = p.optional(p.literal(" to=user"))
    answer = p.tag(p.until_one_of(["<|eot|>", _EOM]), "content")
    final_msg = p.rule("final", _chain(p, recipient, p.literal(_MESSAGE), answer))
    if json_schema is not None:
        response_json = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
        # ("```json" + space() + json + space() + "```") | json
        fence_end = p.literal("```")
        sp_after = p.space()
        sp = p.space()
        fenced = _chain(p, p.literal("```json"), sp, response_json, sp_after, fence_end)
        body = p.choice(fenced, response_json)
        head = p.sequence(recipient, p.literal(_MESSAGE))
        response_format = p.rule("response-format", p.sequence(head, body))
        p.root = _chain(p, _thoughts(p, start, analysis), start, response_format)
        return p
    if tool_choice is None:
        # zero_or_more(start + analysis) + start + final_msg
        p.root = _chain(p, _thoughts(p, start, analysis), start, final_msg)
        return p
    tool_calls = _tool_calls(p, tools, start, parallel_tool_calls=parallel_tool_calls)
    if tool_choice == "required":
        p.root = _chain(p, _thoughts(p, start, analysis), start, tool_calls)
        return p
    eom = p.literal(_EOM)
    trailing_calls = p.optional(_chain(p, eom, start, tool_calls))
    body = p.choice(tool_calls, p.sequence(final_msg, trailing_calls))
    p.root = _chain(p, _thoughts(p, start, analysis), start, body)
    return p


def _chain(p: PegArena, first: int, *rest: int) -> int:
    # first + rest[0] + rest[1] ...: a sequence per +, its operands made already
    for parser in rest:
        first = p.sequence(first, parser)
    return first


def _thoughts(p: PegArena, start: int, analysis: int) -> int:
    # zero_or_more(start + analysis)
    return p.zero_or_more(p.sequence(start, analysis))


def _tool_calls(p: PegArena, tools: Sequence[Mapping[str, Any]], start: int, *,
                parallel_tool_calls: bool) -> int:
    # ac(tool_arg_string_value(until(close)) + tool_arg_close(literal(close)), close)
    close = p.atomic(p.tag(p.literal(_ARG_CLOSE), "tool-arg-close"))
    string_value = p.ac(p.sequence(p.tag(p.until(_ARG_CLOSE), "tool-arg-string-value"), close), [_ARG_CLOSE])
    choice = p.choice()
    for name, function in tool_functions([tool for tool in tools if tool.get("type") == "function"]):
        arg_rules = []
        for argument in tagged_arguments(tool_parameters(function)):
            value = p.eps()
            if may_be_string(argument.schema):
                value = string_value
            else:
                value_close = p.atomic(p.tag(p.literal(_ARG_CLOSE), "tool-arg-close"))
                schema = p.schema(p.json(), f"tool-{name}-arg-{argument.name}-schema", argument.schema)
                value = p.sequence(p.tag(schema, "tool-arg-value"), value_close)
            # tool_arg(tool_arg_open("<atem:parameter name=\"" + tool_arg_name(literal(name)) + "\">")
            #          + value)
            open_end = p.literal('">')
            arg_name = p.atomic(p.tag(p.literal(argument.name), "tool-arg-name"))
            arg_open = p.atomic(p.tag(_chain(p, p.literal('<atem:parameter name="'), arg_name, open_end),
                                      "tool-arg-open"))
            arg_rules.append(p.tag(p.sequence(arg_open, value), "tool-arg"))
        args = p.eps()
        if arg_rules:
            sp = p.space()
            args = p.zero_or_more(p.sequence(p.choice(*arg_rules), sp))
        # tool(tool_open(...) << tool_args(args) << tool_close(...)): the left operand of << first
        opened = _call_open(p, name)
        tool_args = p.tag(args, "tool-args")
        tool = p.tag(_call_close(p, p.sequence(opened, p.space(), tool_args)), "tool")
        choice = p.choice(choice, p.rule(f"tool-{name}", tool))
    if parallel_tool_calls:
        more = p.zero_or_more(_chain(p, p.literal(_EOM), start, choice))
        return p.trigger_rule("tool-call", p.sequence(choice, more))
    return p.trigger_rule("tool-call", choice)


def _call_open(p: PegArena, name: str) -> int:
    # tool_open(" to=" + until("<|message|>") + "<|message|><atem:function_calls>" + space() +
    #           "<atem:invoke name=\"" + tool_name(literal(name)) + "\">" + space())
    sp_last = p.space()
    name_end = p.literal('">')
    tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
    invoke = p.literal('<atem:invoke name="')
    sp = p.space()
    calls_open = p.literal("<|message|><atem:function_calls>")
    recipient = p.until(_MESSAGE)
    return p.atomic(p.tag(_chain(
        p, p.literal(" to="), recipient, calls_open, sp, invoke, tool_name, name_end, sp_last), "tool-open"))


def _call_close(p: PegArena, opened: int) -> int:
    # opened << tool_close("</atem:invoke>" + space() + "</atem:function_calls>")
    calls_end = p.literal("</atem:function_calls>")
    sp = p.space()
    close = p.atomic(p.tag(_chain(p, p.literal("</atem:invoke>"), sp, calls_end), "tool-close"))
    return p.sequence(opened, p.space(), close)
