"""Soak benchmark of the constraintd service (not a test): a hostile and a normal load at once, for minutes.

    .venv/bin/python -m tests.benchmarks.bench_soak                  # 3 minutes
    .venv/bin/python -m tests.benchmarks.bench_soak --seconds 30     # a short run

A `constraintd serve` process on a Unix socket, its address space capped (3 GiB). Normal clients (processes
of their own, `--clients`, 2 by default) generate as a sampler does, over llama.cpp's llama-spm
vocabulary (32,000 tokens) and a JSON schema: accept a token the grammar allows (one drawn at random
from the session's mask), now and then a Mask, a new session every 64 tokens. One hostile client runs
the attacks of the reliability suite in a loop, each drawn at random (seeded): a vocabulary of 2M pieces,
a 48 MiB piece, an Allows of 1M ids (under the default limit: the work is done), a backtracking trigger
pattern accepted 200 times, a megabyte session id, bytes that are no message, files that are no
vocabulary, a replay of 1M tokens against a compile time limit of 1 s (the session it opens when done in
time is closed: open, it holds its million tokens' trail, about 20 MiB, for its idle time of 10 minutes),
and JSON nested 10,500 deep (a prefill of 10,000 arrays, then one array opened per Accept).

Printed: per window of `--window` seconds, the normal Accepts' count, p50, p99 and max, and the server's
resident memory (min and max of one sample a second); the attacks run in the window; the normal Accepts'
p50, p99 and max by the attack running when each began ("none": between attacks); the slowest normal
Accepts with that attack; the server's full collections (from its metrics: each stops its event loop); its
resident memory idle, once the normal clients are ready, and SETTLE_SECONDS after every client is done;
then every status the normal and the hostile clients got, counted.
"""

from __future__ import annotations

import argparse
import bisect
import json
import multiprocessing
import random
import socket
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
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
from constraintd.errors import ConstraintdError  # noqa: E402
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


@dataclass(frozen=True)
class Attack:
    name: str
    started: float  # time.monotonic()
    ended: float
    status: str


@dataclass
class Window:
    accepts: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    attacks: Counter[str] = field(default_factory=Counter)


