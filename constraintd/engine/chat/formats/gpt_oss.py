# The chat params of llama.cpp's hand-written gpt-oss format (common/parsers/gpt-oss.cpp:
# common_chat_params_init_gpt_oss), the grammar side: OpenAI's gpt-oss writes the harmony format, messages
# `<|start|>assistant<|channel|>analysis<|message|>...<|end|>`, its answer on the `final` channel and its
# calls with a recipient, `to=functions.<name>`, in the role header or in the channel header, then an optional
# `<|constrain|>json` and the arguments after `<|message|>`.
#
# Contract:
# - Whatever the request: thinking supported, tags `<|channel|>analysis<|message|>` and (`<|end|>`,); the five
#   harmony markers preserved (`<|channel|>`, `<|constrain|>`, `<|message|>`, `<|start|>`, `<|end|>`); no
#   additional stops; the message delimiters of the five roles' headers.
# - A grammar where there is a response schema (any JSON object, as llama.cpp's is_object) or tools with
#   tool_choice other than none; lazy unless there is a schema or tool_choice is required. Its triggers are
#   four patterns, not words (TRIGGER_PATTERNS, whenever there is a grammar, lazy or not).
# - The grammar is the arena's (peg_arena.py) of the parser llama.cpp builds, made call for call in its
#   order: any number of `<|start|>assistant` messages on the analysis channel (the reasoning where it is
#   extracted, reasoning_format other than none, else content: the grammar is the same) or, with tools, the
#   commentary channel's preambles; then one last `<|start|>assistant` and: with a schema, the final channel
#   (an optional ` [<|constrain|>]type`) holding the schema's JSON, tools or not; else a call (required) or a
#   call or the final channel's text (auto), the call's recipient in the role or the channel header and its
#   arguments the parameters' JSON. Lazy, the grammar is the call alone. One call whatever
#   parallel_tool_calls says (llama.cpp's format does not read it).
# - The parser is built for every request (the message parser runs it), its grammar written only where there
#   is one: with neither a schema nor tools to call, the last message is the final channel's text or a call
#   nobody asked for (` to=` up to `<|end|>`, kept atomic).
# - Every builder call is the arena's (peg_arena.py).
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.json_tool_grammar import tool_functions, tool_parameters
from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["TRIGGER_PATTERNS", "gpt_oss_params"]

START: Final = "<|start|>assistant"
END: Final = "<|end|>"
CHANNEL: Final = "<|channel|>"
MESSAGE: Final = "<|message|>"
CONSTRAIN: Final = "<|constrain|>"
THINKING_START: Final = "<|channel|>analysis<|message|>"
PRESERVED_TOKENS: Final = (CHANNEL, CONSTRAIN, MESSAGE, "<|start|>", END)
MESSAGE_DELIMITERS: Final = (
    ("assistant", "<|start|>assistant"), ("user", "<|start|>user"), ("system", "<|start|>developer"),
    ("system", "<|start|>system"), ("tool", "<|start|>functions"))
TRIGGER_PATTERNS: Final = (
    r"^\s+to$",
    r"^<\|channel\|>(?:commentary|analysis)\s+to=functions$",
    r"<\|start\|>assistant(\s+to)",
    r"<\|start\|>assistant(<\|channel\|>(?:commentary|analysis)\s+to)",
)


def gpt_oss_params(
    source: str, *, tools: Sequence[Mapping[str, Any]] = (), tool_choice: str = "auto",
    parallel_tool_calls: bool = False, json_schema: Any = None, reasoning_format: str = "auto",
) -> FormatParams:
    """common_chat_params_init_gpt_oss's grammar side for a request (see the module's contract).

    `source` (the template) and `parallel_tool_calls` do not change the answer: llama.cpp's format reads
    neither; they are taken for the same call as the other formats'.
    """
    del source, parallel_tool_calls  # the same for every template; one call at a time
    has_tools = bool(tools)
    has_schema = isinstance(json_schema, Mapping)
    include_grammar = has_schema or (has_tools and tool_choice != "none")
    arena = _parser(tool_functions(tools), extract_reasoning=reasoning_format != "none",
                    json_schema=json_schema if has_schema else None,
                    tool_choice=tool_choice if has_tools and tool_choice != "none" else None)
    lazy = include_grammar and not (has_schema or (has_tools and tool_choice == "required"))
    return FormatParams(
        arena, lazy, (), True, THINKING_START, (END,), PRESERVED_TOKENS,
        message_delimiters=MESSAGE_DELIMITERS, trigger_patterns=TRIGGER_PATTERNS if include_grammar else (),
        writes_grammar=include_grammar)


