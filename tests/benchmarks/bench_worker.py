"""Benchmark of the sampler worker (not a test): prints a table.

    .venv/bin/python -m tests.benchmarks.bench_worker            # 4 prompts x 3 seeds x 5 paths
    .venv/bin/python -m tests.benchmarks.bench_worker --quick    # 2 prompts x 1 seed, for a smoke run

Gemma 3 270M (262,144 tokens) answers chat prompts under a JSON schema, with llama-server's default
sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05) and a seed, along five paths. Every
(prompt, seed) pair runs every path in turn before the next pair, so a change in the machine's load
falls on all paths alike:
- unconstrained: our numpy sampler chain, no grammar (the floor the constrained paths are measured from);
- constrained, constraintd in process (`Client("local")`): draw, Accept, on rejection Mask and redraw;
- constrained, constraintd over a Unix socket (a private `constraintd serve` process);
- llama.cpp's own chain and grammar sampler through ctypes, with llama-server's algorithm (check the
  drawn token, mask the whole vocabulary only on rejection), on the same model object as ours: the same
  tokens as ours, llama.cpp's sampler and grammar in place of ours and constraintd;
- llama-cpp-python's `Llama.create_completion(grammar=LlamaGrammar)`: its sampler applies the grammar to
  every token of the vocabulary at every step (grammar first), so its tokens differ from llama-server's.
constraintd's grammar is compiled and its first mask computed before the timed runs (a service keeps
compiled grammars; compile time is `bench_masks.py`'s subject).

Reported per path: generations and tokens; the median over generations of tokens per second after the
prompt (its evaluation left out, as llama-server's `predicted_per_second`: generations of different
lengths would otherwise share the prompt's cost unequally) and that median divided by the unconstrained
path's, by the wall clock and by CPU time; the median milliseconds per token in the model, the sampler
and constraint calls (where the path can tell them apart); rejected first draws and whole-vocabulary
masks per 100 tokens. Numbers depend on the machine and on what else runs on it: compare rows of one run.

`--part stand-in` (b) replays the recorded logits from a forward pass that waits without the CPU, as a
GPU-bound worker (stand_in.py); `--part draws` (c) times single draws, first and masked, against llama.cpp's
own chain on the same logits and masks. The README of this folder has the details.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from clients import Client, Session, VocabHandle  # noqa: E402
from clients.masks import allowed_tokens, apply_mask  # noqa: E402
from constraintd.engine.schema.convert import json_schema_to_gbnf  # noqa: E402
from sampler_worker.chain import SamplerChain, SamplerSettings  # noqa: E402
from sampler_worker.generate import Overlap, generate  # noqa: E402
from sampler_worker.model import Model  # noqa: E402
from sampler_worker.prompt import prompt_tokens  # noqa: E402
from sampler_worker.sidecar import PrivateConstraintd  # noqa: E402
from tests import reference  # noqa: E402
from tests.benchmarks import stand_in as stand_in_module  # noqa: E402
from tests.oracle import LlamaGrammar, LlamaSamplerChain, LlamaVocab, candidates, grammar_allows  # noqa: E402
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
PROMPTS = (
    "Describe a software engineer as a JSON object.",
    "Invent a person who writes compilers; answer in JSON.",
    "Give me a JSON record for a data scientist who works from home.",
    "Who is a typical web developer? Reply with JSON only.",
)
N_CTX = 512


@dataclass
class Run:
    """One generation: what it made and what it cost (None where the path cannot tell)."""

    tokens: int
    seconds: float  # the prompt's evaluation left out, as llama-server's predicted_per_second
    cpu: float = 0.0  # the same in CPU seconds of this process, and of constraintd's when it runs apart
    model: float | None = None
    sampler: float | None = None
    constraint: float | None = None
    rejections: int | None = None
    masks: int | None = None
    waits: int | None = None  # times the generation waited on constraintd with the model idle
    overlap: str | None = None  # the mode the generation ended in (what auto chose)


@dataclass
class PathResults:
    name: str
    runs: list[Run] = field(default_factory=list)

    def tokens_per_second(self) -> float:
        return statistics.median(run.tokens / run.seconds for run in self.runs if run.seconds)

    def tokens_per_cpu_second(self) -> float:
        return statistics.median(run.tokens / run.cpu for run in self.runs if run.cpu)

    def ms_per_token(self, part: Callable[[Run], float | None]) -> str:
        values = [(part(run), run.tokens) for run in self.runs]
        if any(value is None for value, _ in values):
            return "-"
        return f"{statistics.median(1000 * v / n for v, n in values if v is not None and n):.1f}"

    def per_hundred(self, part: Callable[[Run], int | None]) -> str:
        values = [part(run) for run in self.runs]
        tokens = sum(run.tokens for run in self.runs)
        if any(value is None for value in values) or not tokens:
            return "-"
        return f"{100 * sum(v for v in values if v is not None) / tokens:.1f}"


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) of this process, plus that of process `pid` if given."""
    total = time.process_time()
    if pid is not None:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


