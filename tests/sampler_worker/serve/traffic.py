"""A bounded mix of requests for a live `sampler-worker serve`: good ones, refused grammars and schemas, and
clients that go away mid-stream or before any answer. The leak test and `bench_serve.py` both drive it.

Each kind knows the status it must get; `drive` sends `count` requests, kind `i % len(KINDS)` for the
i-th, with seed i, from `clients` threads at once, and returns what each kind got. Every request asks for a
few tokens at most, so the mix is bounded in time (a gone client's generation ends at its next token).
"""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

# Letters and spaces, 2000 times: a stream that does not end before its client goes.
ENDLESS = 'root ::= ([a-z] " "){2000}'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
QUESTION = "What is 6 times 7?"
MAX_TOKENS = 4
ABANDONED = 0  # the status of a request whose client went before the answer: none was read


def _chat(seed: int, **fields: Any) -> dict[str, Any]:
    return {"model": "any", "messages": [{"role": "user", "content": QUESTION}], "seed": seed,
            "max_tokens": MAX_TOKENS, **fields}


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> int:
    return client.post(path, json=body).status_code


def _first_line_then_gone(client: httpx.Client, path: str, body: dict[str, Any]) -> int:
    # read one line of the stream (the generation is running), then close the connection
    with client.stream("POST", path, json=body) as response:
        next(response.iter_lines())
        return response.status_code


def _whole_chat_grammar(client: httpx.Client, seed: int) -> int:
    return _post(client, "/v1/chat/completions", _chat(seed, grammar='root ::= "Answer: " [0-9]+ "."'))


def _streamed_completion(client: httpx.Client, seed: int) -> int:
    body = {"prompt": "The capital of France is", "seed": seed, "max_tokens": MAX_TOKENS, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]", lines
        return response.status_code


def _streamed_schema(client: httpx.Client, seed: int) -> int:
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    body = _chat(seed, response_format=format_, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert [line for line in response.iter_lines() if line][-1] == "data: [DONE]"
        return response.status_code


def _ollama_generate(client: httpx.Client, seed: int) -> int:
    body = {"model": "any", "prompt": QUESTION, "format": SCHEMA, "stream": False,
            "options": {"seed": seed, "num_predict": MAX_TOKENS}}
    return _post(client, "/api/generate", body)


def _bad_grammar(client: httpx.Client, seed: int) -> int:
    return _post(client, "/v1/chat/completions", _chat(seed, grammar='root ::= "a" | ('))


def _bad_schema(client: httpx.Client, seed: int) -> int:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    return _post(client, "/v1/chat/completions", _chat(seed, json_schema=schema))


def _not_json(client: httpx.Client, seed: int) -> int:
    return client.post("/v1/completions", content=b'{"prompt": ').status_code


def _gone_mid_stream(client: httpx.Client, seed: int) -> int:
    body = _chat(seed, grammar=ENDLESS, max_tokens=200, stream=True)
    return _first_line_then_gone(client, "/v1/chat/completions", body)


def _gone_mid_ollama_stream(client: httpx.Client, seed: int) -> int:
    body = {"model": "any", "messages": [{"role": "user", "content": QUESTION}], "stream": True,
            "options": {"seed": seed, "num_predict": 200}}
    return _first_line_then_gone(client, "/api/chat", body)


def _gone_before_the_answer(client: httpx.Client, seed: int) -> int:
    # the whole request sent, the connection closed at once: the server finds nobody to answer
    url = urlsplit(str(client.base_url))
    payload = json.dumps(_chat(seed, grammar=ENDLESS, max_tokens=MAX_TOKENS)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.hostname}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head + payload)
    return ABANDONED


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    send: Callable[[httpx.Client, int], int]
    status: int


KINDS = (
    Kind("chat, grammar", _whole_chat_grammar, 200),
    Kind("completion, streamed", _streamed_completion, 200),
    Kind("chat, schema, streamed", _streamed_schema, 200),
    Kind("ollama generate, schema", _ollama_generate, 200),
    Kind("bad grammar", _bad_grammar, 400),
    Kind("bad schema", _bad_schema, 400),
    Kind("body not JSON", _not_json, 400),
    Kind("gone mid-stream", _gone_mid_stream, 200),
    Kind("gone mid-stream, ollama", _gone_mid_ollama_stream, 200),
    Kind("gone before the answer", _gone_before_the_answer, ABANDONED),
)


def drive(url: str, *, count: int, clients: int, first: int = 0) -> Counter[tuple[str, int]]:
    """Send requests `first` .. `first + count - 1` from `clients` threads; counts of (kind, status)."""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    with httpx.Client(base_url=url, timeout=120, limits=limits) as client:  # shared by the threads

        def one(i: int) -> tuple[str, int]:
            kind = KINDS[i % len(KINDS)]
            return kind.name, kind.send(client, i)

        with ThreadPoolExecutor(max_workers=clients) as pool:
            return Counter(pool.map(one, range(first, first + count)))


def expected(counts: Counter[tuple[str, int]]) -> Counter[tuple[str, int]]:
    """What `counts` should be: the same number of each kind, each with its kind's status."""
    statuses = {kind.name: kind.status for kind in KINDS}
    got: Counter[str] = Counter()
    for (name, _), n in counts.items():
        got[name] += n
    return Counter({(name, statuses[name]): n for name, n in got.items()})
