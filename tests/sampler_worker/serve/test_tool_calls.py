"""Tool calls through `sampler-worker serve`, driven by the `openai` client: Gemma 3 270M with Llama 3.2's
chat template (JSON calls after free text) given as the server's `--chat-template`, as the generate
command's own end-to-end test runs it. The answer whole and streamed, `tool_choice` required, none and
named, the 400 of a chat whose tool calls are not ported, the tokens of `sampler-worker generate
--tools` with the same settings, and two tool chats at once in two slots (`--parallel 2`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from constraintd.engine.chat.params.chat_params import NotPorted
from sampler_worker.cli import main
from sampler_worker.serve.errors import http_error
from tests.sampler_worker.conftest import fixed_date
from tests.sampler_worker.serve.conftest import LiveServer, live_server
from tests.sampler_worker.test_cli import WEATHER_TOOLS, _template

LLAMA_32 = "meta-llama-Llama-3.2-3B-Instruct"
QUESTION = "What is the weather in Paris?"
MESSAGES: list[Any] = [{"role": "user", "content": QUESTION}]
TOOLS: list[Any] = WEATHER_TOOLS  # get_weather(city), get_time()


@pytest.fixture(scope="module")
def tool_server(gemma_path: Path) -> Iterator[LiveServer]:
    # the chats rendered on one day, as `sampler-worker generate` in the test that compares with it
    with fixed_date(), live_server(gemma_path, parallel=1, max_queue=4, timeout=300, n_ctx=1024,
                                   template=_template(LLAMA_32)) as live:
        yield live


@pytest.fixture
def client(tool_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{tool_server.url}/v1", api_key="unused", max_retries=0,
                       timeout=300) as client:
        yield client
    tool_server.wait_idle()


def _streamed(client: openai.OpenAI, **request: Any) -> dict[str, Any]:
    """The deltas of a streamed answer put together, with the chunks' finish reason and the deltas' shapes."""
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    firsts: list[dict[str, Any]] = []
    with client.chat.completions.create(stream=True, **request) as stream:
        for chunk in stream:
            [choice] = chunk.choices
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or ():
                if call.index not in calls:
                    firsts.append(call.model_dump(exclude_none=True))
                    assert call.function is not None
                    calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:  # the id and the name come once, with the call's first delta
                    assert call.id is None and (call.function is None or call.function.name is None)
                assert call.function is not None
                calls[call.index]["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "finish": finish, "firsts": firsts,
            "calls": [calls[index] for index in sorted(calls)]}


def test_a_required_call_whole_and_streamed(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {"model": "gemma", "messages": MESSAGES, "tools": WEATHER_TOOLS[:1],
                               "tool_choice": "required", "seed": 1, "max_tokens": 80}
    whole = client.chat.completions.create(**request)
    [choice] = whole.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    assert len(call.id) == 32 and call.id.isalnum()  # llama-server's random id
    assert choice.message.content  # Gemma writes a sentence before the call

    streamed = _streamed(client, **request)
    assert streamed["finish"] == "tool_calls"
    assert streamed["content"] == choice.message.content and streamed["reasoning"] == ""
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == \
        [("get_weather", call.function.arguments)]
    [first] = streamed["firsts"]
    assert first["type"] == "function" and len(first["id"]) == 32


def test_tool_choice_none_answers_text(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="gemma", messages=MESSAGES, tools=TOOLS,
                                           tool_choice="none", seed=1, max_tokens=24)
    [choice] = whole.choices
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_a_named_tool_choice_calls_that_tool(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {
        "model": "gemma", "messages": [{"role": "user", "content": "What time is it?"}],
        "tools": WEATHER_TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "seed": 1, "max_tokens": 80}
    whole = client.chat.completions.create(**request)
    [choice] = whole.choices
    assert [call.function.name for call in choice.message.tool_calls or []] == ["get_time"]
    streamed = _streamed(client, **request)
    assert [c["name"] for c in streamed["calls"]] == ["get_time"]
    assert streamed["calls"][0]["arguments"] == (choice.message.tool_calls or [])[0].function.arguments


def test_a_tool_choice_that_names_no_tool_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gemma", messages=MESSAGES, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_news"}})
    assert refused.value.status_code == 400 and "get_news" in refused.value.message


def test_a_chat_whose_tool_calls_are_not_ported_is_a_400() -> None:
    # every template of the reference is ported now: the answer the server gives where one is not (a part
    # of llama.cpp's chat layer the request needs, named), as the server makes it from the refusal
    error = http_error(NotPorted("the tag formats' argument markers and atomic function names"))
    assert (error.status, error.type, error.code, error.param) == (
        400, "invalid_request_error", "not_supported", "tools")
    assert error.message == ("not supported on this chat template: the tag formats' argument markers and "
                             "atomic function names")


@pytest.mark.slow  # the command loads the model again
def test_a_tool_call_is_the_generate_commands_tokens(
    tool_server: LiveServer, gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    tools, template = tmp_path / "tools.json", tmp_path / "llama-3.2.jinja"
    tools.write_text(json.dumps(WEATHER_TOOLS[:1]))
    template.write_text(_template(LLAMA_32))
    status = main([
        "generate", "--model", str(gemma_path), "--chat", QUESTION, "--tools", str(tools),
        "--tool-choice", "required", "--chat-template", str(template), "--seed", "1", "--max-tokens", "80",
        "--n-ctx", "1024", "--constraintd", "local", "--output", "json",
    ])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report = json.loads(captured.out)

    request = {"messages": MESSAGES, "tools": WEATHER_TOOLS[:1], "tool_choice": "required", "seed": 1,
               "max_tokens": 80, "return_tokens": True}
    with tool_server.http() as http:
        whole = http.post("/v1/chat/completions", json=request).json()
        with http.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines()
                      if line and line != "data: [DONE]"]
    tool_server.wait_idle()
    assert whole["tokens"] == report["tokens"]
    assert [token for chunk in chunks for token in chunk.get("tokens", [])] == report["tokens"]
    message = whole["choices"][0]["message"]
    assert message["content"] == report["content"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == \
        [(c["name"], c["arguments"]) for c in report["tool_calls"]]


def test_tools_beside_a_grammar_are_refused(tool_server: LiveServer) -> None:
    with tool_server.http() as http:
        answer = http.post("/v1/chat/completions", json={
            "messages": MESSAGES, "tools": WEATHER_TOOLS, "grammar": 'root ::= "x"'})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools"


def test_tools_on_completions_are_ignored(tool_server: LiveServer) -> None:
    with tool_server.http() as http:
        answer = http.post("/v1/completions", json={
            "prompt": "The capital of France is", "tools": WEATHER_TOOLS, "seed": 1, "max_tokens": 4})
    tool_server.wait_idle()
    assert answer.status_code == 200 and "tool_calls" not in answer.json()["choices"][0]


def _calls_of(lines: Iterator[str]) -> tuple[list[tuple[str, str]], str | None]:
    """The tool calls (name, arguments) a streamed answer's deltas put together, and its finish reason."""
    calls: dict[int, list[str]] = {}
    finish = None
    for line in lines:
        if not line or line == "data: [DONE]":
            continue
        [choice] = json.loads(line.removeprefix("data: "))["choices"]
        for call in choice["delta"].get("tool_calls") or ():
            function = call.get("function") or {}
            found = calls.setdefault(call["index"], ["", ""])
            found[0] += function.get("name") or ""
            found[1] += function.get("arguments") or ""
        finish = choice.get("finish_reason") or finish
    return [(name, arguments) for name, arguments in (calls[i] for i in sorted(calls))], finish


