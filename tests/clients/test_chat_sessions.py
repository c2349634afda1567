"""Sessions made from a chat request (CreateSession's `chat`), in-process and over a real server: the service
resolves the request as the worker does (constraintd.chat_templates: the prompt, llama.cpp's chat params), the
session follows that grammar with those triggers, and `Session.parse` reads the answer back."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clients import AsyncClient, ChatRequest, Client, Policy, Session, VocabHandle
from constraintd.chat_templates import chat_grammar_of, chat_prompt_of
from constraintd.engine.chat.parsing.message_parser import ParsedToolCall, parse_message
from constraintd.engine.chat.templates.template_inputs import parse_messages, parse_tools
from constraintd.engine.masks.bitmask import unpack_mask
from constraintd.engine.schema.json_text import parse_json
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import DeadlineError, InputError
from sampler_worker.prompt import regex_escape
from tests import reference
from tests.chat_oracle.cases import template_paths
from tests.server.running import ServerThread, client_of, server_config, socket_dir

POLICY = Policy(timeout=60.0, setup_timeout=120.0)
NOW = 1_767_000_000.0  # a fixed request time: the templates that print the date print the same one
TEMPLATES = {path.stem: path for path in template_paths()}
# Mistral Small 3.2's template with its call ids and [ARGS] markers taken out: a tag format whose function
# names have nothing after them but the arguments (atomic function names), which the project does not port
NO_CALL_IDS = "Mistral-Small-3.2-24B-Instruct-2506 without call ids"
VARIANTS = {NO_CALL_IDS: TEMPLATES["Mistral-Small-3.2-24B-Instruct-2506"].read_text().replace(
    "{{- '[CALL_ID]' + tool_call.id }}", "").replace("'[ARGS]' + tool_call", "tool_call")}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_ARGUMENTS = '{"city": "Paris"}'

# (template, vocabulary file, tool_choice): templates of the reference whose tool grammar is ported (JSON
# calls, and the tag formats' calls), on a vocabulary of their family
CASES = [
    ("Qwen-Qwen2.5-7B-Instruct", "qwen2", "auto"),
    ("Qwen-Qwen2.5-7B-Instruct", "qwen2", "required"),
    ("Qwen-Qwen2.5-7B-Instruct", "qwen2", "get_weather"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "llama-bpe", "auto"),
    ("ibm-granite-granite-4.0", "gpt-2", "required"),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama-bpe", "required"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "llama-spm", "auto"),
    ("GLM-4.6", "qwen2", "required"),
    ("deepseek-ai-DeepSeek-V3.1", "deepseek-llm", "get_weather"),
]


@pytest.fixture(params=["local", "unix"])
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    with client_of(request.param, POLICY) as opened:
        yield opened


def vocab_file(name: str) -> Path:
    return reference.require(reference.vocab_path(name))


def chat_request(template: str, tool_choice: str, *, messages: list[dict[str, Any]] | None = None,
                 tools: list[dict[str, Any]] | None = None) -> ChatRequest:
    source = VARIANTS[template] if template in VARIANTS else TEMPLATES[template].read_text()
    return ChatRequest(messages or ASK, template=source,
                       tools=TOOLS if tools is None else tools, tool_choice=tool_choice, now=NOW)


def direct_params(request: ChatRequest) -> tuple[Any, Any, str]:
    """The prompt and chat params computed here, without the service, and the tool_choice they were for."""
    assert isinstance(request.messages, list) and isinstance(request.tools, list)
    messages = parse_messages(request.messages)
    tools = parse_tools(request.tools)
    choice = request.tool_choice
    if choice not in ("auto", "required", "none"):
        tools, choice = [tool for tool in tools if tool.name == choice], "required"
    made = chat_prompt_of(request.template, messages, tools=tools, now=request.now)
    params = chat_grammar_of(request.template, messages, tools=tools, tool_choice=choice, now=request.now,
                             generation_prompt=made.generation_prompt)
    return made, params, choice


@pytest.mark.parametrize(("template", "vocab_name", "tool_choice"), CASES, ids=lambda v: str(v))
def test_a_chat_session_follows_the_chat_params_of_its_request(
    client: Client, template: str, vocab_name: str, tool_choice: str
) -> None:
    vocab = client.register_vocab(gguf=vocab_file(vocab_name))
    request = chat_request(template, tool_choice)
    made, params, _ = direct_params(request)
    assert params.grammar  # every case gets a grammar
    with client.session(vocab, chat=request) as session:
        chat = session.chat
        assert chat is not None
        assert chat.grammar == params.grammar
        assert chat.grammar_lazy is params.grammar_lazy
        assert (chat.prompt, chat.generation_prompt) == (made.prompt, made.generation_prompt)
        assert chat.preserved_tokens == tuple(params.preserved_tokens or ())
        assert chat.additional_stops == params.additional_stops
        assert chat.thinking_end_tags == params.thinking_end_tags
        words = [trigger.value for trigger in params.grammar_triggers if trigger.kind == "word"]
        # none of these words is one token of these vocabularies: each triggers on its escaped text
        assert chat.trigger_patterns == tuple(regex_escape(word) for word in words)
        assert chat.trigger_tokens == ()
        assert chat.prefill == (b"" if params.grammar_lazy else made.generation_prompt.encode())
        # a lazy session waits: it may end, any token may come; a forced one may not end before its call
        assert session.is_complete() is params.grammar_lazy


def pieces_vocab(specials: list[str]) -> tuple[Vocab, dict[str, int]]:
    """A vocabulary of every printable ASCII character and newline, one token each, with `specials` as control
    tokens and an end-of-generation token after them."""
    chars = [chr(c) for c in range(0x20, 0x7F)] + ["\n"]
    texts = [*chars, *specials, "</s>"]
    control = 1 << 3
    attrs = [1 << 1] * len(chars) + [control] * (len(specials) + 1)
    vocab = Vocab([text.encode() for text in texts], [len(texts) - 1], token_texts=texts, token_attrs=attrs)
    return vocab, {text: token for token, text in enumerate(texts)}


def tokens_of(text: str, ids: dict[str, int], specials: list[str]) -> list[int]:
    """`text` as tokens of `pieces_vocab`: a special token where its text is, else one token a character."""
    tokens: list[int] = []
    at = 0
    while at < len(text):
        special = next((s for s in specials if text.startswith(s, at)), None)
        if special is not None:
            tokens.append(ids[special])
            at += len(special)
        else:
            tokens.append(ids[text[at]])
            at += 1
    return tokens


def allowed_texts(session: Session, texts: list[str]) -> set[str]:
    mask = unpack_mask(session.mask(), len(texts))
    return {texts[token] for token in np.flatnonzero(mask)}


def test_a_trigger_word_that_is_one_preserved_token_triggers_on_that_token(client: Client) -> None:
    # Mistral Nemo's tool calls start with [TOOL_CALLS], a preserved token: on a vocabulary where it is one
    # token, the session triggers on that token (and on no text), as llama-server makes the trigger
    specials = ["[TOOL_CALLS]"]
    vocab, ids = pieces_vocab(specials)
    handle = client.register_vocab(vocab=vocab)
    request = chat_request("mistralai-Mistral-Nemo-Instruct-2407", "auto")
    with client.session(handle, chat=request) as session:
        chat = session.chat
        assert chat is not None and chat.grammar_lazy
        assert chat.trigger_tokens == (ids["[TOOL_CALLS]"],) and chat.trigger_patterns == ()
        # the template's calls carry an id (nine alphanumerics)
        call = {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}
        text = "[TOOL_CALLS]" + json.dumps([call])
        # the word written as characters is no trigger (a pattern would be): the grammar still waits after
        # it, and takes what is no call
        for token in tokens_of("[TOOL_CALLS] no call", ids, []):
            assert session.accept(token)
        assert session.is_complete()
    with client.session(handle, chat=request) as session:
        for token in tokens_of(text, ids, specials):
            assert session.accept(token), token
        assert session.is_complete()
        assert session.parse(text).tool_calls == (ParsedToolCall("get_weather", CALL_ARGUMENTS, "abc123XYZ"),)


def test_a_named_tool_session_takes_exactly_a_call_of_that_tool(client: Client) -> None:
    specials = ["<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]
    vocab, ids = pieces_vocab(specials)
    texts = [*(chr(c) for c in range(0x20, 0x7F)), "\n", *specials, "</s>"]
    handle = client.register_vocab(vocab=vocab)
    request = chat_request("Qwen-Qwen2.5-7B-Instruct", "get_weather")
    call = '<tool_call>\n{"name": "get_weather", "arguments": ' + CALL_ARGUMENTS + "}\n</tool_call>"
    with client.session(handle, chat=request) as session:
        assert session.chat is not None and not session.chat.grammar_lazy
        assert session.chat.prefill == b"<|im_start|>assistant\n"
        tokens = tokens_of(call, ids, specials)
        name_at = call.index("get_weather")
        written = ""
        for token in tokens:
            if len(written) == name_at:
                # the name: only get_weather's first character; the other tool is not offered
                assert allowed_texts(session, texts) == {"g"}
            if written.endswith('"get_'):
                assert allowed_texts(session, texts) == {"w"}
                assert not session.allows(ids["t"])  # get_time
            assert session.accept(token), (written, texts[token])
            written += texts[token]
        assert written == call and session.is_complete()
        # after it, the end, space, or another call of the same tool (llama.cpp's forced grammar repeats its
        # calls: `(tool-call space)+`, its marker as a token or spelled out); no text
        assert allowed_texts(session, texts) == {"</s>", " ", "\n", "<tool_call>", "<"}
        assert session.parse(written) == parse_message(
            written, direct_params(request)[1], generation_prompt=session.chat.generation_prompt,
            tools=[WEATHER], tool_choice="required")
        assert session.parse(written).tool_calls == (ParsedToolCall("get_weather", CALL_ARGUMENTS),)
    with client.session(handle, chat=request) as session:
        # a call of the other tool is refused where its name parts from this one's
        for token in tokens_of('<tool_call>\n{"name": "get_', ids, specials):
            assert session.accept(token)
        assert not session.accept(ids["t"])  # get_time
        assert session.history[-1] == ids["_"]  # refused: nothing changed


def test_parse_reads_content_and_a_call_of_a_lazy_session_back(client: Client) -> None:
    specials = ["<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]
    vocab, ids = pieces_vocab(specials)
    handle = client.register_vocab(vocab=vocab)
    request = chat_request("Qwen-Qwen2.5-7B-Instruct", "auto")
    text = 'Let me look.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    with client.session(handle, chat=request) as session:
        for token in tokens_of(text, ids, specials):
            assert session.accept(token)
        assert session.is_complete()
        parsed = session.parse(text)
        assert parsed.content == "Let me look.\n"
        assert parsed.tool_calls == (ParsedToolCall("get_time", '{"zone": "CET"}'),)
        _, params, _ = direct_params(request)
        assert parsed == parse_message(text, params, generation_prompt=session.chat.generation_prompt
                                       if session.chat else "", tools=TOOLS)


def test_a_hand_written_formats_session_takes_and_parses_its_calls(client: Client) -> None:
    # Qwen3-Coder's format: the session's grammar takes its call, and the parser settings the service hands
    # over (the format's PEG arena, not an analysis) read it back as the engine does
    specials = ["<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]
    vocab, ids = pieces_vocab(specials)
    handle = client.register_vocab(vocab=vocab)
    request = chat_request("Qwen3-Coder", "auto")
    call = "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>"
    text = "Let me look.\n" + call
    with client.session(handle, chat=request) as session:
        for token in tokens_of(text, ids, specials):
            assert session.accept(token)
        assert session.is_complete()
        parsed = session.parse(text)
        assert parsed.content == "Let me look.\n"
        assert parsed.tool_calls == (ParsedToolCall("get_time", '{"zone":"CET"}'),)
        _, params, _ = direct_params(request)
        assert parsed == parse_message(text, params, generation_prompt=session.chat.generation_prompt
                                       if session.chat else "", tools=TOOLS)


@pytest.mark.parametrize(
    ("template", "tool_choice", "tools", "words"),
    [
        (NO_CALL_IDS, "required", TOOLS, "not ported yet: the tag formats' atomic function names"),
        ("Qwen-Qwen2.5-7B-Instruct", "none", TOOLS, "asks for free text"),
        ("meta-llama-Llama-3.2-3B-Instruct", "auto", TOOLS, "asks for free text"),
        ("Qwen-Qwen2.5-7B-Instruct", "get_date", TOOLS, "tool_choice 'get_date' names none of the tools"),
    ],
    ids=["tag-format", "none", "no-trigger-word", "unknown-name"],
)
def test_what_the_service_does_not_resolve_is_refused_with_its_reason(
    client: Client, template: str, tool_choice: str, tools: list[dict[str, Any]], words: str
) -> None:
    handle = client.register_vocab(gguf=vocab_file("qwen2"))
    with pytest.raises(InputError, match=words.replace("(", r"\(")):
        client.session(handle, chat=chat_request(template, tool_choice, tools=tools))


def test_the_async_session_gets_the_same_chat_settings() -> None:
    request = chat_request("Qwen-Qwen2.5-7B-Instruct", "auto")

    async def run() -> tuple[Any, Any]:
        async with AsyncClient("local", policy=POLICY) as client:
            vocab = await client.register_vocab(gguf=vocab_file("qwen2"))
            async with await client.session(vocab, chat=request) as session:
                assert session.chat is not None
                text = f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_ARGUMENTS}}}\n</tool_call>'
                return session.chat, session.parse(text)

    chat, parsed = asyncio.run(run())
    with Client("local", policy=POLICY) as client:
        vocab: VocabHandle = client.register_vocab(gguf=vocab_file("qwen2"))
        with client.session(vocab, chat=request) as session:
            assert session.chat == chat
    assert parsed.tool_calls == (ParsedToolCall("get_weather", CALL_ARGUMENTS),)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "not-thinking"])
def test_a_response_schema_session_takes_the_answer_after_the_generation_prompt(
    client: Client, thinking: bool
) -> None:
    specials = ["<think>", "</think>", "<|im_start|>", "<|im_end|>"]
    vocab, ids = pieces_vocab(specials)
    handle = client.register_vocab(vocab=vocab)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    source = TEMPLATES["Qwen-Qwen3-0.6B"].read_text()
    request = ChatRequest(ASK, template=source, json_schema=schema, enable_thinking=thinking, now=NOW)
    messages = parse_messages(ASK)
    made = chat_prompt_of(source, messages, enable_thinking=thinking, now=NOW)
    params = chat_grammar_of(source, messages, json_schema=parse_json(json.dumps(schema)),
                             enable_thinking=thinking, now=NOW, generation_prompt=made.generation_prompt)
    answer = '{"city": "Paris"}'
    with client.session(handle, chat=request) as session:
        assert session.chat is not None
        assert session.chat.grammar == params.grammar and not session.chat.grammar_lazy
        assert session.chat.prefill == made.generation_prompt.encode()
        # thinking off, the generation prompt holds an empty thinking block: the prefill took it
        assert (b"</think>" in session.chat.prefill) is not thinking
        assert not session.allows(ids["x"])  # no text before the answer
        for token in tokens_of(answer, ids, specials):
            assert not session.is_complete()
            assert session.accept(token)
        assert session.is_complete()


def test_a_template_that_renders_forever_is_stopped_at_the_compile_time_limit() -> None:
    # the template is the caller's: the server renders it in a compile process, stopped at its time limit
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with socket_dir() as directory:
        config = server_config(directory)
        config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, compile_timeout=1.0))
        server = ServerThread(config)
        service = server.start()
        try:
            with Client(service.addresses[0], policy=POLICY) as client:
                vocab = client.register_vocab(vocab=pieces_vocab(["<tool_call>", "</tool_call>"])[0])
                stuck = ChatRequest(ASK, template=endless, tools=TOOLS, now=NOW)
                with pytest.raises(DeadlineError):
                    client.session(vocab, chat=stuck)
                with client.session(vocab, chat=chat_request("Qwen-Qwen2.5-7B-Instruct", "auto")) as session:
                    assert session.chat is not None and session.chat.grammar_lazy
        finally:
            server.stop()
