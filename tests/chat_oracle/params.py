"""The project's chat params (constraintd.engine.chat.chat_params) beside llama.cpp's, on the requests of
tests/chat_oracle/cases.py's PARAMS_CASES.

Compared, byte for byte: the grammar, the lazy flag, the triggers, the additional stops, supports_thinking and
the thinking tags. Preserved tokens are llama.cpp's answer alone for now (they need the tool-call analysis).
A case the project does not compute yet (`NotPorted`: a hand-written format, or a grammar of tool calls) is
counted apart, never as identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constraintd.engine.chat.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.template_inputs import parse_messages, parse_tools
from sampler_worker.prompt import chat_grammar_of
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import (
    BOS_TOKEN,
    EOS_TOKEN,
    MESSAGE_SETS,
    PARAMS_CASES,
    RESPONSE_SCHEMA,
    ParamsCase,
)

FIELDS = ("grammar", "grammar_lazy", "grammar_triggers", "additional_stops", "supports_thinking",
          "thinking_start_tag", "thinking_end_tags")


def _ours(grammar: ChatGrammar) -> dict[str, Any]:
    return {
        "grammar": grammar.grammar, "grammar_lazy": grammar.grammar_lazy,
        "grammar_triggers": [[t.kind, t.value] for t in grammar.grammar_triggers],
        "additional_stops": list(grammar.additional_stops),
        "supports_thinking": grammar.supports_thinking, "thinking_start_tag": grammar.thinking_start_tag,
        "thinking_end_tags": list(grammar.thinking_end_tags),
    }


def _llamas(answer: dict[str, Any]) -> dict[str, Any]:
    fields = {name: answer[name] for name in FIELDS}
    fields["grammar_triggers"] = [[t["type"], t["value"]] for t in answer["grammar_triggers"]]
    return fields


@dataclass(frozen=True, slots=True)
class ParamsComparison:
    """One case on one template: both sides' fields, or why the project's side is not computed."""

    template: str
    case: str
    ours: dict[str, Any] | None
    llama: dict[str, Any]
    not_ported: str | None = None

    @property
    def identical(self) -> bool:
        return self.ours is not None and "error" not in self.llama and self.ours == _llamas(self.llama)

    def describe(self) -> str:
        if self.not_ported is not None:
            return f"{self.case}: not ported ({self.not_ported})"
        if "error" in self.llama:
            return f"{self.case}: llama.cpp refused: {self.llama['error']}"
        assert self.ours is not None
        llama = _llamas(self.llama)
        return f"{self.case}: " + "; ".join(
            f"{name}: ours {self.ours[name]!r} llama.cpp {llama[name]!r}"
            for name in FIELDS if self.ours[name] != llama[name])


def project_params(source: str, case: ParamsCase, *, now: int) -> ChatGrammar:
    """The project's chat params for this case.

    Raises:
        NotPorted: the case needs a part of llama.cpp's chat layer not ported yet.
    """
    return chat_grammar_of(
        source, parse_messages(MESSAGE_SETS["system+user"]), tools=parse_tools(case.tool_list),
        tool_choice=case.llama_tool_choice, json_schema=RESPONSE_SCHEMA if case.schema else None,
        reasoning_format=case.reasoning_format, bos_text=BOS_TOKEN, eos_text=EOS_TOKEN,
        enable_thinking=case.thinking, now=now)


def compare_params(binary: Path, path: Path, *, now: int) -> list[ParamsComparison]:
    """Every case of PARAMS_CASES on one template file, both sides at the same time `now` (Unix seconds)."""
    source = path.read_text()
    comparisons = []
    for case in PARAMS_CASES:
        llama = run_harness(binary, case.request(source, now=now))
        try:
            ours: dict[str, Any] | None = _ours(project_params(source, case, now=now))
            not_ported = None
        except NotPorted as exc:
            ours, not_ported = None, str(exc)
        comparisons.append(ParamsComparison(path.stem, case.name, ours, llama, not_ported))
    return comparisons
