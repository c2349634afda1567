# The chat params of llama.cpp's hand-written gemma4 format (common/parsers/gemma4.cpp:
# common_chat_params_init_gemma4), the grammar side: Gemma 4 writes a call as
# `<|tool_call>call:name{key:value,...}<tool_call|>`, its strings between `<|"|>` marks, and thinks in a
# `<|channel>thought ... <channel|>` block.
#
# Contract:
# - Every template of the format supports thinking: thinking tags `<|channel>thought` and (`<channel|>`);
#   preserved tokens `<|channel>`, `<channel|>`, `<|tool_call>`, `<tool_call|>`, `<|turn>`; no additional
#   stops. The grammar does not depend on the template's source nor on the rendered prompt.
# - A grammar where there is a response schema (any JSON object, an empty one included: llama.cpp tests
#   is_object alone here), or tools with tool_choice other than none. Lazy unless there is a response schema
#   or tool_choice is required. Wherever there is a grammar, the trigger word `<|tool_call>` comes with it,
#   lazy or not (llama.cpp sets it on every grammar of the format).
# - The grammar is the arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: an optional `<|turn>model\n`, the thought rule (the reasoning tagged where it is extracted, the
#   whole block as content where not), then the schema's JSON in a ```json fence, or the calls (a name, then
#   a gemma4-dict of any keys: llama.cpp does not constrain the arguments by their schema), at least one
#   where tool_choice is required, more where parallel calls are on; with tool_choice auto the lazy grammar
#   is the trigger rule `tool-call` alone.
# - Not here: the message rewrites of the older gemma4 templates (tool responses folded into the assistant
#   turn) and the prompt's generation suffix: they shape the prompt, not the grammar.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["gemma4_params"]

TRIGGER: Final = "<|tool_call>"
THINKING_START: Final = "<|channel>thought"
THINKING_END: Final = "<channel|>"
PRESERVED_TOKENS: Final = ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>")
_STRING_MARK: Final = '<|"|>'


