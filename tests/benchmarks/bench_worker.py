"""Benchmark of the sampler worker (not a test): prints a table.

    python tests/benchmarks/bench_worker.py            # a few minutes on two cores
    python tests/benchmarks/bench_worker.py --quick    # fewer and shorter generations, for a smoke run

Gemma 3 270M (262,144 tokens) generates JSON for a chat prompt under a JSON schema, with llama-server's
default sampling and several seeds, along five paths, in this process one after the other:
- unconstrained: our numpy sampler chain, no grammar (the floor the constrained paths are measured from);
- constrained, constraintd in process (`Client("local")`): draw, Accept, on rejection Mask and redraw;
- constrained, constraintd over a Unix socket (a private `constraintd serve`, started before timing);
- llama.cpp's own chain and grammar sampler through ctypes, with llama-server's algorithm (check the
  drawn token, mask the whole vocabulary only on rejection): the same tokens as ours, C speed;
- llama-cpp-python's `Llama.create_completion(grammar=LlamaGrammar)`: its sampler applies the grammar to
  every token of the vocabulary at every step (grammar first), so its tokens differ from llama-server's.
Reported per path: tokens generated, tokens per second (prompt evaluation included, same prompt for all),
milliseconds per token in the model, the sampler and constraint calls (where the path can tell them
apart), and rejected first draws and whole-vocabulary masks per 100 tokens. Numbers depend on the machine
and on what else runs on it: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from clients import Client  # noqa: E402
from constraintd.engine.json_schema import json_schema_to_gbnf  # noqa: E402
from sampler_worker.chain import SamplerSettings  # noqa: E402
from sampler_worker.generate import Generation, generate  # noqa: E402
from sampler_worker.model import Model  # noqa: E402
from sampler_worker.prompt import prompt_tokens  # noqa: E402
from sampler_worker.sidecar import PrivateConstraintd  # noqa: E402
from tests import reference  # noqa: E402
from tests.oracle import LlamaGrammar, LlamaSamplerChain, LlamaVocab, grammar_allows  # noqa: E402
from tests.sampler_worker.llama_chain import llama_steps  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "remote": {"type": "boolean"},
    },
    "required": ["name", "age", "languages", "remote"],
}
CHAT = "Describe a software engineer as a JSON object."
N_CTX = 512
THREADS = 2


@dataclass
class Row:
    path: str
    tokens: int = 0
    seconds: float = 0.0
    model: float | None = None
    sampler: float | None = None
    constraint: float | None = None
    rejections: int | None = None
    masks: int | None = None

    def add(self, generation: Generation, seconds: float, *, constrained: bool) -> None:
        counters = generation.counters
        self.tokens += len(generation.tokens)
        self.seconds += seconds
        self.model = (self.model or 0.0) + counters.model_seconds
        self.sampler = (self.sampler or 0.0) + counters.sampler_seconds
        if constrained:
            self.constraint = (self.constraint or 0.0) + counters.constraint_seconds
            self.rejections = (self.rejections or 0) + counters.rejections
            self.masks = (self.masks or 0) + counters.masks


def run_ours(row: Row, model: Model, tokens: list[int], seeds: list[int], max_tokens: int,
             client: Client | None, gguf: Path) -> None:
    handle = client.register_vocab(gguf=gguf) if client is not None else None
    for seed in seeds:
        settings = SamplerSettings(seed=seed)
        if client is None or handle is None:
            started = time.perf_counter()
            generation = generate(model, tokens, settings, max_tokens=max_tokens)
        else:
            with client.session(handle, json_schema=json.dumps(SCHEMA)) as session:
                started = time.perf_counter()
                generation = generate(model, tokens, settings, session=session, max_tokens=max_tokens)
        row.add(generation, time.perf_counter() - started, constrained=client is not None)


def run_llama_cpp_chain(row: Row, gguf: Path, tokens: list[int], seeds: list[int], max_tokens: int) -> None:
    import llama_cpp

    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
    model = llama_cpp.Llama(model_path=str(gguf), n_ctx=N_CTX, n_threads=THREADS, flash_attn=True,
                            logits_all=True, verbose=False)
    row.rejections = row.masks = 0
    row.sampler = row.model = 0.0
    with LlamaVocab(gguf) as vocab:
        for seed in seeds:
            grammar = LlamaGrammar.create(vocab, gbnf)
            assert grammar is not None
            started = time.perf_counter()
            model.reset()
            with LlamaSamplerChain(llama_steps(SamplerSettings(seed=seed), vocab.n_vocab)) as chain, grammar:
                for token in tokens:
                    chain.accept(token)
                clock = time.perf_counter()
                model.eval(tokens)
                row.model += time.perf_counter() - clock
                for index in range(max_tokens):
                    clock = time.perf_counter()
                    logits = np.array(model.scores[model.n_tokens - 1], dtype=np.float32)
                    token = chain.sample(logits)
                    if not grammar_allows(grammar, token):
                        row.rejections += 1
                        row.masks += 1
                        allowed = grammar.allowed()
                        masked = np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32)
                        token = chain.sample(masked)
                    grammar.accept(token)
                    chain.accept(token)
                    row.sampler += time.perf_counter() - clock
                    row.tokens += 1
                    if vocab.is_eog(token):
                        break
                    if index + 1 < max_tokens:
                        clock = time.perf_counter()
                        model.eval([token])
                        row.model += time.perf_counter() - clock
            row.seconds += time.perf_counter() - started
    model.close()


def run_llama_cpp_python_grammar(
    row: Row, gguf: Path, tokens: list[int], seeds: list[int], max_tokens: int
) -> None:
    import llama_cpp

    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
    model = llama_cpp.Llama(model_path=str(gguf), n_ctx=N_CTX, n_threads=THREADS, verbose=False)
    grammar = llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)
    for seed in seeds:
        model.reset()
        started = time.perf_counter()
        completion = model.create_completion(
            tokens, max_tokens=max_tokens, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed,
            grammar=grammar,
        )
        row.seconds += time.perf_counter() - started
        row.tokens += int(completion["usage"]["completion_tokens"])  # type: ignore[index]
    row.masks = row.tokens  # the grammar is applied to the whole vocabulary at every step
    model.close()


def per_token(value: float | None, tokens: int) -> str:
    return "-" if value is None or not tokens else f"{1000 * value / tokens:.1f}"


def per_hundred(value: int | None, tokens: int) -> str:
    return "-" if value is None or not tokens else f"{100 * value / tokens:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 generations of up to 24 tokens per path")
    parser.add_argument("--seeds", type=int, default=4, help="generations per path (default 4)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per generation (default 64)")
    args = parser.parse_args(argv)
    count, max_tokens = (2, 24) if args.quick else (args.seeds, args.max_tokens)
    seeds = list(range(1, count + 1))
    gguf = reference.gemma_path()
    rows = [
        Row("unconstrained (our chain)"),
        Row("constrained, constraintd in process"),
        Row("constrained, constraintd over a Unix socket"),
        Row("llama.cpp chain + grammar, llama-server's check (ctypes)"),
        Row("llama-cpp-python LlamaGrammar (grammar on every token)"),
    ]
    with Model(gguf, n_ctx=N_CTX, n_threads=THREADS) as model:
        tokens = prompt_tokens(model, chat=CHAT)
        run_ours(rows[0], model, tokens, seeds, max_tokens, None, gguf)
        with Client("local") as client:
            run_ours(rows[1], model, tokens, seeds, max_tokens, client, gguf)
        with PrivateConstraintd() as server, Client(server.target) as client:
            run_ours(rows[2], model, tokens, seeds, max_tokens, client, gguf)
    run_llama_cpp_chain(rows[3], gguf, tokens, seeds, max_tokens)
    run_llama_cpp_python_grammar(rows[4], gguf, tokens, seeds, max_tokens)

    width = max(len(row.path) for row in rows)
    print(
        f"sampler worker benchmark: Gemma 3 270M (262,144 tokens), {count} generations x up to {max_tokens} "
        f"tokens per path, JSON schema, {THREADS} model threads ({os.cpu_count()} CPUs), "
        f"Python {sys.version.split()[0]}"
    )
    header = ("tokens", "tokens/s", "ms model", "ms sampler", "ms constraint", "rejections/100", "masks/100")
    print(f"{'path':<{width}}  " + "  ".join(f"{name:>{len(name)}}" for name in header))
    print(f"{'-' * width}  " + "  ".join("-" * len(name) for name in header))
    for row in rows:
        values = (
            str(row.tokens),
            f"{row.tokens / row.seconds:.1f}" if row.seconds else "-",
            per_token(row.model, row.tokens),
            per_token(row.sampler, row.tokens),
            per_token(row.constraint, row.tokens),
            per_hundred(row.rejections, row.tokens),
            per_hundred(row.masks, row.tokens),
        )
        cells = "  ".join(f"{value:>{len(name)}}" for value, name in zip(values, header, strict=True))
        print(f"{row.path:<{width}}  {cells}")
    print("(ms columns are per generated token; '-' where a path cannot tell the part apart)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
