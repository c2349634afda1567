# The chat params of llama.cpp's hand-written cohere2-moe format (common/parsers/cohere2moe.cpp:
# common_chat_params_init_cohere2moe), the grammar side: Cohere2 MoE writes its turn in markers, the thought
# in `<|START_THINKING|>...<|END_THINKING|>`, then either the text in `<|START_TEXT|>...<|END_TEXT|>` or the
# calls as one JSON array in `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {...}},
# ...]<|END_ACTION|>`, then `<|END_OF_TURN_TOKEN|>`.
#
# Contract:
# - Whatever the template: thinking supported, tags `<|START_THINKING|>` and (`<|END_THINKING|>`), the
#   thirteen markers of the format preserved, no additional stops, the prompt's message delimiters (the
#   tool's before the system's: it is longer and starts alike).
# - A grammar where there is a response schema, or tools with tool_choice other than none; lazy exactly where
#   there is no response schema and tool_choice is auto; the trigger word `<|START_ACTION|>` with every
#   grammar, lazy or not.
# - The parser is built for every request (the message parser runs it), its grammar written only where there
#   is one. It is the arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: the generation prompt's stable prefix, the thought (its markers optional; kept as text where
#   reasoning is not extracted, which writes the same grammar), then the text (the response schema's JSON
#   where there is one) or, where tools are called, the action: the calls each an object of the fields
#   tool_call_id (optional, a string or a number), tool_name and parameters in that order, one call or (with
#   parallel calls) a comma-separated list in brackets. tool_choice required: the action alone; auto: the
#   action or the text. Lazy, the grammar is the action from its marker on.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["cohere2moe_params"]

TURN_START: Final = "<|START_OF_TURN_TOKEN|>"
TURN_END: Final = "<|END_OF_TURN_TOKEN|>"
CHATBOT: Final = "<|CHATBOT_TOKEN|>"
USER: Final = "<|USER_TOKEN|>"
SYSTEM: Final = "<|SYSTEM_TOKEN|>"
THINK_START: Final = "<|START_THINKING|>"
THINK_END: Final = "<|END_THINKING|>"
TEXT_START: Final = "<|START_TEXT|>"
TEXT_END: Final = "<|END_TEXT|>"
ACTION_START: Final = "<|START_ACTION|>"
ACTION_END: Final = "<|END_ACTION|>"
RESULT_START: Final = "<|START_TOOL_RESULT|>"
RESULT_END: Final = "<|END_TOOL_RESULT|>"
GENERATION_PREFIX: Final = TURN_START + CHATBOT
PRESERVED_TOKENS: Final = (
    TURN_START, TURN_END, CHATBOT, USER, SYSTEM, THINK_START, THINK_END, TEXT_START, TEXT_END, ACTION_START,
    ACTION_END, RESULT_START, RESULT_END)
MESSAGE_DELIMITERS: Final = (
    ("assistant", GENERATION_PREFIX), ("user", TURN_START + USER),
    ("tool", TURN_START + SYSTEM + RESULT_START), ("system", TURN_START + SYSTEM))

_NAME_KEY: Final = "tool_name"
_ARGS_KEY: Final = "parameters"
_GEN_ID_KEY: Final = "tool_call_id"


