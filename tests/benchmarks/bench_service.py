"""Benchmark of the constraintd service (not a test): prints a table, each measure beside its target.

    python tests/benchmarks/bench_service.py            # about three minutes
    python tests/benchmarks/bench_service.py --quick    # fewer samples, for a smoke run
    python tests/benchmarks/bench_service.py --only compile   # one section: accept, step, memory, compile

What it measures, against a `constraintd serve` subprocess (uvloop) on a Unix socket and on loopback TCP,
from clients in this process (a separate process from the server, as a model worker is):
- Accept round trip, p50 / p99: the blocking client (`Session.accept`, which sends it on a Step stream kept
  open) over each; the async client over the Unix socket; and in-process (`Client("local")`) for the cost
  of the client and the engine alone;
- the floor grpc itself sets on this machine: a bare grpc.aio echo server (uvloop, same options, another
  process; no protobuf, no work) answering the blocking client's unary call and a message on an open
  stream, over the same kind of Unix socket (the stream's messages timed in blocks alternating with the
  Unix socket's accepts, so the ratio of their p50s compares times taken under the same load);
- token commits per second through Step (AsyncClient, each session's accept in one message's accept
  batch) with 1, 16 and 64 sessions, one message in flight; and 64 sessions in two groups whose messages
  are pipelined on the one stream (a worker that decodes one group while the other's answer travels);
  with the server process's CPU time per commit and per message (Linux), and the same 64-session loop
  in process (`AsyncClient("local")`: client, service operations and engine, no grpc) as a ceiling
  (every 2,000 messages each session's history is rolled back by a unary Rollback, inside the timed loop);
- memory per idle session (traced allocations of the service's session store, fresh and after 100 accepted
  tokens) and sessions per GiB;
- Accept p99 while another client compiles large JSON schemas (MaskBench's largest) over a 151,936-token
  vocabulary, beside the same measure with nothing compiling, sampled before and after the compiles.
Vocabularies are llama.cpp's vocabulary-only GGUFs (llama-spm, qwen2) from the reference data
(`python -m tests.reference fetch`). Numbers depend on the machine and what else runs on it (on a shared
2-core machine p99s swing by several milliseconds from run to run): compare rows of one run, not runs of
different machines.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from clients import AsyncClient, AsyncSession, Client, Policy, Session  # noqa: E402
from clients.transports import LocalTransport  # noqa: E402
from constraintd.engine.vocab.vocab import Vocab  # noqa: E402
from constraintd.v1 import constraintd_pb2 as pb  # noqa: E402
from tests import reference  # noqa: E402
from tests.server.running import wait_serving  # noqa: E402

LETTERS = "root ::= [a-z ]*"  # a grammar every word-piece token keeps satisfying
POLICY = Policy(timeout=60.0, setup_timeout=600.0)
MASKBENCH = ROOT / "tests" / "vectors" / "maskbench-sample"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """`constraintd serve` on uvloop, on a Unix socket and a loopback port."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.unix = f"unix://{directory}/bench.sock"
        self.tcp = f"127.0.0.1:{free_port()}"
        args = [
            sys.executable,
            "-m",
            "constraintd",
            "serve",
            "--listen",
            self.unix,
            "--listen",
            self.tcp,
            "--log-format",
            "text",
            "--log-level",
            "WARNING",
            "--max-sessions",
            "100000",
            # the vocabularies it registers by path are llama.cpp's, in the reference data
            "--gguf-dir",
            str(reference.llama_cpp_dir() / "models"),
            *extra,
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.log = (directory / "server.log").open("wb")
        self.process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        wait_serving(self.unix)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def word_tokens(vocab: Vocab) -> list[int]:
    """Tokens whose piece is lowercase letters and spaces: always accepted by LETTERS."""
    return [t for t, piece in enumerate(vocab.pieces) if piece and re.fullmatch(rb"[a-z ]+", piece)]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def accept_latencies(
    session: Session,
    tokens: list[int],
    count: int,
    *,
    stop: threading.Event | None = None,
    ahead: bool = False,
) -> list[float]:
    """Seconds per accept (`ahead`: per `accept_and_mask`, the accept that answers the next mask); the
    session is rolled back now and then so its history stays short."""
    samples: list[float] = []
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        token = tokens[i % len(tokens)]
        started = time.perf_counter()
        accepted = session.accept_and_mask(token)[0] if ahead else session.accept(token)
        samples.append(time.perf_counter() - started)
        assert accepted
        if len(session.record.history) >= 256:
            session.rollback(256)
    return samples


# Accepts (Unix socket) and echo messages are timed in alternating blocks of this many, so the two rows the
# ratio compares see the same load on a shared machine (timed seconds apart, their p50s moved by up to 40%
# between runs with nothing changed)
BLOCK = 250


def bench_accept(
    server: Server, gguf: Path, tokens: list[int], count: int, echo: Echo
) -> tuple[list[tuple[str, float, float]], list[float]]:
    """Accept latencies by transport; and the echo's open-stream message latencies, timed in blocks
    alternating with the Unix socket's accepts."""
    rows = []
    echoed: list[float] = []
    for name, target in (("in-process", "local"), ("Unix socket", server.unix), ("TCP loopback", server.tcp)):
        with Client(target, policy=POLICY) as client:
            session = client.session(client.register_vocab(gguf=gguf), gbnf=LETTERS)
            accept_latencies(session, tokens, 300)  # warm up
            if target == server.unix:
                echo.message_latencies(300)
                samples: list[float] = []
                while len(samples) < count:
                    samples += accept_latencies(session, tokens, min(BLOCK, count - len(samples)))
                    echoed += echo.message_latencies(min(BLOCK, count - len(echoed)))
            else:
                samples = accept_latencies(session, tokens, count)
            rows.append((name, *percentiles(samples)))
            if target == server.unix:  # mask-ahead's call: the accept and the next mask (a state met before)
                accept_latencies(session, tokens, 300, ahead=True)
                p50, p99 = percentiles(accept_latencies(session, tokens, count, ahead=True))
                rows.append(("Unix socket, with the next mask (mask_after)", p50, p99))
    return rows, echoed


async def async_accept_latencies(
    target: str, gguf: Path, tokens: list[int], count: int
) -> tuple[float, float]:
    async with AsyncClient(target, policy=POLICY) as client:
        session = await client.session(await client.register_vocab(gguf=gguf), gbnf=LETTERS)
        samples: list[float] = []
        for i in range(300 + count):
            started = time.perf_counter()
            accepted = await session.accept(tokens[i % len(tokens)])
            if i >= 300:
                samples.append(time.perf_counter() - started)
            assert accepted
            if len(session.record.history) >= 256:
                await session.rollback(256)
        return percentiles(samples)


ECHO = "bench.Echo"


def serve_echo(address: str) -> None:
    """A bare grpc.aio server on uvloop that answers every message with itself (the `--echo` process)."""
    import grpc
    import uvloop

    async def unary(request: bytes, context: object) -> bytes:
        return request

    async def stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        }
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(ECHO, handlers)])
        server.add_insecure_port(address)
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()

    uvloop.run(main())


