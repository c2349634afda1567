"""The project's chat-template path beside llama.cpp's, on the requests of tests/chat_oracle/cases.py.

The project renders a chat prompt in `sampler_worker.prompt.chat_text`: Jinja2's sandbox (trim_blocks,
lstrip_blocks, a `raise_exception` global) given `messages` (role and content), `bos_token`, `eos_token` and
`add_generation_prompt`. llama.cpp renders with its own Jinja engine (common/jinja) after its chat layer has
normalised the messages for the template's detected capabilities, and gives the template more variables
(`enable_thinking`, `tools`, `date_string`, `datetime`, ...).

Content-only conversations go through `chat_text` itself. `chat_text` takes no tools and no tool calls, so
the cases that have them go through the same Jinja2 environment with the OpenAI messages and `tools` as
llama-server receives them (`render_like_chat_text`); a test checks that this renders exactly as `chat_text`
wherever both can.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sampler_worker.prompt import Message, TemplateError, chat_text
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, CASES, EOS_TOKEN, MESSAGE_SETS, WEATHER_TOOL, ChatCase


@dataclass(slots=True)  # not frozen: chat_text's protocol declares plain (settable) attributes
class TemplateSource:
    """A chat template as `chat_text` reads it from a model, with no model behind it: BOS and EOS are not
    cut (the tokenizer adds neither), as llama.cpp's chat layer does when it is given no model."""

    chat_template: str | None
    bos_text: str = BOS_TOKEN
    eos_text: str = EOS_TOKEN
    add_bos: bool = False
    add_eos: bool = False

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        raise TypeError("a template source has no vocabulary: only chat_text is used with it")


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt, or the error that stopped the renderer."""

    prompt: str | None
    error: str | None = None


def render_like_chat_text(
    source: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> Rendered:
    """`chat_text`'s Jinja2 environment and variables, with OpenAI messages and, when given, `tools`."""
    import jinja2
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    variables: dict[str, Any] = {
        "messages": messages, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "add_generation_prompt": True,
    }
    if tools is not None:
        variables["tools"] = tools
    try:
        return Rendered(environment.from_string(source).render(**variables))
    except (jinja2.TemplateError, TemplateError, TypeError, ValueError) as exc:
        return Rendered(None, f"{type(exc).__name__}: {exc}")


def project_prompt(source: str, case: ChatCase) -> Rendered:
    """The prompt the project's chat-template path renders for this case."""
    messages = MESSAGE_SETS[case.messages]
    if case.tools or any(set(m) != {"role", "content"} for m in messages):
        return render_like_chat_text(source, messages, [WEATHER_TOOL] if case.tools else None)
    try:
        plain = [Message(m["role"], m["content"]) for m in messages]
        return Rendered(chat_text(TemplateSource(source), plain))
    except TemplateError as exc:
        return Rendered(None, f"TemplateError: {exc}")


@dataclass(frozen=True, slots=True)
class PromptComparison:
    """One case on one template: both prompts (or errors)."""

    template: str
    case: str
    ours: Rendered
    llama: Rendered

    @property
    def identical(self) -> bool:
        return self.ours.prompt is not None and self.ours.prompt == self.llama.prompt


def llama_prompt(binary: Path, source: str, case: ChatCase) -> Rendered:
    answer = run_harness(binary, case.request(source))
    if "error" in answer:
        return Rendered(None, f"{answer['stage']}: {answer['error']}")
    return Rendered(answer["prompt"])


def compare_template(binary: Path, path: Path) -> list[PromptComparison]:
    """Every case of CASES on one template file."""
    source = path.read_text()
    return [
        PromptComparison(
            path.stem, case.name, project_prompt(source, case), llama_prompt(binary, source, case)
        )
        for case in CASES
    ]
