"""constraintd.engine.chat.chat_params, diff_split and reasoning: the grammar side of llama.cpp's chat params.

The oracle test runs tests/chat_oracle/cases.py's PARAMS_CASES on every template of the reference through
llama.cpp's chat layer (tests/chat_oracle/harness.cpp) and through the project's port, and compares the
grammar, lazy flag, triggers, additional stops and thinking tags byte for byte. What is ported is asserted
per template: on the auto-parser's templates every case but the tool-call grammars (tools offered, tool_choice
auto / required / named, no schema) is identical; the hand-written formats (SPECIALISED) are not ported.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.chat_params import _excluding_grammar, chat_params, specialised_format
from constraintd.engine.chat.diff_split import DiffSplit, Segment, diff_split, segments, trim_whitespace
from constraintd.engine.chat.prompt import template_source
from constraintd.engine.chat.reasoning import ReasoningMode, analyze_reasoning
from constraintd.engine.chat.template_inputs import TemplateCaps
from sampler_worker.prompt import render_template
from tests.chat_oracle.cases import PARAMS_CASES, template_paths
from tests.chat_oracle.params import ParamsComparison, compare_params
from tests.conftest import OracleReport

TEMPLATES = template_paths()

# The templates llama.cpp's chat layer gives a hand-written format (common_chat_try_specialized_template),
# by the marks in their source; every other template of the reference runs the auto-parser.
SPECIALISED = {
    "Cohere2MoE": "cohere2-moe", "GigaChat3-10B-A1.8B": "gigachat-v3", "Kimi-K2-Instruct": "kimi-k2",
    "Kimi-K2-Thinking": "kimi-k2", "Kimi-K3": "kimi-k3", "LFM2-8B-A1B": "lfm2", "LFM2.5-8B-A1B": "lfm2.5",
    "LFM2.5-Instruct": "lfm2.5", "MiniMax-M3": "minimax-m3",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "qwen3-coder",
    "Qwen3-Coder": "qwen3-coder", "Qwen3.5-4B": "qwen3-coder", "StepFun3.5-Flash": "qwen3-coder",
    "deepseek-ai-DeepSeek-V3.2": "deepseek-v3.2", "deepseek-ai-DeepSeek-V4-Flash-0731": "deepseek-v3.2",
    "deepseek-ai-DeepSeek-V4": "deepseek-v3.2", "google-gemma-4-31B-it-interleaved": "gemma4",
    "google-gemma-4-31B-it": "gemma4", "inclusionai-ling-3.0-flash": "ling-3",
    "meetkai-functionary-medium-v3.2": "functionary-v3.2",
    "mistralai-Ministral-3-14B-Reasoning-2512": "ministral-3",
    "moonshotai-Kimi-K2": "kimi-k2", "muse-glimmer": "muse-glimmer", "openai-gpt-oss-120b": "gpt-oss",
    "openbmb-MiniCPM5-1B": "minicpm5", "unsloth-mistral-Devstral-Small-2507": "ministral-3",
}
TOOL_GRAMMAR_CHOICES = {"auto", "required", "named"}


def _expected_ported(template: str) -> set[str]:
    if template in SPECIALISED:
        return set()
    return {case.name for case in PARAMS_CASES if case.schema or case.tool_choice not in TOOL_GRAMMAR_CHOICES}


@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_specialised_formats_are_llama_cpps_choice(path: Path) -> None:
    assert specialised_format(template_source(path.read_text())) == SPECIALISED.get(path.stem)


def test_segments_cut_markers_and_text() -> None:
    assert segments("a<b>c[d]<e") == [Segment(False, "a"), Segment(True, "<b>"), Segment(False, "c"),
                                     Segment(True, "[d]"), Segment(False, "<e")]
    assert segments("<a]>") == [Segment(True, "<a]>")]  # a marker closes with its own opener's closer
    assert segments("") == []


def test_diff_split_finds_the_inserted_part() -> None:
    left = "<s>user: hi<e><a>answer<e>"
    right = "<s>user: hi<e><a><think>why</think>answer<e>"
    split = diff_split(left, right)
    assert split == DiffSplit(prefix="<s>user: hi<e><a>", suffix="answer<e>", left="",
                              right="<think>why</think>")
    assert split.prefix + split.left + split.suffix == left
    assert split.prefix + split.right + split.suffix == right


def test_diff_split_of_equal_texts_is_all_prefix() -> None:
    assert diff_split("<a>x<b>", "<a>x<b>") == DiffSplit(prefix="<a>x<b>")


@given(st.text(alphabet="ab<>[] x", max_size=12), st.text(alphabet="ab<>[] x", max_size=12),
       st.text(alphabet="ab<>[] x", max_size=12), st.text(alphabet="ab<>[] x", max_size=12))
def test_diff_split_rebuilds_both_texts(prefix: str, left: str, right: str, suffix: str) -> None:
    a, b = prefix + left + suffix, prefix + right + suffix
    split = diff_split(a, b)
    if split.left or split.right:
        assert split.prefix + split.left + split.suffix == a
        assert split.prefix + split.right + split.suffix == b


def test_trim_is_c_isspace() -> None:
    assert trim_whitespace("\v\f x \u00a0\n") == "x \u00a0"


BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def _excluding(delimiter: str) -> Grammar:
    rules: dict[str, str] = {}

    def add_rule(name: str, rule: str) -> str:
        rules[name] = rule
        return name

    start = _excluding_grammar(add_rule, "until-4", [delimiter])
    text = f"root ::= {start}\n" + "".join(f"{name} ::= {rule}\n" for name, rule in rules.items())
    return Grammar.from_gbnf(text, BYTES)


@pytest.mark.parametrize("delimiter", ["</think>", "aab", "[/THINK]", "<｜end▁of▁thinking｜>"])
@given(st.text(alphabet="ab</think>[/THINK]｜▁", max_size=20))
def test_until_grammar_takes_exactly_the_texts_without_the_delimiter(delimiter: str, text: str) -> None:
    matcher = Matcher(_excluding(delimiter))
    taken = matcher.accept_bytes(text.encode()) and matcher.is_complete()
    assert taken == (delimiter not in text)


def test_reasoning_of_a_chatml_template_with_think_tags() -> None:
    source = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
        "{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n"
        "{%- if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    )

    def render(context: object) -> str:
        assert isinstance(context, dict)
        return render_template(source, context)

    caps = TemplateCaps.from_map({"supports_string_content": True, "supports_system_role": True})
    found = analyze_reasoning(source, render, caps)
    assert found.mode is ReasoningMode.TAG_BASED
    assert (found.start, found.end) == ("<think>\n", "\n</think>\n\n")
    made = chat_params(source, render, caps, generation_prompt="<|im_start|>assistant\n",
                       json_schema={"type": "string"})
    assert (made.supports_thinking, made.thinking_start_tag, made.thinking_end_tags) == (
        True, "<think>", ("</think>",))
    root = next(line for line in made.grammar.splitlines() if line.startswith("root ::= "))
    # the end tag's three optional whitespace characters come before `until` in the arena: 1 + 3 * 3 + 2
    assert root.startswith('root ::= "<|im_start|>assistant\\n" space ("<think>" "\\n"? until-13 "\\n"? '
                           '"</think>"')
    assert not made.grammar_lazy and not made.grammar_triggers


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_chat_params_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Grammar, lazy flag, triggers, stops and thinking tags are llama.cpp's on every ported case; the
    ported cases are exactly the expected ones."""
    comparisons = compare_params(chat_oracle, path, now=int(time.time()))
    identical = {c.case for c in comparisons if c.identical}
    oracle_report.add("chat params: grammar, lazy, triggers, stops, thinking tags", path.stem,
                      identical=len(identical), total=len(comparisons))
    ported = {c.case for c in comparisons if c.not_ported is None}
    assert ported == _expected_ported(path.stem), _describe(comparisons)
    assert identical == ported, _describe([c for c in comparisons if c.case in ported - identical])


def _describe(comparisons: list[ParamsComparison]) -> str:
    return "\n".join(c.describe() for c in comparisons)