class Runner(Protocol):
    def run(self, tokens: list[int], seed: int, max_tokens: int) -> Run: ...


class Ours:
    """Our worker: the numpy chain and `generate`, constrained through a client or not."""

    def __init__(
        self,
        model: Model,
        client: Client | None,
        gguf: Path,
        *,
        server_pid: int | None = None,
        overlap: Overlap = "off",
    ) -> None:
        self.model = model
        self.client = client
        self.server_pid = server_pid
        self.overlap: Overlap = overlap
        self.handle: VocabHandle | None = None
        if client is not None:
            self.handle = client.register_vocab(gguf=gguf)
            with self.session() as session:  # compile the grammar and its first mask before timing
                session.mask()

    def session(self) -> Session:
        assert self.client is not None and self.handle is not None
        return self.client.session(self.handle, json_schema=json.dumps(SCHEMA))

    def run(self, tokens: list[int], seed: int, max_tokens: int) -> Run:
        settings = SamplerSettings(seed=seed)
        if self.client is None:
            started, cpu = time.perf_counter(), cpu_seconds()
            generation = generate(self.model, tokens, settings, max_tokens=max_tokens)
            seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        else:
            with self.session() as session:
                started, cpu = time.perf_counter(), cpu_seconds(self.server_pid)
                generation = generate(
                    self.model, tokens, settings, session=session, max_tokens=max_tokens, overlap=self.overlap
                )
                seconds, cpu = time.perf_counter() - started, cpu_seconds(self.server_pid) - cpu
        counters = generation.counters
        constrained = self.client is not None
        prompt = counters.prompt_seconds
        return Run(
            len(generation.tokens), seconds - prompt, cpu - prompt, counters.model_seconds - prompt,
            counters.sampler_seconds,
            counters.constraint_seconds if constrained else None,
            counters.rejections if constrained else None, counters.masks if constrained else None,
            counters.waits if constrained else None, generation.overlap if constrained else None,
        )


class LlamaCppChain:
    """llama.cpp's chain and grammar sampler with llama-server's check-then-mask, on our model's logits."""

    def __init__(self, model: Model, gguf: Path) -> None:
        self.gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
        self.model = model
        self.vocab = LlamaVocab(gguf)

    def run(self, tokens: list[int], seed: int, max_tokens: int) -> Run:
        grammar = LlamaGrammar.create(self.vocab, self.gbnf)
        assert grammar is not None
        generated = rejections = 0
        model_seconds = sampler_seconds = 0.0
        started, cpu = time.perf_counter(), cpu_seconds()
        self.model.reset()
        with LlamaSamplerChain(llama_steps(SamplerSettings(seed=seed), self.vocab.n_vocab)) as chain, grammar:
            for token in tokens:
                chain.accept(token)
            clock = time.perf_counter()
            logits = self.model.decode(tokens)
            prompt = time.perf_counter() - clock
            for index in range(max_tokens):
                clock = time.perf_counter()
                token = chain.sample(logits)
                if not grammar_allows(grammar, token):
                    rejections += 1
                    allowed = grammar.allowed()
                    token = chain.sample(np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32))
                grammar.accept(token)
                chain.accept(token)
                sampler_seconds += time.perf_counter() - clock
                generated += 1
                if self.vocab.is_eog(token):
                    break
                if index + 1 < max_tokens:
                    clock = time.perf_counter()
                    logits = self.model.decode([token])
                    model_seconds += time.perf_counter() - clock
        seconds, cpu = time.perf_counter() - started - prompt, cpu_seconds() - cpu - prompt
        # the sampler column holds the grammar's time too: llama.cpp's loop does not tell them apart
        return Run(generated, seconds, cpu, model_seconds, sampler_seconds, None, rejections, rejections)

    def close(self) -> None:
        self.vocab.close()


