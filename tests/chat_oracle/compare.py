"""The project's chat-template path beside llama.cpp's, on the requests of tests/chat_oracle/cases.py.

The project renders a chat prompt as llama.cpp's chat layer does: `constraintd.engine.chat.template_inputs`
reads the OpenAI messages and tools and rewrites them for the template (`template_context`), and
`sampler_worker.prompt.render_template` renders them in a Jinja2 environment made to behave as llama.cpp's
Jinja engine; `finish_prompt` adds what a specialised format appends. The template's capabilities (which
rewrites apply) are the project's own, found as llama.cpp finds them (`sampler_worker.prompt.template_caps`
over constraintd.engine.chat.caps); `llama_caps` reads llama.cpp's from the oracle, to compare them.

Both sides render with the current time (llama.cpp reads the clock itself): a comparison that straddles
midnight could see two dates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constraintd.engine.chat.template_inputs import (
    ChatRequestError,
    TemplateCaps,
    finish_prompt,
    parse_messages,
    parse_tools,
    template_context,
)
from sampler_worker.prompt import TemplateError, render_template, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, CASES, EOS_TOKEN, MESSAGE_SETS, ChatCase


@dataclass(frozen=True, slots=True)
class Rendered:
    """A prompt, or the error that stopped the renderer."""

    prompt: str | None
    error: str | None = None


def project_prompt(
    source: str, case: ChatCase, caps: TemplateCaps | None = None, *, now: float | None = None
) -> Rendered:
    """The prompt the project's chat-template path renders for this case (with the capabilities it finds
    in the template, unless given)."""
    now = time.time() if now is None else now
    caps = template_caps(source, now=now) if caps is None else caps
    try:
        context = template_context(
            source, parse_messages(MESSAGE_SETS[case.messages]), caps=caps, tools=parse_tools(case.tool_list),
            bos_token=BOS_TOKEN, eos_token=EOS_TOKEN, now=now, enable_thinking=case.thinking,
            add_generation_prompt=case.generation_prompt)
        prompt = render_template(source, context, now=now)
        return Rendered(finish_prompt(source, prompt, add_generation_prompt=case.generation_prompt))
    except (TemplateError, ChatRequestError) as exc:
        return Rendered(None, str(exc))


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
    return Rendered(answer["prompt"])


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
