# Prompt text to prompt tokens, as llama-server makes them.
#
# Contract:
# - A raw prompt (`/completion`) is tokenized with special tokens parsed (`<start_of_turn>` written in
#   the text is that token) and BOS added when the model's metadata says so: llama-server's
#   `tokenize_input_prompts(..., add_special=true, parse_special=true)`.
# - A chat prompt (`/v1/chat/completions`, one user message) is the GGUF's chat template rendered
#   with Jinja (messages, bos_token, eos_token, add_generation_prompt=true), or llama.cpp's ChatML
#   template when the GGUF has none; a leading BOS text is cut when the tokenizer adds BOS itself
#   (and a trailing EOS text when it adds EOS), as `common_chat_template_direct_apply` does; then the
#   text is tokenized as a raw prompt.
# - Not done: tools, images, reasoning formats, and prefilling the grammar with the template's
#   generation prompt (llama-server does that only for templates whose output starts inside it).

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CHATML_TEMPLATE", "Message", "chat_text", "prompt_tokens"]

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)
"""llama.cpp's fallback chat template (ChatML), used when a GGUF carries none."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: str
    content: str


class TemplateModel(Protocol):
    """What prompt building needs from a model (`sampler_worker.model.Model` has it)."""

    chat_template: str | None
    bos_text: str
    eos_text: str
    add_bos: bool
    add_eos: bool

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...


class TemplateError(ValueError):
    """A chat template that cannot be rendered (or raised an error on purpose)."""


def chat_text(model: TemplateModel, messages: Sequence[Message]) -> str:
    """The prompt text llama-server renders for these messages, ready to tokenize.

    Raises:
        TemplateError: the template does not render.
    """
    import jinja2
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    try:
        template = environment.from_string(model.chat_template or CHATML_TEMPLATE)
        text = template.render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            bos_token=model.bos_text,
            eos_token=model.eos_text,
            add_generation_prompt=True,
        )
    except jinja2.TemplateError as exc:
        raise TemplateError(f"the chat template does not render: {exc}") from exc
    if model.add_bos and model.bos_text and text.startswith(model.bos_text):
        text = text[len(model.bos_text) :]
    if model.add_eos and model.eos_text and text.endswith(model.eos_text):
        text = text[: -len(model.eos_text)]
    return text


def prompt_tokens(model: TemplateModel, *, prompt: str | None = None, chat: str | None = None) -> list[int]:
    """The tokens llama-server evaluates for a raw prompt or a one-message chat.

    Raises:
        ValueError: not exactly one of prompt and chat.
        TemplateError: the chat template does not render.
    """
    if (prompt is None) == (chat is None):
        raise ValueError("give exactly one of prompt= and chat=")
    text = prompt if prompt is not None else chat_text(model, [Message("user", chat or "")])
    return model.tokenize(text, add_special=True, parse_special=True)