def gemma4_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_gemma4's grammar side for a request (see the module's contract).

    `source` is the template's; the format's grammar does not depend on it. Does not validate tool_choice
    (one of auto, required, none).
    """
    del source  # the same arguments as every format's; this one's grammar reads nothing of the template
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    wants_tools = has_tools and tool_choice != "none"
    functions = tool_functions([tool for tool in tools if tool.get("type") == "function"])
    arena = _parser(functions, extract_reasoning=reasoning_format != "none",
                    json_schema=json_schema if has_schema else None,
                    tool_choice=tool_choice if wants_tools else None, parallel_tool_calls=parallel_tool_calls)
    include_grammar = has_schema or wants_tools
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(
        arena, lazy, (TRIGGER,) if include_grammar else (), True,
        THINKING_START, (THINKING_END,), PRESERVED_TOKENS, writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool, json_schema: Any,
            tool_choice: str | None, parallel_tool_calls: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` and `|` first, the left one of `<<` first)
    p = PegArena()
    start = p.rule("start", p.optional(p.literal("<|turn>model\n")))
    # "<|channel>thought" + space() + reasoning(until("<channel|>")) + "<channel|>", or all of it as content
    close = p.literal(THINKING_END)
    body = p.until(THINKING_END)
    if extract_reasoning:
        body = p.tag(body, "reasoning")
    head = p.space()
    head = p.sequence(p.literal(THINKING_START), head)
    block = p.sequence(p.sequence(head, body), close)
    p.rule("thought", block if extract_reasoning else p.tag(block, "content"))
    # (peek("<|channel>") + gbnf(zero_or_more("<|channel>" + negate("thought")), "") + ref("thought"))
    #   | negate("<|channel>")
    not_thought = p.negate(p.literal("thought"))
    empty_channels = p.gbnf(p.zero_or_more(p.sequence(p.literal("<|channel>"), not_thought)), "")
    no_channel = p.negate(p.literal("<|channel>"))
    thought_ref = p.ref("thought")
    opened = p.sequence(p.sequence(p.peek(p.literal("<|channel>")), empty_channels), thought_ref)
    thought = p.choice(opened, no_channel)
    if json_schema is not None:
        fence = p.literal("```json")
        fenced = _then(p, fence, p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content"))
        fenced = _then(p, fenced, p.literal("```"))
        p.root = p.sequence(p.sequence(start, p.optional(thought)), fenced)
        return p
    if tool_choice is not None:
        tool_call = _calls(p, functions, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls)
        if tool_choice == "required":
            p.root = p.sequence(p.sequence(start, thought), tool_call)
            return p
        scan = p.rule("scan-to-toolcall", p.until(TRIGGER))
        content = p.rule("content", p.tag(p.until_one_of(["<|channel>", THINKING_END, TRIGGER]), "content"))
        message = p.rule("message", p.sequence(thought, content))
        p.root = p.sequence(p.sequence(p.sequence(start, p.zero_or_more(message)), scan), tool_call)
        return p
    content = p.rule("content", p.tag(p.until_one_of(["<|channel>", THINKING_END]), "content"))
    message = p.rule("message", p.sequence(thought, content))
    p.root = p.sequence(start, p.repeat(message, 1, -1))
    return p


def _then(p: PegArena, left: int, right: int) -> int:
    # left << right: a space between
    return p.sequence(left, p.space(), right)


def _calls(p: PegArena, functions: list[tuple[str, Mapping[str, Any]]], *, tool_choice: str,
           parallel_tool_calls: bool) -> int:
    _value_rules(p)
    choice = p.choice()
    for name, _ in functions:
        # tool(sequence({tool_open(tool_name(literal(name)) + peek(literal("{"))), tool_args(ref(dict))}))
        peek = p.peek(p.literal("{"))
        tool_open = p.atomic(p.tag(p.sequence(p.atomic(p.tag(p.literal(name), "tool-name")), peek),
                                   "tool-open"))
        tool = p.tag(p.sequence(tool_open, p.tag(p.ref("gemma4-dict"), "tool-args")), "tool")
        choice = p.choice(choice, p.rule(f"tool-{name}", tool))
    call = p.sequence(p.sequence(p.literal("<|tool_call>call:"), choice), p.literal("<tool_call|>"))
    return p.trigger_rule("tool-call", p.repeat(call, 1 if tool_choice == "required" else 0,
                                                -1 if parallel_tool_calls else 1))


def _value_rules(p: PegArena) -> None:
    # the gemma4 value rules (the traversal of llama.cpp's gemma4_to_json): strings between <|"|> marks,
    # JSON's numbers, booleans and null, and dicts of bare keys
    p.rule("gemma4-string-content", p.until(_STRING_MARK))
    close = p.literal(_STRING_MARK)
    content = p.ref("gemma4-string-content")
    p.rule("gemma4-string", p.sequence(p.sequence(p.literal(_STRING_MARK), content), close))
    p.rule("gemma4-bool", p.json_bool())
    p.rule("gemma4-null", p.json_null())
    p.rule("gemma4-number", p.json_number())
    colon = p.literal(":")
    p.rule("gemma4-dict-key", p.sequence(p.rule("gemma4-dict-key-name", p.chars("[^:}]", 1, -1)), colon))
    value = p.ref("gemma4-value")
    space = p.space()
    p.rule("gemma4-dict-kv", p.sequence(p.sequence(p.ref("gemma4-dict-key"), space), value))
    p.rule_of("gemma4-dict", lambda: _container(p, "{", "}", "gemma4-dict-kv"))
    p.rule_of("gemma4-array", lambda: _container(p, "[", "]", "gemma4-value"))
    p.rule_of("gemma4-value", lambda: p.choice(*(p.ref(f"gemma4-{kind}") for kind in (
        "string", "dict", "array", "number", "bool", "null"))))


def _container(p: PegArena, open_: str, close: str, member_rule: str) -> int:
    # open ws (close | member ("," ws member)* ws close): no space before a comma, unlike JSON's
    ws = p.space()
    member = p.ref(member_rule)
    members = p.sequence(member, p.zero_or_more(p.sequence(p.literal(","), ws, member)))
    return p.sequence(p.literal(open_), ws, p.choice(
        p.literal(close), p.sequence(members, ws, p.literal(close))))
