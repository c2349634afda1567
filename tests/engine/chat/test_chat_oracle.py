"""llama.cpp's chat layer as an oracle (tests/chat_oracle), and the project's chat prompts against it.

Issue 18 ports llama.cpp's chat layer. Its prompt: the project's path (the message rewrites and template
variables of constraintd.engine.chat.templates.template_inputs, rendered by
sampler_worker.prompt.render_template) with the capabilities it finds in the template (checked against
llama.cpp's own on every template)
renders every template of the reference (models/templates/, 70 of them) on the cases of
tests/chat_oracle/cases.py, and the prompt is compared byte for byte with llama.cpp's. Every case is
identical except those listed with their reason, so a case that stops being identical fails the test, and so
does a listed one that becomes identical. The counts go to the end-of-run table, one row per template.

The harness's other outputs (format, grammar, triggers, the parser) are checked to run on every template;
`python -m tests.chat_oracle.survey` prints them as a table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from constraintd.engine.chat.templates.template_inputs import parse_messages
from sampler_worker.prompt import TemplateError, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import CASES, JINJA_CASES, MESSAGE_SETS, WEATHER_TOOL, ChatCase, template_paths
from tests.chat_oracle.compare import PromptComparison, compare_drawn, compare_template, llama_caps
from tests.chat_oracle.drawn import drawn_requests
from tests.conftest import OracleReport

TEMPLATES = template_paths()
TEMPLATE_COUNT = 70  # *.jinja files under the pinned llama.cpp's models/templates/ (and a README.md)
FORMATS = {"Content-only", "peg-simple", "peg-native", "peg-gemma4", "peg-minimax-m3"}

ALL = tuple(case.name for case in CASES)

# Where the project's path does not render llama.cpp's prompt: template -> {case: why}. Every other case of
# every template renders byte for byte the same prompt, and a case that stops doing so fails the test.
SAME_REFUSAL = "both refuse: the template raises, and llama.cpp's error ends with the same message"
EXPECTED_DIFFERENCES: dict[str, dict[str, str]] = {
    # a tool turn between user and assistant ("Conversation roles must alternate user/assistant/...")
    "google-gemma-2-2b-it": {"tool_result +tools": SAME_REFUSAL, "parallel_calls +tools": SAME_REFUSAL},
    # "This model only supports single tool-calls at once!"
    "meta-llama-Llama-3.1-8B-Instruct": {"parallel_calls +tools": SAME_REFUSAL},
    "meta-llama-Llama-3.2-3B-Instruct": {"parallel_calls +tools": SAME_REFUSAL},
    "meta-llama-Llama-3.3-70B-Instruct": {"parallel_calls +tools": SAME_REFUSAL},
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
    "google-gemma-2-2b-it": {"tool_result +tools": "Unable to generate parser for this template",
                             "parallel_calls +tools": "Unable to generate parser for this template"},
    # the template raises on two calls in one turn (the chat layer's own error, before its parser)
    **{name: {"parallel_calls +tools": "This model only supports single tool-calls at once!"}
       for name in ("meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct",
                    "meta-llama-Llama-3.3-70B-Instruct")},
}


def test_every_template_is_read() -> None:
    assert len(TEMPLATES) == TEMPLATE_COUNT


def test_expected_differences_name_real_templates_and_cases() -> None:
    names = {path.stem for path in TEMPLATES}
    for template, cases in EXPECTED_DIFFERENCES.items():
        assert template in names
        assert set(cases) <= set(ALL) and cases
        assert all(cases.values())


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_prompt_is_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """The project's prompt is llama.cpp's, byte for byte, on every case but the listed ones, and so is the
    generation prompt (common_chat_params.generation_prompt) wherever llama.cpp answers."""
    comparisons = compare_template(chat_oracle, path)
    identical = [c.case for c in comparisons if c.identical]
    oracle_report.add("chat prompts (project template path)", path.stem, identical=len(identical),
                      total=len(comparisons))
    expected = EXPECTED_DIFFERENCES.get(path.stem, {})
    refused = {c.case: c.llama.error or "" for c in comparisons if c.llama.error}
    expected_refusals = LLAMA_REFUSALS.get(path.stem, {})
    assert set(refused) == set(expected_refusals), f"llama.cpp refused: {refused}"
    for case, message in expected_refusals.items():
        assert message in refused[case]
    assert len(identical) == len(comparisons) - len(expected), _describe(comparisons)
    answered = [c for c in comparisons if c.llama.error is None]
    same_generation = [c for c in answered if c.same_generation_prompt]
    oracle_report.add("chat generation prompts", path.stem, identical=len(same_generation),
                      total=len(answered))
    assert len(same_generation) == len(answered), [
        (c.case, c.ours.generation_prompt, c.llama.generation_prompt) for c in answered]
    for c in comparisons:
        if c.case in expected:
            assert not c.identical
            assert c.same_refusal == (expected[c.case] == SAME_REFUSAL), _describe([c])


# Where the project's renderer and llama.cpp's Jinja still part (JINJA_CASES index -> why): all are
# features llama.cpp lacks, where the project's renderer is the more lenient, or a different shape of value.
JINJA_DIFFERENCES = {
    1: "llama.cpp's Jinja has no // operator (a parse error); Jinja2 divides",
    11: "'abc'[-1] is '' in llama.cpp (no negative string index), 'c' in Jinja2",
    12: "llama.cpp's dictsort gives a mapping (tojson writes an object), Jinja2's a list of pairs",
    25: "select with no test is refused by llama.cpp, keeps the true items in Jinja2",
    36: "llama.cpp has no sum filter",
    38: "llama.cpp's unique filter on a list is not implemented (it raises)",
}


@pytest.mark.oracle
def test_jinja_cases_render_as_llama_cpps(chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Small templates on single points of llama.cpp's Jinja dialect render as llama.cpp renders them,
    except the listed ones."""
    from sampler_worker.prompt import chat_prompt_of

    user = [{"role": "user", "content": "hi"}]
    differing = {}
    for number, source in enumerate(JINJA_CASES):
        request = {"template": source, "messages": user, "add_generation_prompt": False}
        llama = run_harness(chat_oracle, request)
        try:
            made = chat_prompt_of(source, parse_messages(user), add_generation_prompt=False)
            ours: str | None = made.prompt
        except TemplateError:
            ours = None
        if ours != llama.get("prompt"):
            differing[number] = (source, ours, llama)
    oracle_report.add("Jinja dialect cases", "small templates", identical=len(JINJA_CASES) - len(differing),
                      total=len(JINJA_CASES))
    assert set(differing) == set(JINJA_DIFFERENCES), differing


