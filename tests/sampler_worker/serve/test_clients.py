"""sampler-worker serve through the real client libraries: `openai` and `ollama` from PyPI."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import ollama
import openai
import pytest
from pydantic import BaseModel

from tests.sampler_worker.serve.conftest import ANSWER_GRAMMAR, QUESTION, LiveServer


@pytest.fixture
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        yield client
    server.wait_idle()


@pytest.fixture
def ollama_client(server: LiveServer) -> Iterator[ollama.Client]:
    client = ollama.Client(host=server.url, timeout=300)
    try:
        yield client
    finally:
        client.close()
    server.wait_idle()


def test_openai_chat_whole_and_streamed(client: openai.OpenAI) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model="gemma", messages=messages, seed=3, max_tokens=12,
                                           extra_body={"grammar": ANSWER_GRAMMAR})
    content = whole.choices[0].message.content
    assert content is not None and re.fullmatch(r"Answer: [0-9]+\.", content)
    assert whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and whole.usage.completion_tokens > 0
    stream = client.chat.completions.create(model="gemma", messages=messages, seed=3, max_tokens=12,
                                            stream=True, extra_body={"grammar": ANSWER_GRAMMAR})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="gemma", prompt="The capital of France is", max_tokens=4,
                                           seed=1)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4


def test_openai_errors_raise_the_clients_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "x"}],
                                       extra_body={"grammar": 'root ::= "a'})
    assert raised.value.code == "invalid_grammar"
    assert "line 1, column" in raised.value.message


class City(BaseModel):
    name: str
    population: int


@pytest.mark.slow  # a JSON schema's first masks over a 262k vocabulary
def test_openai_json_schema_and_structured_parse(client: openai.OpenAI) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "Name a city and its population, as JSON."}
    ]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    strict = {"name": "ok", "schema": schema, "strict": True}
    answer = client.chat.completions.create(
        model="gemma", messages=messages, seed=2, max_tokens=16,
        response_format={"type": "json_schema", "json_schema": strict},
    )
    assert set(json.loads(answer.choices[0].message.content or "")) == {"ok"}
    parsed = client.chat.completions.parse(model="gemma", messages=messages, response_format=City, seed=2,
                                           max_tokens=40)
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City)


def test_ollama_generate_streamed(ollama_client: ollama.Client) -> None:
    parts = list(ollama_client.generate(model="gemma", prompt=QUESTION, stream=True,
                                        options={"seed": 3, "num_predict": 5}))
    assert parts[-1].done and parts[-1].done_reason == "length"
    assert parts[-1].eval_count == 5
    assert "".join(p.response for p in parts)


def test_ollama_errors_raise_the_clients_exception(ollama_client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as raised:
        ollama_client.chat(model="gemma", messages=[{"role": "user", "content": "x"}],
                           format={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    assert raised.value.status_code == 400
    assert "#/format/properties/a" in raised.value.error


@pytest.mark.slow  # a JSON schema's first masks over a 262k vocabulary
def test_ollama_chat_with_a_schema(ollama_client: ollama.Client) -> None:
    answer = ollama_client.chat(model="gemma", messages=[{"role": "user", "content": "Is water wet? JSON."}],
                                format={"type": "object", "properties": {"ok": {"type": "boolean"}},
                                        "required": ["ok"]},
                                options={"seed": 2, "num_predict": 16})
    assert answer.done
    assert set(json.loads(answer.message.content or "")) == {"ok"}
