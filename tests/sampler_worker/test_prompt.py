"""sampler_worker.prompt: prompt text to tokens as llama-server makes them."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pytest

from sampler_worker.prompt import CHATML_TEMPLATE, Message, TemplateError, chat_text, prompt_tokens


@dataclass
class FakeModel:
    chat_template: str | None = None
    bos_text: str = "<s>"
    eos_text: str = "</s>"
    add_bos: bool = True
    add_eos: bool = False
    seen: list[tuple[str | bytes, bool, bool]] = field(default_factory=list)

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        self.seen.append((text, add_special, parse_special))
        return [len(text)]


def test_chatml_is_the_fallback() -> None:
    text = chat_text(FakeModel(), [Message("user", "hi")])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.oracle
def test_chatml_fallback_renders_as_llama_cpp_applies_chatml() -> None:
    import llama_cpp

    messages = [Message("system", "Be brief."), Message("user", "Name a colour.\nOne word.")]
    array = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m.role.encode(), content=m.content.encode()) for m in messages]
    )
    buffer = ctypes.create_string_buffer(4096)
    n = llama_cpp.llama_chat_apply_template(b"chatml", array, len(messages), True, buffer, len(buffer))
    assert n > 0
    assert chat_text(FakeModel(chat_template=CHATML_TEMPLATE), messages) == buffer.raw[:n].decode()


def test_leading_bos_is_cut_when_the_tokenizer_adds_it() -> None:
    template = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"
    assert chat_text(FakeModel(chat_template=template), [Message("user", "x")]) == "[x]</s>"
    assert chat_text(FakeModel(chat_template=template, add_bos=False), [Message("user", "x")]) == "<s>[x]</s>"
    assert chat_text(FakeModel(chat_template=template, add_eos=True), [Message("user", "x")]) == "[x]"


def test_template_errors_say_so() -> None:
    failing = FakeModel(chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(TemplateError, match="no system role"):
        chat_text(failing, [Message("user", "x")])
    broken = FakeModel(chat_template="{% for %}")
    with pytest.raises(TemplateError, match="does not render"):
        chat_text(broken, [Message("user", "x")])


def test_prompts_are_tokenized_with_special_tokens_parsed_and_added() -> None:
    model = FakeModel()
    prompt_tokens(model, prompt="raw")
    prompt_tokens(model, chat="hello")
    assert model.seen == [
        ("raw", True, True),
        ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", True, True),
    ]


def test_exactly_one_of_prompt_and_chat() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        prompt_tokens(FakeModel())
    with pytest.raises(ValueError, match="exactly one"):
        prompt_tokens(FakeModel(), prompt="a", chat="b")