class LlamaCppPythonGrammar:
    """llama-cpp-python's own path: `create_completion(grammar=LlamaGrammar)` (grammar on every token)."""

    def __init__(self, gguf: Path, threads: int) -> None:
        import llama_cpp

        self.model: Any = llama_cpp.Llama(
            model_path=str(gguf), n_ctx=N_CTX, n_threads=threads, flash_attn=True, verbose=False
        )
        gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
        self.grammar = llama_cpp.llama_grammar.LlamaGrammar.from_string(gbnf, verbose=False)

    def run(self, tokens: list[int], seed: int, max_tokens: int) -> Run:
        import llama_cpp

        self.model.reset()  # no prompt cache: every path evaluates the prompt
        llama_cpp.llama_perf_context_reset(self.model.ctx)
        started, cpu = time.perf_counter(), cpu_seconds()
        completion: Any = self.model.create_completion(
            tokens, max_tokens=max_tokens, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=seed,
            grammar=self.grammar,
        )
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        prompt = llama_cpp.llama_perf_context(self.model.ctx).t_p_eval_ms / 1000
        seconds, cpu = seconds - prompt, cpu - prompt
        generated = int(completion["usage"]["completion_tokens"])
        # the grammar is applied to the whole vocabulary at every step: one mask per token
        return Run(generated, seconds, cpu, masks=generated)

    def close(self) -> None:
        self.model.close()


REAL_PATHS: tuple[tuple[str, str | None, Overlap], ...] = (
    # (name, where constraintd runs: None unconstrained, "local" or "unix"; overlap mode)
    ("unconstrained (our chain)", None, "off"),
    ("constrained, in process, overlap off", "local", "off"),
    ("constrained, in process, overlap ahead", "local", "ahead"),
    ("constrained, Unix socket, overlap off", "unix", "off"),
    ("constrained, Unix socket, overlap ahead", "unix", "ahead"),
    ("constrained, Unix socket, overlap auto", "unix", "auto"),
)


def real_model(args: argparse.Namespace) -> None:
    """(a) The real model on this machine's CPU: every path on the same prompts and seeds."""
    prompts, seeds, max_tokens = (2, 1, 24) if args.quick else (args.prompts, args.seeds, args.max_tokens)
    gguf = reference.gemma_path()
    paths = [PathResults(name) for name, _, _ in REAL_PATHS]
    paths += [
        PathResults("llama.cpp chain + grammar, llama-server's check (ctypes)"),
        PathResults("llama-cpp-python LlamaGrammar (grammar on every token)"),
    ]
    with (
        Model(gguf, n_ctx=N_CTX, n_threads=args.threads) as model,
        Client("local") as local,
        PrivateConstraintd() as server,
        Client(server.target) as remote,
    ):
        chain, peer = LlamaCppChain(model, gguf), LlamaCppPythonGrammar(gguf, args.threads)
        assert server.process is not None
        clients = {"local": local, "unix": remote}
        runners: list[Runner] = [
            Ours(
                model, clients[where] if where else None, gguf, overlap=overlap,
                server_pid=server.process.pid if where == "unix" else None,
            )
            for _, where, overlap in REAL_PATHS
        ]
        runners += [chain, peer]
        for prompt in PROMPTS[:prompts]:
            tokens = prompt_tokens(model, chat=prompt)
            for seed in range(1, seeds + 1):
                for path, runner in zip(paths, runners, strict=True):
                    path.runs.append(runner.run(tokens, seed, max_tokens))
                print(f"prompt {PROMPTS.index(prompt) + 1}, seed {seed}: done", file=sys.stderr)
        chain.close()
        peer.close()

    floor, cpu_floor = paths[0].tokens_per_second(), paths[0].tokens_per_cpu_second()
    width = max(len(path.name) for path in paths)
    print(
        f"(a) real model: Gemma 3 270M (262,144 tokens), {prompts} prompts x {seeds} seeds = "
        f"{prompts * seeds} generations of up to {max_tokens} tokens per path, JSON schema, llama-server's "
        f"default sampling, {args.threads} model thread(s) ({os.cpu_count()} CPUs), "
        f"Python {sys.version.split()[0]}"
    )
    header = ("tokens", "tokens/s p50", "x unconstr.", "tokens/CPU-s p50", "x unconstr.", "ms model",
              "ms sampler", "ms waiting", "waits/100", "rejections/100", "masks/100", "ran ahead")
    print(f"{'path':<{width}}  " + "  ".join(header))
    print(f"{'-' * width}  " + "  ".join("-" * len(name) for name in header))
    for path in paths:
        speed, cpu_speed = path.tokens_per_second(), path.tokens_per_cpu_second()
        overlaps = [run.overlap for run in path.runs]
        values = (
            str(sum(run.tokens for run in path.runs)),
            f"{speed:.1f}",
            f"{speed / floor:.3f}",
            f"{cpu_speed:.1f}",
            f"{cpu_speed / cpu_floor:.3f}",
            path.ms_per_token(lambda run: run.model),
            path.ms_per_token(lambda run: run.sampler),
            path.ms_per_token(lambda run: run.constraint),
            path.per_hundred(lambda run: run.waits),
            path.per_hundred(lambda run: run.rejections),
            path.per_hundred(lambda run: run.masks),
            "-" if None in overlaps else f"{overlaps.count('ahead')} of {len(overlaps)}",
        )
        cells = "  ".join(f"{value:>{len(name)}}" for value, name in zip(values, header, strict=True))
        print(f"{path.name:<{width}}  {cells}")
    print("(tokens/s: median over generations, after the prompt, wall clock; tokens/CPU-s: the same over the "
          "CPU time of this process and of the constraintd process; ms columns: median per generated token, "
          "wall clock, after the prompt, 'ms waiting' being the time spent waiting on constraintd with the "
          "model idle; waits/100: such waits per 100 tokens; ran ahead: generations that ended in mask-ahead "
          "mode; '-' where a path cannot tell the part apart)")