DRAWN_PER_TEMPLATE = 3


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_drawn_prompts_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Conversations drawn at random (tests/chat_oracle/drawn.py; seeded per template) render as llama.cpp
    renders them, with its generation prompt, or both refuse for the template's own error."""
    seed = TEMPLATES.index(path)
    comparisons = compare_drawn(chat_oracle, path, drawn_requests(seed, DRAWN_PER_TEMPLATE))
    agreeing = [c for c in comparisons if c.identical or c.same_refusal]
    oracle_report.add("chat prompts, drawn conversations (or the same refusal)", "every template",
                      identical=len(agreeing), total=len(comparisons))
    assert len(agreeing) == len(comparisons), _describe(comparisons)
    for c in comparisons:
        assert c.identical == (c.llama.error is None), _describe([c])
        assert c.llama.error is not None or c.same_generation_prompt, _describe([c])


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_caps_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """The capabilities the project finds in a template are those llama.cpp finds (jinja::caps)."""
    source = path.read_text()
    ours, llama = template_caps(source), llama_caps(chat_oracle, source)
    oracle_report.add("chat template capabilities", "every template", identical=int(ours == llama), total=1)
    assert ours == llama


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


@pytest.mark.oracle
def test_the_bundled_models_chat_prompt_is_llama_cpps(chat_oracle: Path, gemma_path: Path) -> None:
    """The sampler worker's chat prompt for the bundled model is llama.cpp's, on every message set without
    tools: the model's own template, or ChatML where it has none (Gemma 3 270M's GGUF has none), with its
    BOS and EOS texts, before the BOS text is cut for the tokenizer."""
    from sampler_worker.model import Model
    from sampler_worker.prompt import chat_prompt_of

    with Model(gemma_path, n_ctx=64, n_threads=1) as model:
        source, bos, eos = model.chat_template, model.bos_text, model.eos_text
    for case in CASES:
        if case.tools:
            continue
        request = {**case.request(source or "chatml"), "bos_token": bos, "eos_token": eos}
        llama = run_harness(chat_oracle, request)
        ours = chat_prompt_of(source or "", parse_messages(MESSAGE_SETS[case.messages]), bos_text=bos,
                              eos_text=eos, enable_thinking=case.thinking,
                              add_generation_prompt=case.generation_prompt)
        assert ours.prompt == llama["prompt"], case.name
        assert ours.generation_prompt == llama["generation_prompt"], case.name