def test_tool_calls_in_two_slots_at_once(gemma_path: Path) -> None:
    # --parallel 2: two tool chats decoded in one batch, each under its own grammar and preserved tokens
    # (batching changes llama.cpp's floats, so the tokens need not be those of --parallel 1; the calls are
    # the ones each request asks for, with arguments that are JSON objects)
    weather = {"messages": MESSAGES, "tools": WEATHER_TOOLS[:1], "tool_choice": "required", "seed": 1,
               "max_tokens": 120, "stream": True}
    time_of_day = {"messages": [{"role": "user", "content": "What time is it?"}], "tools": WEATHER_TOOLS,
                   "tool_choice": {"type": "function", "function": {"name": "get_time"}}, "seed": 1,
                   "max_tokens": 120, "stream": True}
    with live_server(gemma_path, parallel=2, max_queue=0, timeout=300, n_ctx=1024,
                     template=_template(LLAMA_32)) as live, live.http() as http:
        with http.stream("POST", "/v1/chat/completions", json=weather) as first, \
                http.stream("POST", "/v1/chat/completions", json=time_of_day) as second:
            a, b = first.iter_lines(), second.iter_lines()
            heads = next(a), next(b)  # both started: each holds a slot (no queue: a third would be a 429)
            answers = [_calls_of(iter([heads[0], *a])), _calls_of(iter([heads[1], *b]))]
        live.wait_idle()
        assert live.open_sessions() == 0
    (weather_calls, weather_finish), (time_calls, time_finish) = answers
    assert weather_finish == time_finish == "tool_calls", answers
    assert [name for name, _ in weather_calls] == ["get_weather"]
    assert [name for name, _ in time_calls] == ["get_time"]
    for _, arguments in weather_calls + time_calls:
        assert isinstance(json.loads(arguments), dict)


