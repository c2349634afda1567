# The chat params of llama.cpp's hand-written gigachat-v3 format (common/parsers/gigachat-v3.cpp:
# common_chat_params_init_gigachat_v3), the grammar side: GigaChat 3 writes one call as a message of its own,
# `<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "f", "arguments": {...}}`.
#
# Contract:
# - No thinking (no thinking tags), `<|message_sep|>\n\n` and `<|role_sep|>\n` preserved. No additional stops,
#   no message delimiters.
# - A grammar exactly where there are tools and tool_choice is not none (a response schema is not read, nor
#   parallel calls: the format writes one call at most); lazy exactly where tool_choice is auto, the call's
#   start (TOOL_CALL_START) its trigger word.
# - The parser is built for every request (the message parser runs it; with no tools to call, the rest after
#   the generation prompt as content), its grammar written only where there is one. It is the arena's
#   (peg_arena.py) of the parser llama.cpp builds, made call for call in its order: the generation prompt, the
#   text up to `<|message_sep|>\n\n`, then the call (required where tool_choice is required, else optional):
#   the call's start and a JSON object of the tool's name and its arguments, the parameters' schema's JSON.
# - Not here: json_member, which the arena lacks, is written in this module (_json_member).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["TOOL_CALL_START", "gigachat_v3_params"]

GENERATION_PROMPT: Final = "assistant<|role_sep|>\n"
MESSAGE_SEP: Final = "<|message_sep|>\n\n"
TOOL_CALL_START: Final = MESSAGE_SEP + "function call<|role_sep|>\n"
PRESERVED_TOKENS: Final = (MESSAGE_SEP, "<|role_sep|>\n")


def gigachat_v3_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_gigachat_v3's grammar side for a request (see the module's contract).

    Does not render the prompt nor read the messages (they change the prompt only); the template's source, the
    response schema, parallel calls and the reasoning format do not change what it gives.
    """
    if not tools or tool_choice == "none":
        return FormatParams(_content_parser(), False, (), False, "", (), PRESERVED_TOKENS,
                            writes_grammar=False)
    arena = _parser(tools, require_tools=tool_choice == "required")
    return FormatParams(arena, tool_choice == "auto", (TOOL_CALL_START,), False, "", (), PRESERVED_TOKENS)


def _parser(tools: Sequence[Mapping[str, Any]], *, require_tools: bool) -> PegArena:
    # the parser of build_chat_peg_parser's function, each expression's parsers made in llama.cpp's order
    # (the right operand of `+` first, the left one of `<<` first)
    p = PegArena()
    p.eps()  # the returned parser's first value, replaced before use
    tool_choice = p.choice()
    for tool in tools:  # every tool, as llama.cpp reads them here (not foreach_function)
        function = tool["function"]
        name = str(function["name"])
        # json_member("name", "\"" + tool_name(literal(name)) + "\"")
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        quoted = p.sequence(p.literal('"'), tool_name)
        quoted = p.sequence(quoted, p.literal('"'))
        name_member = _json_member(p, "name", quoted)
        args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
        args_member = _json_member(p, "arguments", args)
        tool_open = p.atomic(p.tag(_then(p, p.literal("{"), name_member), "tool-open"))
        # tool_open << "," << tool_args << "}"
        body = _then(p, tool_open, p.literal(","))
        body = _then(p, body, args_member)
        body = _then(p, body, p.literal("}"))
        tool_choice = p.choice(tool_choice, p.rule(f"tool-{name}", body))
    tool_call = p.rule("tool-call", p.sequence(p.literal(TOOL_CALL_START), tool_choice))
    tool_calls = p.trigger_rule("tool-call-root", p.repeat(tool_call, 1 if require_tools else 0, 1))
    body = _then(p, p.tag(p.until(MESSAGE_SEP), "content"), tool_calls)
    p.root = p.sequence(p.literal(GENERATION_PROMPT), body)
    return p


def _content_parser() -> PegArena:
    # literal(GENERATION_PROMPT) + content(rest()): the parser of a request with no tools to call
    p = PegArena()
    p.eps()  # the returned parser's first value, replaced
    content = p.tag(p.rest(), "content")
    p.root = p.sequence(p.literal(GENERATION_PROMPT), content)
    return p


def _then(p: PegArena, left: int, right: int) -> int:
    # left << right: a space between, made after both
    return p.sequence(left, p.space(), right)


def _json_member(p: PegArena, key: str, value: int) -> int:
    # common_peg_parser_builder::json_member: "key" space ":" space value
    ws = p.space()
    return p.sequence(p.literal(f'"{key}"'), ws, p.literal(":"), ws, value)
