# Continuing the final message (llama.cpp's continue_final_message): the last message of the chat is a
# partial assistant turn the model goes on writing, as common_chat_templates_apply_jinja and the formats'
# inits make the request's prompt and generation prompt for it.
#
# Contract:
# - `parse_continuation` reads llama-server's continue_final_message value (common_chat_continuation_parse):
#   true continues as the message asks (AUTO), "reasoning_content" its thought, "content" its content;
#   anything else continues nothing.
# - `continued_chat` is common_chat_templates_apply_jinja's split: with a continuation, no generation prompt
#   is added, the template renders every message but the last, and AUTO becomes REASONING where the message
#   has reasoning and no content (nor content parts), else CONTENT. With no message to continue (none at
#   all, or an empty one: has_continuation), the generation prompt's text is kept as rendered.
# - `continued_prompt` rebuilds the generation prompt as the request's format does (the auto-parser's
#   generate_parser, or the hand-written format's init in common/parsers/): the assistant turn's opening,
#   the thought's start tag and the message's reasoning, then, continuing the content, the thought's end
#   and the message's content (render_content: text parts joined by a blank line); the prompt gets it
#   appended. The parser is built on the generation prompt before it (llama.cpp's parser_generation_prompt):
#   only ling-3's reads the continuation (its thought is open unless the content is continued).
# - Not done: the legacy (non-Jinja) templates, which llama.cpp does not continue either.
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from constraintd.engine.chat.templates.prompt import ChatPrompt
from constraintd.engine.chat.templates.template_inputs import ChatMessage

if TYPE_CHECKING:  # chat_params reads the continuation: it is imported here for the type alone
    from constraintd.engine.chat.params.chat_params import ChatGrammar

__all__ = [
    "Continuation",
    "ContinuedChat",
    "continued_chat",
    "continued_prompt",
    "parse_continuation",
    "parser_input",
]


class Continuation(enum.Enum):
    """What of the final message the model continues (common_chat_continuation)."""

    NONE = "none"
    AUTO = "auto"
    REASONING = "reasoning_content"
    CONTENT = "content"


def parse_continuation(value: Any) -> Continuation:
    """llama-server's continue_final_message value as llama.cpp reads it (see the module's contract)."""
    if value is True:
        return Continuation.AUTO
    if value == "reasoning_content":
        return Continuation.REASONING
    if value == "content":
        return Continuation.CONTENT
    return Continuation.NONE


@dataclass(frozen=True, slots=True)
class ContinuedChat:
    """A chat split for its continuation: the messages the template renders, whether it adds the generation
    prompt, and the message continued (None: none) with what of it is continued (NONE, REASONING, CONTENT)."""

    messages: tuple[ChatMessage, ...]
    add_generation_prompt: bool
    message: ChatMessage | None = None
    continuation: Continuation = Continuation.NONE


def _empty(message: ChatMessage) -> bool:
    # common_chat_msg::empty (the role aside)
    return not (message.content or message.content_parts or message.tool_calls or message.reasoning_content
                or message.tool_name or message.tool_call_id)


def continued_chat(messages: Sequence[ChatMessage], continuation: Continuation, *,
                   add_generation_prompt: bool = True) -> ContinuedChat:
    """The chat as llama.cpp renders it for a continuation of its final message (see the module's contract).

    Does not change `messages`.
    """
    if continuation is Continuation.NONE:
        return ContinuedChat(tuple(messages), add_generation_prompt)
    if not messages:
        return ContinuedChat((), False)
    message = messages[-1]
    if continuation is Continuation.AUTO:
        continuation = Continuation.REASONING if (
            message.reasoning_content and not message.content and not message.content_parts
        ) else Continuation.CONTENT
    if _empty(message):
        return ContinuedChat(tuple(messages[:-1]), False)
    return ContinuedChat(tuple(messages[:-1]), False, message, continuation)


def _content(message: ChatMessage) -> str:
    # common_chat_msg::render_content("\n\n")
    if message.content:
        return message.content
    return "\n\n".join(part.text for part in message.content_parts if part.type == "text")


@dataclass(frozen=True, slots=True)
class _Opening:
    """A hand-written format's continued turn: `turn` (None: the generation prompt as rendered), the
    thought's start tag (None: the format writes no thought), what closes the thought before the content,
    and whether the content follows in either continuation (`always_content`, else only the content's)."""

    turn: str | None
    start: str | None
    end: str = ""
    always_content: bool = False