def _parser(functions: list[tuple[str, Mapping[str, Any]]], *, extract_reasoning: bool,
            json_schema: Mapping[str, Any] | None, tool_choice: str | None) -> PegArena:
    # the parser of build_chat_peg_parser's function (tool_choice None: no tools to call), each expression's
    # parsers made in llama.cpp's order (the right operand of `+` and `|` first)
    p = PegArena()
    start = p.rule("start", p.literal(START))
    end = p.rule("end", p.literal(END))
    content = p.rule("message-content", p.until(END))
    # literal(CHANNEL) + (literal("commentary") | literal("analysis"))
    analysis_name = p.literal("analysis")
    channel_names = p.choice(p.literal("commentary"), analysis_name)
    channel = p.sequence(p.literal(CHANNEL), channel_names)
    constrain_type = p.chars("[A-Za-z0-9_-]", 1, -1)
    # optional(literal("<|channel|>commentary") + optional(literal(" to=assistant")))
    to_assistant = p.optional(p.literal(" to=assistant"))
    stray_commentary = p.optional(p.sequence(p.literal(CHANNEL + "commentary"), to_assistant))
    start_analysis = p.sequence(stray_commentary, p.literal(THINKING_START))
    if extract_reasoning:
        p.rule("analysis", p.sequence(p.sequence(start_analysis, p.tag(content, "reasoning")), end))
    else:
        p.rule("analysis", p.tag(p.sequence(p.sequence(start_analysis, content), end), "content"))
    analysis = p.ref("analysis")
    preamble_content = p.tag(content, "content")
    preamble = p.rule("preamble", p.sequence(
        p.sequence(p.literal(CHANNEL + "commentary" + MESSAGE), preamble_content), end))
    final_content = p.tag(content, "content")
    final_msg = p.rule("final", p.sequence(
        p.sequence(stray_commentary, p.literal(CHANNEL + "final" + MESSAGE)), final_content))
    # atomic(optional(channel) + literal(" to=") + content + end)
    to = p.literal(" to=")
    unsolicited = p.sequence(p.sequence(p.sequence(p.optional(channel), to), content), end)
    unsolicited = p.rule("unsolicited", p.atomic(unsolicited))
    any_message = p.rule("any", p.choice(preamble, analysis))
    if json_schema is not None:
        constraint = _constraint(p, constrain_type)
        body = p.tag(p.schema(p.json(), "response-format-schema", json_schema), "content")
        message = p.literal(MESSAGE)
        head = p.sequence(p.literal(CHANNEL + "final"), constraint)
        response_format = p.rule("response-format", p.sequence(p.sequence(head, message), body))
        leading = p.zero_or_more(p.sequence(start, analysis))
        p.root = p.sequence(p.sequence(leading, start), response_format)
        return p
    if tool_choice is None:
        # zero_or_more(start + any) + start + (final_msg | unsolicited)
        last = p.choice(final_msg, unsolicited)
        leading = p.zero_or_more(p.sequence(start, any_message))
        p.root = p.sequence(p.sequence(leading, start), last)
        return p
    choice = p.choice()
    for name, function in functions:
        tool_name = p.atomic(p.tag(p.literal(name), "tool-name"))
        func_name = p.sequence(p.literal(" to=functions."), tool_name)
        constraint = _constraint(p, constrain_type)
        args = p.tag(p.schema(p.json(), f"tool-{name}-schema", tool_parameters(function)), "tool-args")
        # tool(tool_open(func_name + channel + constraint + literal(MESSAGE)) + args): the recipient in the
        # role header, then in the channel header
        message = p.literal(MESSAGE)
        opened = p.atomic(p.tag(p.sequence(p.sequence(p.sequence(func_name, channel), constraint), message),
                                "tool-open"))
        in_role = p.tag(p.sequence(opened, args), "tool")
        message = p.literal(MESSAGE)
        opened = p.atomic(p.tag(p.sequence(p.sequence(p.sequence(channel, func_name), constraint), message),
                                "tool-open"))
        in_channel = p.tag(p.sequence(opened, args), "tool")
        choice = p.choice(choice, p.rule(f"tool-{name}", p.choice(in_role, in_channel)))
    tool_call = p.trigger_rule("tool-call", choice)
    last = tool_call if tool_choice == "required" else p.choice(tool_call, final_msg)
    leading = p.zero_or_more(p.sequence(start, any_message))
    p.root = p.sequence(p.sequence(leading, start), last)
    return p


def _constraint(p: PegArena, constrain_type: int) -> int:
    # optional(space() + optional(literal(CONSTRAIN)) + constrain_type)
    constrain = p.optional(p.literal(CONSTRAIN))
    return p.optional(p.sequence(p.sequence(p.space(), constrain), constrain_type))
