"""The service's chat sessions against the worker's own preparation (sampler_worker.prompt.tool_chat):
with the bundled Gemma model, the same request made into a session by the service (CreateSession's `chat`)
gives the worker's prompt, grammar, triggers, prefill and stops, and a seeded generation through it is token
for token the generation through the session the worker makes itself: what the worker needs to take the
service path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clients import ChatRequest, Client, VocabHandle
from constraintd.engine.chat.message_parser import MessageParseError, ParsedMessage
from constraintd.engine.chat.template_inputs import parse_tools
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import generate
from sampler_worker.model import Model
from sampler_worker.prompt import tool_chat
from tests.chat_oracle.cases import template_paths

NOW = 1_767_000_000
ASK = "What is the weather in Paris?"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
# the worker's tool cases: Llama 3.2 (JSON calls after free text, no marker) and Qwen 2.5 (<tool_call>)
CASES = [
    ("meta-llama-Llama-3.2-3B-Instruct", "required"),
    ("meta-llama-Llama-3.2-3B-Instruct", "get_weather"),
    ("Qwen-Qwen2.5-7B-Instruct", "auto"),
    ("Qwen-Qwen2.5-7B-Instruct", "required"),
]
SEEDS = (1, 7)


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Model]:
    with Model(gemma_path, n_ctx=1024, n_threads=1) as model:
        yield model


@pytest.fixture(scope="module")
def local(gemma_path: Path) -> Iterator[tuple[Client, VocabHandle]]:
    with Client("local") as client:
        yield client, client.register_vocab(gguf=gemma_path)


@pytest.mark.slow
@pytest.mark.parametrize(("template", "tool_choice"), CASES, ids=lambda v: str(v))
def test_the_services_chat_session_is_the_workers(
    gemma: Model, local: tuple[Client, VocabHandle], template: str, tool_choice: str
) -> None:
    source = next(path for path in template_paths() if path.stem == template).read_text()
    ours = tool_chat(gemma, ASK, parse_tools([WEATHER, TIME]), tool_choice=tool_choice, template=source,
                     now=NOW)
    assert ours.session is not None
    request = ChatRequest([{"role": "user", "content": ASK}], template=source, tools=[WEATHER, TIME],
                          tool_choice=tool_choice, bos_text=gemma.bos_text, eos_text=gemma.eos_text,
                          add_bos=gemma.add_bos, add_eos=gemma.add_eos, now=NOW)
    client, vocab = local
    for seed in SEEDS:
        settings = SamplerSettings(seed=seed)
        with client.session(vocab, chat=request) as served:
            chat = served.chat
            assert chat is not None
            assert gemma.tokenize(chat.prompt, add_special=True, parse_special=True) == ours.prompt
            assert chat.grammar == ours.session["gbnf"]
            assert chat.prefill == ours.session.get("prefill", b"")
            assert list(chat.trigger_patterns) == ours.session.get("trigger_patterns", [])
            assert list(chat.trigger_tokens) == ours.session.get("trigger_tokens", [])
            assert chat.additional_stops == ours.stops
            through_service = generate(gemma, ours.prompt, settings, session=served, max_tokens=48,
                                       special=ours.preserved)
        with client.session(vocab, **ours.session) as own:  # type: ignore[arg-type]
            through_worker = generate(gemma, ours.prompt, settings, session=own, max_tokens=48,
                                      special=ours.preserved)
        assert through_service.tokens == through_worker.tokens
        assert through_service.rejected_at == through_worker.rejected_at
        assert read(served.parse, through_service.text) == read(ours.parse, through_worker.text)


def read(parse: Callable[[str], ParsedMessage], text: str) -> ParsedMessage | str:
    # the message, or the parser's words for a text it refuses (a generation cut short inside a call)
    try:
        return parse(text)
    except MessageParseError as exc:
        return str(exc)
