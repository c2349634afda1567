"""sampler_worker.cli: the `sampler-worker generate` command line."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients import Client
from constraintd.engine.chat.requests import AnswerFormat, read_request
from constraintd.errors import InputError
from sampler_worker.chain import SamplerSettings
from sampler_worker.cli import (
    UsageError,
    answers_json,
    build_parser,
    constraint_from,
    main,
    settings_from,
    tools_from,
)
from sampler_worker.prompt import TemplateError, ToolChat, tool_chat
from tests.sampler_worker.conftest import fixed_date


def parse(*argv: str) -> object:
    return build_parser().parse_args(["generate", *argv])


def test_defaults_are_llama_servers() -> None:
    assert settings_from(parse("--prompt", "x")) == SamplerSettings()


def test_sampling_options() -> None:
    args = parse("--prompt", "x", "--seed", "7", "--temp", "0.5", "--top-k", "12", "--top-p", "0.9",
                 "--min-p", "0.1", "--typical-p", "0.8", "--repeat-penalty", "1.2", "--repeat-last-n", "32",
                 "--frequency-penalty", "0.3", "--presence-penalty", "0.4")
    assert settings_from(args) == SamplerSettings(
        seed=7, temperature=0.5, top_k=12, top_p=0.9, min_p=0.1, typical_p=0.8, repeat_penalty=1.2,
        penalty_last_n=32, frequency_penalty=0.3, presence_penalty=0.4,
    )


def test_prompt_or_chat_is_required_and_exclusive() -> None:
    with pytest.raises(SystemExit):
        parse()
    with pytest.raises(SystemExit):
        parse("--prompt", "a", "--chat", "b")


def test_constraints(tmp_path: Path) -> None:
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object"}')
    grammar = tmp_path / "g.gbnf"
    grammar.write_text('root ::= "x"')
    openai = tmp_path / "openai.json"
    openai.write_text('{"response_format": {"type": "json_object"}}')
    ollama = tmp_path / "ollama.json"
    ollama.write_text('{"format": "json"}')
    assert constraint_from(parse("--prompt", "p")) is None
    assert constraint_from(parse("--prompt", "p", "--json")) == {"json_object": True}
    assert constraint_from(parse("--prompt", "p", "--schema", str(schema))) == {
        "json_schema": '{"type": "object"}'
    }
    assert constraint_from(parse("--prompt", "p", "--grammar", str(grammar))) == {"gbnf": 'root ::= "x"'}
    assert constraint_from(parse("--prompt", "p", "--request", str(openai))) == {
        "openai_request": openai.read_text()
    }
    assert constraint_from(parse("--prompt", "p", "--request", str(ollama))) == {
        "ollama_request": '{"format": "json"}'
    }
    # strict and the dialect go with a schema, given or in a request, and with nothing else
    extended = parse("--prompt", "p", "--schema", str(schema), "--strict", "--dialect", "extended")
    assert constraint_from(extended) == {
        "json_schema": '{"type": "object"}', "strict": True, "dialect": "extended"
    }
    assert constraint_from(parse("--prompt", "p", "--request", str(openai), "--strict")) == {
        "openai_request": openai.read_text(), "strict": True
    }
    assert constraint_from(parse("--prompt", "p", "--json", "--strict")) == {"json_object": True}


def test_unreadable_or_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"absent\.json"):
        constraint_from(parse("--prompt", "p", "--schema", str(tmp_path / "absent.json")))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match=r"bad\.json: invalid JSON"):
        constraint_from(parse("--prompt", "p", "--request", str(bad)))


# Which request field a body goes in, and whether it constrains at all, is `read_request`'s answer.
REQUEST_CASES = [
    ('{"response_format": {"type": "json_object"}}', "openai_request"),
    ('{"grammar": "root ::= \\"a\\""}', "openai_request"),
    ('{"format": {"type": "object"}}', "ollama_request"),
    # an OpenAI field that asks for nothing beside Ollama's format: an Ollama request
    ('{"format": "json", "response_format": null}', "ollama_request"),
    # Ollama's format left empty beside an OpenAI grammar: an OpenAI request
    ('{"format": "", "grammar": "root ::= \\"a\\""}', "openai_request"),
    # nothing asked for: no constraint, the generation runs free
    ('{"format": null}', None),
    ('{"messages": [], "response_format": {"type": "text"}}', None),
]


@pytest.mark.parametrize(
    ("body", "field"), REQUEST_CASES,
    ids=["openai-json", "openai-grammar", "ollama-schema", "ollama-beside-null", "openai-beside-empty-format",
         "null-format", "text"],
)
def test_request_dialect_is_read_requests(tmp_path: Path, body: str, field: str | None) -> None:
    path = tmp_path / "request.json"
    path.write_text(body)
    requested = read_request(body)
    assert (requested.kind is AnswerFormat.NONE) is (field is None)
    expected = None if field is None else {field: body}
    assert constraint_from(parse("--prompt", "p", "--request", str(path))) == expected


def test_conflicting_request_is_bad_input_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "request.json"
    path.write_text('{"format": "json", "grammar": "root ::= \\"a\\""}')
    absent = tmp_path / "absent.gguf"
    status = main(["generate", "--model", str(absent), "--prompt", "x", "--request", str(path)])
    assert status == 2
    assert "Cannot use both format and grammar (at #/grammar)" in capsys.readouterr().err


def test_missing_model_fails_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "x"])
    assert status == 1
    assert "nope.gguf: no such file" in capsys.readouterr().err


def test_refused_settings_are_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--prompt", "x", "--repeat-penalty", "0"]) == 2
    assert "penalty_repeat" in capsys.readouterr().err


def generate_json(capsys: pytest.CaptureFixture[str], model: Path, *argv: str) -> dict[str, Any]:
    """`sampler-worker generate ... --output json` in this process, the engine in-process; its report."""
    status = main([
        "generate", "--model", str(model), *argv, "--constraintd", "local",
        "--n-ctx", "256", "--threads", "2", "--output", "json",
    ])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report: dict[str, Any] = json.loads(captured.out)
    return report


@pytest.mark.slow
def test_constrained_generation_in_process(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "."')
    report = generate_json(
        capsys, gemma_path, "--chat", "Is the sky blue? Answer yes or no.", "--grammar", str(grammar),
        "--seed", "5", "--max-tokens", "8",
    )
    assert report["text"] in ("yes.", "no.")
    assert report["content"] == report["text"]  # not JSON: the content is the text
    assert report["stop_reason"] == "eog"
    assert report["seed"] == 5
    assert report["counters"]["draws"] == len(report["tokens"]) + report["counters"]["rejections"]
    # auto begins ahead, and a generation shorter than its probe stays ahead for every step
    assert report["overlap"] == "ahead"
    assert report["counters"]["ahead_steps"] == len(report["tokens"])


@pytest.mark.slow
def test_overlap_ahead_gives_the_same_tokens(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}))
    argv = ("--chat", "Name a city as JSON.", "--schema", str(schema), "--seed", "3", "--max-tokens", "12")
    runs = {mode: generate_json(capsys, gemma_path, *argv, "--overlap", mode) for mode in ("off", "ahead")}
    assert runs["off"]["tokens"] == runs["ahead"]["tokens"]
    assert runs["off"]["rejected_at"] == runs["ahead"]["rejected_at"]
    assert runs["ahead"]["overlap"] == "ahead"
    assert runs["ahead"]["counters"]["ahead_steps"] == len(runs["ahead"]["tokens"])
    assert runs["ahead"]["counters"]["masks"] == len(runs["ahead"]["tokens"])


def test_an_unknown_overlap_mode_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse("--prompt", "x", "--overlap", "sideways")
    assert caught.value.code == 2


@pytest.mark.parametrize(
    ("argv", "json_answer"),
    [
        (("--json",), True),
        (("--schema", "SCHEMA"), True),
        (("--grammar", "GRAMMAR"), False),
        (("--request", "OPENAI_JSON"), True),
        (("--request", "OPENAI_GRAMMAR"), False),
        (("--request", "OLLAMA_JSON"), True),
        ((), False),
    ],
    ids=["json", "schema", "grammar", "openai-json", "openai-grammar", "ollama-json", "none"],
)
def test_which_answers_are_json(tmp_path: Path, argv: tuple[str, ...], json_answer: bool) -> None:
    files = {
        "SCHEMA": '{"type": "object"}',
        "GRAMMAR": 'root ::= "a"',
        "OPENAI_JSON": '{"response_format": {"type": "json_object"}}',
        "OPENAI_GRAMMAR": '{"grammar": "root ::= \\"a\\""}',
        "OLLAMA_JSON": '{"format": "json"}',
    }
    paths = []
    for arg in argv:
        if arg in files:
            path = tmp_path / f"{arg}.txt"
            path.write_text(files[arg])
            arg = str(path)
        paths.append(arg)
    assert answers_json(constraint_from(parse("--prompt", "p", *paths))) is json_answer


@pytest.mark.slow
def test_json_answer_reports_its_content(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}')
    # a chat's schema is llama-server's response format: space around the value (Gemma writes 20 tokens of
    # it here, as it would under llama-server), or a ```json fence
    report = generate_json(
        capsys, gemma_path, "--chat", "Is the sky blue? Answer in JSON.", "--schema", str(schema),
        "--seed", "3", "--max-tokens", "80",
    )
    assert report["stop_reason"] == "eog"
    assert json.loads(report["content"]) in ({"ok": True}, {"ok": False})
    assert report["content"] == report["text"].strip()  # the value alone, without surrounding space


@pytest.mark.slow
def test_bad_grammar_is_bad_input_with_its_place(
    tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grammar = tmp_path / "broken.gbnf"
    grammar.write_text('root ::= "a" |\nrest ::= [z')
    status = main([
        "generate", "--model", str(gemma_path), "--prompt", "x", "--grammar", str(grammar),
        "--constraintd", "local", "--n-ctx", "64",
    ])
    assert status == 2
    assert "line 2" in capsys.readouterr().err


WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def test_tools_are_read_as_llama_cpp_reads_them(tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(WEATHER_TOOLS))
    read = tools_from(parse("--chat", "c", "--tools", str(tools)))
    assert read is not None and [tool.name for tool in read] == ["get_weather", "get_time"]
    assert tools_from(parse("--chat", "c")) is None
    with pytest.raises(UsageError, match="--tools needs --chat"):
        tools_from(parse("--prompt", "p", "--tools", str(tools)))
    with pytest.raises(UsageError, match="give no --json"):
        tools_from(parse("--chat", "c", "--tools", str(tools), "--json"))
    tools.write_text('[{"type": "retrieval"}]')
    with pytest.raises(UsageError, match="Unsupported tool type"):
        tools_from(parse("--chat", "c", "--tools", str(tools)))


def test_tools_without_chat_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(WEATHER_TOOLS))
    status = main(["generate", "--model", str(tmp_path / "absent.gguf"), "--prompt", "x",
                   "--tools", str(tools)])
    assert status == 2
    assert "--tools needs --chat" in capsys.readouterr().err


class TextModel:
    """A stand-in for the model in prompt preparation: one token per byte, and a few special tokens."""

    SPECIAL = ("<tool_call>", "<bos>")

    def __init__(self, template: str | None) -> None:
        self.chat_template = template
        self.bos_text, self.eos_text, self.add_bos, self.add_eos = "<bos>", "<eos>", True, False

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        tokens = [1000] if add_special else []
        while data:
            special = next((s for s in self.SPECIAL if parse_special and data.startswith(s.encode())), None)
            if special is not None:
                tokens.append(1000 + self.SPECIAL.index(special))
                data = data[len(special):]
            else:
                tokens.append(data[0])
                data = data[1:]
        return tokens

    def piece(self, token: int, *, special: bool = True) -> bytes:
        if token >= 1000:
            return self.SPECIAL[token - 1000].encode() if special else b""
        return bytes([token])


def _template(name: str) -> str:
    from tests.chat_oracle.cases import template_paths

    return next(path for path in template_paths() if path.stem == name).read_text()


# TextModel's vocabulary for constraintd: a byte a token, then its special tokens (ids 1000 and up)
TEXT_PIECES = [bytes([i]) for i in range(256)] + [b"\x00"] * (1000 - 256) + [
    s.encode() for s in TextModel.SPECIAL]


@contextlib.contextmanager
def text_chat(
    template: str | None, chat: str, tools: list[dict[str, Any]], **options: Any
) -> Iterator[ToolChat]:
    """`tool_chat` for TextModel on this template, through an in-process constraintd."""
    from constraintd.engine.chat.templates.template_inputs import parse_tools

    with Client("local") as client:
        vocab = client.register_vocab(pieces=TEXT_PIECES)
        model = TextModel(template)
        with tool_chat(client, vocab, model, chat, parse_tools(tools), now=0, **options) as made:
            yield made


def test_a_required_tool_call_prefills_the_generation_prompt() -> None:
    with text_chat(_template("Qwen-Qwen2.5-7B-Instruct"), "Weather in Paris?", WEATHER_TOOLS,
                   tool_choice="required") as chat:
        assert chat.session is not None and not chat.settings.grammar_lazy
        assert chat.settings.prefill == b"<|im_start|>assistant\n" == chat.settings.generation_prompt.encode()
        assert "tool-get-time ::=" in chat.settings.grammar  # both tools
        assert b"get_weather" in bytes(t for t in chat.prompt if t < 256)  # the tools are in the prompt
        text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        message = chat.parse(text)
        assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Paris"}')]


def test_auto_triggers_on_the_call_marker_and_a_name_calls_that_tool() -> None:
    qwen = _template("Qwen-Qwen2.5-7B-Instruct")
    with text_chat(qwen, "Weather in Paris?", WEATHER_TOOLS) as auto:
        assert auto.session is not None and auto.settings.grammar_lazy
        # the word is more than one token here: a pattern of its text, escaped (llama.cpp's regex_escape)
        assert auto.settings.trigger_patterns == ("<tool_call>\n",) and auto.settings.trigger_tokens == ()
        assert auto.preserved == frozenset({1000})  # <tool_call> is one token: its text is written out
    with text_chat(qwen, "Weather in Paris?", WEATHER_TOOLS, tool_choice="get_weather") as named:
        parser = named.settings.format
        assert parser.tool_choice == "required"
        assert [tool["function"]["name"] for tool in parser.tools] == ["get_weather"]
        assert named.session is not None and "tool-get-time ::=" not in named.settings.grammar
    with pytest.raises(InputError, match="tool_choice 'get_news' names none of the tools"), \
            text_chat(qwen, "x", WEATHER_TOOLS, tool_choice="get_news"):
        pass


def test_a_template_without_tool_syntax_gets_no_grammar() -> None:
    with text_chat(None, "Weather in Paris?", WEATHER_TOOLS, tool_choice="required") as chat:
        assert chat.session is None  # ChatML writes no tool calls: llama.cpp constrains nothing either
        assert chat.parse("It is mild.").content == "It is mild."


def test_free_text_is_the_settings_the_service_would_give() -> None:
    # tool_choice none on a template with tool calls: no grammar, so no session, but the prompt with the
    # tools, the template's stops and the parser are what the service gives the same request with a grammar
    qwen = _template("Qwen-Qwen2.5-7B-Instruct")
    with text_chat(qwen, "Weather in Paris?", WEATHER_TOOLS, tool_choice="none") as free, \
            text_chat(qwen, "Weather in Paris?", WEATHER_TOOLS, tool_choice="required") as held:
        assert free.session is None and held.session is not None
        assert (free.prompt, free.preserved, free.stops) == (held.prompt, held.preserved, held.stops)
        assert free.settings.format.tool_choice == "none"
        text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        assert free.parse(text).tool_calls == ()


def test_a_lazy_grammar_on_a_thinking_template_gets_llama_servers_reasoning_budget() -> None:
    from sampler_worker.reasoning_budget import UNLIMITED, BudgetState

    think, end = TextModel(None).tokenize("<think>", add_special=False), TextModel(None).tokenize(
        "</think>", add_special=False)
    # QwQ's generation prompt ends in the start tag: the block is open from the first token
    with text_chat(_template("Qwen-QwQ-32B"), "Weather in Paris?", WEATHER_TOOLS) as auto:
        assert auto.session is not None and auto.settings.grammar_lazy
        assert auto.settings.generation_prompt.endswith("<think>\n")
        budget = auto.reasoning_budget(TextModel(None))
        assert budget is not None and budget.state == BudgetState.COUNTING and budget.budget == UNLIMITED
        assert budget.forced == tuple(end)
        limited = auto.reasoning_budget(TextModel(None), 2, "Enough.")
        assert limited is not None and limited.forced == (*b"Enough.", *end)
    with text_chat(_template("Qwen-Qwen3-0.6B"), "Weather in Paris?", WEATHER_TOOLS) as qwen3:
        budget = qwen3.reasoning_budget(TextModel(None))
        assert budget is not None and budget.state == BudgetState.IDLE
        for token in think:
            budget.accept(token)
        assert budget.state == BudgetState.COUNTING
    # no lazy grammar to keep the block from and no limit: llama-server makes no budget
    with text_chat(_template("Qwen-QwQ-32B"), "Weather in Paris?", WEATHER_TOOLS,
                   tool_choice="required") as required:
        assert not required.settings.grammar_lazy and required.settings.prefill
        assert required.reasoning_budget(TextModel(None)) is None
        # a budget of 0 forces from the start tag on; the prompt's newline after it is accepted as the
        # first forced token, as llama.cpp's sampler counts any token it accepts while forcing
        forced = required.reasoning_budget(TextModel(None), 0)
        assert forced is not None and forced.state == BudgetState.FORCING and forced.forced_token() == end[1]


def test_a_template_that_does_not_render_is_a_template_error() -> None:
    # the service's ChatTemplateError, said by the worker as its own template errors (HTTP: invalid_template)
    from sampler_worker.serve.errors import http_error

    with pytest.raises(TemplateError, match="no such chat") as caught, \
            text_chat("{{ raise_exception('no such chat') }}", "Weather in Paris?", WEATHER_TOOLS):
        pass
    assert (http_error(caught.value).status, http_error(caught.value).code) == (400, "invalid_template")


def test_regex_escape_is_llama_cpps() -> None:
    from sampler_worker.prompt import regex_escape

    assert regex_escape('{"type": "function",') == '\\{"type": "function",'
    assert regex_escape("a.b*c?[d](e)|^$\\") == "a\\.b\\*c\\?\\[d\\]\\(e\\)\\|\\^\\$\\\\"


@pytest.mark.slow
def test_a_tool_call_end_to_end(tmp_path: Path, gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma 3 270M with Llama 3.2's template (JSON calls after free text): tool_choice required gives a
    call the parser reads, the text before it as content."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(WEATHER_TOOLS[:1]))
    template = tmp_path / "llama3.2.jinja"
    template.write_text(_template("meta-llama-Llama-3.2-3B-Instruct"))
    with fixed_date():
        status = main([
            "generate", "--model", str(gemma_path), "--chat", "What is the weather in Paris?",
            "--tools", str(tools), "--tool-choice", "required", "--chat-template", str(template),
            "--seed", "1", "--max-tokens", "80", "--constraintd", "local", "--n-ctx", "512", "--threads", "1",
            "--output", "json",
        ])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report = json.loads(captured.out)
    [call] = report["tool_calls"]
    assert call["name"] == "get_weather" and "city" in json.loads(call["arguments"])
    assert report["text"].startswith(report["content"]) and report["reasoning_content"] == ""
    assert report["stop_reason"] == "eog"
