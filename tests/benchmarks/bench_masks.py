"""Mask benchmark (a program, not a test): constraintd, llama.cpp, XGrammar and llguidance side by side.

    .venv/bin/python -m tests.benchmarks.bench_masks --vocab both          # the whole sample
    .venv/bin/python -m tests.benchmarks.bench_masks --vocab qwen2 --schemas 20   # a quick subset

Workload: the MaskBench sample (`tests/vectors/maskbench-sample/`, real JSON schemas with valid documents).
Each schema is converted to GBNF by constraintd's converter (llama.cpp's, byte for byte); each valid
document is serialized compactly and tokenized by llama.cpp's tokenizer; documents llama.cpp's grammar
sampler does not accept to the end are dropped. Each kept document is then walked token by token by every
engine at once, on the same vocabulary and the same tokens: at every step a whole mask, then `allows` and
`accept` of the next token. Per engine it prints p50 / p90 / p99 / max of:
- mask: one whole-vocabulary mask (every step but a grammar's first, which is counted in compile);
- compile: from the grammar text to the first mask ready (one per grammar);
- lookahead (constraintd's alone): after the compile, before the first document, `--lookahead` seconds of
  CPU spent learning the verdicts the grammar's first states need (`Grammar.lookahead`), as a server
  spends the time a new session's prompt is evaluated in; measured apart, and not counted in compile;
- allows / accept: one token;
with the ratio of each peer's time to constraintd's (above 1: constraintd is faster), and checks that
constraintd's masks equal llama.cpp's, every one of them, in the same run. The same tables follow for the
short documents alone (under SHORT_TOKENS tokens: a function call's arguments), nearly all of whose masks
are a grammar's first visit to a state.

`--schemas N` walks N schemas drawn uniformly at random, without replacement, from the whole sample (the
first N of a permutation of all of them drawn from `--seed`). Every engine is measured on the same steps:
a document llama.cpp refuses is walked by none, and an engine that fails a document keeps none of its
times for it.

`--worst N` lists constraintd's N slowest masks of the first pass, with the schema, the document and the
step each was asked at, so a profile can start from them.

With `--again`, each schema's kept documents are walked a second time by the same compiled grammars and
the masks, allows and accepts of that pass get tables of their own: a grammar that has served its
documents before, as a server's grammar for a schema its sessions keep asking for (constraintd keeps what
it learnt on the first pass; the peers keep what they keep).

All engines run on one thread in one process, in turn at each step, so they see the same machine. What
lives through the run (the imports, the vocabulary and every engine's tables) is frozen out of the garbage
collector's sight (`gc.freeze`, as `constraintd serve` freezes its imports), and the collector runs between
schemas; it stays on during a walk, which pays for the collections its own allocations cause. The report
counts the full collections inside the walks and their longest pause. `--keep-grammars` holds every
compiled grammar of constraintd through the run, as a server's cache of compiled grammars does, and does not
collect between schemas: the collector's own full collections then walk them all, inside the walks; at
the end it counts the objects a full collection walks with them all held and times one (CPU time).
Numbers depend on the machine and on what else runs on it: compare the rows of one run.
Progress goes to stderr; the tables to stdout. See README.md for the peers' one-time setup.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Final

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from constraintd.engine import Vocab  # noqa: E402
from constraintd.engine.masks.ahead import LOOKAHEAD_SECONDS  # noqa: E402
from constraintd.engine.schema.convert import json_schema_to_gbnf  # noqa: E402
from constraintd.errors import SchemaError  # noqa: E402
from tests import reference  # noqa: E402
from tests.benchmarks import peers  # noqa: E402
from tests.oracle import LlamaVocab  # noqa: E402

WORKLOAD: Final = ROOT / "tests" / "vectors" / "maskbench-sample"
VOCABS: Final = ("qwen2", "gemma")
MASK, COMPILE, LOOKAHEAD, ALLOWS, ACCEPT = "mask", "compile", "lookahead", "allows", "accept"
COLLECTIONS: Final = 5  # full collections timed at the end of a run that held its grammars
# metric -> (unit, nanoseconds per unit)
UNITS: Final = {
    MASK: ("ms", 1e6),
    COMPILE: ("ms", 1e6),
    LOOKAHEAD: ("ms", 1e6),
    ALLOWS: ("µs", 1e3),
    ACCEPT: ("µs", 1e3),
}
PERCENTILES: Final = (50, 90, 99, 100)
SHORT_TOKENS: Final = 64  # documents shorter than this get tables of their own
PEER_INPUTS: Final = {
    "gbnf": (peers.GBNF,),
    "schema": (peers.JSON_SCHEMA,),
    "both": (peers.GBNF, peers.JSON_SCHEMA),
    "none": (),  # constraintd and llama.cpp alone (llama.cpp decides the documents and checks the masks)
}


@dataclass(frozen=True, slots=True)
class Schema:
    name: str
    text: str  # the JSON schema, as JSON text
    documents: tuple[str, ...]  # valid documents, compact JSON


def read_workload(directory: Path, *, count: int | None, seed: int) -> list[Schema]:
    """`count` of the sample's schemas (all by default) drawn uniformly from all of them by `seed`.

    The first `count` of a uniformly random permutation (`random.shuffle`, Fisher-Yates) of every file:
    each subset of that size is equally likely, whatever the files' names.
    """
    files = sorted(directory.glob("*.json"))
    random.Random(seed).shuffle(files)
    schemas = []
    for path in files[:count]:
        entry = json.loads(path.read_text(encoding="utf-8"))
        documents = tuple(
            json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            for test in entry["tests"]
            if test["valid"]
        )
        schemas.append(Schema(path.stem, json.dumps(entry["schema"]), documents))
    return schemas


@dataclass(slots=True)
class Tally:
    """What one vocabulary's run met, beside the timings."""

    schemas: int = 0
    converter_refused: int = 0
    llama_refused: int = 0
    without_document: int = 0
    documents: int = 0
    kept: int = 0
    rejected: int = 0  # llama.cpp refused a token of the document
    unfinished: int = 0  # llama.cpp does not allow end of generation after the document
    inconsistent: int = 0  # llama.cpp's whole mask disagrees with its one-token check
    tokens: int = 0
    short: int = 0  # kept documents under SHORT_TOKENS tokens
    short_tokens: int = 0
    forms: dict[str, Counter[str]] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)  # kept documents an engine could not walk
    gave_up: Counter[str] = field(default_factory=Counter)  # kept documents left after a too slow mask
    errors: dict[str, str] = field(default_factory=dict)  # an engine's first error, for the reader
    equal: Counter[str] = field(default_factory=Counter)  # masks equal to llama.cpp's
    compared: Counter[str] = field(default_factory=Counter)
    cache_bytes: list[int] = field(default_factory=list)  # constraintd, per grammar
    cache_states: list[int] = field(default_factory=list)
    shared_bytes: int = 0  # constraintd's shared verdicts and run ends, after the last grammar
    shared_tops: int = 0


