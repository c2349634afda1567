"""sampler_worker.serve.bodies: what a request body asks the generation for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from constraintd.errors import SchemaError
from sampler_worker.chain import SamplerSettings
from sampler_worker.prompt import Message
from sampler_worker.serve.bodies import (
    ChatCompletionRequest,
    CompletionRequest,
    Job,
    OllamaChatRequest,
    OllamaGenerateRequest,
    RequestError,
    job_from,
)

USER = [{"role": "user", "content": "hi"}]


def job(model: type[BaseModel], body: dict[str, Any]) -> Job:
    text = json.dumps(body)
    return job_from(model.model_validate_json(text), text)


def test_absent_fields_keep_llama_servers_defaults() -> None:
    got = job(ChatCompletionRequest, {"messages": USER})
    assert got.settings == SamplerSettings()
    assert (got.max_tokens, got.stop, got.constraint, got.json_answer) == (None, (), None, False)
    assert got.chat == (Message("user", "hi"),)


def test_sampling_fields_as_llama_server_names_them() -> None:
    got = job(ChatCompletionRequest, {
        "messages": USER, "temperature": 0.3, "top_k": 5, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.9,
        "seed": 9, "repeat_penalty": 1.1, "repeat_last_n": 16, "presence_penalty": 0.1,
        "frequency_penalty": 0.2, "stop": "\n",
    })
    assert got.settings == SamplerSettings(
        temperature=0.3, top_k=5, top_p=0.5, min_p=0.2, typical_p=0.9, seed=9, repeat_penalty=1.1,
        penalty_last_n=16, presence_penalty=0.1, frequency_penalty=0.2,
    )
    assert got.stop == ("\n",)


@pytest.mark.parametrize(("fields", "budget"), [
    ({"max_tokens": 7}, 7),
    ({"max_completion_tokens": 5, "max_tokens": 7}, 5),
    ({"n_predict": 3}, 3),
    ({"max_tokens": -1}, None),
], ids=["max_tokens", "max_completion_tokens-first", "n_predict", "negative-is-unbounded"])
def test_the_token_budget(fields: dict[str, Any], budget: int | None) -> None:
    assert job(CompletionRequest, {"prompt": "x", **fields}).max_tokens == budget


@pytest.mark.parametrize(("model", "body", "dialect", "json_answer"), [
    (ChatCompletionRequest, {"messages": USER, "response_format": {"type": "json_object"}}, "openai", True),
    (ChatCompletionRequest, {"messages": USER, "json_schema": {"type": "integer"}}, "openai", True),
    (ChatCompletionRequest, {"messages": USER, "grammar": 'root ::= "a"'}, "openai", False),
    (OllamaChatRequest, {"messages": USER, "format": "json"}, "ollama", True),
    (OllamaGenerateRequest, {"prompt": "x", "format": {"type": "object"}}, "ollama", True),
], ids=["json_object", "json_schema", "grammar", "ollama-json", "ollama-schema"])
def test_a_constraint_goes_to_constraintd_as_the_body_itself(
    model: type[BaseModel], body: dict[str, Any], dialect: str, json_answer: bool
) -> None:
    got = job(model, body)
    assert got.constraint == {f"{dialect}_request": json.dumps(body)}
    assert got.json_answer is json_answer


def test_openais_strict_is_honoured_only_when_the_server_says_so() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "number", "minimum": 1}}}
    body = {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": schema}}}
    text = json.dumps(body)
    parsed = ChatCompletionRequest.model_validate_json(text)
    plain = job_from(parsed, text)
    assert plain.constraint == {"openai_request": text}
    # a chat's schema is llama-server's response format, made from the chat request
    assert plain.chat_schema is not None and json.loads(plain.chat_schema) == schema
    # strict, honoured: the schema the grammar cannot hold is refused before any work, at its place
    with pytest.raises(SchemaError, match=r"minimum.*#/response_format/json_schema/schema/properties/x"):
        job_from(parsed, text, honour_strict=True)
    not_strict = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    lenient = json.dumps(dict(body, response_format=not_strict))
    lenient_job = job_from(ChatCompletionRequest.model_validate_json(lenient), lenient, honour_strict=True)
    assert lenient_job.constraint == {"openai_request": lenient} and lenient_job.chat_schema is not None


def test_free_text_asks_for_no_constraint() -> None:
    text = {"messages": USER, "response_format": {"type": "text"}}
    assert job(ChatCompletionRequest, text).constraint is None
    assert job(OllamaChatRequest, {"messages": USER, "format": ""}).constraint is None


def test_ollama_options_and_templates() -> None:
    got = job(OllamaGenerateRequest, {"prompt": "p", "system": "s", "options": {"num_predict": 4, "seed": 2,
                                                                             "stop": ["x"]}})
    assert got.chat == (Message("system", "s"), Message("user", "p"))
    assert (got.max_tokens, got.settings.seed, got.stop) == (4, 2, ("x",))
    raw = job(OllamaGenerateRequest, {"prompt": "<b>p", "raw": True})
    assert (raw.chat, raw.prompt) == (None, "<b>p")


def test_text_parts_are_joined() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert job(ChatCompletionRequest, {"messages": parts}).chat == (Message("user", "ab"),)


@pytest.mark.parametrize(("model", "body", "param"), [
    (ChatCompletionRequest, {"messages": USER, "n": 2}, "n"),
    (ChatCompletionRequest, {"messages": []}, "messages"),
    (CompletionRequest, {"prompt": ["a", "b"]}, "prompt"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    (ChatCompletionRequest, {"messages": USER, "top_k": 5, "temperature": 0.5, "dry_multiplier": 1}, None),
], ids=["n", "no-messages", "prompts", "image", "out-of-range-ignored-field"])
def test_refused(model: type[BaseModel], body: dict[str, Any], param: str | None) -> None:
    if param is None:  # a field the server does not read is ignored, as llama-server ignores it
        job(model, body)
        return
    with pytest.raises(RequestError) as raised:
        job(model, body)
    assert raised.value.param == param


def test_a_malformed_constraint_is_refused_with_its_pointer() -> None:
    with pytest.raises(SchemaError) as raised:
        job(ChatCompletionRequest, {"messages": USER, "response_format": "json"})
    assert raised.value.pointer == "#/response_format"


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time"}}]


@pytest.mark.parametrize(("choice", "read"), [
    (None, "auto"), ("auto", "auto"), ("required", "required"), ("none", "none"),
    ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
], ids=["absent", "auto", "required", "none", "named"])
def test_tools_and_their_choice_as_llama_server_reads_them(choice: Any, read: str) -> None:
    body: dict[str, Any] = {"messages": USER, "tools": TOOLS, "parallel_tool_calls": True}
    if choice is not None:
        body["tool_choice"] = choice
    got = job(ChatCompletionRequest, body)
    assert got.tools is not None and got.constraint is None
    assert [tool.name for tool in got.tools.tools] == ["get_weather", "get_time"]
    assert (got.tools.tool_choice, got.tools.parallel_tool_calls) == (read, True)


def test_a_chat_with_tools_keeps_its_tool_calls_and_answers() -> None:
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
    got = job(ChatCompletionRequest, {"messages": messages, "tools": TOOLS})
    assert got.tools is not None
    [_, call, answer] = got.tools.messages
    assert [(c.name, c.arguments, c.id) for c in call.tool_calls] == [("get_time", "{}", "c1")]
    assert (answer.role, answer.content, answer.tool_call_id) == ("tool", "noon", "c1")


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tool_choice": "sometimes"}, "tool_choice", "Invalid tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_news"}}}, "tool_choice", "get_news"),
    ({"grammar": 'root ::= "x"'}, "tools", "not supported"),
    ({"response_format": {"type": "json_object"}}, "tools", "not supported"),
], ids=["unknown-choice", "unknown-name", "grammar", "json"])
def test_tools_a_request_cannot_have_are_refused(fields: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(RequestError, match=words) as refused:
        job(ChatCompletionRequest, {"messages": USER, "tools": TOOLS, **fields})
    assert refused.value.param == param


def test_no_tools_is_a_plain_chat_and_completions_ignore_tools() -> None:
    assert job(ChatCompletionRequest, {"messages": USER, "tools": []}).tools is None
    assert job(CompletionRequest, {"prompt": "p", "tools": TOOLS}).tools is None
    assert job(OllamaChatRequest, {"messages": USER, "tools": TOOLS}).tools is None
