"""constraintd.engine.chat.params.chat_params, diff_split and reasoning: the grammar side of llama.cpp's chat
params.

The oracle test runs tests/chat_oracle/cases.py's PARAMS_CASES on every template of the reference through
llama.cpp's chat layer (tests/chat_oracle/harness.cpp) and through the project's port, and compares the
grammar, lazy flag, triggers, additional stops and thinking tags byte for byte. What is ported is asserted
per template: on the auto-parser's templates every case is identical; the hand-written formats
(SPECIALISED) are not ported. Preserved tokens are compared on every ported case, and the analysis itself
(the tag formats' markers included) on every template.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.analysis.diff_split import (
    DiffSplit,
    Segment,
    diff_split,
    segments,
    trim_whitespace,
)
from constraintd.engine.chat.analysis.reasoning import ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import ToolMode, analyze_template
from constraintd.engine.chat.params.chat_params import (
    NotPorted,
    _excluding_grammar,
    _state_grammar,
    chat_params,
    specialised_format,
)
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import TemplateCaps
from sampler_worker.prompt import render_template, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import PARAMS_CASES, ParamsCase, template_paths
from tests.chat_oracle.params import ParamsComparison, compare_analysis, compare_params, project_params
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
# Auto-parser templates with a tag format (<function=...>, <arg_key>...): their analysis and preserved tokens
# are compared as every other template's, and their tool grammars, lazy (tool_choice auto) and not
# (required, named), of JSON arguments (TAG_JSON) and tagged ones (TAG_TAGGED).
TAG_FORMATS = {
    "ByteDance-Seed-OSS", "GLM-4.6", "GLM-4.7-Flash", "MiniMax-M2", "Mistral-Small-3.2-24B-Instruct-2506",
    "Spark2.5", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1",
    "llama-cpp-deepseek-r1", "meetkai-functionary-medium-v3.1", "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2", "tencent-Hy3", "upstage-Solar-Open-100B",
}
# Where the project's analysis still parts from llama.cpp's: template -> (field, why). Functionary 3.2 has its
# own format (SPECIALISED), so its chat params do not depend on it.
TAG_JSON = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1", "llama-cpp-deepseek-r1",
    "meetkai-functionary-medium-v3.1", "upstage-Solar-Open-100B", "Mistral-Small-3.2-24B-Instruct-2506",
}
TAG_TAGGED = {
    "ByteDance-Seed-OSS", "GLM-4.6", "GLM-4.7-Flash", "MiniMax-M2", "Spark2.5", "poolside-Laguna-S-2.1",
    "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2", "tencent-Hy3",
}
ANALYSIS_DIFFERENCES = {
    "meetkai-functionary-medium-v3.2": (
        ("tool mode", "function", "arguments", "preserved tokens"),
        "the template joins a string and the arguments object with +: llama.cpp's Jinja writes the object, "
        "the project's renderer refuses (its capability probes count on that refusal): the probe finds no "
        "call"),
}


# The hand-written formats ported (chat/formats/): every case of their templates, as of the auto-parser's.
PORTED_FORMATS = {
    "cohere2-moe", "deepseek-v3.2", "functionary-v3.2", "gemma4", "gigachat-v3", "gpt-oss", "kimi-k2",
    "kimi-k3", "ling-3", "lfm2", "lfm2.5", "minicpm5", "minimax-m3", "ministral-3", "muse-glimmer",
    "qwen3-coder",
}


def _expected_ported(template: str) -> set[str]:
    # every case of the auto-parser's templates and of the ported formats' ones, tool grammars of every
    # tool_choice included
    if template in SPECIALISED and SPECIALISED[template] not in PORTED_FORMATS:
        return set()
    return {case.name for case in PARAMS_CASES}


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


DIFF_PIECES = ("a", "b", " ", "\n", "<x>", "<y>", "[z]", "<", ">", "[", "]", "<think>", "</think>", "é")


@pytest.mark.oracle
def test_diff_split_is_llama_cpps(chat_oracle: Path, oracle_report: OracleReport) -> None:
    """calculate_diff_split on drawn pairs (a shared prefix and suffix around two drawn middles, seeded):
    the same four parts, including where llama.cpp's parts do not rebuild the texts."""
    rng = random.Random(18)

    def text() -> str:
        return "".join(rng.choice(DIFF_PIECES) for _ in range(rng.randint(0, 8)))

    pairs = []
    for _ in range(2000):
        prefix, suffix = text(), text()
        pairs.append((prefix + text() + suffix, prefix + text() + suffix))
    splits = run_harness(chat_oracle, {"mode": "diff", "pairs": pairs})["splits"]
    ours = [dataclasses.asdict(diff_split(left, right)) for left, right in pairs]
    same = sum(a == b for a, b in zip(ours, splits, strict=True))
    oracle_report.add("chat auto-parser diff split", "drawn pairs", identical=same, total=len(pairs))
    assert ours == splits


