"""Soak benchmark of the constraintd service (not a test): a hostile and a normal load at once, for minutes.

    .venv/bin/python -m tests.benchmarks.bench_soak                  # 3 minutes
    .venv/bin/python -m tests.benchmarks.bench_soak --seconds 30     # a short run

A `constraintd serve` process on a Unix socket, its address space capped (3 GiB). Normal clients (processes
of their own, `--clients`, 2 by default) generate as a sampler does, over llama.cpp's llama-spm
vocabulary (32,000 tokens) and a JSON schema: accept a token the grammar allows (one drawn at random
from the session's mask), now and then a Mask, a new session every 64 tokens. One hostile client runs
the attacks of the hardening issue in a loop, each drawn at random (seeded), with `--pause` seconds between
two (its item in brackets):
- JSON nested 10,500 deep (a prefill of 10,000 arrays, then one array opened per Accept) and a nesting
  prefill of 6 KB [1];
- grammars of 70,000 and 90,000 alternatives and a schema enum of 60,000 strings over qwen2, each new at
  every run so that each is compiled (the cache must bound them by bytes) [2];
- a backtracking trigger pattern accepted 200 times; a lazy grammar that waits through 1M tokens for a
  trigger that never comes (what a waiting session holds, given back once it is closed); Allows of 1M ids
  (under the default limit: the work is done) and of 30M (refused); a 48 MiB piece [3];
- six first masks of new 1,000-alternative grammars over qwen2 at once, each past a 50 ms deadline; a
  40 MiB trigger pattern; a replay of 1M tokens against a compile time limit of 1 s (the session it opens
  when done in time is closed: open, it holds its trail for its idle time) and one of 10M [4];
- files that are no vocabulary: /dev/zero, a FIFO in an allowed directory, /etc/shadow,
  /proc/self/environ [5];
- vocabularies of 2M and 10M pieces, in one message (refused unread: over the message limit), and of 2M
  pieces in parts of 256 KiB (read, then refused past the million) [6];
- a megabyte session id, bytes that are no message [7];
- a compile storm: the 8 largest objects of the MaskBench sample over qwen2, compiled at once, each new at
  every run.
The hostile client registers its vocabularies (qwen2 among them, when an attack needs it) before the soak
begins, as the normal clients do.

Printed: per window of `--window` seconds, the normal Accepts' count, p50, p99 and max, and the server's
resident memory (min and max of a sample every half second); the attacks run in the window; the normal
Accepts' p50, p99 and max and the normal Masks' p99 by the attack running when each began ("none":
between attacks), with the server's resident memory the attack added while it ran (its largest) and kept
once the pause after it was over (the median of its runs); the slowest normal Accepts with that attack;
the server's full collections (from its metrics: each stops its event loop); its resident memory idle,
once every client is ready, and SETTLE_SECONDS after every client is done, beside what its grammar caches
hold then (`constraintd_grammar_cache_bytes`); then every status the normal and the hostile clients got,
counted. `--serve ARG` passes an argument more to the server (e.g. a smaller cache bound).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import multiprocessing
import os
import random
import socket
import statistics
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import Queue
from pathlib import Path
from typing import Any

import grpc
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from clients import Client, Policy  # noqa: E402
from clients.masks import allowed_tokens  # noqa: E402
from clients.transports.grpc import vocab_parts  # noqa: E402
from constraintd.errors import ConstraintdError  # noqa: E402
from constraintd.server.memory import resident_bytes  # noqa: E402
from constraintd.v1 import constraintd_pb2 as pb  # noqa: E402
from constraintd.v1 import constraintd_pb2_grpc as pb_grpc  # noqa: E402
from tests import reference  # noqa: E402
from tests.server.running import (  # noqa: E402
    AB_PLUS,
    TINY_EOG,
    TINY_PIECES,
    CappedServer,
    socket_dir,
    wait_serving,
)

MIB = 1 << 20
SETTLE_SECONDS = 10  # the server's memory is read this long once every client is done
SLOW = 0.1  # an Accept slower than this is listed, with the attack running when it began
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
    },
    "required": ["name", "tags", "score"],
}


SAMPLE = ROOT / "tests" / "vectors" / "maskbench-sample"
STORM = 8  # compiles at once in the compile storm
LAZY_TOKENS = 1 << 20  # tokens a lazy grammar waits through (in Step messages of 4,096)
MASK_DEADLINE = 0.05  # seconds: the first masks of a 1,000-alternative grammar over qwen2 take longer


@dataclass(frozen=True)
class Attack:
    name: str
    started: float  # time.monotonic()
    ended: float
    status: str
    rss_before: int  # the server's resident bytes as it began
    rss_after: int  # and once the pause after it was over


@dataclass
class Window:
    accepts: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    attacks: Counter[str] = field(default_factory=Counter)


class Soak:
    def __init__(self, server: CappedServer, seconds: float, window: float) -> None:
        self.server = server
        self.started = time.monotonic()  # set again once the clients are ready
        self.seconds = seconds
        self.window = window
        self.windows = [Window() for _ in range(int(seconds // window) + 1)]
        self.normal_statuses: Counter[str] = Counter()
        self.slowest: list[tuple[float, float]] = []  # (seconds, when it began) of the slow Accepts
        self.began: list[tuple[float, float]] = []  # (when it began, seconds) of every normal Accept
        self.masks: list[tuple[float, float]] = []  # the same of every normal Mask
        self.rss: list[tuple[float, int]] = []  # (when, resident bytes) of every sample

    def at(self, moment: float) -> Window:
        """The window of a moment (time.monotonic(), one clock for every process of the machine)."""
        return self.windows[min(len(self.windows) - 1, max(0, int((moment - self.started) // self.window)))]

    def running(self) -> bool:
        return time.monotonic() - self.started < self.seconds

    def add_normal(self, report: NormalReport) -> None:
        accepts, masks, statuses = report
        for started, elapsed in accepts:
            self.at(started).accepts.append(elapsed)
            self.began.append((started, elapsed))
            if elapsed > SLOW:
                self.slowest.append((elapsed, started))
        self.masks.extend(masks)
        self.normal_statuses.update(statuses)

    def sample_memory(self) -> None:
        while self.running():
            rss, now = self.server.rss(), time.monotonic()
            self.at(now).rss.append(rss)
            self.rss.append((now, rss))
            time.sleep(0.5)

    def peak_growth(self, attack: Attack) -> int:
        """The most the server's resident size stood above its size at the attack's start, while it ran."""
        during = [rss for at, rss in self.rss if attack.started <= at <= attack.ended]
        return max([attack.rss_before, *during]) - attack.rss_before


# A normal client's Accepts and Masks, (when each began, seconds), and its answers counted by status.
NormalReport = tuple[list[tuple[float, float]], list[tuple[float, float]], dict[str, int]]


def normal(
    target: str,
    seed: int,
    seconds: float,
    forward: float,
    ready: Any,
    start: Any,
    out: Queue[NormalReport],
) -> None:
    """A normal client, in a process of its own as a sampler is (threads of one process would wait on each
    other's GIL, up to Python's 5 ms switch interval, and count it as the server's): gets its vocabulary
    and schema ready, waits at `ready`, then generates from `start.value` for `seconds`, waiting `forward`
    seconds after each token as a sampler waits for its model's forward pass."""
    rng = random.Random(seed)
    gguf = reference.require(reference.vocab_path("llama-spm"))
    accepts: list[tuple[float, float]] = []
    masks: list[tuple[float, float]] = []
    statuses: Counter[str] = Counter()

    def mask(session: Any) -> Any:
        started = time.monotonic()
        answer = session.mask()
        masks.append((started, time.monotonic() - started))
        return answer

    with Client(target, policy=Policy(timeout=60.0)) as client:
        vocab = client.register_vocab(gguf=gguf)
        client.session(vocab, json_schema=json.dumps(SCHEMA)).close()
        ready.wait(timeout=900)
        ready.wait(timeout=60)  # the second time: `start` is set
        until = start.value + seconds
        while time.monotonic() < until:
            try:
                with client.session(vocab, json_schema=json.dumps(SCHEMA)) as session:
                    for step in range(64):
                        allowed = allowed_tokens(mask(session), vocab.size)
                        if not len(allowed) or time.monotonic() >= until:
                            break
                        token = int(allowed[rng.randrange(len(allowed))])
                        started = time.monotonic()
                        taken = session.accept(token)
                        accepts.append((started, time.monotonic() - started))
                        statuses["OK" if taken else "refused (a bug)"] += 1
                        if step % 8 == 7:
                            mask(session)
                        if forward:
                            time.sleep(forward)
            except ConstraintdError as error:
                statuses[type(error).__name__] += 1
    out.put((accepts, masks, dict(statuses)))


def hostile(
    target: str,
    pid: int,
    fifo: Path,
    seed: int,
    seconds: float,
    pause: float,
    only: list[str],
    ready: Any,
    start: Any,
    out: Queue[list[Attack]],
) -> None:
    """The hostile client, in a process of its own (building its requests would otherwise hold the normal
    clients' GIL): gets its vocabularies ready, waits at `ready`, then runs attacks from `start.value` for
    `seconds`, `pause` seconds apart, and reports each with the server's (`pid`) resident size before it and
    once the pause after it is over."""
    rng = random.Random(seed)
    done: list[Attack] = []
    options = [("grpc.max_send_message_length", 256 * MIB)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.ConstraintdStub(channel)  # type: ignore[no-untyped-call]
        attacks = _attacks(stub, channel, fifo, set(only or ATTACKS))
        ready.wait(timeout=900)
        ready.wait(timeout=60)
        until = start.value + seconds
        while time.monotonic() < until:
            name = rng.choice(sorted(attacks))
            call = attacks[name]()  # the request is built before the clock starts
            before, started = resident_bytes(pid), time.monotonic()
            try:
                answered = call()
                status = answered if isinstance(answered, str) else "OK"
            except grpc.RpcError as error:
                status = error.code().name
            ended = time.monotonic()
            time.sleep(pause)
            done.append(Attack(name, started, ended, status, before, resident_bytes(pid)))
    out.put(done)


Call = Callable[[], object]


def counted(calls: list[Call]) -> str:
    """Runs the calls at once, each on a thread of its own; their statuses counted, as one status."""

    def status(call: Call) -> str:
        try:
            call()
            return "OK"
        except grpc.RpcError as error:
            return str(error.code().name)

    with ThreadPoolExecutor(len(calls)) as pool:
        statuses = Counter(pool.map(status, calls))
    return ", ".join(f"{name} x{count}" for name, count in sorted(statuses.items()))


def largest_objects(count: int) -> list[dict[str, Any]]:
    """The `count` largest schemas of the MaskBench sample whose root lists properties (a property can be
    added to them, so that each compile is a new grammar)."""
    schemas = [json.loads(path.read_text())["schema"] for path in SAMPLE.glob("*.json")]
    objects = [schema for schema in schemas if isinstance(schema.get("properties"), dict)]
    return sorted(objects, key=lambda schema: len(json.dumps(schema)), reverse=True)[:count]


def _attacks(
    stub: pb_grpc.ConstraintdStub, channel: grpc.Channel, fifo: Path, wanted: set[str]
) -> dict[str, Callable[[], Call]]:
    """Each attack by name: a function that builds its requests and returns the call that sends them. The
    vocabularies they need are registered here, before the soak; `fifo` is a FIFO in a directory the
    server may read vocabularies from."""
    fresh = itertools.count()  # makes each grammar of the cache attacks new

    def register(pieces: list[bytes], eog: list[int]) -> str:
        request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces, eog=eog))
        return str(stub.RegisterVocab(request, timeout=600).vocab_id)

    vocab_id = register(list(TINY_PIECES), list(TINY_EOG))
    json_vocab = register([b"</s>", *(bytes((b,)) for b in range(1, 256))], [0])
    qwen2_attacks = {
        "70,000 alternatives", "90,000 alternatives", "60,000-string enum", "first masks past deadline",
        "compile storm",
    }
    qwen2 = ""
    if wanted & qwen2_attacks:
        request = pb.RegisterVocabRequest(gguf_path=str(reference.require(reference.vocab_path("qwen2"))))
        qwen2 = str(stub.RegisterVocab(request, timeout=600).vocab_id)

    def session(options: pb.SessionOptions | None = None) -> str:
        request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), options=options)
        return str(stub.CreateSession(request).session_id)

    def backtracking() -> None:
        session_id = session(options=pb.SessionOptions(trigger_patterns=["(a+a+)+y"]))
        for _ in range(200):
            stub.Accept(pb.AcceptRequest(session_id=session_id, token=3))
        stub.Close(pb.CloseRequest(session_id=session_id))

    def lazy_waiting() -> None:
        # a lazy grammar whose trigger never comes keeps every token it waits through (as llama.cpp keeps
        # their text) and, inside the rollback window, the patterns' scan after each
        options = pb.SessionOptions(trigger_patterns=["(a+a+)+y"])
        session_id = session(options=options)
        batch = pb.AcceptBatch(session_ids=[session_id] * 4096, tokens=[3] * 4096)
        steps = (pb.StepRequest(accepts=batch) for _ in range(LAZY_TOKENS // 4096))
        for _ in stub.Step(steps):
            pass
        stub.Close(pb.CloseRequest(session_id=session_id))

    def deep_nesting() -> None:
        # 10,000 arrays deep through a prefill, then 500 more one Accept at a time
        options = pb.SessionOptions(prefill=b'{"a":' + b"[" * 10_000)
        reply = stub.CreateSession(
            pb.CreateSessionRequest(vocab_id=json_vocab, json_object=pb.JsonObject(), options=options)
        )
        for _ in range(500):
            stub.Accept(pb.AcceptRequest(session_id=reply.session_id, token=ord("[")))
        stub.Close(pb.CloseRequest(session_id=reply.session_id))

    def nesting_prefill() -> None:
        options = pb.SessionOptions(prefill=b'{"a":' + b"[" * 6_000)
        reply = stub.CreateSession(
            pb.CreateSessionRequest(vocab_id=json_vocab, json_object=pb.JsonObject(), options=options)
        )
        stub.Close(pb.CloseRequest(session_id=reply.session_id))

    def vocabulary(pieces: list[bytes]) -> Call:
        request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces))
        return lambda: stub.RegisterVocab(request)

    def vocabulary_in_parts(pieces: list[bytes]) -> Call:
        # as a client sends a vocabulary over one message: parts of 256 KiB, read whole, then refused
        parts = vocab_parts(pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces)))
        return lambda: stub.RegisterVocabParts(iter(parts))

    # 10M pieces make a message of about 100 MB: made once, sent as bytes
    register_raw = channel.unary_unary("/constraintd.v1.Constraintd/RegisterVocab")
    ten_million: list[bytes] = []

    def ten_million_pieces() -> Call:
        if not ten_million:
            ten_million.append(
                pb.RegisterVocabRequest(
                    pieces=pb.PieceList(pieces=[b"p%d" % i for i in range(10_000_000)])
                ).SerializeToString()
            )
        return lambda: register_raw(ten_million[0])

    def huge_pattern() -> Call:
        options = pb.SessionOptions(trigger_patterns=["x" * (40 * MIB)])
        request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), options=options)
        return lambda: stub.CreateSession(request)

    def allows(count: int) -> Call:
        request = pb.AllowsRequest(session_id=session(), tokens=[3] * count)
        return lambda: stub.Allows(request)

    def replay(count: int) -> Call:
        replayed = [3] + [4] * count
        request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), replay=replayed)

        def call() -> None:
            # a replay done in time opens a session: closed, as a client done with it would
            session_id = stub.CreateSession(request).session_id
            stub.Close(pb.CloseRequest(session_id=session_id))

        return call

    def alternatives(count: int) -> Call:
        nonce = next(fresh)
        text = "root ::= " + " | ".join(f'"w{nonce}x{i}"' for i in range(count))
        request = pb.CreateSessionRequest(vocab_id=qwen2, gbnf=pb.Gbnf(text=text))
        return lambda: stub.CreateSession(request)

    def enum() -> Call:
        nonce = next(fresh)
        schema = json.dumps({"enum": [f"v{nonce}x{i}" for i in range(60_000)]})
        request = pb.CreateSessionRequest(vocab_id=qwen2, json_schema=schema)
        return lambda: stub.CreateSession(request)

    def first_masks() -> Call:
        def one() -> None:
            nonce = next(fresh)
            text = "root ::= " + " | ".join(f'"m{nonce}x{i}"' for i in range(1_000))
            reply = stub.CreateSession(pb.CreateSessionRequest(vocab_id=qwen2, gbnf=pb.Gbnf(text=text)))
            try:
                stub.Mask(pb.MaskRequest(session_id=reply.session_id), timeout=MASK_DEADLINE)
            finally:
                stub.Close(pb.CloseRequest(session_id=reply.session_id))

        return lambda: counted([one] * 6)

    storm_schemas = largest_objects(STORM) if "compile storm" in wanted else []

    def storm() -> Call:
        nonce = next(fresh)
        requests = [
            pb.CreateSessionRequest(
                vocab_id=qwen2,
                json_schema=json.dumps({**schema, "properties": {**schema["properties"], f"n{nonce}": {}}}),
            )
            for schema in storm_schemas
        ]
        return lambda: counted([partial(stub.CreateSession, request) for request in requests])

    def read(path: str) -> Call:
        return lambda: stub.RegisterVocab(pb.RegisterVocabRequest(gguf_path=path))

    not_vocabularies = [read(path) for path in ("/dev/zero", str(fifo), "/etc/shadow", "/proc/self/environ")]
    raw = channel.unary_unary("/constraintd.v1.Constraintd/Accept")
    attacks: dict[str, Callable[[], Call]] = {
        "JSON nested 10,500 deep": lambda: deep_nesting,
        "6 KB nesting prefill": lambda: nesting_prefill,
        "70,000 alternatives": lambda: alternatives(70_000),
        "90,000 alternatives": lambda: alternatives(90_000),
        "60,000-string enum": enum,
        "backtracking trigger": lambda: backtracking,
        "lazy grammar waiting 1M tokens": lambda: lazy_waiting,
        "Allows of 1M ids": lambda: allows(1_000_000),  # under the default limit
        "Allows of 30M ids": lambda: allows(30_000_000),
        "48 MiB piece": lambda: vocabulary([*TINY_PIECES, b"x" * (48 * MIB)]),
        "first masks past deadline": first_masks,
        "40 MiB trigger pattern": huge_pattern,
        "replay of 1M tokens": lambda: replay(1_000_000),
        "replay of 10M tokens": lambda: replay(10_000_000),
        "files that are no vocabulary": lambda: lambda: counted(not_vocabularies),
        "2M-piece vocabulary": lambda: vocabulary([b"p%d" % i for i in range(2_000_000)]),
        "2M-piece vocabulary in parts": lambda: vocabulary_in_parts([b"p%d" % i for i in range(2_000_000)]),
        "10M-piece vocabulary": ten_million_pieces,
        "megabyte session id": lambda: lambda: stub.Accept(pb.AcceptRequest(session_id="x" * MIB, token=3)),
        "bytes that are no message": lambda: lambda: raw(b"\xff" * 1000),
        "compile storm": storm,
    }
    return {name: attack for name, attack in attacks.items() if name in wanted}