class Soak:
    def __init__(self, server: CappedServer, seconds: float, window: float) -> None:
        self.server = server
        self.started = time.monotonic()  # set again once the normal clients are ready
        self.seconds = seconds
        self.window = window
        self.windows = [Window() for _ in range(int(seconds // window) + 1)]
        self.normal_statuses: Counter[str] = Counter()
        self.slowest: list[tuple[float, float]] = []  # (seconds, when it began) of the slow Accepts
        self.began: list[tuple[float, float]] = []  # (when it began, seconds) of every normal Accept

    def at(self, moment: float) -> Window:
        """The window of a moment (time.monotonic(), one clock for every process of the machine)."""
        return self.windows[min(len(self.windows) - 1, max(0, int((moment - self.started) // self.window)))]

    def running(self) -> bool:
        return time.monotonic() - self.started < self.seconds

    def add_normal(self, report: NormalReport) -> None:
        accepts, statuses = report
        for started, elapsed in accepts:
            self.at(started).accepts.append(elapsed)
            self.began.append((started, elapsed))
            if elapsed > SLOW:
                self.slowest.append((elapsed, started))
        self.normal_statuses.update(statuses)

    def sample_memory(self) -> None:
        while self.running():
            rss = self.server.rss()
            self.at(time.monotonic()).rss.append(rss)
            time.sleep(1.0)


# A normal client's Accepts, (when each began, seconds), and its answers counted by status.
NormalReport = tuple[list[tuple[float, float]], dict[str, int]]


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
    statuses: Counter[str] = Counter()
    with Client(target, policy=Policy(timeout=60.0)) as client:
        vocab = client.register_vocab(gguf=gguf)
        client.session(vocab, json_schema=json.dumps(SCHEMA)).close()
        ready.wait(timeout=600)
        ready.wait(timeout=60)  # the second time: `start` is set
        until = start.value + seconds
        while time.monotonic() < until:
            try:
                with client.session(vocab, json_schema=json.dumps(SCHEMA)) as session:
                    for step in range(64):
                        allowed = allowed_tokens(session.mask(), vocab.size)
                        if not len(allowed) or time.monotonic() >= until:
                            break
                        token = int(allowed[rng.randrange(len(allowed))])
                        started = time.monotonic()
                        taken = session.accept(token)
                        accepts.append((started, time.monotonic() - started))
                        statuses["OK" if taken else "refused (a bug)"] += 1
                        if step % 8 == 7:
                            session.mask()
                        if forward:
                            time.sleep(forward)
            except ConstraintdError as error:
                statuses[type(error).__name__] += 1
    out.put((accepts, dict(statuses)))


def hostile(target: str, seed: int, until: float, only: list[str], out: Queue[list[Attack]]) -> None:
    """The hostile client, in a process of its own (building its requests would otherwise hold the normal
    clients' GIL): runs attacks until `until` (time.monotonic()) and reports each."""
    rng = random.Random(seed)
    done: list[Attack] = []
    options = [("grpc.max_send_message_length", 256 * MIB)]
    with grpc.insecure_channel(target, options=options) as channel:
        stub = pb_grpc.ConstraintdStub(channel)  # type: ignore[no-untyped-call]
        vocab_id = stub.RegisterVocab(
            pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=TINY_PIECES, eog=TINY_EOG))
        ).vocab_id
        attacks = _attacks(stub, channel, vocab_id)
        if only:
            attacks = {name: attacks[name] for name in only}
        while time.monotonic() < until:
            name = rng.choice(sorted(attacks))
            prepare = attacks[name]
            call = prepare()  # the request is built before the clock starts
            started = time.monotonic()
            try:
                call()
                status = "OK"
            except grpc.RpcError as error:
                status = error.code().name  # type: ignore[attr-defined]
            done.append(Attack(name, started, time.monotonic(), status))
            time.sleep(0.2)
    out.put(done)


Call = Callable[[], object]


def _attacks(
    stub: pb_grpc.ConstraintdStub, channel: grpc.Channel, vocab_id: str
) -> dict[str, Callable[[], Call]]:
    """Each attack by name: a function that builds its requests and returns the call that sends them."""

    def session(**fields: object) -> str:
        request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), **fields)
        return str(stub.CreateSession(request).session_id)

    def backtracking() -> None:
        session_id = session(options=pb.SessionOptions(trigger_patterns=["(a+a+)+y"]))
        for _ in range(200):
            stub.Accept(pb.AcceptRequest(session_id=session_id, token=3))
        stub.Close(pb.CloseRequest(session_id=session_id))

    json_vocab = stub.RegisterVocab(
        pb.RegisterVocabRequest(
            pieces=pb.PieceList(pieces=[b"</s>", *(bytes((b,)) for b in range(1, 256))], eog=[0])
        )
    ).vocab_id

    def deep_nesting() -> None:
        # 10,000 arrays deep through a prefill, then 500 more one Accept at a time
        options = pb.SessionOptions(prefill=b'{"a":' + b"[" * 10_000)
        reply = stub.CreateSession(
            pb.CreateSessionRequest(vocab_id=json_vocab, json_object=pb.JsonObject(), options=options)
        )
        for _ in range(500):
            stub.Accept(pb.AcceptRequest(session_id=reply.session_id, token=ord("[")))
        stub.Close(pb.CloseRequest(session_id=reply.session_id))

    def vocabulary(pieces: list[bytes]) -> Call:
        request = pb.RegisterVocabRequest(pieces=pb.PieceList(pieces=pieces))
        return lambda: stub.RegisterVocab(request)

    def allows() -> Call:
        request = pb.AllowsRequest(session_id=session(), tokens=[3] * 1_000_000)  # under the default limit
        return lambda: stub.Allows(request)

    def replay() -> Call:
        replayed = [3] + [4] * 1_000_000
        request = pb.CreateSessionRequest(vocab_id=vocab_id, gbnf=pb.Gbnf(text=AB_PLUS), replay=replayed)

        def call() -> None:
            # a replay done in time opens a session: closed, as a client done with it would
            session_id = stub.CreateSession(request).session_id
            stub.Close(pb.CloseRequest(session_id=session_id))

        return call

    raw = channel.unary_unary("/constraintd.v1.Constraintd/Accept")
    return {
        "2M-piece vocabulary": lambda: vocabulary([b"p%d" % i for i in range(2_000_000)]),
        "48 MiB piece": lambda: vocabulary([*TINY_PIECES, b"x" * (48 * MIB)]),
        "Allows of 1M ids": allows,
        "backtracking trigger": lambda: backtracking,
        "megabyte session id": lambda: lambda: stub.Accept(pb.AcceptRequest(session_id="x" * MIB, token=3)),
        "bytes that are no message": lambda: lambda: raw(b"\xff" * 1000),
        "/dev/zero as a vocabulary": lambda: lambda: stub.RegisterVocab(
            pb.RegisterVocabRequest(gguf_path="/dev/zero")
        ),
        "replay of 1M tokens": replay,
        "JSON nested 10,500 deep": lambda: deep_nesting,
    }


ATTACKS = (
    "2M-piece vocabulary", "48 MiB piece", "Allows of 1M ids", "backtracking trigger", "megabyte session id",
    "bytes that are no message", "/dev/zero as a vocabulary", "replay of 1M tokens",
    "JSON nested 10,500 deep",
)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def by_attack(began: list[tuple[float, float]], done: list[Attack]) -> dict[str, list[float]]:
    """The normal Accepts' milliseconds by the attack running when each began ("none" between attacks:
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


def collector_pauses(port: int) -> tuple[int, float, dict[float, int]]:
    """The server's full collections from its metrics: how many, their seconds in all, and how many lasted
    longer than each of 0.01, 0.1 and 1 s."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    values = dict(line.rsplit(" ", 1) for line in lines if line.startswith("constraintd_gc_pause_seconds_"))
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
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--attack", action="append", default=[], choices=ATTACKS,
                        help="run only this attack (repeatable; default: all of them)")
    args = parser.parse_args(argv)
    reference.require(reference.vocab_path("llama-spm"))
    with socket_dir() as directory:
        metrics_port = _free_port()
        server = CappedServer(
            directory / "constraintd.sock", "--compile-timeout", "1",
            "--metrics", f"127.0.0.1:{metrics_port}",
        )
        server.launch()
        try:
            wait_serving(server.target)
            idle = server.rss()
            soak = Soak(server, args.seconds, args.window)
            spawn = multiprocessing.get_context("spawn")
            # the normal clients have their vocabulary and their schema compiled, then the soak begins:
            # attacks never delay a client's set-up, as in a service already running
            ready = spawn.Barrier(args.clients + 1)
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
            for client in clients:
                client.start()
            ready.wait(timeout=600)
            ready_rss = server.rss()
            soak.started = start.value = time.monotonic()
            ready.wait(timeout=60)
            reports: Queue[list[Attack]] = spawn.Queue()
            attacker = spawn.Process(
                target=hostile,
                args=(server.target, args.seed + 1000, soak.started + args.seconds, args.attack, reports),
            )
            attacker.start()
            soak.sample_memory()
            for _ in clients:
                soak.add_normal(normals.get(timeout=600))
            for client in clients:
                client.join(timeout=60)
            done = reports.get(timeout=600)
            attacker.join(timeout=60)
            pauses = collector_pauses(metrics_port)
            after = settled_rss(server)
        finally:
            server.kill()
    for attack in done:
        soak.at(attack.started).attacks[attack.name] += 1
    print(
        f"soak: {args.seconds:g} s, {args.clients} normal clients (llama-spm, a JSON schema, "
        f"{args.forward_ms:g} ms forward passes) and one "
        f"hostile; server idle RSS {idle / MIB:.0f} MiB, address space capped at 3 GiB"
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
    print(f"{'normal Accepts by the attack running when each began':<44}  {'accepts':>8}  {'p50 ms':>7}  "
          f"{'p99 ms':>7}  {'max ms':>7}")
    for name, values in sorted(by_attack(soak.began, done).items()):
        p50, p99 = percentile(values, 50), percentile(values, 99)
        print(f"  {name:<42}  {len(values):>8}  {p50:>7.2f}  {p99:>7.2f}  {max(values):>7.1f}")
    print(f"normal Accepts over {SLOW * 1000:g} ms: {len(soak.slowest)}; the slowest, with the attack "
          "running when each began:")
    for seconds, at in sorted(soak.slowest, reverse=True)[:10]:
        running = [a.name for a in done if a.started <= at <= a.ended] or ["-"]
        print(f"  {seconds * 1000:7.1f} ms at {at - soak.started:6.1f} s  {', '.join(running)}")
    print("the server's full collections (its cyclic collector's generation 2; each stops the event loop):")
    count, total, over = pauses
    print(f"  {count}, {total * 1000:.0f} ms in all; over 10 ms: {over[0.01]}, over 100 ms: {over[0.1]}, "
          f"over 1 s: {over[1.0]}")
    print(
        f"the server's RSS: {idle / MIB:.0f} MiB idle, {ready_rss / MIB:.0f} MiB once the normal clients "
        f"were ready, {after[-1] / MIB:.0f} MiB {len(after)} s after the last client was done "
        f"(in those seconds {min(after) / MIB:.0f}-{max(after) / MIB:.0f})"
    )
    print("normal clients' answers:", dict(soak.normal_statuses))
    print("hostile client's answers:")
    for (name, status), count in sorted(Counter((a.name, a.status) for a in done).items()):
        print(f"  {name}: {status} x{count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