Samples = dict[str, dict[str, list[int]]]  # engine -> metric -> nanoseconds
Clock = Callable[[], int]
# CPU time of this process by default: on a shared machine, wall time also counts the waits for a core
CLOCKS: Final[dict[str, Clock]] = {"cpu": time.process_time_ns, "wall": time.perf_counter_ns}


def _bit(words: np.ndarray, token: int) -> bool:
    return bool((int(words[token // 32]) >> (token % 32)) & 1)


class Run:
    """One vocabulary: its engines, the walk of every schema, and what it measured."""

    def __init__(
        self,
        engines: Sequence[peers.Engine],
        llama: LlamaVocab,
        eog: Sequence[int],
        *,
        clock: Clock,
        give_up_seconds: float,
        again: bool = False,
        lookahead: float = 0.0,
        keep_grammars: bool = False,
    ) -> None:
        self.engines = list(engines)  # llama.cpp first: it decides which documents are kept
        self.lookahead = lookahead  # CPU seconds of constraintd's lookahead after each compile
        # constraintd's compiled grammars, each held through the run (--keep-grammars), as a server's
        # cache of compiled grammars holds them
        self.kept_grammars: list[object] | None = [] if keep_grammars else None
        self.clock = clock
        self.give_up_ns = int(give_up_seconds * 1e9)
        self.llama = llama
        self.eog = list(eog)
        self.tally = Tally(forms={e.name: Counter() for e in engines})
        self.samples: Samples = {e.name: {m: [] for m in UNITS} for e in engines}
        # the second walk of each schema's documents (--again), kept apart
        self.again: Samples | None = {e.name: {m: [] for m in UNITS} for e in engines} if again else None
        # the first walk's steps of documents under SHORT_TOKENS tokens, also counted in `samples`
        self.short: Samples = {e.name: {m: [] for m in UNITS} for e in engines}
        # where each of constraintd's first-pass masks in `samples` was asked: (schema, document, step,
        # the document's tokens), in the same order
        self.where: list[tuple[str, int, int, int]] = []
        self._at: tuple[str, int] = ("", 0)  # the schema and document being walked

    def schema(self, schema: Schema) -> tuple[int, int]:
        """Walk the documents of one schema; (documents kept, tokens walked)."""
        tally = self.tally
        tally.schemas += 1
        tally.documents += len(schema.documents)
        try:
            gbnf = json_schema_to_gbnf(schema.text)
        except SchemaError:
            tally.converter_refused += 1
            return 0, 0
        documents = self.accepted(gbnf, schema)
        if documents is None:
            tally.llama_refused += 1
            return 0, 0
        if not documents:
            tally.without_document += 1
            return 0, 0
        clock = self.clock
        cursors: dict[str, peers.Cursor] = {}
        compile_ns: dict[str, int] = {}
        forms: dict[str, str] = {}
        for engine in self.engines:
            try:
                started = clock()
                cursor, form = engine.start(gbnf, schema.text)
                cursor.compute_mask()
                compile_ns[engine.name] = clock() - started
            except Exception as exc:  # a refusal, or any failure of a peer: counted, never fatal
                tally.refused[engine.name] += 1
                tally.errors.setdefault(engine.name, f"{schema.name}: {type(exc).__name__}: {exc}"[:300])
                if engine.name == peers.LLAMA_CPP:
                    raise  # it accepted this grammar a moment ago
                continue
            cursors[engine.name], forms[engine.name] = cursor, form
        lookahead_ns = None
        mine = cursors.get(peers.CONSTRAINTD)
        if self.lookahead > 0 and isinstance(mine, peers.ConstraintdCursor):
            # the window a server's session has between its creation and its first mask (its prompt's
            # evaluation), spent as a server spends it: measured apart from the compile
            started = clock()
            mine.grammar.lookahead(self.lookahead)
            lookahead_ns = clock() - started
        if self.kept_grammars is not None and isinstance(mine, peers.ConstraintdCursor):
            self.kept_grammars.append(mine.grammar)
        kept = tokens = 0
        for index, document in enumerate(documents):
            if index:
                for cursor in cursors.values():
                    cursor.reset()
            self._at = (schema.name, index)
            walked = self.document(cursors, document, first=index == 0, into=self.samples)
            kept += walked > 0
            tokens += walked
        if kept and self.again is not None:
            for document in documents:
                for cursor in cursors.values():
                    cursor.reset()
                self.document(cursors, document, first=False, into=self.again)
        if kept:
            for name, ns in compile_ns.items():
                self.samples[name][COMPILE].append(ns)
                tally.forms[name][forms[name]] += 1
            if lookahead_ns is not None:
                self.samples[peers.CONSTRAINTD][LOOKAHEAD].append(lookahead_ns)
            if peers.CONSTRAINTD in cursors:
                cache_bytes, states, shared_bytes, shared_tops = peers.constraintd_cache(
                    cursors[peers.CONSTRAINTD]
                )
                tally.shared_bytes, tally.shared_tops = shared_bytes, shared_tops
                tally.cache_bytes.append(cache_bytes)
                tally.cache_states.append(states)
        else:
            tally.without_document += 1
        for cursor in cursors.values():
            cursor.close()
        return kept, tokens

    def accepted(self, gbnf: str, schema: Schema) -> list[list[int]] | None:
        """The tokens of the documents llama.cpp's sampler accepts whole (None: it refuses the grammar).

        Decided as llama.cpp's common_sampler decides a drawn token, by applying the grammar to that token
        alone, so the documents it drops cost no whole masks; the walk checks the masks again.
        """
        try:
            cursor, _ = self.engines[0].start(gbnf, schema.text)
        except peers.Refused:
            return None
        kept = []
        for document in schema.documents:
            tokens = self.llama.tokenize(document.encode())
            cursor.reset()
            for token in tokens:
                if not cursor.allows(token):
                    self.tally.rejected += 1
                    break
                cursor.accept(token)
            else:
                if any(cursor.allows(t) for t in self.eog):
                    kept.append(tokens)
                else:
                    self.tally.unfinished += 1
        cursor.close()
        return kept

    def document(
        self, cursors: dict[str, peers.Cursor], tokens: list[int], *, first: bool, into: Samples
    ) -> int:
        """Walk one document with every engine, its times added to `into`; its token count when llama.cpp
        accepts it, else 0 (the tally counts documents and tokens of the first walk only)."""
        tally, clock = self.tally, self.clock
        samples: Samples = {name: {m: [] for m in UNITS} for name in cursors}
        steps: list[int] = []  # the step of each of constraintd's masks in `samples`
        equal: Counter[str] = Counter()
        compared: Counter[str] = Counter()
        alive = dict(cursors)
        failed: set[str] = set()
        gave_up: set[str] = set()  # a mask took longer than `give_up_ns`: measured up to there

        def fail(name: str, why: str) -> None:
            del alive[name]
            failed.add(name)
            tally.errors.setdefault(name, why[:300])

        for step in range(len(tokens) + 1):
            for name, cursor in list(alive.items()):
                if first and step == 0:
                    continue  # the compile's own mask
                try:
                    started = clock()
                    cursor.compute_mask()
                    samples[name][MASK].append(clock() - started)
                    if name == peers.CONSTRAINTD:
                        steps.append(step)
                except Exception as exc:
                    fail(name, f"mask at step {step}: {type(exc).__name__}: {exc}")
                    continue
                if samples[name][MASK][-1] > self.give_up_ns and name != peers.LLAMA_CPP:
                    gave_up.add(name)
            reference_words = alive[peers.LLAMA_CPP].mask_words()
            for name, cursor in alive.items():
                if name != peers.LLAMA_CPP:
                    compared[name] += 1
                    equal[name] += bool(np.array_equal(cursor.mask_words(), reference_words))
            for name in gave_up.intersection(alive):
                del alive[name]
            if step == len(tokens):
                if not any(_bit(reference_words, t) for t in self.eog):
                    tally.inconsistent += into is self.samples
                    return 0
                break
            token = tokens[step]
            if not _bit(reference_words, token):
                tally.inconsistent += into is self.samples
                return 0
            for name, cursor in list(alive.items()):
                try:
                    started = clock()
                    allowed = cursor.allows(token)
                    ns = clock() - started
                    if allowed is not None:
                        samples[name][ALLOWS].append(ns)
                    started = clock()
                    accepted = cursor.accept(token)
                    samples[name][ACCEPT].append(clock() - started)
                except Exception as exc:
                    fail(name, f"token {token} at step {step}: {type(exc).__name__}: {exc}")
                    continue
                if allowed is False or not accepted:
                    fail(name, f"refused token {token} at step {step}, which llama.cpp allows")
        short = into is self.samples and len(tokens) < SHORT_TOKENS
        if into is self.samples:
            tally.kept += 1
            tally.tokens += len(tokens)
            tally.short += short
            tally.short_tokens += len(tokens) if short else 0
        tally.equal.update(equal)
        tally.compared.update(compared)
        for name in failed:
            tally.failed[name] += 1
        tally.gave_up.update(gave_up)
        if into is self.samples and peers.CONSTRAINTD in (*alive, *gave_up):
            self.where.extend((*self._at, step, len(tokens)) for step in steps)
        for name in (*alive, *gave_up):
            for metric, values in samples[name].items():
                into[name][metric].extend(values)
                if short:
                    self.short[name][metric].extend(values)
        return len(tokens)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def vocab_file(name: str) -> Path:
    return reference.gemma_path() if name == "gemma" else reference.require(reference.vocab_path(name))


def run_vocab(
    name: str,
    schemas: Sequence[Schema],
    *,
    clock: Clock,
    inputs: Sequence[str],
    give_up: float,
    again: bool = False,
    worst: int = 0,
    lookahead: float = 0.0,
    keep_grammars: bool = False,
) -> None:
    path = vocab_file(name)
    _progress(f"[{name}] loading the vocabulary and building each engine's tables")
    llama = LlamaVocab(path)
    started = time.perf_counter()
    vocab = Vocab.from_gguf(path)
    load_seconds = time.perf_counter() - started
    same_pieces = sum(vocab.piece(t) == llama.piece(t) for t in range(llama.n_vocab))
    same_eog = vocab.eog_ids == llama.eog_ids()
    constraintd = peers.ConstraintdEngine(vocab)
    constraintd.setup_seconds += load_seconds
    eog = sorted(vocab.eog_ids)
    others, missing = peers.load_peers(vocab.pieces, eog, lambda text: llama.tokenize(text), inputs=inputs)
    engines: list[peers.Engine] = [peers.LlamaEngine(llama), constraintd, *others]
    run = Run(
        engines,
        llama,
        eog,
        clock=clock,
        give_up_seconds=give_up,
        again=again,
        lookahead=lookahead,
        keep_grammars=keep_grammars,
    )
    gc.collect()
    gc.freeze()  # the imports, the vocabulary and the engines' tables live through the run
    pauses = _FullCollections()
    gc.callbacks.append(pauses)
    started = time.perf_counter()
    for number, schema in enumerate(schemas, 1):
        begun = time.perf_counter()
        pauses.counting = True
        kept, tokens = run.schema(schema)
        pauses.counting = False
        if not keep_grammars:
            gc.collect()  # a server holding its grammars has no such pause between them
        now = time.perf_counter()
        _progress(
            f"[{name} {number}/{len(schemas)}] {schema.name}: {kept} of {len(schema.documents)} documents, "
            f"{tokens} tokens, {now - begun:.1f} s (total {now - started:.0f} s)"
        )
    print_report(
        name,
        llama.n_vocab,
        run,
        same_pieces=same_pieces,
        same_eog=same_eog,
        missing=missing,
        give_up=give_up,
        worst=worst,
    )
    kept = "" if run.kept_grammars is None else f" ({len(run.kept_grammars)} compiled grammars held)"
    print(
        f"full collections inside the walks{kept}: {pauses.count}, longest {pauses.longest * 1e3:.1f} ms",
        flush=True,
    )
    if run.kept_grammars is not None:
        tracked, seconds = _full_collection()
        print(
            f"one full collection with them held: {tracked:,} objects in the collector's sight, "
            f"{seconds * 1e3:.1f} ms of CPU (median of {COLLECTIONS})",
            flush=True,
        )
    print()
    gc.callbacks.remove(pauses)
    gc.unfreeze()
    llama.close()


def _full_collection() -> tuple[int, float]:
    """What one full collection walks now (the objects in the collector's sight, after a first
    collection lets go of what it stops tracking) and its CPU time, the median of COLLECTIONS."""
    gc.collect()
    tracked = len(gc.get_objects())
    times = []
    for _ in range(COLLECTIONS):
        started = time.process_time()
        gc.collect()
        times.append(time.process_time() - started)
    return tracked, float(np.median(times))


class _FullCollections:
    """A `gc.callbacks` entry: counts the full collections while `counting`, and the longest (elapsed)."""

    def __init__(self) -> None:
        self.counting = False
        self.count = 0
        self.longest = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.counting or info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.count += 1
            self.longest = max(self.longest, time.perf_counter() - self._began)


def _stats(values: Sequence[int], scale: float) -> list[float]:
    return [float(v) / scale for v in np.percentile(np.array(values, dtype=np.float64), PERCENTILES)]


def _number(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def print_report(
    vocab: str,
    n_vocab: int,
    run: Run,
    *,
    same_pieces: int,
    same_eog: bool,
    missing: Sequence[str],
    give_up: float,
    worst: int = 0,
) -> None:
    tally = run.tally
    names = [e.name for e in run.engines]
    order = [peers.CONSTRAINTD, *(n for n in names if n != peers.CONSTRAINTD)]
    print(f"\n== {vocab}: {n_vocab:,} tokens ==")
    print(
        f"pieces identical to llama.cpp's: {same_pieces:,} of {n_vocab:,}; "
        f"end-of-generation set identical: {'yes' if same_eog else 'NO'}"
    )
    print(
        f"schemas: {tally.schemas} walked, {tally.converter_refused} refused by the converter, "
        f"{tally.llama_refused} by llama.cpp, {tally.without_document} with no document kept"
    )
    print(
        f"documents: {tally.documents} valid, {tally.kept} kept ({tally.rejected} with a token llama.cpp "
        f"refuses, {tally.unfinished} unfinished at the end); {tally.tokens:,} tokens"
    )
    if tally.inconsistent:
        print(f"  {tally.inconsistent} documents dropped: llama.cpp's mask disagreed with its token check")
    for engine in run.engines:
        forms = ", ".join(f"{form} {count}" for form, count in sorted(tally.forms[engine.name].items()))
        extra = ""
        if tally.refused[engine.name]:
            extra += f", refused {tally.refused[engine.name]}"
        if tally.failed[engine.name]:
            extra += f", could not walk {tally.failed[engine.name]} kept documents"
        if tally.gave_up[engine.name]:
            extra += f", left {tally.gave_up[engine.name]} documents after a mask over {give_up:g} s"
        setup = f"vocabulary setup {engine.setup_seconds:.2f} s wall" if engine.setup_seconds else "-"
        print(f"  {engine.name:<20} compiled from: {forms or '-'}{extra}; {setup}")
    for note in missing:
        print(f"  NOT MEASURED: {note} (see tests/benchmarks/README.md)")
    for name, error in tally.errors.items():
        print(f"  first error of {name}: {error}")
    print("÷: the peer's time divided by constraintd's at that percentile (above 1: constraintd is faster)")
    _print_tables(run.samples, order)
    print(
        f"\n-- short documents: the {tally.short} kept documents under {SHORT_TOKENS} tokens "
        f"({tally.short_tokens:,} tokens), the steps above that belong to them --"
    )
    _print_tables(run.short, order)
    if run.again is not None:
        print("\n-- the same documents walked again by the same compiled grammars --")
        _print_tables(run.again, order)
    print()
    for name in order:
        if name in tally.compared:
            same, total = tally.equal[name], tally.compared[name]
            verdict = "identical" if name == peers.CONSTRAINTD else "equal to llama.cpp's (information)"
            print(f"{name}: {same:,} of {total:,} masks {verdict}")
    if tally.cache_bytes:
        sizes = np.array(tally.cache_bytes, dtype=np.float64) / 2**20
        states = np.array(tally.cache_states, dtype=np.float64)
        shared = tally.shared_bytes / 2**20
        print(
            f"constraintd caches per grammar after its walks: masks p50 {np.percentile(sizes, 50):.2f} MiB, "
            f"max {sizes.max():.2f} MiB; interned states p50 {np.percentile(states, 50):.0f}, "
            f"max {states.max():.0f}\n"
            "constraintd caches of the vocabulary: verdicts shared by its grammars, and run ends, "
            f"{shared:.1f} MiB "
            f"({tally.shared_tops:,} stack tops); with every grammar's masks kept "
            f"({sizes.size} grammars) {shared + sizes.sum():.1f} MiB"
        )
    if worst:
        _print_worst(run, worst)
    print(flush=True)


def _print_worst(run: Run, count: int) -> None:
    # constraintd's slowest first-pass masks, with where they were asked
    times = run.samples[peers.CONSTRAINTD][MASK]
    if len(times) != len(run.where):  # cannot happen: both are appended for the same steps
        print("(the masks' places were not recorded)")
        return
    unit, scale = UNITS[MASK]
    print(f"constraintd's {min(count, len(times))} slowest masks of the first pass ({unit}):")
    by_time = sorted(range(len(times)), key=times.__getitem__, reverse=True)[:count]
    for index in by_time:
        schema, document, step, tokens = run.where[index]
        where = f"document {document}, step {step} of {tokens} tokens"
        print(f"  {times[index] / scale:>8.3g}  {schema}  {where}")


def _print_tables(samples: Samples, order: Sequence[str]) -> None:
    mine = samples[peers.CONSTRAINTD]
    columns = f"{'n':>8}" + "".join(f"{'p' + str(p) if p < 100 else 'max':>10}" for p in PERCENTILES)
    for metric, (unit, scale) in UNITS.items():
        if not any(samples[name][metric] for name in order):
            continue
        print(f"\n{metric + ' (' + unit + ')':<22}{columns}{'÷ p50':>10}{'÷ p99':>10}")
        for name in order:
            values = samples[name][metric]
            if not values:
                print(f"  {name:<20}{'n/a':>8}")
                continue
            cells = "".join(f"{_number(v):>10}" for v in _stats(values, scale))
            row = f"  {name:<20}{len(values):>8,}{cells}"
            if name != peers.CONSTRAINTD and mine[metric]:
                ours, theirs = _stats(mine[metric], 1.0), _stats(values, 1.0)
                row += f"{_number(theirs[0] / ours[0]):>10}{_number(theirs[2] / ours[2]):>10}"
            print(row)


def _versions() -> str:
    found = []
    for package in ("llama-cpp-python", "xgrammar", "llguidance", "numpy"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--vocab", choices=(*VOCABS, "both"), default="both")
    parser.add_argument("--schemas", type=int, default=None, help="only the first N schemas (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="the order of the schemas (default 0)")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="cpu",
        help="cpu: this process's CPU time (default; steady on a busy machine); wall: elapsed time",
    )
    parser.add_argument(
        "--peer-input",
        choices=tuple(PEER_INPUTS),
        default="both",
        help="what XGrammar and llguidance compile: the same GBNF, the JSON schema, or both (default); "
        "none: no peer but llama.cpp (a quicker run of constraintd's numbers)",
    )
    parser.add_argument(
        "--give-up",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="an engine (not llama.cpp) whose mask takes longer leaves that document (default 2)",
    )
    parser.add_argument(
        "--worst",
        type=int,
        default=0,
        metavar="N",
        help="list constraintd's N slowest masks of the first pass, with their schema and step",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="walk each schema's documents a second time and report that pass apart",
    )
    parser.add_argument(
        "--lookahead",
        type=float,
        default=LOOKAHEAD_SECONDS,
        metavar="SECONDS",
        help="CPU seconds constraintd learns each new grammar's first verdicts for after its compile, as "
        f"a server does while a new session's prompt is evaluated (default {LOOKAHEAD_SECONDS:g}, the "
        "server's; 0: none, every state's first visit pays for it)",
    )
    parser.add_argument(
        "--keep-grammars",
        action="store_true",
        help="hold every compiled grammar of constraintd through the run, as a server's cache of compiled "
        "grammars does, with no collection between schemas: the collector's own full collections walk them",
    )
    args = parser.parse_args(argv)
    schemas = read_workload(WORKLOAD, count=args.schemas, seed=args.seed)
    print(
        f"MaskBench sample: {len(schemas)} schemas, seed {args.seed}; {args.clock} time; "
        f"constraintd's lookahead {args.lookahead:g} s a grammar; "
        f"Python {platform.python_version()}, {os.cpu_count()} cores; {_versions()}"
    )
    for name in VOCABS if args.vocab == "both" else (args.vocab,):
        run_vocab(
            name,
            schemas,
            clock=CLOCKS[args.clock],
            inputs=PEER_INPUTS[args.peer_input],
            give_up=args.give_up,
            again=args.again,
            worst=args.worst,
            lookahead=args.lookahead,
            keep_grammars=args.keep_grammars,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
