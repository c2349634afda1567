"""The project's chat-template path beside llama.cpp's, on the requests of tests/chat_oracle/cases.py.

The project renders a chat prompt as llama.cpp's chat layer does:
`constraintd.engine.chat.templates.template_inputs` reads the OpenAI messages and tools and rewrites them for
the template (`template_context`),
`sampler_worker.prompt` renders them in a Jinja2 environment made to behave as llama.cpp's Jinja engine,
and `constraintd.engine.chat.templates.prompt.chat_prompt` makes the prompt and the generation prompt from
them (`sampler_worker.prompt.chat_prompt_of` runs it with that renderer). The template's capabilities (which
rewrites apply) are the project's own, found as llama.cpp finds them (`sampler_worker.prompt.template_caps`
over constraintd.engine.chat.templates.caps); `llama_caps` reads llama.cpp's from the oracle, to compare them.

Both sides render with the current time (llama.cpp reads the clock itself): a comparison that straddles
midnight could see two dates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constraintd.engine.chat.templates.template_inputs import (
    ChatRequestError,
    TemplateCaps,
    parse_messages,
    parse_tools,
)
from sampler_worker.prompt import TemplateError, chat_prompt_of, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, CASES, EOS_TOKEN, MESSAGE_SETS, ChatCase
from tests.chat_oracle.drawn import DrawnRequest


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt and its generation prompt, or the error that stopped the renderer."""

    prompt: str | None
    error: str | None = None
    generation_prompt: str | None = None


def project_prompt(
    source: str, case: ChatCase, caps: TemplateCaps | None = None, *, now: float | None = None
) -> Rendered:
    """The prompt the project's chat-template path renders for this case (with the capabilities it finds
    in the template, unless given)."""
    try:
        made = chat_prompt_of(
            source, parse_messages(MESSAGE_SETS[case.messages]), tools=parse_tools(case.tool_list),
            bos_text=BOS_TOKEN, eos_text=EOS_TOKEN, add_generation_prompt=case.generation_prompt,
            enable_thinking=case.thinking, now=now, caps=caps, template_kwargs=dict(case.template_kwargs))
    except (TemplateError, ChatRequestError) as exc:
        return Rendered(None, str(exc))
    return Rendered(made.prompt, generation_prompt=made.generation_prompt)


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

    @property
    def same_generation_prompt(self) -> bool:
        """The generation prompts (what the template adds to open the assistant's turn) are identical."""
        return self.ours.generation_prompt is not None and \
            self.ours.generation_prompt == self.llama.generation_prompt

    @property
    def same_refusal(self) -> bool:
        """Both refuse, for the template's own `raise_exception` message (llama.cpp's error ends with it)."""
        ours, llama = self.ours.error, self.llama.error
        return ours is not None and llama is not None and ours.startswith("Jinja Exception: ") \
            and llama.endswith(ours)


def llama_answer(binary: Path, source: str, case: ChatCase) -> dict[str, Any]:
    return run_harness(binary, case.request(source))


def _rendered(answer: dict[str, Any]) -> Rendered:
    if "error" in answer:
        return Rendered(None, f"{answer['stage']}: {answer['error']}")
    return Rendered(answer["prompt"], generation_prompt=answer["generation_prompt"])


def llama_caps(binary: Path, source: str) -> TemplateCaps:
    """The template's capabilities as llama.cpp's chat layer detects them (jinja::caps)."""
    answer = run_harness(binary, {"template": source, "messages": [{"role": "user", "content": "x"}]})
    return TemplateCaps.from_map(answer.get("caps", {}))


def compare_template(binary: Path, path: Path) -> list[PromptComparison]:
    """Every case of CASES on one template file."""
    source = path.read_text()
    caps = template_caps(source)
    comparisons = []
    for case in CASES:
        llama = _rendered(llama_answer(binary, source, case))
        comparisons.append(PromptComparison(path.stem, case.name, project_prompt(source, case, caps), llama))
    return comparisons


def compare_drawn(binary: Path, path: Path, requests: list[DrawnRequest]) -> list[PromptComparison]:
    """Drawn requests (tests/chat_oracle/drawn.py) on one template file."""
    source = path.read_text()
    caps = template_caps(source)
    comparisons = []
    for number, drawn in enumerate(requests):
        try:
            made = chat_prompt_of(
                source, parse_messages(drawn.messages), tools=parse_tools(drawn.tools), bos_text=BOS_TOKEN,
                eos_text=EOS_TOKEN, add_generation_prompt=drawn.generation_prompt,
                enable_thinking=drawn.thinking, caps=caps)
            ours = Rendered(made.prompt, generation_prompt=made.generation_prompt)
        except (TemplateError, ChatRequestError) as exc:
            ours = Rendered(None, str(exc))
        llama = _rendered(run_harness(binary, drawn.request(source)))
        comparisons.append(PromptComparison(path.stem, f"drawn {number}", ours, llama))
    return comparisons
