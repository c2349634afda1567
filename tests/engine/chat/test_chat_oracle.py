"""llama.cpp's chat layer as an oracle (tests/chat_oracle), and the first question it answers.

Issue 18 ports llama.cpp's chat layer; its template rendering may use the project's existing template path
(sampler_worker.prompt.chat_text: Jinja2) only where that renders exactly as llama.cpp does. Here every
template of the reference (models/templates/, 70 of them) is rendered by both, on the cases of
tests/chat_oracle/cases.py, and the prompts are compared byte for byte: where they are identical the test
says so, and where they differ the difference is listed below with its cause, so that a difference that
goes away, or a new one, fails the test. The counts go to the end-of-run table, one row per template.

The harness's other outputs (format, grammar, triggers, the parser) are checked to run on every template;
`python -m tests.chat_oracle.survey` prints them as a table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chat_oracle.build import harness_binary, run_harness
from tests.chat_oracle.cases import CASES, MESSAGE_SETS, WEATHER_TOOL, ChatCase, template_paths
from tests.chat_oracle.compare import (
    PromptComparison,
    compare_template,
    project_prompt,
    render_like_chat_text,
)
from tests.conftest import OracleReport

TEMPLATES = template_paths()
TEMPLATE_COUNT = 70  # *.jinja files under the pinned llama.cpp's models/templates/ (and a README.md)
FORMATS = {"Content-only", "peg-simple", "peg-native", "peg-gemma4", "peg-minimax-m3"}

ALL = tuple(case.name for case in CASES)
WITH_TOOLS = tuple(case.name for case in CASES if case.tools)
TOOL_RESULT = ("tool_result +tools",)

# Why the project's path renders something else than llama.cpp (each cause read off the two prompts).
# Its Jinja2 environment, beside llama.cpp's Jinja engine:
BREAK = "{% break %} needs Jinja2's loopcontrols extension, which chat_text does not load"
GENERATION = "{% generation %} (transformers' assistant-mask tag) is unknown to Jinja2"
STRFTIME = "strftime_now is undefined in chat_text's environment (llama.cpp's Jinja has it)"
SORTED = "Jinja2's tojson sorts keys and writes ' as \\u0027; llama.cpp's keeps the tool's key order"
MARKUP = "Jinja2's tojson returns Markup, so text joined to it is HTML-escaped (&lt; &#34; &#39;)"
ENSURE_ASCII = "Jinja2's tojson takes no ensure_ascii argument"
FROM_JSON = "no from_json filter in Jinja2"
APPEND = "list.append is refused by Jinja2's immutable sandbox"
GENERATOR = "tools|map(...) is a generator in Jinja2, which tojson cannot write"
FUNCTIONS = "joins an undefined `functions` to text: Jinja2's Undefined raises, llama.cpp's renders nothing"
# The variables and messages llama.cpp's chat layer gives the template:
THINKING = "llama.cpp sets enable_thinking (true by default); unset here, the no-thinking branch runs"
DATE = "llama.cpp sets date_string to today; unset here, the template's default 26 Jul 2024"
DATETIME = "llama.cpp sets datetime to today, which the template prints"
SYSTEM = "no system role: llama.cpp folds the system message into the user turn; here the template raises"
NULL_CONTENT = "the tool-call turn's content is null: llama.cpp renders it as '' (its workaround), here None"
ARGUMENTS = "llama.cpp gives tool-call arguments as an object; here the request's JSON string"


def _why(cases: tuple[str, ...], *reasons: str) -> tuple[tuple[str, ...], str]:
    return cases, "; ".join(reasons)


# Where the project's path does not render what llama.cpp renders: template -> (cases, why).
EXPECTED_DIFFERENCES: dict[str, tuple[tuple[str, ...], str]] = {
    "Apertus-8B-Instruct": _why(ALL, THINKING),
    "Apriel-1.6-15b-Thinker-fixed": _why(TOOL_RESULT, MARKUP),
    "Bielik-11B-v3.0-Instruct": _why(ALL, THINKING, SORTED, NULL_CONTENT),
    "ByteDance-Seed-OSS": _why(TOOL_RESULT, ARGUMENTS),
    "Cohere2MoE": _why(ALL, BREAK),
    "CohereForAI-c4ai-command-r-plus-tool_use": _why(TOOL_RESULT, NULL_CONTENT),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": _why(ALL, BREAK),
    "GLM-4.6": _why(WITH_TOOLS, ENSURE_ASCII),
    "GLM-4.7-Flash": _why(WITH_TOOLS, ENSURE_ASCII),
    "Kimi-K2-Instruct": _why(WITH_TOOLS, SORTED, APPEND),
    "Kimi-K2-Thinking": _why(WITH_TOOLS, SORTED, APPEND),
    "Kimi-K3": _why(ALL, BREAK),
    "LFM2-8B-A1B": _why(WITH_TOOLS, MARKUP),
    "LFM2.5-8B-A1B": _why(ALL, GENERATION),
    "LFM2.5-Instruct": _why(WITH_TOOLS, MARKUP),
    "MiMo-VL": _why(WITH_TOOLS, SORTED),
    "MiniMax-M1": _why(WITH_TOOLS, SORTED),
    "MiniMax-M2": _why(WITH_TOOLS, ENSURE_ASCII),
    "MiniMax-M3": _why(WITH_TOOLS, ENSURE_ASCII),
    "Mistral-Small-3.2-24B-Instruct-2506": _why(ALL, STRFTIME),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _why(TOOL_RESULT, ARGUMENTS),
    "NVIDIA-Nemotron-Nano-v2": _why(WITH_TOOLS, SORTED),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": _why(WITH_TOOLS, SORTED),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": _why(WITH_TOOLS, SORTED),
    "Qwen-QwQ-32B": _why(ALL, THINKING, SORTED, NULL_CONTENT),
    "Qwen-Qwen2.5-7B-Instruct": _why(WITH_TOOLS, SORTED),
    "Qwen-Qwen3-0.6B": _why(WITH_TOOLS, SORTED, NULL_CONTENT),
    "Qwen3-Coder": _why(TOOL_RESULT, ARGUMENTS),
    "Qwen3.5-4B": _why(WITH_TOOLS, SORTED, ARGUMENTS),
    "Reka-Edge": _why(ALL, BREAK),
    "Spark2.5": _why(WITH_TOOLS, SORTED, ARGUMENTS),
    "StepFun3.5-Flash": _why(WITH_TOOLS, ENSURE_ASCII),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": _why(TOOL_RESULT, NULL_CONTENT),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": _why(ALL, THINKING, MARKUP),
    "deepseek-ai-DeepSeek-V3.1": _why(ALL, THINKING, MARKUP),
    "deepseek-ai-DeepSeek-V3.2": _why(ALL, THINKING, MARKUP, FROM_JSON),
    "deepseek-ai-DeepSeek-V4-Flash-0731": _why(ALL, THINKING, MARKUP, FROM_JSON),
    "deepseek-ai-DeepSeek-V4": _why(ALL, THINKING, MARKUP, FROM_JSON),
    "fireworks-ai-llama-3-firefunction-v2": _why(ALL, FUNCTIONS, DATETIME),
    "google-gemma-2-2b-it": _why(ALL, SYSTEM),
    "google-gemma-4-31B-it-interleaved": _why(ALL, THINKING),
    "google-gemma-4-31B-it": _why(ALL, THINKING),
    "ibm-granite-granite-3.3-2B-Instruct": _why(WITH_TOOLS, SORTED, NULL_CONTENT),
    "ibm-granite-granite-4.0": _why(WITH_TOOLS, MARKUP),
    "ibm-granite-granite-4.1": _why(WITH_TOOLS, MARKUP),
    "inclusionai-ling-3.0-flash": _why(WITH_TOOLS, SORTED, ARGUMENTS),
    "llama-cpp-deepseek-r1": _why(WITH_TOOLS, GENERATOR),
    "llama-cpp-rwkv-world": _why(ALL, THINKING, NULL_CONTENT),
    "meetkai-functionary-medium-v3.1": _why(WITH_TOOLS, SORTED),
    "meta-llama-Llama-3.1-8B-Instruct": _why(ALL, DATE),
    "meta-llama-Llama-3.2-3B-Instruct": _why(ALL, DATE),
    "meta-llama-Llama-3.3-70B-Instruct": _why(ALL, DATE),
    "microsoft-Phi-3.5-mini-instruct": _why(TOOL_RESULT, NULL_CONTENT),
    "mistralai-Ministral-3-14B-Reasoning-2512": _why(WITH_TOOLS, SORTED, NULL_CONTENT),
    "mistralai-Mistral-Nemo-Instruct-2407": _why(WITH_TOOLS, SORTED, MARKUP),
    "moonshotai-Kimi-K2": _why(WITH_TOOLS, SORTED),
    "muse-glimmer": _why(WITH_TOOLS, MARKUP, ARGUMENTS),
    "openai-gpt-oss-120b": _why(ALL, STRFTIME),
    "openbmb-MiniCPM5-1B": _why(ALL, THINKING, ENSURE_ASCII),
    "poolside-Laguna-S-2.1": _why(ALL, GENERATION),
    "poolside-Laguna-XS-2.1": _why(ALL, GENERATION),
    "poolside-Laguna-XS.2": _why(ALL, GENERATION),
    "tencent-Hy3": _why(WITH_TOOLS, SORTED, ARGUMENTS),
    "unsloth-Apriel-1.5": _why(TOOL_RESULT, MARKUP),
    "unsloth-mistral-Devstral-Small-2507": _why(WITH_TOOLS, SORTED, NULL_CONTENT),
    "upstage-Solar-Open-100B": _why(ALL, STRFTIME),
}
# Templates for which llama.cpp's chat layer (auto-parser) finds no tool-call syntax: a request with tools
# gets the tools rendered into the prompt where the template can, but no grammar and no triggers.
NO_TOOL_GRAMMAR = {
    "HuggingFaceTB-SmolLM3-3B", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "google-gemma-2-2b-it",
    "ibm-granite-granite-3.3-2B-Instruct", "llama-cpp-rwkv-world", "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct",
    "microsoft-Phi-3.5-mini-instruct",
}
# Templates whose parser (reasoning_format auto, as llama-server's default) refuses a plain answer with no
# tool call: their format wants a frame around every answer (Cohere's Response/START_RESPONSE, functionary's
# ">>>all", gpt-oss's channels, Muse Glimmer's recipients).
PLAIN_ANSWER_REFUSED = {
    "CohereForAI-c4ai-command-r-plus-tool_use", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
    "meetkai-functionary-medium-v3.2", "muse-glimmer", "openai-gpt-oss-120b",
}
# Cases llama.cpp itself refuses (its error, from the harness): template -> {case: start of the message}.
LLAMA_REFUSALS = {
    # the template raises on a tool turn ("Conversation roles must alternate user/assistant/...")
    "google-gemma-2-2b-it": {"tool_result +tools": "Unable to generate parser for this template"},
}


@pytest.fixture(scope="module")
def chat_oracle(pytestconfig: pytest.Config) -> Path:
    """llama.cpp's chat layer, built from the reference on first use (about ten minutes, then cached)."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def progress(line: str) -> None:
        # the build is long: say so on the terminal even while output is captured
        if reporter is None or capture is None:
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(line)

    return harness_binary(progress=progress)