# common/parsers/*.cpp's `if (inputs.has_continuation())` blocks, by format (chat_params.specialised_format)
_OPENINGS: Final = {
    "ministral-3": _Opening("", "[THINK]", "[/THINK]"),
    "gpt-oss": _Opening("<|start|>assistant<|channel|>analysis<|message|>", "",
                        "<|end|><|start|>assistant<|channel|>final<|message|>"),
    "muse-glimmer": _Opening("<|start|>assistant to=self<|message|>", "",
                             "<|eom|><|start|>assistant to=user<|message|>"),
    "functionary-v3.2": _Opening("<|start_header_id|>assistant<|end_header_id|>\n\n>>>all\n", None,
                                 always_content=True),
    "kimi-k2": _Opening("<|im_assistant|>assistant<|im_middle|>", "<think>", "</think>"),
    "kimi-k3": _Opening('<|open|>message role="assistant"<|sep|>', "<|open|>think<|sep|>",
                        "<|close|>think<|sep|><|open|>response<|sep|>"),
    "ling-3": _Opening("<role>ASSISTANT</role>\n", "<think>", "</think>"),
    "cohere2-moe": _Opening("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|START_THINKING|>",
                            "<|END_THINKING|><|START_TEXT|>"),
    "lfm2": _Opening("<|im_start|>assistant\n", "<think>", "</think>"),
    "lfm2.5": _Opening("<|im_start|>assistant\n", "<think>", "</think>"),
    "gigachat-v3": _Opening("assistant<|role_sep|>\n", None, always_content=True),
    "minimax-m3": _Opening(None, "<mm:think>", "</mm:think>"),
    "deepseek-v3.2": _Opening("<｜Assistant｜>", "<think>", "</think>"),
    "minicpm5": _Opening("<|im_start|>assistant\n<think>\n", "", "\n</think>\n\n"),
    "qwen3-coder": _Opening("<|im_start|>assistant\n", "<think>\n", "\n</think>\n\n"),
}
_GEMMA4_TURN: Final = "<|turn>model\n"
_GEMMA4: Final = _Opening(_GEMMA4_TURN, "<|channel>thought\n", "<channel|>")


def _opening(name: str, source: str, prompt: str, message: ChatMessage) -> _Opening:
    # the formats whose opening depends on the template, the prompt or the message
    if name == "gemma4":
        # the model's turn opened only where the rendered prompt closed one without opening the next
        return _GEMMA4 if prompt.endswith("<turn|>\n") else _Opening("", _GEMMA4.start, _GEMMA4.end)
    if name == "qwen3-coder" and "<think>" not in source:
        return _Opening("<|im_start|>assistant\n", None)
    if name == "deepseek-v3.2" and "function_calls" not in source and not message.reasoning_content:
        # DeepSeek V4 continues a message without reasoning after a closed, empty thought
        return _Opening("<｜Assistant｜></think>", None)
    return _OPENINGS[name]


def continued_prompt(source: str, prompt: ChatPrompt, chat: ContinuedChat,
                     grammar: ChatGrammar) -> ChatPrompt:
    """The request's prompt and generation prompt with the final message continued (see the module's
    contract); `prompt` as prompt.chat_prompt renders `chat.messages`, unchanged where nothing is continued.

    `source` is the template llama.cpp renders (prompt.template_source), `grammar` the request's chat params
    (chat_params.chat_params, made on `prompt`'s generation prompt): its hand-written format, or the
    auto-parser's analysis and its reasoning tags. Does not change the parser `grammar` holds.
    """
    message, continuation = chat.message, chat.continuation
    if message is None or continuation is Continuation.NONE:
        return prompt
    content = continuation is Continuation.CONTENT
    if not grammar.format_name:
        generation = prompt.generation_prompt
        reasoning = grammar.analysis.reasoning if grammar.analysis is not None else None
        if reasoning is not None and reasoning.start:
            at = generation.find(reasoning.start)
            generation = generation if at < 0 else generation[:at]
            generation += reasoning.start + message.reasoning_content
            generation += reasoning.end if content else ""
    else:
        opening = _opening(grammar.format_name, source, prompt.prompt, message)
        generation = prompt.generation_prompt if opening.turn is None else opening.turn
        content = content or opening.always_content
        if opening.start is not None:
            generation += opening.start + message.reasoning_content + (opening.end if content else "")
    generation += _content(message) if content else ""
    return ChatPrompt(prompt.prompt + generation, generation)


def parser_input(rendered: ChatPrompt, continued: ChatPrompt) -> tuple[str, str]:
    """What the message parser (message_parser.parse_message) is given for a continued message: the
    generation prompt it reads its prefix from, and the text to put before the generated text.

    llama.cpp builds the parser on the generation prompt `rendered` (before the continuation) and runs it on
    the continued one followed by the generated text; parse_message takes one generation prompt for both.
    Where the continued one extends the rendered one (a template without a thought: the continued content
    follows the turn's opening), the parser gets the rendered one and the rest goes before the text: the
    continued content is then read as content, as llama.cpp reads it. Elsewhere the two agree up to the
    thought's start tag (the prefix the parser reads), and the continued one is given whole.
    """
    before, after = rendered.generation_prompt, continued.generation_prompt
    if after.startswith(before):
        return before, after[len(before):]
    return after, ""