def stand_in(args: argparse.Namespace) -> None:
    """(b) The GPU-bound stand-in (tests/benchmarks/stand_in.py): where the constraint's round trip hides."""
    gguf = reference.gemma_path()
    schema = json.dumps(SCHEMA)
    forwards = [float(f) for f in args.forward_ms.split(",")]
    batches = [int(n) for n in args.batch.split(",")]
    rows: dict[tuple[float, int, str], list[stand_in_module.BatchRun]] = {}
    with (
        Model(gguf, n_ctx=N_CTX, n_threads=args.threads) as model,
        Client("local") as local,
        contextlib.ExitStack() as kept,
    ):
        handle = local.register_vocab(gguf=gguf)
        trajectories = _recorded(model, local, handle, schema, args)
        shared = None if args.cold else _served(kept, gguf)
        if shared is not None:  # every state the trajectories reach, and its mask, met once before timing
            for trajectory in trajectories:
                _one(model, trajectory, 0.0, *shared, schema, "ahead")
        for repeat in range(args.repeats):
            for forward in forwards:
                seconds = forward / 1000
                for count in batches:
                    chosen = [trajectories[i % len(trajectories)] for i in range(count)]
                    modes = ["unconstrained", "off", "ahead"] + (["auto"] if count == 1 else [])
                    for mode in modes:
                        with contextlib.ExitStack() as fresh:
                            # cold: a constraintd of its own for each constrained run, so the grammar's
                            # states, their masks and the vocabulary's shared verdicts are first met in it
                            remote, remote_handle = shared or (
                                _served(fresh, gguf, *args.serve)
                                if mode != "unconstrained" else (local, handle)
                            )
                            run = _timed(
                                model, trajectories if count == 1 else chosen, seconds, remote, remote_handle,
                                schema, mode, one_at_a_time=count == 1,
                            )
                        rows.setdefault((forward, count, mode), []).append(run)
                    print(f"repeat {repeat + 1}, F = {forward:g} ms, N = {count}: done", file=sys.stderr)
    print(
        f"(b) GPU-bound stand-in: Gemma 3 270M's logits replayed, each forward pass waiting F ms without "
        f"the CPU; {len(trajectories)} recorded trajectories of up to {args.stand_in_tokens} tokens, "
        f"constraintd over a Unix socket, {args.repeats} repeats (medians); "
        + ("cold: a constraintd of its own for each constrained run, so that the grammar's states are first "
           "met in it"
           if args.cold else "warm: every state's mask computed once before timing (first visits are "
           "bench_masks.py's subject)")
    )
    header = ("F ms", "N", "mode", "tokens/s p50", "x unconstr.", "ms waiting/token", "waits/100",
              "rejections/100")
    print("  ".join(f"{name:>14}" for name in header))
    for (forward, count, mode), runs in rows.items():
        baseline = rows[(forward, count, "unconstrained")]
        speed = stand_in_module.median([r.tokens / r.seconds for r in runs])
        # each repeat's run against the unconstrained run of the same repeat, moments apart: a shared
        # machine's drift between repeats moves both, not the ratio
        paired = stand_in_module.median([
            (r.tokens / r.seconds) / (b.tokens / b.seconds) for r, b in zip(runs, baseline, strict=True)
        ])
        made = sum(r.tokens for r in runs)
        values = (
            f"{forward:g}", str(count), mode, f"{speed:.1f}", f"{paired:.3f}",
            f"{stand_in_module.median([1000 * r.wait_seconds / r.tokens for r in runs]):.3f}",
            f"{100 * sum(r.waits for r in runs) / made:.1f}",
            f"{100 * sum(r.rejections for r in runs) / made:.1f}",
        )
        print("  ".join(f"{value:>14}" for value in values))
    print("(tokens/s: all N generations' tokens over the wall clock after the prompts, median of the "
          "repeats; x unconstr.: the median over the repeats of each run's tokens/s over the unconstrained "
          "run's of the same repeat; ms waiting/token: time the worker waited on constraintd after its "
          "forward pass, per token; waits/100: such waits per 100 tokens (off: every Step; ahead: a reply "
          "not in by the end of the forward pass; the last token's, which no forward pass follows, counts))")