THINKING = "Qwen-QwQ-32B"  # its generation prompt opens the thinking block; tool_choice auto is lazy


@pytest.mark.slow  # the command loads the model again
def test_a_reasoning_budget_is_the_generate_commands(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # the request's budget and message, then the server's (--reasoning-budget 3); each generation as
    # `sampler-worker generate --reasoning-budget` makes it, the forced end tag after the message
    tools, template = tmp_path / "tools.json", tmp_path / "qwq.jinja"
    tools.write_text(json.dumps(WEATHER_TOOLS[:1]))
    template.write_text(_template(THINKING))
    reports = {}
    for budget, message in ((5, " Done."), (3, "")):
        with fixed_date():
            status = main([
                "generate", "--model", str(gemma_path), "--chat", QUESTION, "--tools", str(tools),
                "--chat-template", str(template), "--seed", "1", "--max-tokens", "24", "--n-ctx", "1024",
                "--constraintd", "local", "--output", "json", "--reasoning-budget", str(budget),
                *(["--reasoning-budget-message", message] if message else []),
            ])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        reports[budget] = json.loads(captured.out)
    request: dict[str, Any] = {"messages": MESSAGES, "tools": WEATHER_TOOLS[:1], "seed": 1, "max_tokens": 24,
                               "return_tokens": True}
    with fixed_date(), live_server(gemma_path, parallel=1, max_queue=0, timeout=300, n_ctx=1024,
                                   template=_template(THINKING), reasoning_budget=3) as live, \
            live.http() as http:
        asked = http.post("/v1/chat/completions", json={
            **request, "reasoning_budget_tokens": 5, "reasoning_budget_message": " Done."}).json()
        live.wait_idle()  # one slot and no queue: the next request once the slot is given back
        default = http.post("/v1/chat/completions", json=request).json()
        live.wait_idle()
    assert asked["tokens"] == reports[5]["tokens"] and default["tokens"] == reports[3]["tokens"]
    assert asked["tokens"] != default["tokens"]
    # the block ends where the budget forced it: the reasoning is read apart, the message its end
    assert asked["choices"][0]["message"]["reasoning_content"].endswith(" Done.")
    assert reports[5]["reasoning_content"] == asked["choices"][0]["message"]["reasoning_content"]


def _holds(tokens: list[int], part: list[int]) -> bool:
    return any(tokens[i : i + len(part)] == part for i in range(len(tokens)))


def test_a_thinking_block_ended_by_a_control_request(gemma_path: Path) -> None:
    # llama-server's POST /v1/chat/completions/control: reasoning_end forces the end tag of the running
    # answer's thinking block (no limit otherwise: QwQ's block is open from the first token, and Gemma
    # never closes it on its own in 40 tokens)
    request: dict[str, Any] = {"messages": MESSAGES, "tools": WEATHER_TOOLS[:1], "seed": 1, "max_tokens": 40,
                               "return_tokens": True, "stream": True}
    with fixed_date(), live_server(gemma_path, parallel=1, max_queue=1, timeout=300, n_ctx=1024,
                                   template=_template(THINKING)) as live, live.http() as http:
        end = live.state.generations.contexts[0].tokenize("</think>", add_special=False)
        answers = []
        for controlled in (False, True):
            with http.stream("POST", "/v1/chat/completions",
                             json={**request, "reasoning_control": controlled}) as response:
                lines = response.iter_lines()
                first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
                control = http.post("/v1/chat/completions/control",
                                    json={"id": first["id"], "action": "reasoning_end"}).json()
                chunks = [first] + [json.loads(line[6:]) for line in lines
                                    if line.startswith("data: ") and line != "data: [DONE]"]
            tokens = [token for chunk in chunks for token in chunk.get("tokens", [])]
            answers.append((control, tokens))
        refused = [http.post("/v1/chat/completions/control", json=body) for body in (
            {"id": "chatcmpl-none", "action": "reasoning_end"}, {"id": "chatcmpl-none", "action": "pause"},
            {"action": "reasoning_end"})]
        live.wait_idle()
    (plain_control, plain), (control, ended) = answers
    assert plain_control == {"success": False, "message": "reasoning control not enabled for this completion"}
    assert control == {"success": True}
    assert not _holds(plain, end) and _holds(ended, end)
    assert refused[0].json() == {"success": False, "message": "no active completion for this id"}
    assert [answer.status_code for answer in refused[1:]] == [400, 400]


@pytest.mark.slow  # the command loads the model again
def test_a_chat_without_tools_runs_the_budget_too(
    gemma_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # llama-server makes the budget for any chat on a thinking template that sets one: a plain chat (its
    # thinking tags are the chat params'), and a chat with a response format (the grammar holds the block)
    template = tmp_path / "qwq.jinja"
    template.write_text(_template(THINKING))
    schema = tmp_path / "object.json"
    schema.write_text('{"type": "object"}')
    reports = []
    for constraint in ([], ["--schema", str(schema)]):
        with fixed_date():
            status = main([
                "generate", "--model", str(gemma_path), "--chat", QUESTION, "--chat-template", str(template),
                "--seed", "1", "--max-tokens", "16", "--n-ctx", "1024", "--constraintd", "local",
                "--output", "json", "--reasoning-budget", "2", *constraint,
            ])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        reports.append(json.loads(captured.out))
    request: dict[str, Any] = {"messages": MESSAGES, "seed": 1, "max_tokens": 16, "return_tokens": True}
    with fixed_date(), live_server(gemma_path, parallel=1, max_queue=0, timeout=300, n_ctx=1024,
                                   template=_template(THINKING), reasoning_budget=2) as live, \
            live.http() as http:
        end = live.state.generations.contexts[0].tokenize("</think>", add_special=False)
        # one slot and no queue: each request after the last one's worker thread has given the slot back
        # (a response is sent before that, and a request that finds the slot busy is refused with 429)
        plain = http.post("/v1/chat/completions", json=request).json()
        live.wait_idle()
        shaped = http.post("/v1/chat/completions", json={
            **request, "response_format": {"type": "json_object"}}).json()
        live.wait_idle()
        unlimited = http.post("/v1/chat/completions", json={**request, "reasoning_budget_tokens": 100}).json()
        live.wait_idle()
    assert plain["tokens"] == reports[0]["tokens"] and shaped["tokens"] == reports[1]["tokens"]
    # the prompt's newline after <think> is the block's first token: the end is forced after one more
    assert plain["tokens"][1 : 1 + len(end)] == end and shaped["tokens"][1 : 1 + len(end)] == end
    assert not _holds(unlimited["tokens"], end)
    # the shaped answer is read by the chat's parser: the thinking block apart from the JSON content
    message = shaped["choices"][0]["message"]
    assert "</think>" not in message["content"] and message["content"] == reports[1]["content"]
    assert message.get("reasoning_content", "") == reports[1]["reasoning_content"]
