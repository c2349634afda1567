"""sampler_worker.serve.app over a live server, with raw HTTP: answers, streams, error shapes, the queue."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from clients import Client, Policy
from tests.sampler_worker.serve.conftest import ANSWER_GRAMMAR, QUESTION, LiveServer


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [{"role": "user", "content": QUESTION}], **fields}


def sse(response: httpx.Response) -> list[Any]:
    """The events of a server-sent-event stream; the last must be `[DONE]`."""
    events = [line[len("data: "):] for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


def test_health_and_models(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["gemma-3-270m-q4_k_m.gguf"]


def test_a_chat_answer_follows_its_grammar_and_counts_its_tokens(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json=chat(grammar=ANSWER_GRAMMAR, seed=3, max_tokens=12,
                                                        return_tokens=True)).json()
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"]["role"] == "assistant"
    assert re.fullmatch(r"Answer: [0-9]+\.", choice["message"]["content"])
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["completion_tokens"] == len(body["tokens"])
    assert usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_stream_says_what_the_whole_answer_says(http: httpx.Client) -> None:
    request = {"prompt": "The capital of France is", "seed": 5, "max_tokens": 6, "return_tokens": True}
    whole = http.post("/v1/completions", json=request).json()
    streamed = {**request, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=streamed) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = sse(response)
    assert whole["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == whole["choices"][0]["text"]
    assert [t for c in chunks for t in c.get("tokens", [])] == whole["tokens"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == whole["usage"]


def test_a_stop_string_ends_the_answer(http: httpx.Client) -> None:
    body = http.post("/v1/chat/completions", json=chat(grammar=ANSWER_GRAMMAR, seed=3, max_tokens=12,
                                                        stop=[":"])).json()
    assert body["choices"][0]["message"]["content"] == "Answer"
    assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.slow  # JSON mode's first masks over a 262k vocabulary
def test_json_content_follows_the_content_rule_streamed_and_whole(http: httpx.Client) -> None:
    # A fenced JSON answer's content is the value alone; streamed deltas add up to it.
    grammar = 'root ::= "```json\\n{\\"a\\": " [0-9] "}\\n```"'
    schema_free = chat(grammar=grammar, seed=1, max_tokens=16)
    whole = http.post("/v1/chat/completions", json=schema_free).json()
    assert whole["choices"][0]["message"]["content"].startswith("```json")  # a grammar: no content rule
    # JSON mode in a chat is llama-server's response format: space may come before the value (Gemma writes
    # some here), then the value; 24 tokens reach into it
    request = chat(response_format={"type": "json_object"}, seed=1, max_tokens=24)
    whole = http.post("/v1/chat/completions", json=request).json()
    with http.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as response:
        chunks = sse(response)
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert streamed == whole["choices"][0]["message"]["content"]
    assert streamed.startswith("{")


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


REFUSED = [
    (chat(grammar='root ::= "a'), "invalid_grammar", "grammar", "line 1, column"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
        "a": {"$ref": "#/definitions/missing"}}}}}), "invalid_schema",
     "#/response_format/json_schema/schema/properties/a",
     "#/response_format/json_schema/schema/properties/a"),
    (chat(grammar='root ::= "a"', json_schema={"type": "object"}), "invalid_schema", "#/grammar", "grammar"),
    (chat(response_format={"type": "xml"}), "invalid_schema", "#/response_format/type", "xml"),
    ({"model": "any"}, None, "messages", "messages"),
    (chat(n=2), None, "n", "n = 1"),
    (chat(temperature="hot"), None, "temperature", "temperature"),
]


@pytest.mark.parametrize(("body", "code", "param", "said"), REFUSED,
                         ids=["grammar", "schema", "conflict", "format", "no-messages", "n", "type"])
def test_refused_requests_say_where(http: httpx.Client, body: dict[str, Any], code: str | None, param: str,
                                    said: str) -> None:
    error = error_of(http.post("/v1/chat/completions", json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert said in error["message"]


def test_a_body_that_is_not_json_is_refused(http: httpx.Client) -> None:
    error = error_of(http.post("/v1/completions", content=b"{not json"), 400)
    assert error["type"] == "invalid_request_error"


def test_ollama_errors_are_ollamas(http: httpx.Client) -> None:
    response = http.post("/api/chat", json={"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                            "format": "yaml", "stream": False})
    assert response.status_code == 400
    assert response.json() == {
        "error": 'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object (at #/format)'
    }


def test_an_unreachable_constraintd_is_503(server: LiveServer, http: httpx.Client,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    nowhere = Client("unix:///nonexistent/constraintd.sock", policy=Policy(attempts=1, setup_timeout=2))
    monkeypatch.setattr(server.state.generations, "client", nowhere)
    try:
        response = http.post("/v1/chat/completions", json=chat(grammar=ANSWER_GRAMMAR, max_tokens=4))
    finally:
        nowhere.close()
    error = error_of(response, 503)
    assert error["code"] == "constraintd_unavailable"
    assert error["message"].startswith("constraintd cannot serve the request now")
    assert response.headers["retry-after"] == "1"


def metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    found = re.search(rf"^sampler_worker_{name} (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


# Letters and spaces, 2000 times: no end within the test; each token adds at most a few characters.
ENDLESS = 'root ::= ([a-z] " "){2000}'


def test_a_full_queue_is_429_and_a_gone_client_ends_its_generation(server: LiveServer,
                                                                    http: httpx.Client) -> None:
    cancelled, refused = metric(http, "generations_cancelled_total"), metric(http, "queue_full_total")
    with http.stream("POST", "/v1/chat/completions",
                     json=chat(grammar=ENDLESS, max_tokens=900, stream=True)) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the generation holds the only slot now
        assert server.open_sessions() == 1
        assert metric(http, "constraintd_sessions_open") == 1
        busy = http.post("/v1/chat/completions", json=chat(max_tokens=1))
        error = error_of(busy, 429)
        assert busy.headers["retry-after"] == "1"
        assert error["code"] == "rate_limit_exceeded"
    # the client has gone: its generation ends at its next token, its constraintd session with it
    server.wait_idle()
    assert server.open_sessions() == 0
    assert metric(http, "constraintd_sessions_open") == 0
    assert metric(http, "generations_cancelled_total") == cancelled + 1
    assert metric(http, "queue_full_total") == refused + 1
    assert metric(http, "generations_active") == 0
    assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200


def requests_total(http: httpx.Client, endpoint: str, code: int) -> float:
    text = http.get("/metrics").text
    sample = rf'^sampler_worker_requests_total\{{endpoint="{endpoint}",code="{code}"\}} (\S+)$'
    found = re.search(sample, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_client_gone_before_its_whole_answer_ends_its_generation(server: LiveServer,
                                                                    http: httpx.Client) -> None:
    cancelled, tokens = metric(http, "generations_cancelled_total"), metric(http, "generated_tokens_total")
    closed, failed = requests_total(http, "chat", 499), requests_total(http, "chat", 500)
    body = json.dumps(chat(grammar=ENDLESS, max_tokens=900)).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        # not streamed: nothing comes back before the end; the generation has begun once its session is open
        until(lambda: metric(http, "constraintd_sessions_open") == 1)
    # the connection is closed: the server hears it, and the generation ends at its next token
    until(lambda: metric(http, "generations_cancelled_total") == cancelled + 1)
    server.wait_idle()
    assert server.open_sessions() == 0
    assert metric(http, "constraintd_sessions_open") == 0
    assert metric(http, "generated_tokens_total") < tokens + 900
    # counted as the client closing its request (nginx's 499), not as the server failing
    until(lambda: requests_total(http, "chat", 499) == closed + 1)
    assert requests_total(http, "chat", 500) == failed


def until(condition: Callable[[], bool], timeout: float = 120) -> None:
    """Wait for a condition the server reaches on its own threads (a generation's progress)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition was not reached"
        time.sleep(0.02)


def test_metrics_count_requests_tokens_and_rejections(http: httpx.Client) -> None:
    before = {name: metric(http, name) for name in ("generated_tokens_total", "grammar_rejections_total",
                                                    "constraintd_wait_seconds_total")}
    body = http.post("/v1/chat/completions", json=chat(grammar=ANSWER_GRAMMAR, seed=3, max_tokens=12)).json()
    assert metric(http, "generated_tokens_total") == before["generated_tokens_total"] + \
        body["usage"]["completion_tokens"]
    assert metric(http, "grammar_rejections_total") > before["grammar_rejections_total"]
    assert metric(http, "constraintd_wait_seconds_total") > before["constraintd_wait_seconds_total"]
    text = http.get("/metrics").text
    requests = r'^sampler_worker_requests_total\{endpoint="chat",code="200"\} [1-9]'
    assert re.search(requests, text, re.MULTILINE)
    assert "# TYPE sampler_worker_generations_active gauge" in text
    assert "# TYPE sampler_worker_constraintd_sessions_open gauge" in text