class Echo:
    """The bare echo server (the `--echo` process) and the blocking client's unary call and open stream to
    it: grpc's floor."""

    def __init__(self, directory: Path) -> None:
        import grpc

        address = f"unix://{directory}/echo.sock"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--echo", address], cwd=ROOT, env=env, stdout=subprocess.PIPE
        )
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == b"ready"
        self.payload = b"x" * 48  # about an AcceptRequest
        self.channel = grpc.insecure_channel(address)
        self.unary = self.channel.unary_unary(f"/{ECHO}/Unary")
        self.requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.replies = self.channel.stream_stream(f"/{ECHO}/Stream")(iter(self.requests.get, None))

    def unary_latencies(self, count: int) -> list[float]:
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            self.unary(self.payload, timeout=60)
            samples.append(time.perf_counter() - started)
        return samples

    def message_latencies(self, count: int) -> list[float]:
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            self.requests.put(self.payload)
            next(self.replies)
            samples.append(time.perf_counter() - started)
        return samples

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()
        self.process.terminate()
        self.process.wait(timeout=60)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux: /proc; elsewhere NaN)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def step_rate(
    target: str,
    gguf: Path,
    tokens: list[int],
    sessions: int,
    seconds: float,
    *,
    in_flight: int = 1,
    server_pid: int | None = None,
) -> tuple[float, float]:
    """Token commits per second, and the server's CPU seconds per commit (NaN without `server_pid`): the
    sessions split into `in_flight` groups, each stepping its own batches (one Step message per group per
    round) at the same time, pipelined on the client's one Step stream."""
    async with AsyncClient(target, policy=POLICY) as client:
        vocab = await client.register_vocab(gguf=gguf)
        opened = [await client.session(vocab, gbnf=LETTERS) for _ in range(sessions)]
        groups = [opened[i::in_flight] for i in range(in_flight)]
        cpu_before = process_cpu(server_pid) if server_pid is not None else math.nan
        started = time.perf_counter()

        async def run(group: list[AsyncSession]) -> int:
            committed = rounds = 0
            while time.perf_counter() - started < seconds:
                token = tokens[rounds % len(tokens)]
                outcomes = await client.step([(s, token) for s in group], mask_on_reject=False)
                committed += sum(1 for o in outcomes if o.accepted)
                rounds += 1
                if rounds % 2000 == 0:  # keep histories bounded (unary Rollbacks, timed too)
                    for session in group:
                        await session.rollback(len(session.record.history))
            return committed

        committed = sum(await asyncio.gather(*(run(group) for group in groups)))
        elapsed = time.perf_counter() - started
        cpu = process_cpu(server_pid) - cpu_before if server_pid is not None else math.nan
        return committed / elapsed, cpu / committed


