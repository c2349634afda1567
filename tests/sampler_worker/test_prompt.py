"""sampler_worker.prompt: prompt text to tokens as llama-server makes them."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pytest

from constraintd.engine.chat.templates.template_inputs import TemplateCaps
from sampler_worker.prompt import (
    CHATML_TEMPLATE,
    Message,
    TemplateError,
    chat_text,
    prompt_tokens,
    render_template,
    template_caps,
)


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


# llama.cpp's Jinja where it differs from Jinja2's defaults (each rendered by llama.cpp itself, through the
# chat oracle, on the reference's templates in tests/engine/chat/test_chat_oracle.py).
RENDERED_AS_LLAMA_CPP = [
    ("{{ x|tojson }}", {"x": {"b": 1, "a": "<'é'>"}}, '{"b": 1, "a": "<\'é\'>"}'),
    ("{{ x|tojson(ensure_ascii=true) }}", {"x": "é"}, '"\\u00e9"'),
    ("{{ x|tojson(indent=2) }}", {"x": [1]}, "[\n  1\n]"),
    ("{{ '<a>'|safe + x|tojson }}", {"x": "'"}, "<a>\"'\""),
    ("{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}, "1"),
    ("{% generation %}a{% endgeneration %}b", {}, "ab"),
    ("{{ none }}|{{ {'a': 1} }}|{{ [1, 'b'] }}|{{ 2.50 }}", {}, "||1b|2.5"),
    ("{{ 'a' + none }}{{ 'b' + missing }}", {}, "ab"),
    ("{{ xs|map(attribute='n')|list|tojson }}{{ (xs|map(attribute='n'))[1] }}", {"xs": [{"n": 1}, {"n": 2}]},
     "[1, 2]2"),
    ("{% set l = [] %}{{ l.append(2) or '' }}{{ l|tojson }}", {}, "[2]"),
    ("{{ m == m }} {{ n == n }}", {"m": {"c": [1]}, "n": {"c": 1}}, "False True"),
    ("{{ 'a' ~ none ~ missing ~ 1.0 ~ true ~ [1, 'b'] }}", {}, "a1.0True[1, 'b']"),
    ("{{ '{} and {}'|format(1, 'b') }}{{ '%s'|format(1) }}", {}, "1 and b%s"),
]


@pytest.mark.parametrize(("source", "context", "text"), RENDERED_AS_LLAMA_CPP,
                         ids=[f"case{i}" for i in range(len(RENDERED_AS_LLAMA_CPP))])
def test_rendered_as_llama_cpps_jinja(source: str, context: dict[str, object], text: str) -> None:
    assert render_template(source, context) == text


def test_strftime_now_and_raise_exception() -> None:
    assert render_template("{{ strftime_now('%Y') }}", {}, now=0.0) in ("1970", "1969")
    with pytest.raises(TemplateError, match=r"^Jinja Exception: no$"):
        render_template("{{ raise_exception('no') }}", {})


def test_template_caps() -> None:
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    assert template_caps(plain) == TemplateCaps(
        supports_tools=False, supports_tool_calls=False, supports_parallel_tool_calls=False)
    no_system = ("{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_caps(no_system).supports_system_role
    tools = ("{% for t in tools %}{{ t.function.name }}{% endfor %}{% for m in messages %}{{ m.content }}"
             "{% for c in m.tool_calls or [] %}{{ c.function.arguments|tojson }}{% endfor %}{% endfor %}")
    caps = template_caps(tools)
    assert caps.supports_tools and caps.supports_tool_calls and caps.supports_object_arguments
    typed = ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
             "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}")
    assert template_caps(typed).supports_typed_content
    assert template_caps("{% for %}") == TemplateCaps()


def test_chat_text_folds_the_system_message_where_the_template_has_no_system_role() -> None:
    template = ("{% if messages[0].role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
                "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}")
    messages = [Message("system", "S"), Message("user", "U")]
    model = FakeModel(chat_template=template)
    assert chat_text(model, messages, caps=template_caps(template)) == "[user:S\nU]"


def test_string_filter_writes_as_llama_cpp() -> None:
    assert render_template("{{ x|string }}", {"x": {"d": "é\xa0"}}) == "{'d': 'é\xa0'}"


def test_a_template_that_divides_by_zero_does_not_render() -> None:
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        render_template("{{ 1 / 0 }}", {})
