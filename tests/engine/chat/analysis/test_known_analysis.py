"""A template's analysis remembered across requests: the analysis a request would make afresh, made once
while the clock reads the same to the template's renders, and a copy of its own for each request. (The
chat params oracle tests, which go through the remembered analysis, compare it with llama.cpp's.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from constraintd import chat_templates
from constraintd.chat_templates import known_analysis, known_caps, renderer
from constraintd.engine.chat.analysis.template_analysis import TemplateAnalysis, analyze_template

# a ChatML template whose thinking tag carries the minute it was rendered in: its analysis depends on the time
STAMPED = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.reasoning_content %}<think at=\"{{ strftime_now('%H:%M') }}\">\n{{ m.reasoning_content }}\n"
    "</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NOON = 12 * 3600.0


@pytest.fixture
def analyses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The templates analysed afresh, in order, from an empty memory."""
    made: list[str] = []

    def counted(source: str, *args: Any, **kwargs: Any) -> TemplateAnalysis:
        made.append(source)
        return analyze_template(source, *args, **kwargs)

    monkeypatch.setattr(chat_templates, "_analyses", type(chat_templates._analyses)())
    monkeypatch.setattr(chat_templates, "analyze_template", counted)
    yield made


def fresh(source: str, now: float) -> TemplateAnalysis:
    return analyze_template(source, renderer(source, now), known_caps(source))


def test_the_same_minute_is_analysed_once(analyses: list[float]) -> None:
    caps = known_caps(STAMPED)
    first = known_analysis(STAMPED, NOON, caps)
    again = known_analysis(STAMPED, NOON + 59, caps)
    assert analyses == [STAMPED]
    assert first == again == fresh(STAMPED, NOON)
    assert first.reasoning.start == '<think at="12:00">\n'


def test_another_minute_is_analysed_again(analyses: list[float]) -> None:
    caps = known_caps(STAMPED)
    known_analysis(STAMPED, NOON, caps)
    later = known_analysis(STAMPED, NOON + 60, caps)
    assert analyses == [STAMPED, STAMPED]
    assert later == fresh(STAMPED, NOON + 60)
    assert later.reasoning.start == '<think at="12:01">\n'


def test_each_request_gets_a_copy_of_its_own(analyses: list[float]) -> None:
    caps = known_caps(STAMPED)
    first = known_analysis(STAMPED, NOON, caps)
    first.additional_stops.append("<|changed|>")
    first.reasoning.start = "changed"
    again = known_analysis(STAMPED, NOON, caps)
    assert again == fresh(STAMPED, NOON)
    again.additional_stops.append("<|changed|>")
    assert known_analysis(STAMPED, NOON, caps) == fresh(STAMPED, NOON)
    assert analyses == [STAMPED]


def test_other_special_tokens_are_another_analysis(analyses: list[float]) -> None:
    caps = known_caps(STAMPED)
    known_analysis(STAMPED, NOON, caps, eos_token="<|im_end|>")
    known_analysis(STAMPED, NOON, caps, eos_token="</s>")
    assert analyses == [STAMPED, STAMPED]


def test_the_memory_is_bounded(analyses: list[float]) -> None:
    caps = known_caps(STAMPED)
    for n in range(chat_templates._KEPT_ANALYSES + 1):
        known_analysis(STAMPED + "{#" + str(n) + "#}", NOON, caps)
    assert len(chat_templates._analyses) == chat_templates._KEPT_ANALYSES
    known_analysis(STAMPED + "{#0#}", NOON, caps)  # the oldest, dropped: made again
    assert len(analyses) == chat_templates._KEPT_ANALYSES + 2