def bench_memory(gguf: Path, tokens: list[int], count: int, accepted: int) -> float:
    """Bytes per idle session in the session store (tracemalloc over the service's own operations, in
    this process: the store, matcher and id of each session, not the shared grammar and vocabulary)."""
    transport = LocalTransport()
    operations = transport.operations
    vocab = operations.register_vocab(pb.RegisterVocabRequest(gguf_path=str(gguf)))
    request = pb.CreateSessionRequest(vocab_id=vocab.vocab_id, gbnf=pb.Gbnf(text=LETTERS))
    request.replay.extend(tokens[i % len(tokens)] for i in range(accepted))
    operations.close(
        pb.CloseRequest(session_id=operations.create_session(request).session_id)
    )  # compile first
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = [operations.create_session(request).session_id for _ in range(count)]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_session = (after - before - sys.getsizeof(ids)) / count
    transport.close()
    return per_session


def largest_schemas(count: int) -> list[str]:
    files = sorted(MASKBENCH.glob("*.json"), key=lambda p: p.stat().st_size, reverse=True)
    schemas = []
    for path in files:
        schema = json.dumps(json.loads(path.read_text())["schema"])
        schemas.append(schema)
        if len(schemas) == count:
            break
    return schemas


def bench_accept_under_compiles(
    server: Server, gguf: Path, big_gguf: Path, tokens: list[int], seconds: float, schemas: list[str]
) -> tuple[tuple[float, float], tuple[float, float], int, float]:
    """Accept latencies with nothing compiling (half before the compiles, half after) and while they run;
    how many schemas compiled, and how long the compiles took."""
    with Client(server.unix, policy=POLICY) as client:
        session = client.session(client.register_vocab(gguf=gguf), gbnf=LETTERS)
        accept_latencies(session, tokens, 300)

        def quietly(for_seconds: float) -> list[float]:
            samples: list[float] = []
            started = time.perf_counter()
            while time.perf_counter() - started < for_seconds:
                samples += accept_latencies(session, tokens, 200)
            return samples

        quiet = quietly(seconds / 2)
        with Client(server.unix, policy=POLICY) as compiler:
            big = compiler.register_vocab(gguf=big_gguf)
            stop = threading.Event()
            compiled = [0]

            def compile_all() -> None:
                for schema in schemas:
                    try:
                        compiler.session(big, json_schema=schema).close()
                        compiled[0] += 1
                    except Exception:  # a schema llama.cpp refuses is refused here too; it still compiled
                        pass
                stop.set()

            worker = threading.Thread(target=compile_all)
            began = time.perf_counter()
            worker.start()
            busy: list[float] = []
            while not stop.is_set():
                busy += accept_latencies(session, tokens, 200, stop=stop)
            worker.join()
            took = time.perf_counter() - began
        quiet += quietly(seconds / 2)
    return percentiles(quiet), percentiles(busy), compiled[0], took


Row = tuple[str, str, str]  # measure, value, target
SECTIONS = ("accept", "step", "memory", "compile")


def accept_rows(server: Server, directory: Path, gguf: Path, tokens: list[int], count: int) -> list[Row]:
    rows: list[Row] = []
    echo = Echo(directory)
    try:
        bench_accept_rows, echoed = bench_accept(server, gguf, tokens, count, echo)
        for name, p50, p99 in bench_accept_rows:
            target = "p50 < 150 µs" if name == "Unix socket" else ""
            rows.append((f"Accept round trip, {name} (p50 / p99)", f"{micro(p50)} / {micro(p99)}", target))
        p50, p99 = asyncio.run(async_accept_latencies(server.unix, gguf, tokens, count))
        rows.append(("Accept round trip, Unix socket, AsyncClient", f"{micro(p50)} / {micro(p99)}", ""))
        echo.unary_latencies(300)
        p50, p99 = percentiles(echo.unary_latencies(count))
        rows.append(("floor: bare grpc echo, unary call (Unix)", f"{micro(p50)} / {micro(p99)}", ""))
    finally:
        echo.close()
    accept_p50 = next(p50 for name, p50, _ in bench_accept_rows if name == "Unix socket")
    p50, p99 = percentiles(echoed)
    rows.append(
        (
            "floor: bare grpc echo, message on an open stream (Unix, timed between the accepts)",
            f"{micro(p50)} / {micro(p99)}",
            "",
        )
    )
    rows.append(("Accept p50 (Unix) / that floor's p50", f"{accept_p50 / p50:.2f}x", "<= 1.5x"))
    return rows


