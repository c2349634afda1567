"""Nesting benchmark (a program, not a test): JSON mode nested N arrays deep, one token at a time.

    .venv/bin/python -m tests.benchmarks.bench_nesting                 # 10,000 deep
    .venv/bin/python -m tests.benchmarks.bench_nesting --depth 2000    # a quick run
    .venv/bin/python -m tests.benchmarks.bench_nesting --engine "constraintd, Unix socket"

Each engine walks the same tokens of qwen2's vocabulary (llama.cpp's vocabulary-only GGUF): `{"a":`, then
`[` one token at a time until `--depth` arrays are open, then `1`, and every array closed again. Each runs
alone in a fresh process, so its memory is its own: what it held once its grammar was ready, the resident
memory it gained at the deepest point above that, and what it still held when the walk was over and the
matcher dropped. Per-token times are p50 / p99 / max over the way down and over the way up.

Engines: constraintd in process (`Matcher.accept`); constraintd over a Unix socket (a `constraintd serve`
process, its memory measured from outside, each Accept one round trip of the blocking client; the server
is a warm one: the JSON grammar compiled by a session before, and the server idle again, its lookahead over
that grammar done);
llama.cpp's grammar sampler (llama-cpp-python, `llama_sampler_accept`, the same GBNF as constraintd's);
XGrammar and llguidance from the schema `{"type": "object"}`, where installed. Numbers depend on the
machine and on what else runs on it: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from constraintd.server.memory import resident_bytes as rss  # noqa: E402
from tests import reference  # noqa: E402

MIB = 1 << 20
# llama.cpp's, XGrammar's and llguidance's names as tests/benchmarks/peers.py gives them
ENGINES = ("constraintd, in process", "constraintd, Unix socket", "llama.cpp", "XGrammar", "llguidance")
OPEN_SCHEMA = json.dumps({"type": "object"})


def walk_tokens(depth: int) -> tuple[list[int], int]:
    """The tokens of the walk on qwen2, and how many of them go down (the rest come back up)."""
    from tests.oracle import LlamaVocab

    llama = LlamaVocab(reference.require(reference.vocab_path("qwen2")))
    start = llama.tokenize(b'{"a":')
    (bracket,) = llama.tokenize(b"[")
    (one,) = llama.tokenize(b"1")
    (close,) = llama.tokenize(b"]")
    (brace,) = llama.tokenize(b"}")
    down = [*start, *[bracket] * depth]
    return [*down, one, *[close] * depth, brace], len(down)


def walk(
    accept: Callable[[int], bool], tokens: list[int], down: int, memory: Callable[[], int]
) -> dict[str, Any]:
    """Accepts every token, timing each; the memory gained at the deepest point."""
    gc.collect()  # what loading left for the collector is not counted against the walk
    base = memory()
    seconds: list[float] = []
    deepest = 0
    for index, token in enumerate(tokens):
        started = time.perf_counter()
        taken = accept(token)
        seconds.append(time.perf_counter() - started)
        if not taken:
            raise RuntimeError(f"token {index} of the walk was refused")
        if index == down - 1:
            deepest = memory() - base
    return {"base": base, "deepest": deepest, "down": seconds[:down], "up": seconds[down:]}


def run_engine(name: str, depth: int, results: Any) -> None:
    """One engine's walk, in a process of its own; its row goes to `results`."""
    try:
        tokens, down = walk_tokens(depth)
        if name == "constraintd, Unix socket":
            results.put((name, _over_socket(tokens, down)))
            return
        accept, close = _in_process(name)
        row = walk(accept, tokens, down, rss)
        close()
        gc.collect()
        row["after"] = rss() - row["base"]
        results.put((name, row))
    except Exception as error:  # reported in the table
        results.put((name, {"error": f"{type(error).__name__}: {error}"[:200]}))