def test_trim_is_c_isspace() -> None:
    assert trim_whitespace("\v\f x \u00a0\n") == "x \u00a0"


BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def _excluding(delimiter: str, *, including: bool = False) -> Grammar:
    rules: dict[str, str] = {}

    def add_rule(name: str, rule: str) -> str:
        rules[name] = rule
        return name

    start = _state_grammar(add_rule, "ac-4", [delimiter], including=True) if including else \
        _excluding_grammar(add_rule, "until-4", [delimiter])
    text = f"root ::= {start}\n" + "".join(f"{name} ::= {rule}\n" for name, rule in rules.items())
    return Grammar.from_gbnf(text, BYTES)


@pytest.mark.parametrize("delimiter", ["</think>", "aab", "[/THINK]", "<｜end▁of▁thinking｜>"])
@given(st.text(alphabet="ab</think>[/THINK]｜▁", max_size=20))
def test_until_grammar_takes_exactly_the_texts_without_the_delimiter(delimiter: str, text: str) -> None:
    matcher = Matcher(_excluding(delimiter))
    taken = matcher.accept_bytes(text.encode()) and matcher.is_complete()
    assert taken == (delimiter not in text)


@pytest.mark.parametrize("delimiter", ["</arg_value>", "aab", "</parameter>\n", "<｜DSML｜parameter>"])
@given(st.text(alphabet="ab</arg_value>\n｜▁", max_size=12), st.booleans(),
       st.text(alphabet="ab</arg_value>\n｜▁", max_size=4))
def test_ac_grammar_takes_exactly_the_texts_up_to_the_first_delimiter(
    delimiter: str, head: str, inserted: bool, tail: str
) -> None:
    text = head + (delimiter if inserted else "") + tail
    matcher = Matcher(_excluding(delimiter, including=True))
    taken = matcher.accept_bytes(text.encode()) and matcher.is_complete()
    assert taken == (text.find(delimiter) == len(text) - len(delimiter) and delimiter in text)


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
    found = analyze_template(source, render, caps).reasoning
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


@pytest.mark.parametrize("path", sorted(path for path in TEMPLATES if path.stem in TAG_FORMATS),
                         ids=lambda path: path.stem)
def test_the_tag_format_sets_follow_the_analysis(path: Path) -> None:
    assert TAG_FORMATS == TAG_JSON | TAG_TAGGED
    source = template_source(path.read_text())
    tools = analyze_template(source, lambda context: render_template(source, context, now=0),
                             template_caps(source, now=0)).tools
    assert tools.mode is (ToolMode.TAG_WITH_TAGGED if path.stem in TAG_TAGGED else ToolMode.TAG_WITH_JSON)


@dataclasses.dataclass(frozen=True, slots=True)
class TagFormatCase:
    """A tag format's texts: the grammar's generation prompt, one call of get_weather, the same call of
    search, the section around the calls ("" where there is none), the calls' marker, whether the template
    has a reasoning block."""

    template: str
    prompt: str
    call: str
    other: str
    section: str
    marker: str
    reasoning: bool = True

    def calls(self, calls: str) -> str:
        return self.prompt + (self.section.format(calls) if self.section else calls)


DEEPSEEK_CALL = ("<\uff5ctool\u2581call\u2581begin\uff5c>{}<\uff5ctool\u2581sep\uff5c>{}"
                 "<\uff5ctool\u2581call\u2581end\uff5c>")
TAG_FORMAT_CASES = [
    TagFormatCase("deepseek-ai-DeepSeek-V3.1", "<\uff5cAssistant\uff5c>",
                  DEEPSEEK_CALL.format("get_weather", '{"city": "Paris"}'),
                  DEEPSEEK_CALL.format("search", '{"query": "Paris"}'),
                  "<\uff5ctool\u2581calls\u2581begin\uff5c>{}<\uff5ctool\u2581calls\u2581end\uff5c>",
                  "<\uff5ctool\u2581calls\u2581begin\uff5c>"),
    TagFormatCase("GLM-4.6", "<|assistant|>\n",
                  "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
                  "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
                  "", "<tool_call>"),
    # a call id between the name and the arguments (optional), no close nor end marker after the arguments;
    # llama.cpp's analysis reads the call id's suffix [ARGS] as the name's suffix too, so its grammar (and
    # this one) writes [ARGS] before the call id as well as after it
    TagFormatCase("Mistral-Small-3.2-24B-Instruct-2506", "",
                  '[TOOL_CALLS]get_weather[ARGS][CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
                  '[TOOL_CALLS]search[ARGS][ARGS]{"query": "Paris"}', "", "[TOOL_CALLS]", reasoning=False),
]
TAG_FORMAT_IDS = ["JSON arguments", "tagged arguments", "call id"]