def cohere2moe_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_cohere2moe's grammar side for a request (see the module's contract).

    `source` (the template) does not change the answer: llama.cpp's format does not read it; it is taken for
    the same call as the other formats'. `reasoning_format` does not change the grammar either (the thought
    is the same text whether it is extracted or kept as content).
    """
    del source  # the format is the same for every template
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping) and bool(json_schema)
    wants_tools = has_tools and tool_choice != "none"
    include_grammar = has_schema or wants_tools
    arena = _parser(tools if wants_tools else (), json_schema if has_schema else None,
                    extract_reasoning=reasoning_format != "none", tool_choice=tool_choice,
                    parallel_tool_calls=parallel_tool_calls)
    return FormatParams(
        arena, include_grammar and not has_schema and tool_choice == "auto",
        (ACTION_START,) if include_grammar else (), True, THINK_START, (THINK_END,), PRESERVED_TOKENS,
        message_delimiters=MESSAGE_DELIMITERS, writes_grammar=include_grammar)


def _parser(tools: Sequence[Mapping[str, Any]], json_schema: Any, *, extract_reasoning: bool,
            tool_choice: str, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of + first)
    p = PegArena()
    generation_prompt = p.literal(GENERATION_PREFIX)
    at_end = p.end()
    reasoning = p.eps()
    # optional(THINK_START + reasoning(until_one_of(...)) + optional(THINK_END)), or the block as content
    think_end = p.optional(p.literal(THINK_END))
    thought = p.until_one_of([THINK_END, TEXT_START, ACTION_START])
    if extract_reasoning:
        thought = p.tag(thought, "reasoning")
    block = p.sequence(p.sequence(p.literal(THINK_START), thought), think_end)
    reasoning = p.optional(block if extract_reasoning else p.tag(block, "content"))
    # literal(TEXT_START) + content(schema(json()) or until(TEXT_END)) + optional(literal(TEXT_END))
    text_end = p.optional(p.literal(TEXT_END))
    if json_schema is not None:
        text = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
    else:
        text = p.tag(p.until(TEXT_END), "content")
    text_content = p.sequence(p.sequence(p.literal(TEXT_START), text), text_end)
    if not tools:
        turn_end = p.optional(p.literal(TURN_END))
        p.root = _chain(p, generation_prompt, reasoning, text_content, turn_end, at_end)
        return p
    tool_calls = _standard_json_tools(p, tools, parallel_tool_calls=parallel_tool_calls)
    body = tool_calls if tool_choice == "required" else p.choice(tool_calls, text_content)
    turn_end = p.optional(p.literal(TURN_END))
    p.root = _chain(p, generation_prompt, reasoning, body, turn_end, at_end)
    return p


def _standard_json_tools(p: PegArena, tools: Sequence[Mapping[str, Any]], *,
                         parallel_tool_calls: bool) -> int:
    # common_chat_peg_builder::standard_json_tools as this format calls it: the section forced, the calls
    # wrapped in an array, flat keys (build_json_tools_flat_keys) with the generated call id first
    p.eps()  # the tool choices' first value, before the layout's builder replaces it
    choices = p.choice()
    name_key = p.literal(f'"{_NAME_KEY}"')
    args_key = p.literal(f'"{_ARGS_KEY}"')
    for name, function in tool_functions(tools):
        # name_key + space() + ":" + space() + atomic("\"" + tool_name(literal(name)) + "\"")
        close_quote = p.literal('"')
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        quoted = p.atomic(_chain(p, p.literal('"'), tool_name, close_quote))
        name_field = _key_value(p, name_key, quoted)
        # args_key + space() + ":" + space() + tool_args(schema(json(), "tool-<name>-schema", params))
        args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
        args_field = _key_value(p, args_key, args)
        p.eps()  # the call id's parser, no call id key
        p.eps()  # the generated call id's, before it is made
        gen_id = p.optional(p.atomic(_key_value(p, None, _string_or_number_id(p), key_text=_GEN_ID_KEY)))
        fields = [gen_id, name_field, args_field]  # parameters_order
        # tool_open(literal("{")) + space() + type_field (eps(): no OpenAI wrapper), then the fields
        type_field = p.eps()
        sp = p.space()
        body = p.sequence(p.atomic(p.tag(p.literal("{"), "tool-open")), sp)
        body = p.sequence(body, type_field)
        for at, field in enumerate(fields):
            body = p.sequence(body, field)
            if at < len(fields) - 1:
                sp_after = p.space()
                comma = p.literal(",")
                body = _chain(p, body, p.space(), comma, sp_after)
        close = p.atomic(p.tag(p.literal("}"), "tool-close"))
        body = _chain(p, body, p.space(), close)
        choices = p.choice(choices, p.rule(f"tool-{name}", p.tag(body, "tool")))
    calls = choices
    if parallel_tool_calls:
        sp_after = p.space()
        comma = p.literal(",")
        calls = p.sequence(calls, p.zero_or_more(_chain(p, p.space(), comma, sp_after, choices)))
    # literal("[") + space() + calls + space() + literal("]")
    close_bracket = p.literal("]")
    sp_after = p.space()
    sp = p.space()
    calls = _chain(p, p.literal("["), sp, calls, sp_after, close_bracket)
    # trigger_rule("tool-call", literal(ACTION_START) + space() + calls + space() + literal(ACTION_END))
    section_end = p.literal(ACTION_END)
    sp_after = p.space()
    sp = p.space()
    return p.trigger_rule("tool-call", _chain(p, p.literal(ACTION_START), sp, calls, sp_after, section_end))


def _chain(p: PegArena, first: int, *rest: int) -> int:
    # first + rest[0] + rest[1] ...: a sequence per +, its operands made already
    for parser in rest:
        first = p.sequence(first, parser)
    return first


def _key_value(p: PegArena, key: int | None, value: int, *, key_text: str = "") -> int:
    # key + space() + literal(":") + space() + value, the value made already (the right operand first); the
    # key's literal made last where it is given as text
    sp_after = p.space()
    colon = p.literal(":")
    sp = p.space()
    key_parser = key if key is not None else p.literal(f'"{key_text}"')
    return _chain(p, key_parser, sp, colon, sp_after, value)


def _string_or_number_id(p: PegArena) -> int:
    # choice({literal("\"") + tool_id(string_content('"')) + literal("\""), tool_id(json_number())})
    close_quote = p.literal('"')
    string_id = p.atomic(p.tag(p.string_content(), "tool-id"))
    quoted = _chain(p, p.literal('"'), string_id, close_quote)
    return p.choice(quoted, p.atomic(p.tag(p.json_number(), "tool-id")))