ATTACKS = (
    "JSON nested 10,500 deep", "6 KB nesting prefill", "70,000 alternatives", "90,000 alternatives",
    "60,000-string enum", "backtracking trigger", "lazy grammar waiting 1M tokens", "Allows of 1M ids",
    "Allows of 30M ids", "48 MiB piece", "first masks past deadline", "40 MiB trigger pattern",
    "replay of 1M tokens", "replay of 10M tokens", "files that are no vocabulary", "2M-piece vocabulary",
    "2M-piece vocabulary in parts", "10M-piece vocabulary", "megabyte session id",
    "bytes that are no message", "compile storm",
)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def by_attack(began: list[tuple[float, float]], done: list[Attack]) -> dict[str, list[float]]:
    """The normal calls' milliseconds by the attack running when each began ("none" between attacks:
    the hostile client runs one at a time)."""
    spans = sorted((a.started, a.ended, a.name) for a in done)
    starts = [span[0] for span in spans]
    grouped: dict[str, list[float]] = {}
    for at, seconds in began:
        index = bisect.bisect_right(starts, at) - 1
        name = spans[index][2] if index >= 0 and at <= spans[index][1] else "none"
        grouped.setdefault(name, []).append(1000 * seconds)
    return grouped


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def read_metrics(port: int) -> dict[str, str]:
    """The server's metrics, sample by sample ("name{labels}" -> value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))


def collector_pauses(values: dict[str, str]) -> tuple[int, float, dict[float, int]]:
    """The server's full collections from its metrics: how many, their seconds in all, and how many lasted
    longer than each of 0.01, 0.1 and 1 s."""
    name = "constraintd_gc_pause_seconds"
    count = int(float(values.get(f'{name}_count{{generation="2"}}', "0")))
    total = float(values.get(f'{name}_sum{{generation="2"}}', "0"))
    over = {
        bound: count - int(float(values.get(f'{name}_bucket{{generation="2",le="{bound:g}"}}', "0")))
        for bound in (0.01, 0.1, 1.0)
    }
    return count, total, over


def settled_rss(server: CappedServer, seconds: float = SETTLE_SECONDS) -> list[int]:
    """The server's resident size once the load is over, a sample a second for `seconds`."""
    samples = []
    for _ in range(int(seconds)):
        time.sleep(1.0)
        samples.append(server.rss())
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=180.0, help="how long (default 180)")
    parser.add_argument("--window", type=float, default=30.0, help="seconds a row of the table (default 30)")
    parser.add_argument("--clients", type=int, default=2, help="normal clients (default 2)")
    parser.add_argument("--forward-ms", type=float, default=0.0,
                        help="ms a normal client waits after each token, as a sampler waits for its forward "
                        "pass (default 0: the clients take every core they can)")
    parser.add_argument("--pause", type=float, default=0.2,
                        help="seconds between two attacks, after which the memory an attack kept is read "
                        "(default 0.2; the server gives memory back once a second)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve", action="append", default=[], metavar="ARG",
                        help="an argument more for `constraintd serve`, e.g. --serve=--lookahead-seconds=0 "
                        "(repeatable)")
    parser.add_argument("--attack", action="append", default=[], choices=ATTACKS,
                        help="run only this attack (repeatable; default: all of them)")
    args = parser.parse_args(argv)
    reference.require(reference.vocab_path("llama-spm"))
    with socket_dir() as directory:
        metrics_port = _free_port()
        (directory / "vocabularies").mkdir()
        fifo = directory / "vocabularies" / "fifo.gguf"
        os.mkfifo(fifo)
        server = CappedServer(
            directory / "constraintd.sock", "--compile-timeout", "1",
            "--metrics", f"127.0.0.1:{metrics_port}", "--gguf-dir", str(fifo.parent), *args.serve,
        )
        server.launch()
        try:
            wait_serving(server.target, server=server)
            assert server.process is not None
            idle = server.rss()
            soak = Soak(server, args.seconds, args.window)
            spawn = multiprocessing.get_context("spawn")
            # every client has its vocabularies (and the normal ones their schema) ready, then the soak
            # begins: attacks never delay a client's set-up, as in a service already running
            ready = spawn.Barrier(args.clients + 2)
            start = spawn.Value("d", 0.0)
            normals: Queue[NormalReport] = spawn.Queue()
            clients = [
                spawn.Process(
                    target=normal,
                    args=(
                        server.target, args.seed + i, args.seconds, args.forward_ms / 1000, ready, start,
                        normals,
                    ),
                )
                for i in range(args.clients)
            ]
            reports: Queue[list[Attack]] = spawn.Queue()
            attacker = spawn.Process(
                target=hostile,
                args=(
                    server.target, server.process.pid, fifo, args.seed + 1000, args.seconds, args.pause,
                    args.attack, ready, start, reports,
                ),
            )
            for process in (*clients, attacker):
                process.start()
            ready.wait(timeout=900)
            ready_rss = server.rss()
            soak.started = start.value = time.monotonic()
            ready.wait(timeout=60)
            soak.sample_memory()
            for _ in clients:
                soak.add_normal(normals.get(timeout=600))
            for client in clients:
                client.join(timeout=60)
            done = reports.get(timeout=600)
            attacker.join(timeout=60)
            after = settled_rss(server)
            metrics = read_metrics(metrics_port)
        finally:
            server.kill()
    for attack in done:
        soak.at(attack.started).attacks[attack.name] += 1
    print(
        f"soak: {args.seconds:g} s, {args.clients} normal clients (llama-spm, a JSON schema, "
        f"{args.forward_ms:g} ms forward passes) and one "
        f"hostile; server idle RSS {idle / MIB:.0f} MiB, address space capped at 3 GiB"
        + (f"; serve {' '.join(args.serve)}" if args.serve else "")
    )
    names = ("window", "accepts", "p50 ms", "p99 ms", "max ms", "RSS MiB")
    header = zip(names, (10, 8, 7, 7, 7, 13), strict=True)
    print("  ".join(f"{name:>{width}}" for name, width in header) + "  attacks")
    for index, window in enumerate(soak.windows):
        if not window.accepts and not window.rss:
            continue
        span = f"{index * args.window:g}-{(index + 1) * args.window:g}s"
        rss = f"{min(window.rss) / MIB:.0f}-{max(window.rss) / MIB:.0f}" if window.rss else "-"
        attacks = ", ".join(f"{name} x{count}" for name, count in sorted(window.attacks.items()))
        values = [1000 * s for s in window.accepts]
        print(
            f"{span:>10}  {len(values):>8}  {percentile(values, 50):>7.2f}  {percentile(values, 99):>7.2f}  "
            f"{max(values, default=float('nan')):>7.1f}  {rss:>13}  {attacks}"
        )
    everything = [1000 * s for window in soak.windows for s in window.accepts]
    print(
        f"{'all':>10}  {len(everything):>8}  {percentile(everything, 50):>7.2f}  "
        f"{percentile(everything, 99):>7.2f}  {max(everything, default=float('nan')):>7.1f}"
    )
    print(f"normal calls by the attack running when each began; the server's RSS the attack added at most "
          f"while it ran, and kept {args.pause:g} s after it (median of its runs), MiB")
    print(f"  {'attack':<30}  {'runs':>4}  {'accepts':>7}  {'p50 ms':>7}  {'p99 ms':>7}  {'max ms':>7}  "
          f"{'masks':>5}  {'mask p99':>8}  {'RSS added':>9}  {'kept':>6}")
    accepts, masks = by_attack(soak.began, done), by_attack(soak.masks, done)
    for name in sorted(set(accepts) | {a.name for a in done}):
        values, ran = accepts.get(name, []), [a for a in done if a.name == name]
        p50, p99 = percentile(values, 50), percentile(values, 99)
        mask_values = masks.get(name, [])
        added = max((soak.peak_growth(a) for a in ran), default=0) / MIB
        kept = statistics.median([a.rss_after - a.rss_before for a in ran]) / MIB if ran else float("nan")
        print(f"  {name:<30}  {len(ran) or '-':>4}  {len(values):>7}  {p50:>7.2f}  {p99:>7.2f}  "
              f"{max(values, default=float('nan')):>7.1f}  {len(mask_values):>5}  "
              f"{percentile(mask_values, 99):>8.2f}  {added:>9.1f}  {kept:>6.1f}")
    print(f"normal Accepts over {SLOW * 1000:g} ms: {len(soak.slowest)}; the slowest, with the attack "
          "running when each began:")
    for seconds, at in sorted(soak.slowest, reverse=True)[:10]:
        running = [a.name for a in done if a.started <= at <= a.ended] or ["-"]
        print(f"  {seconds * 1000:7.1f} ms at {at - soak.started:6.1f} s  {', '.join(running)}")
    print("the server's full collections (its cyclic collector's generation 2; each stops the event loop):")
    count, total, over = collector_pauses(metrics)
    print(f"  {count}, {total * 1000:.0f} ms in all; over 10 ms: {over[0.01]}, over 100 ms: {over[0.1]}, "
          f"over 1 s: {over[1.0]}")
    cached = float(metrics.get("constraintd_grammar_cache_bytes", "nan")) / MIB
    print(
        f"the server's RSS: {idle / MIB:.0f} MiB idle, {ready_rss / MIB:.0f} MiB once every client "
        f"was ready, {after[-1] / MIB:.0f} MiB {len(after)} s after the last client was done "
        f"(in those seconds {min(after) / MIB:.0f}-{max(after) / MIB:.0f}); its grammar caches then held "
        f"{cached:.0f} MiB"
    )
    print("normal clients' answers:", dict(soak.normal_statuses))
    print("hostile client's answers:")
    for (name, status), count in sorted(Counter((a.name, a.status) for a in done).items()):
        print(f"  {name}: {status} x{count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