def _required_tag_matcher(template: str, tool_choice: str, *, parallel: bool = False) -> Matcher:
    path = next(path for path in TEMPLATES if path.stem == template)
    made = project_params(path.read_text(), ParamsCase(tool_choice, False, False), now=1_767_000_000,
                          parallel_tool_calls=parallel)
    assert not made.grammar_lazy and made.grammar_triggers == ()  # the grammar holds from the first token
    return Matcher(Grammar.from_gbnf(made.grammar, BYTES))


def _takes(matcher: Matcher, text: str) -> bool:
    return matcher.fork().accept_bytes(text.encode())


def _completes(matcher: Matcher, text: str) -> bool:
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


@pytest.mark.parametrize("case", TAG_FORMAT_CASES, ids=TAG_FORMAT_IDS)
def test_a_tag_formats_required_grammar_takes_a_call_and_no_answer_without_one(case: TagFormatCase) -> None:
    matcher = _required_tag_matcher(case.template, "required")
    assert _completes(matcher, case.calls(case.call))
    assert _completes(matcher, case.calls(case.other))
    assert _completes(matcher, case.prompt + "Let me look it up." + case.calls(case.call)[len(case.prompt):])
    assert _takes(matcher, case.prompt + "Let me look it up.")
    assert not _completes(matcher, case.prompt + "Let me look it up.")  # no end without a call
    assert not _completes(matcher, case.prompt)
    assert not _takes(matcher, case.calls(case.call) + "Done.")  # nothing after the call
    # the text before the calls may not hold their marker; a reasoning block before them may
    assert not _takes(matcher, case.prompt + f"I shall write {case.marker} next.")
    thought = case.prompt + f"<think>I shall write {case.marker} next.</think>" + case.calls(case.call)[
        len(case.prompt):]
    assert _completes(matcher, thought) is case.reasoning


@pytest.mark.parametrize("case", TAG_FORMAT_CASES, ids=TAG_FORMAT_IDS)
def test_a_tag_formats_required_grammar_repeats_calls_only_where_parallel_calls_are_on(
    case: TagFormatCase,
) -> None:
    two = case.calls(case.call + case.other)
    assert not _takes(_required_tag_matcher(case.template, "required"), two)
    assert _completes(_required_tag_matcher(case.template, "required", parallel=True), two)


@pytest.mark.parametrize("case", TAG_FORMAT_CASES, ids=TAG_FORMAT_IDS)
def test_a_tag_formats_grammar_for_a_named_tool_calls_that_tool_alone(case: TagFormatCase) -> None:
    matcher = _required_tag_matcher(case.template, "named")  # the named tool alone, tool_choice required
    assert _completes(matcher, case.calls(case.call))
    assert not _takes(matcher, case.calls(case.other))


