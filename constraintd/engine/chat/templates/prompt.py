# The prompt and generation prompt of llama.cpp's chat params (common_chat_params.prompt and
# .generation_prompt), as common_chat_templates_apply makes them, through a renderer of llama.cpp's Jinja
# dialect that the caller gives (sans-IO: sampler_worker.prompt.render_template is one).
#
# Contract:
# - `chat_prompt` renders the template with `template_context`'s variables, finishes the text as the
#   specialised formats do (`finish_prompt`), and cuts the BOS / EOS texts the tokenizer adds itself
#   (`cut_special`); the generation prompt is what rendering with add_generation_prompt adds to rendering
#   without it (the text after their common prefix), as common_chat_template_generation_prompt takes it,
#   except where a specialised format sets its own (Gemma 4's model turn after a tool call).
# - `template_source` is the template llama.cpp renders for a model's template text: ChatML where there
#   is none (or it is "chatml"), and two known templates' refusals patched out (gpt-oss's of a channel
#   written in content, Mistral's of an assistant turn with neither content nor tool calls).
# - Continuing the final message (continue_final_message) is continuation.py's: it splits the chat before
#   this renders it, and rebuilds the generation prompt after.
# - Not done: a GGUF's separate tool_use template, and the formats' parsers (chat_params.py has the grammar
#   side, in part).
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from constraintd.engine.chat.templates.template_inputs import (
    ChatMessage,
    ChatTool,
    TemplateCaps,
    template_context,
)

__all__ = ["CHATML_TEMPLATE", "ChatPrompt", "chat_prompt", "cut_special", "finish_prompt", "template_source"]

GEMMA4_MODEL_TURN = "<|turn>model\n"

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
"""llama.cpp's fallback chat template (ChatML), used when a model carries none."""

# (marks that must all be in the template, the text replaced, its replacement)
SOURCE_PATCHES = (
    (("<|channel|>", "in message.content or"),
     '{%- if "<|channel|>analysis<|message|>" in message.content or '
     '"<|channel|>final<|message|>" in message.content %}', "{%- if false %}"),
    (("[TOOL_CALLS]", "if (message['content'] is none or"),
     "{%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) "
     "and (message['tool_calls'] is not defined or message['tool_calls'] is none or "
     "message['tool_calls']|length == 0) %}", "{%- if false %}"),
)


def template_source(source: str | None) -> str:
    """The template llama.cpp renders for a model's chat template text (see the module's contract)."""
    if not source or source == "chatml":
        return CHATML_TEMPLATE
    for marks, text, replacement in SOURCE_PATCHES:
        if all(mark in source for mark in marks):
            source = source.replace(text, replacement)
    return source


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The prompt to evaluate, and the part of it the generation prompt adds (the assistant turn's start)."""

    prompt: str
    generation_prompt: str


def _gemma4(source: str) -> bool:
    return "'<|tool_call>call:'" in source


def finish_prompt(source: str, prompt: str, *, add_generation_prompt: bool = True) -> str:
    """The rendered prompt as llama.cpp's specialised formats finish it: Gemma 4's model turn opened where
    the template closed a turn after a tool call without opening the next; gpt-oss's last `<|return|>`
    written `<|end|>` when no generation prompt follows (llama.cpp issue 15417)."""
    if _gemma4(source) and add_generation_prompt and prompt.endswith("<turn|>\n"):
        return prompt + GEMMA4_MODEL_TURN
    if "<|channel|>" in source and not add_generation_prompt:
        at = prompt.rfind("<|return|>")
        if at >= 0:
            return prompt[:at] + "<|end|>" + prompt[at + len("<|return|>"):]
    return prompt


def cut_special(text: str, *, bos_token: str, eos_token: str, add_bos: bool, add_eos: bool) -> str:
    """The rendered prompt without the BOS and EOS texts the tokenizer will add itself."""
    if add_bos and text.startswith(bos_token):
        text = text[len(bos_token):]
    if add_eos and text.endswith(eos_token):
        text = text[: len(text) - len(eos_token)]
    return text


def _added(without: str, with_prompt: str) -> str:
    common = 0
    for a, b in zip(without, with_prompt, strict=False):
        if a != b:
            break
        common += 1
    return with_prompt[common:]


def chat_prompt(
    source: str,
    messages: Sequence[ChatMessage],
    render: Callable[[Mapping[str, Any]], str],
    *,
    caps: TemplateCaps,
    tools: Sequence[ChatTool] = (),
    bos_token: str = "",
    eos_token: str = "",
    add_bos: bool = False,
    add_eos: bool = False,
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    now: float,
    template_kwargs: Mapping[str, Any] | None = None,
) -> ChatPrompt:
    """llama.cpp's prompt and generation prompt for these messages on the template `source`.

    `render(context)` renders `source` with `context` in llama.cpp's Jinja dialect; what it raises is
    passed on. `add_bos` / `add_eos`: the tokenizer adds BOS / EOS itself, so their texts are cut.

    Raises:
        ChatRequestError: tool-call arguments that are not JSON, for a template that reads them as objects.
    """
    def rendered(generation_prompt: bool) -> str:
        context = template_context(
            source, messages, caps=caps, tools=tools, bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=generation_prompt, enable_thinking=enable_thinking, now=now,
            template_kwargs=template_kwargs)
        return cut_special(render(context), bos_token=bos_token, eos_token=eos_token,
                           add_bos=add_bos and bool(bos_token), add_eos=add_eos and bool(eos_token))

    text = rendered(add_generation_prompt)
    prompt = finish_prompt(source, text, add_generation_prompt=add_generation_prompt)
    if _gemma4(source) and prompt != text:
        return ChatPrompt(prompt, GEMMA4_MODEL_TURN)
    other = rendered(not add_generation_prompt)
    without, with_prompt = (other, text) if add_generation_prompt else (text, other)
    return ChatPrompt(prompt, _added(without, with_prompt))