def _served(stack: contextlib.ExitStack, gguf: Path, *serve_args: str) -> tuple[Client, VocabHandle]:
    """A private constraintd on a Unix socket (closed with `stack`), a client of it and the vocabulary."""
    server = stack.enter_context(PrivateConstraintd(serve_args=serve_args))
    remote = stack.enter_context(Client(server.target))
    return remote, remote.register_vocab(gguf=gguf)


def _timed(
    model: Model, trajectories: list[stand_in_module.Trajectory], seconds: float, client: Client,
    handle: VocabHandle, schema: str, mode: str, *, one_at_a_time: bool,
) -> stand_in_module.BatchRun:
    """The trajectories replayed in `mode`: one generation at a time, each in turn, or all at once over
    one Step stream."""
    if not one_at_a_time:
        return stand_in_module.run_batch(
            model, trajectories, seconds, client if mode != "unconstrained" else None, handle, schema, mode
        )
    runs = [_one(model, trajectory, seconds, client, handle, schema, mode) for trajectory in trajectories]
    return stand_in_module.BatchRun(
        sum(r.tokens for r in runs), sum(r.seconds for r in runs), sum(r.waits for r in runs),
        sum(r.wait_seconds for r in runs), sum(r.rejections for r in runs),
    )


def _recorded(
    model: Model, local: Client, handle: VocabHandle, schema: str, args: argparse.Namespace
) -> list[stand_in_module.Trajectory]:
    """The real model's constrained generations, one a prompt and seed, their logits kept step by step."""
    trajectories = []
    for prompt in PROMPTS[: args.prompts]:
        tokens = prompt_tokens(model, chat=prompt)
        for seed in range(1, args.seeds + 1):
            with local.session(handle, json_schema=schema) as session:
                trajectory = stand_in_module.record(model, tokens, seed, session, args.stand_in_tokens)
                trajectories.append(trajectory)
    print(f"recorded {len(trajectories)} trajectories of the real model", file=sys.stderr)
    return trajectories