def test_every_template_is_read() -> None:
    assert len(TEMPLATES) == TEMPLATE_COUNT


def test_expected_differences_name_real_templates_and_cases() -> None:
    names = {path.stem for path in TEMPLATES}
    for template, (cases, reason) in EXPECTED_DIFFERENCES.items():
        assert template in names
        assert set(cases) <= set(ALL) and cases
        assert reason


@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_render_like_chat_text_is_chat_text(path: Path) -> None:
    """The tool cases go through a copy of chat_text's environment: it must render as chat_text does."""
    source = path.read_text()
    for case in CASES:
        if case.tools:
            continue
        ours = project_prompt(source, case)
        copy = render_like_chat_text(source, MESSAGE_SETS[case.messages], None)
        assert (copy.prompt is None) == (ours.prompt is None)
        assert copy.prompt == ours.prompt


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_prompt_is_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    comparisons = compare_template(chat_oracle, path)
    identical = [c.case for c in comparisons if c.identical]
    oracle_report.add("chat prompts (project template path)", path.stem, identical=len(identical),
                      total=len(comparisons))
    differing = tuple(c.case for c in comparisons if not c.identical)
    expected = EXPECTED_DIFFERENCES.get(path.stem, ((), ""))[0]
    refused = {c.case: c.llama.error or "" for c in comparisons if c.llama.error}
    expected_refusals = LLAMA_REFUSALS.get(path.stem, {})
    assert set(refused) == set(expected_refusals), f"llama.cpp refused: {refused}"
    for case, message in expected_refusals.items():
        assert message in refused[case]
    assert differing == expected, _describe(comparisons)