def _in_process(name: str) -> tuple[Callable[[int], bool], Callable[[], None]]:
    from constraintd.engine import Grammar, Matcher, Vocab, json_object_grammar
    from tests.benchmarks import peers
    from tests.oracle import LlamaVocab

    path = reference.require(reference.vocab_path("qwen2"))
    gbnf = json_object_grammar()
    if name == "constraintd, in process":
        matcher: Matcher | None = Matcher(Grammar.from_gbnf(gbnf, Vocab.from_gguf(path)), max_stacks=10**6)

        def close() -> None:
            nonlocal matcher
            matcher = None

        return lambda token: matcher is not None and matcher.accept(token), close
    llama = LlamaVocab(path)
    if name == peers.LLAMA_CPP:
        cursor, _ = peers.LlamaEngine(llama).start(gbnf, OPEN_SCHEMA)
    else:
        vocab = Vocab.from_gguf(path)
        eog = sorted(vocab.eog_ids)
        engines, _ = peers.load_peers(vocab.pieces, eog, llama.tokenize, inputs=(peers.JSON_SCHEMA,))
        chosen = [engine for engine in engines if engine.name.startswith(name)]
        if not chosen:
            raise RuntimeError(f"{name} is not installed")
        cursor, _ = chosen[0].start(gbnf, OPEN_SCHEMA)
    return cursor.accept, cursor.close


def _over_socket(tokens: list[int], down: int) -> dict[str, Any]:
    from clients import Client, Policy
    from tests.server.running import CappedServer, socket_dir, wait_serving

    with socket_dir() as directory:
        server = CappedServer(directory / "constraintd.sock")
        server.args.remove("--no-uvloop")  # as the service runs
        server.launch()
        try:
            wait_serving(server.target, server=server)
            with Client(server.target, policy=Policy(timeout=120.0)) as client:
                vocab = client.register_vocab(gguf=reference.vocab_path("qwen2"))
                client.session(vocab, json_object=True).close()  # the grammar compiled, as a warm server
                assert server.process is not None
                pid = server.process.pid
                # and the server idle again: a new grammar's lookahead (--lookahead-seconds of CPU, in a
                # thread) runs beside the first sessions' calls and learns verdicts the grammar keeps
                _until_idle(server)
                with client.session(vocab, json_object=True) as session:
                    row = walk(session.accept, tokens, down, lambda: rss(pid))
                # the Close is answered before its session's memory is let go, and the server gives back what
                # the session freed at its next look at its size (server/memory.py: once a second)
                time.sleep(3.0)
                row["after"] = rss(pid) - row["base"]
                return row
        finally:
            server.kill()


def _until_idle(server: Any, *, most: float = 30.0) -> None:
    """Waits until the server spends less than a tenth of a core (over half a second), or `most` seconds."""
    until = time.monotonic() + most
    while time.monotonic() < until:
        cpu = server.cpu_seconds()
        time.sleep(0.5)
        if server.cpu_seconds() - cpu < 0.05:
            return


def _times(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered) * 1e6:,.0f} / {p99 * 1e6:,.0f} / {ordered[-1] * 1e6:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depth", type=int, default=10_000, help="arrays opened (default 10,000)")
    parser.add_argument("--engine", action="append", default=[], choices=ENGINES,
                        help="walk only this engine (repeatable; default: all of them)")
    args = parser.parse_args(argv)
    names = args.engine or list(ENGINES)
    context = multiprocessing.get_context("spawn")
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"[nesting] {name}: {args.depth:,} arrays deep and back", file=sys.stderr, flush=True)
        results = context.Queue()
        process = context.Process(target=run_engine, args=(name, args.depth, results))
        process.start()
        got, row = results.get(timeout=3600)
        process.join(timeout=60)
        rows[got] = row
    print(f"JSON mode, {args.depth:,} arrays deep, one token at a time (qwen2's tokens)")
    header = ("engine", "MiB at start", "MiB deepest", "MiB after", "down: µs p50 / p99 / max",
              "up: µs p50 / p99 / max")
    widths = (26, 12, 12, 10, 28, 28)
    print("  ".join(f"{h:<{w}}" for h, w in zip(header, widths, strict=True)))
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:<26}  {row['error']}")
            continue
        cells = (
            name,
            f"{row['base'] / MIB:,.1f}",
            f"{row['deepest'] / MIB:,.1f}",
            f"{row['after'] / MIB:,.1f}",
            _times(row["down"]),
            _times(row["up"]),
        )
        print("  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