def draws(args: argparse.Namespace) -> None:
    """(c) One draw at a time: our chain's first draws and masked redraws against llama.cpp's own chain,
    on the same logits and masks."""
    gguf = reference.gemma_path()
    schema = json.dumps(SCHEMA)
    times: dict[tuple[str, str], list[float]] = {}
    allowed_counts: list[int] = []
    identical = total = 0
    clock = time.perf_counter
    with Model(gguf, n_ctx=N_CTX, n_threads=args.threads) as model, Client("local") as local:
        handle = local.register_vocab(gguf=gguf)
        trajectories = _recorded(model, local, handle, schema, args)
        for _ in range(args.repeats):
            for trajectory in trajectories:
                settings = SamplerSettings(seed=trajectory.seed)
                ours = SamplerChain.from_settings(settings)
                with (
                    LlamaSamplerChain(llama_steps(settings, model.n_vocab)) as theirs,
                    local.session(handle, json_schema=schema) as session,
                ):
                    for logits in trajectory.logits:
                        started = clock()
                        token = ours.sample(logits)
                        times.setdefault(("first draw", "ours"), []).append(clock() - started)
                        data = candidates(logits)
                        started = clock()
                        _, selected = theirs.apply_to(data)
                        times.setdefault(("first draw", "llama.cpp"), []).append(clock() - started)
                        their_token = int(data["id"][selected])
                        if not session.allows(token):
                            words = session.mask()
                            started = clock()
                            allowed = allowed_tokens(words, model.n_vocab)
                            token = ours.sample(logits, allowed_ids=allowed)
                            times.setdefault(("redraw", "ours"), []).append(clock() - started)
                            allowed_counts.append(allowed.size)
                            data = candidates(apply_mask(logits.copy(), words))
                            started = clock()
                            _, selected = theirs.apply_to(data)
                            times.setdefault(("redraw", "llama.cpp"), []).append(clock() - started)
                            their_token = int(data["id"][selected])
                        identical += token == their_token
                        total += 1
                        ours.accept(token)
                        theirs.accept(token)
                        session.accept(token)
    print(
        f"(c) draws: Gemma 3 270M's logits ({model.n_vocab:,} tokens) along {len(trajectories)} recorded "
        f"constrained generations, {args.repeats} repeats, llama-server's default chain; a redraw follows "
        f"each first draw the grammar refuses, on its mask (allowed tokens p50 "
        f"{statistics.median(allowed_counts) if allowed_counts else 0:g}); tokens identical to llama.cpp's "
        f"chain: {identical} of {total}"
    )
    header = (
        "draw", "count", "ours p50 µs", "ours p90 µs", "llama.cpp p50 µs", "llama.cpp p90 µs", "x llama.cpp",
    )
    print("  ".join(f"{name:>16}" for name in header))
    for kind in ("first draw", "redraw"):
        mine, peer = times.get((kind, "ours"), []), times.get((kind, "llama.cpp"), [])
        if not mine:
            continue
        values = (
            kind, str(len(mine)), f"{_quantile(mine, 0.5):.1f}", f"{_quantile(mine, 0.9):.1f}",
            f"{_quantile(peer, 0.5):.1f}", f"{_quantile(peer, 0.9):.1f}",
            f"{statistics.median(mine) / statistics.median(peer):.3f}",
        )
        print("  ".join(f"{value:>16}" for value in values))
    print("(µs: wall clock of one draw; ours from the logits and, for a redraw, the packed mask; llama.cpp's "
          "the chain's own `llama_sampler_apply` on candidates already built, which leaves out the "
          "vocabulary-sized array llama-server builds and masks before it; x llama.cpp: the medians' ratio)")


def _quantile(seconds: list[float], q: float) -> float:
    # microseconds; numpy's percentile, so that p50 is the median the ratio column divides
    return 1e6 * float(np.percentile(seconds, 100 * q))


def _one(
    model: Model, trajectory: stand_in_module.Trajectory, seconds: float, client: Client,
    handle: VocabHandle, schema: str, mode: str,
) -> stand_in_module.BatchRun:
    if mode == "unconstrained":
        return stand_in_module.run_one(model, trajectory, seconds, None, "off")
    overlap: Overlap = "off" if mode == "off" else "ahead" if mode == "ahead" else "auto"
    with client.session(handle, json_schema=schema) as session:
        return stand_in_module.run_one(model, trajectory, seconds, session, overlap)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=["real", "stand-in", "draws", "all"], default="all",
                        help="(a) the real model, (b) the GPU-bound stand-in, (c) one draw at a time against "
                        "llama.cpp's chain, or all three (default)")
    parser.add_argument("--quick", action="store_true", help="(a): 2 prompts x 1 seed of up to 24 tokens")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"prompts (1-{len(PROMPTS)})")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per prompt (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="(a): tokens per generation (default 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="model threads, every path (default 1: steady on a shared machine)")
    parser.add_argument("--forward-ms", default="5,15,30", help="(b): forward pass times F, ms")
    parser.add_argument("--batch", default="1,8,64", help="(b): concurrent generations N")
    parser.add_argument("--stand-in-tokens", type=int, default=32, help="(b): tokens per trajectory")
    parser.add_argument("--repeats", type=int, default=3,
                        help="(b): repeats of every cell; (c): walks of every trajectory (default 3)")
    parser.add_argument("--serve", action="append", default=[], metavar="ARG",
                        help="(b): an argument more for a cold run's constraintd (--serve=--warm-seconds=30)")
    parser.add_argument("--cold", action="store_true",
                        help="(b): each constrained run on a constraintd of its own, caches empty")
    args = parser.parse_args(argv)
    if args.part in ("real", "all"):
        real_model(args)
    if args.part in ("stand-in", "all"):
        stand_in(args)
    if args.part in ("draws", "all"):
        draws(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
