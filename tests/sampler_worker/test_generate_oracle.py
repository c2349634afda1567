"""sampler_worker.generate against llama-server's sampling, rebuilt from llama.cpp's own parts.

The reference is `common_sampler_sample(grammar_first = false)` + `common_sampler_accept`, step by step,
with llama.cpp's sampler chain (tests/oracle.py `LlamaSamplerChain`, built as `common_sampler_init`
builds it), llama.cpp's grammar sampler (`LlamaGrammar`) and the model through llama-cpp-python's
`Llama` class (flash attention on, as llama.cpp's default context has it):
    draw with the chain; apply the grammar to that one token; if it is refused, apply the grammar to
    every token and run the whole chain again (same generator); accept the token in grammar and chain.
Ours: `generate` with a constraintd session (in process, and once through a private server on a Unix
socket). Compared: every token id and every step where the first draw was refused.

Sizes (chosen for CI; about 240 generated tokens each way): 6 in-process generations of at most 40
tokens on Gemma 3 270M (a JSON schema, JSON mode and llama.cpp's list grammar; two sampler settings;
chat and raw prompts), plus 1 of them again through the Unix socket.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from clients import Client
from constraintd.engine.json_schema import json_schema_to_gbnf
from constraintd.engine.requests import json_object_grammar
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import generate
from sampler_worker.model import Model
from sampler_worker.prompt import prompt_tokens
from sampler_worker.sidecar import PrivateConstraintd
from tests.conftest import OracleReport
from tests.oracle import LlamaGrammar, LlamaSamplerChain, LlamaVocab, grammar_allows
from tests.sampler_worker.llama_chain import llama_steps

N_CTX = 512
MAX_TOKENS = 40
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}
# Hotter than llama-server's defaults, top-k off and a repetition penalty: more rejections, the
# full-vocabulary sampler paths, and penalties fed by the prompt.
WARM = SamplerSettings(temperature=1.3, top_k=0, top_p=0.98, min_p=0.02, repeat_penalty=1.1)


@dataclass(frozen=True)
class Case:
    name: str
    constraint: str  # "schema", "json", or a grammar file of llama.cpp's grammars/ directory
    chat: str | None
    prompt: str | None
    settings: SamplerSettings


CASES = [
    Case("schema-chat-defaults", "schema", "Describe a programmer as JSON.", None, SamplerSettings(seed=11)),
    Case("schema-chat-warm", "schema", "Describe a programmer as JSON.", None,
         replace(WARM, seed=12)),
    Case("json-mode-chat-defaults", "json", "Give me a JSON object about the moon.", None,
         SamplerSettings(seed=13)),
    Case("json-mode-raw-warm", "json", None, "Weather report:",
         replace(WARM, seed=14)),
    Case("list-grammar-raw-defaults", "list.gbnf", None, "Groceries:\n", SamplerSettings(seed=15)),
    Case("list-grammar-chat-warm", "list.gbnf", "Three things to pack for a hike.", None,
         replace(WARM, seed=16)),
]


def grammar_text(case: Case, llama_cpp_dir: Path) -> str:
    if case.constraint == "schema":
        return json_schema_to_gbnf(json.dumps(PERSON_SCHEMA))
    if case.constraint == "json":
        return json_object_grammar()
    return (llama_cpp_dir / "grammars" / case.constraint).read_text()


def session_arguments(case: Case, llama_cpp_dir: Path) -> dict[str, object]:
    if case.constraint == "schema":
        return {"json_schema": json.dumps(PERSON_SCHEMA)}
    if case.constraint == "json":
        return {"json_object": True}
    return {"gbnf": grammar_text(case, llama_cpp_dir)}


def reference(
    gemma_path: Path, vocab: LlamaVocab, tokens: list[int], settings: SamplerSettings, gbnf: str
) -> tuple[list[int], list[int]]:
    """llama-server's tokens and rejection points, from llama.cpp's chain, grammar sampler and model."""
    import llama_cpp

    model = llama_cpp.Llama(
        model_path=str(gemma_path), n_ctx=N_CTX, n_threads=2, flash_attn=True, logits_all=True, verbose=False
    )
    grammar = LlamaGrammar.create(vocab, gbnf)
    assert grammar is not None
    generated: list[int] = []
    rejected: list[int] = []
    with LlamaSamplerChain(llama_steps(settings, vocab.n_vocab)) as chain, grammar:
        for token in tokens:
            chain.accept(token)
        model.eval(tokens)
        for index in range(MAX_TOKENS):
            logits = np.array(model.scores[model.n_tokens - 1], dtype=np.float32)
            token = chain.sample(logits)
            if not grammar_allows(grammar, token):
                rejected.append(index)
                allowed = grammar.allowed()
                token = chain.sample(np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32))
            grammar.accept(token)
            chain.accept(token)
            generated.append(token)
            if vocab.is_eog(token):
                break
            if index + 1 < MAX_TOKENS:
                model.eval([token])
    model.close()
    return generated, rejected


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Model]:
    with Model(gemma_path, n_ctx=N_CTX, n_threads=2) as model:
        yield model


@pytest.fixture(scope="module")
def llama_vocab(gemma_path: Path) -> Iterator[LlamaVocab]:
    with LlamaVocab(gemma_path) as vocab:
        yield vocab


def compare(
    case: Case, client: Client, gemma: Model, gemma_path: Path, llama_vocab: LlamaVocab, llama_cpp_dir: Path,
    oracle_report: OracleReport, subject: str,
) -> None:
    tokens = prompt_tokens(gemma, prompt=case.prompt, chat=case.chat)
    handle = client.register_vocab(gguf=gemma_path)
    with client.session(handle, **session_arguments(case, llama_cpp_dir)) as session:  # type: ignore[arg-type]
        ours = generate(gemma, tokens, case.settings, session=session, max_tokens=MAX_TOKENS)
    gbnf = grammar_text(case, llama_cpp_dir)
    expected, rejected = reference(gemma_path, llama_vocab, tokens, case.settings, gbnf)
    same = sum(a == b for a, b in zip(ours.tokens, expected, strict=False))
    total = max(len(expected), len(ours.tokens))
    oracle_report.add("generated tokens", subject, identical=same, total=total)
    oracle_report.add("rejection points", subject, identical=int(list(ours.rejected_at) == rejected), total=1)
    assert list(ours.tokens) == expected
    assert list(ours.rejected_at) == rejected


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_in_process_generation_is_llama_servers(
    case: Case, gemma: Model, gemma_path: Path, llama_vocab: LlamaVocab, llama_cpp_dir: Path,
    oracle_report: OracleReport,
) -> None:
    with Client("local") as client:
        compare(
            case, client, gemma, gemma_path, llama_vocab, llama_cpp_dir, oracle_report, "gemma-3-270m local"
        )


@pytest.mark.oracle
@pytest.mark.slow
def test_generation_through_a_unix_socket_is_llama_servers(
    gemma: Model, gemma_path: Path, llama_vocab: LlamaVocab, llama_cpp_dir: Path, oracle_report: OracleReport
) -> None:
    with PrivateConstraintd() as server, Client(server.target) as client:
        subject = "gemma-3-270m unix"
        compare(CASES[1], client, gemma, gemma_path, llama_vocab, llama_cpp_dir, oracle_report, subject)
