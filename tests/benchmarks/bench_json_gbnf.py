"""Whole-vocabulary mask time: constraintd's Matcher.mask() beside llama.cpp's grammar sampler, same run.

    .venv/bin/python -m tests.benchmarks.bench_json_gbnf [--vocab NAME ...] [--grammar FILE] [--steps N]

For each vocabulary: compile llama.cpp's grammars/json.gbnf (or --grammar), walk a fixed JSON text
tokenized by the vocabulary, then seeded random steps among the allowed tokens, and time at every step
constraintd's mask computed cold (its mask cache emptied first; the per-vocabulary tables and the learnt
grammar states and per-position verdicts are kept, as in a running server), warm (the same state
again), and as a plain column walk over the whole vocabulary (no mask caches at all: the cost of a
state never seen), beside llama.cpp's llama_sampler_apply over the whole vocabulary. Prints a table;
not a test (nothing is asserted).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from constraintd.engine import Grammar, Matcher, Vocab, unpack_mask
from constraintd.engine.masks.compute import compute_mask
from tests import reference
from tests.oracle import LlamaGrammar, LlamaVocab

TEXT = (
    '{"name": "J\u00e9r\u00f4me \u4e2d\u6587", "age": 42, "tags": ["a", "b\\n"], '
    '"nested": {"list": [1.5e3, true, null, -0.25], "s": "some longer text here"}}'
)


def measure(name: str, grammar_text: str, steps: int) -> dict[str, object]:
    path = reference.gemma_path() if name == "gemma" else reference.vocab_path(name)
    llama_vocab = LlamaVocab(path)
    start = time.perf_counter()
    vocab = Vocab.from_gguf(path)
    grammar = Grammar.from_gbnf(grammar_text, vocab)
    matcher = Matcher(grammar)
    matcher.mask()  # builds the per-vocabulary tables once
    setup = time.perf_counter() - start
    llama = LlamaGrammar.create(llama_vocab, grammar_text)
    assert llama is not None
    rng = np.random.default_rng(0)
    tokens = iter(llama_vocab.tokenize(TEXT.encode()))
    cold: list[float] = []
    warm: list[float] = []
    full: list[float] = []
    reference_times: list[float] = []
    identical = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        expected = llama.allowed()
        reference_times.append(time.perf_counter() - t0)
        grammar._masks.forget_masks()
        t0 = time.perf_counter()
        mask = matcher.mask()
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        matcher.mask()
        warm.append(time.perf_counter() - t0)
        state = grammar._states.intern(matcher.stacks, matcher.max_stacks)
        t0 = time.perf_counter()
        compute_mask(state, matcher.partial_utf8, grammar._decoded, matcher.max_stacks)
        full.append(time.perf_counter() - t0)
        identical += bool(np.array_equal(unpack_mask(mask, expected.size), expected))
        token = next(tokens, None)
        if token is None or not expected[token]:
            allowed = np.flatnonzero(expected)
            if allowed.size == 0:
                break
            token = int(rng.choice(allowed))
        if not matcher.fork().accept(token):
            break
        llama.accept(token)
        matcher.accept(token)
    llama.close()
    llama_vocab.close()
    return {
        "vocab": name,
        "tokens": len(vocab),
        "setup_s": setup,
        "masks": len(cold),
        "identical": identical,
        "cold_median_ms": 1000 * statistics.median(cold),
        "cold_p90_ms": 1000 * float(np.percentile(cold, 90)),
        "cold_max_ms": 1000 * max(cold),
        "warm_median_us": 1e6 * statistics.median(warm),
        "full_median_ms": 1000 * statistics.median(full),
        "full_max_ms": 1000 * max(full),
        "llama_median_ms": 1000 * statistics.median(reference_times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", action="append", help="qwen2, llama-bpe, llama-spm, gemma, ...")
    parser.add_argument("--grammar", help="a GBNF file (default: llama.cpp's grammars/json.gbnf)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    grammar_path = args.grammar or reference.llama_cpp_dir() / "grammars" / "json.gbnf"
    grammar_text = Path(grammar_path).read_text(encoding="utf-8")
    rows = [measure(name, grammar_text, args.steps) for name in args.vocab or ["qwen2", "gemma"]]
    header = (
        f"{'vocab':<10} {'tokens':>7} {'setup s':>8} {'masks':>6} {'same':>5} {'cold med ms':>11} "
        f"{'p90 ms':>7} {'max ms':>7} {'masks/s':>8} {'warm us':>8} {'walk med ms':>11} {'walk max':>8} "
        f"{'llama.cpp ms':>12}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['vocab']:<10} {r['tokens']:>7} {r['setup_s']:>8.2f} {r['masks']:>6} {r['identical']:>5} "
            f"{r['cold_median_ms']:>11.1f} {r['cold_p90_ms']:>7.1f} {r['cold_max_ms']:>7.1f} "
            f"{1000 / r['cold_median_ms']:>8.0f} {r['warm_median_us']:>8.1f} {r['full_median_ms']:>11.1f} "
            f"{r['full_max_ms']:>8.1f} {r['llama_median_ms']:>12.1f}"
        )


if __name__ == "__main__":
    main()