def _describe(comparisons: list[PromptComparison]) -> str:
    lines = []
    for c in comparisons:
        if not c.identical:
            lines.append(f"{c.case}: ours {c.ours.error or repr(c.ours.prompt)[:300]}\n"
                         f"    llama.cpp {c.llama.error or repr(c.llama.prompt)[:300]}")
    return "\n".join(lines)


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_chat_params_on_every_template(path: Path, chat_oracle: Path) -> None:
    """Format detection, grammar and parser generation run on every template, with tools and without."""
    source = path.read_text()
    plain = run_harness(chat_oracle, ChatCase("system+user", tools=False).request(source))
    tools = run_harness(chat_oracle, ChatCase("system+user", tools=True).request(source))
    assert "error" not in plain, plain
    assert "error" not in tools, tools
    assert plain["format"] in FORMATS and tools["format"] in FORMATS
    assert tools["prompt"]
    # a tool request gets a grammar that names the tool, except where llama.cpp finds no tool-call syntax
    names_the_tool = WEATHER_TOOL["function"]["name"] in tools["grammar"]  # type: ignore[index]
    assert names_the_tool == (path.stem not in NO_TOOL_GRAMMAR), tools["grammar"]
    assert tools["grammar_lazy"] == names_the_tool


@pytest.mark.oracle
def test_parse_mode_reads_a_tool_call(chat_oracle: Path) -> None:
    """common_chat_parse through the harness: a Hermes-style call after some text (Qwen 2.5's template)."""
    source = (TEMPLATES[0].parent / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    case = ChatCase("system+user", tools=True)
    answer = run_harness(chat_oracle, case.request(source, mode="parse", text=text))
    assert answer == {
        "role": "assistant", "content": "Let me look.\n", "reasoning_content": "",
        "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Paris"}', "id": ""}],
    }
    partial = run_harness(chat_oracle, case.request(source, mode="parse", text=text[:40], is_partial=True))
    assert partial["content"] == "Let me look.\n"


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_parser_on_a_plain_answer(path: Path, chat_oracle: Path) -> None:
    """common_chat_parse runs on every template: a plain answer (tools offered, none called) is content or
    reasoning, except for the formats listed that require a frame."""
    text = "The capital is Paris."
    request = ChatCase("system+user", tools=True).request(
        path.read_text(), mode="parse", text=text, reasoning_format="auto")
    answer = run_harness(chat_oracle, request)
    if path.stem in PLAIN_ANSWER_REFUSED:
        refusal = "The model produced output that does not match the expected peg-native format"
        assert answer == {"error": refusal, "stage": "parse"}
        return
    assert "error" not in answer, answer
    assert answer["tool_calls"] == []
    assert text in answer["content"] + answer["reasoning_content"]


@pytest.mark.oracle
def test_llama_cpp_errors_come_back_as_json(chat_oracle: Path) -> None:
    """A template llama.cpp cannot parse, one that raises, and a bad request: an error object, exit 0."""
    assert run_harness(chat_oracle, {"template": "{% for %}"}) == {
        "error": "Unexpected token: %} of type 9", "stage": "init"}
    raising = run_harness(chat_oracle, ChatCase("system+user", tools=False).request(
        "{{ raise_exception('no system role') }}"))
    assert raising["stage"] == "apply"
    assert raising["error"].endswith("Error: Jinja Exception: no system role")
    assert run_harness(chat_oracle, {"template": "x", "messages": 5}) == {
        "error": "Failed to parse messages: Expected 'messages' to be an array, got 5", "stage": "apply"}