def step_rows(server: Server, gguf: Path, tokens: list[int], seconds: float) -> list[Row]:
    rows: list[Row] = []
    for sessions, in_flight in ((1, 1), (16, 1), (64, 1), (64, 2)):
        rate, cpu = asyncio.run(
            step_rate(
                server.unix,
                gguf,
                tokens,
                sessions,
                seconds,
                in_flight=in_flight,
                server_pid=server.process.pid,
            )
        )
        plural = "s" * (sessions > 1)
        pipelined = f", {in_flight} messages in flight" if in_flight > 1 else ""
        rows.append(
            (
                f"Step token commits/s, {sessions} session{plural}{pipelined} (Unix)",
                f"{rate:,.0f}",
                "≥ 50,000" if sessions == 64 else "",
            )
        )
        rows.append(("  server CPU per commit (per message)", f"{micro(cpu)} ({micro(cpu * sessions)})", ""))
    local_rate, _ = asyncio.run(step_rate("local", gguf, tokens, 64, seconds))
    rows.append(("Step token commits/s, 64 sessions, in-process (no grpc)", f"{local_rate:,.0f}", ""))
    return rows


def memory_rows(gguf: Path, tokens: list[int], count: int) -> list[Row]:
    rows: list[Row] = []
    for accepted in (0, 100):
        per_session = bench_memory(gguf, tokens, count, accepted)
        rows.append(
            (f"Memory per idle session, {accepted} tokens accepted", f"{per_session / 1024:,.2f} KiB", "")
        )
        rows.append(
            (
                f"Idle sessions per GiB, {accepted} tokens accepted",
                f"{(1 << 30) / per_session:,.0f}",
                "≥ 100,000" if accepted else "",
            )
        )
    return rows


def compile_rows(
    server: Server, gguf: Path, big_gguf: Path, tokens: list[int], seconds: float, schemas: list[str]
) -> list[Row]:
    quiet, busy, compiled, took = bench_accept_under_compiles(
        server, gguf, big_gguf, tokens, seconds, schemas
    )
    return [
        ("Accept p50 / p99, nothing compiling (Unix)", f"{micro(quiet[0])} / {micro(quiet[1])}", ""),
        (
            f"Accept p50 / p99 while {compiled} large schemas compile (qwen2, {took:.1f} s)",
            f"{micro(busy[0])} / {micro(busy[1])}",
            f"p99 ≤ 2 × {micro(quiet[1])}",
        ),
        ("  p99 while compiling / p99 with nothing compiling", f"{busy[1] / quiet[1]:.1f} ×", "≤ 2 ×"),
    ]


def micro(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument(
        "--only",
        choices=SECTIONS,
        action="append",
        help="run only this section (repeat for several; default: all)",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for `constraintd serve` (repeat; e.g. --server-arg=--compile-processes=0)",
    )
    parser.add_argument("--echo", metavar="ADDRESS", help=argparse.SUPPRESS)  # the floor's echo server
    args = parser.parse_args(argv)
    if args.echo:
        serve_echo(args.echo)
        return 0
    count = 1000 if args.quick else 5000
    seconds = 1.0 if args.quick else 3.0
    gguf = reference.require(reference.vocab_path("llama-spm"))
    big_gguf = reference.require(reference.vocab_path("qwen2"))
    tokens = word_tokens(Vocab.from_gguf(gguf))
    sections = set(args.only or SECTIONS)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cd-", dir="/tmp") as directory:
        server = Server(Path(directory), *args.server_arg)
        try:
            if "accept" in sections:
                rows += accept_rows(server, Path(directory), gguf, tokens, count)
            if "step" in sections:
                rows += step_rows(server, gguf, tokens, seconds)
            if "memory" in sections:
                rows += memory_rows(gguf, tokens, 2000 if args.quick else 10000)
            if "compile" in sections:
                schemas = largest_schemas(2 if args.quick else 6)
                rows += compile_rows(server, gguf, big_gguf, tokens, seconds, schemas)
        finally:
            server.stop()
    width = max(len(name) for name, _, _ in rows)
    values = max(len(value) for _, value, _ in rows)
    print(
        f"constraintd service benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
        f"vocabularies llama-spm 32,000 and qwen2 151,936 tokens)"
    )
    print(f"{'measure':<{width}}  {'value':<{values}}  target")
    print(f"{'-' * width}  {'-' * values}  {'-' * 16}")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:<{values}}  {target}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