def test_a_tag_formats_call_id_is_optional_and_ends_at_its_suffix() -> None:
    matcher = _required_tag_matcher("Mistral-Small-3.2-24B-Instruct-2506", "required")
    assert _completes(matcher, '[TOOL_CALLS]get_weather[ARGS][ARGS]{"city": "Paris"}')
    assert _completes(matcher, '[TOOL_CALLS]get_weather[ARGS][CALL_ID]any text[ARGS]{"city": "Paris"}')
    assert not _takes(matcher, "[TOOL_CALLS]get_weather[ARGS][CALL_ID]a[ARGS]b")  # the id stops at [ARGS]
    assert not _takes(matcher, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')  # the suffix is not optional
    assert not _takes(matcher, "[TOOL_CALLS]get_weather[CALL_ID]")  # see TAG_FORMAT_CASES
    # with neither a close nor an end marker, the function ends with space
    assert _completes(matcher, '[TOOL_CALLS]get_weather[ARGS][ARGS]{"city": "Paris"}\n  ')


def test_a_tag_format_with_no_start_marker_has_no_required_grammar_ported() -> None:
    # no template of the reference has one: a tag format's analysis with its calls' markers taken away
    path = next(path for path in TEMPLATES if path.stem == "GLM-4.6")
    source = template_source(path.read_text())

    def render(context: object) -> str:
        assert isinstance(context, dict)
        return render_template(source, context, now=0)

    caps = template_caps(source, now=0)
    found = analyze_template(source, render, caps)
    unmarked = dataclasses.replace(found, tools=dataclasses.replace(found.tools, section_start="",
                                                                    per_call_start=""))
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {}}}]
    lazy = chat_params(source, render, caps, generation_prompt="", tools=tools, analyze=lambda: unmarked)
    assert lazy.grammar == ""  # tool_choice auto: nothing to trigger on, no grammar (as llama.cpp)
    with pytest.raises(NotPorted, match=r"^the tag formats' calls with no start marker \(tool_choice"):
        chat_params(source, render, caps, generation_prompt="", tools=tools, tool_choice="required",
                    analyze=lambda: unmarked)


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
    known = [c for c in comparisons if c.preserved_tokens is not None]
    same = [c for c in known if c.same_preserved_tokens]
    oracle_report.add("chat params: preserved tokens", path.stem, identical=len(same), total=len(comparisons))
    assert len(known) == len(ported)
    assert len(same) == len(known), [
        (c.case, c.preserved_tokens, c.llama.get("preserved_tokens")) for c in known]


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_parallel_tool_call_grammars_are_llama_cpps(
    path: Path, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """With parallel_tool_calls on, tool_choice auto and required: identical wherever ported (every tool
    grammar of the auto-parser's templates, and the templates with no tool grammar)."""
    comparisons = compare_params(chat_oracle, path, now=int(time.time()), parallel_tool_calls=True)
    ported = [c for c in comparisons if c.not_ported is None]
    oracle_report.add("chat params: parallel tool calls", path.stem,
                      identical=sum(c.identical for c in ported), total=len(comparisons))
    assert [c for c in ported if not c.identical] == [], _describe([c for c in ported if not c.identical])
    expected = {c.case for c in comparisons} & _expected_ported(path.stem)
    assert {c.case for c in ported} == expected


# Tools whose arguments reach the tagged grammar's other branches: no arguments at all and optional ones only
# (first, so their parsers number the later rules), a value that is no string before a string (the JSON value
# rules made once, then named again), and the schemas whose may-be-a-string answer reads an enum, a const,
# an anyOf, a pattern or a list of types.
TAGGED_TOOLS = [
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "maybe", "parameters": {"properties": {
        "note": {"anyOf": [{"type": "null"}, {"type": "string"}]}, "flag": {"type": ["boolean", "null"]},
        "tag": {"type": ["null", "string"]}, "code": {"pattern": "^[a-z]+$"}}}}},
    {"type": "function", "function": {"name": "count", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}, "label": {"type": "string"}, "unit": {"enum": ["m", "s"]},
        "scale": {"enum": [1, 2]}, "mode": {"const": "fast"}, "size": {"type": "array"}},
        "required": ["n", "label", "unit"]}}},
]
# Seed-OSS's template reads every property's type, so llama.cpp refuses these tools there
TAGGED = sorted(path for path in TEMPLATES if path.stem in TAG_TAGGED - {"ByteDance-Seed-OSS"})


@pytest.mark.oracle
@pytest.mark.parametrize("path", TAGGED, ids=[path.stem for path in TAGGED])
@pytest.mark.parametrize("parallel", [False, True], ids=["one call", "parallel calls"])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_tagged_tool_grammars_of_other_arguments_are_llama_cpps(
    path: Path, parallel: bool, tool_choice: str, chat_oracle: Path, oracle_report: OracleReport
) -> None:
    """The grammar of tagged arguments with TAGGED_TOOLS, lazy (tool_choice auto) and not (required):
    llama.cpp's byte for byte."""
    source, now, case = path.read_text(), int(time.time()), ParamsCase(tool_choice, True, False)
    llama = run_harness(chat_oracle, case.request(source, now=now, tools=TAGGED_TOOLS,
                                                  parallel_tool_calls=parallel))
    ours = project_params(source, case, now=now, tools=TAGGED_TOOLS, parallel_tool_calls=parallel)
    oracle_report.add("chat params: tagged arguments, other tools", path.stem,
                      identical=int(ours.grammar == llama["grammar"]), total=1)
    assert ours.grammar == llama["grammar"]
    assert ours.grammar_lazy is llama["grammar_lazy"]
    assert [[t.kind, t.value] for t in ours.grammar_triggers] == [
        [t["type"], t["value"]] for t in llama["grammar_triggers"]]


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_template_analysis_is_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """The auto-parser's analysis (reasoning, content, the tool format's mode, markers and JSON fields, the
    tag formats' function, argument and call id markers; the preserved tokens; stops) is llama.cpp's on every
    template, the specialised ones too (llama.cpp analyses them as well, though it then uses their own
    formats)."""
    ours, llama = compare_analysis(chat_oracle, path, now=time.time())
    oracle_report.add("chat auto-parser analysis", "every template", identical=int(ours == llama), total=1)
    if path.stem in ANALYSIS_DIFFERENCES:
        fields, why = ANALYSIS_DIFFERENCES[path.stem]
        assert ours["tool mode"] != llama["tool mode"], why
        ours = {k: v for k, v in ours.items() if k not in fields}
        llama = {k: v for k, v in llama.items() if k not in fields}
    assert ours == llama


def _describe(comparisons: list[ParamsComparison]) -> str:
    return "\n".join(c.describe() for c in comparisons)
