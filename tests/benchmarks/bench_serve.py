"""Benchmark of `sampler-worker serve` (not a test): prints a table.

    .venv/bin/python -m tests.benchmarks.bench_serve            # about three minutes on two cores
    .venv/bin/python -m tests.benchmarks.bench_serve --quick    # fewer repetitions and tokens

Everything runs as it is deployed: one `constraintd serve` process on a Unix socket (its Prometheus
metrics on loopback, to count its sessions), `sampler-worker serve` processes reaching it there, and the
`sampler-worker generate` command reaching the same socket. Gemma 3 270M, llama-server's default sampling,
a chat prompt under a GBNF grammar (a JSON schema converted to GBNF, so no content rule applies).
- (a) One streamed request through the server against the command, same prompt, seed, settings, grammar
  and token budget: tokens per second from the first token to the last, as a client sees them arrive
  (the server's server-sent events; the command's text on its standard output). Medians of `--reps`
  runs, taken in turn; the command's tokens are checked to be the server's.
- (b) Four clients at once, each a streamed request (seeds 1 to 4), against `--parallel 4` and against
  `--parallel 1` (whose queue holds the other three): total tokens per second over the round (median of
  `--reps` rounds), and p50 / p99 of the time to the first token (queueing included) and of the time
  between tokens, over every request of every round.
- (c) Leaks: the `--parallel 4` server gets `--leak-requests` requests from four clients (the mix of
  tests/sampler_worker/serve/traffic.py: good requests, refused grammars and schemas, clients gone
  mid-stream or before their answer); then the server's open generations and constraintd sessions (its
  /metrics), constraintd's own open sessions (its /metrics), and both processes' resident memory before
  (after a warm-up of two of each kind) and after.
Numbers depend on the machine and on what else runs on it: compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from constraintd.engine.schema.convert import json_schema_to_gbnf  # noqa: E402
from sampler_worker.model import default_threads  # noqa: E402
from tests import reference  # noqa: E402
from tests.sampler_worker.serve.traffic import KINDS, drive, expected  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "biography": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "biography", "languages"],
}
QUESTION = "Invent a software engineer and write a long biography of them, as a JSON object."
N_CTX = 512
PYTHON = sys.executable


def rss(pid: int) -> int:
    """A process's resident memory in bytes."""
    found = re.search(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    assert found
    return int(found.group(1)) << 10


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not in the metrics"
    return float(found.group(1))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Constraintd:
    process: subprocess.Popen[bytes]
    target: str
    metrics_url: str

    def metric(self, name: str) -> float:
        return gauge(httpx.get(self.metrics_url, timeout=30).text, name)


@contextmanager
def constraintd(directory: Path, model: Path) -> Iterator[Constraintd]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = f"unix://{directory}/constraintd.sock"
    port = free_port()
    command = [PYTHON, "-m", "constraintd", "serve", "--listen", target, "--metrics", f"127.0.0.1:{port}",
               "--gguf-dir", str(model.resolve().parent), "--log-level", "WARNING"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        with grpc.insecure_channel(target) as channel:  # wait_for_ready: the call waits for the socket
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=60, wait_for_ready=True)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        yield Constraintd(process, target, f"http://127.0.0.1:{port}/metrics")
    finally:
        process.terminate()
        process.wait(timeout=30)


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text


@contextmanager
def server(model: Path, target: str, *, parallel: int, threads: int,
           overlap: str = "auto") -> Iterator[Server]:
    command = [PYTHON, "-m", "sampler_worker", "serve", "--model", str(model), "--listen", "127.0.0.1:0",
               "--constraintd", target, "--parallel", str(parallel), "--threads", str(threads),
               "--n-ctx", str(N_CTX), "--max-queue", "8", "--timeout", "300", "--overlap", overlap]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:  # the server says where it listens once it serves
            if line.startswith("listening on "):
                url = line.split()[-1]
                break
        else:
            raise SystemExit(f"the server exited ({process.wait()}) without listening")
        # keep reading its standard error, so that it never blocks on a full pipe
        drain = threading.Thread(target=lambda: [None for _ in process.stderr or ()], daemon=True)
        drain.start()
        yield Server(process, url)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def request(seed: int, max_tokens: int, grammar: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": QUESTION}], "grammar": grammar, "seed": seed,
            "max_tokens": max_tokens, "stream": True, "return_tokens": True}


@dataclass
class Stream:
    sent: float
    tokens: list[int]
    arrivals: list[float]  # one a token, when the chunk carrying it arrived

    def rate(self) -> float:
        """Tokens per second from the first token to the last."""
        return (len(self.tokens) - 1) / (self.arrivals[-1] - self.arrivals[0])

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def stream(client: httpx.Client, body: dict[str, Any]) -> Stream:
    sent = time.perf_counter()
    tokens: list[int] = []
    arrivals: list[float] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                got = json.loads(line[len("data: "):]).get("tokens", [])
                now = time.perf_counter()
                tokens += got
                arrivals += [now] * len(got)
    return Stream(sent, tokens, arrivals)


def generate_command(model: Path, target: str, grammar: Path, *, seed: int, max_tokens: int,
                     threads: int, output: str) -> list[str]:
    return [PYTHON, "-m", "sampler_worker", "generate", "--model", str(model), "--chat", QUESTION,
            "--grammar", str(grammar), "--seed", str(seed), "--max-tokens", str(max_tokens),
            "--threads", str(threads), "--n-ctx", str(N_CTX), "--constraintd", target, "--output", output]


def command_rate(command: list[str], tokens: int) -> float:
    """Tokens per second of the command's streamed text, from its first token's text to its last."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    assert process.stdout is not None
    reads: list[tuple[float, bytes]] = []
    while chunk := os.read(process.stdout.fileno(), 1 << 16):
        reads.append((time.perf_counter(), chunk))
    assert process.wait() == 0
    # the command writes a newline once the generation has ended (after its session and model close)
    text = [at for at, chunk in reads if chunk.strip()]
    return (tokens - 1) / (text[-1] - text[0])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def one_request(model: Path, daemon: Constraintd, grammar_file: Path, grammar: str,
                args: argparse.Namespace) -> list[tuple[str, ...]]:
    seed = 1
    with server(model, daemon.target, parallel=1, threads=args.threads) as one, \
            httpx.Client(base_url=one.url, timeout=300) as client:
        # constraintd keeps the masks it made by grammar state: one untimed pass makes every mask of this
        # request, so neither path is timed on masks the other one made
        stream(client, request(seed, args.max_tokens, grammar))
        check = subprocess.run(generate_command(model, daemon.target, grammar_file, seed=seed,
                                                max_tokens=args.max_tokens, threads=args.threads,
                                                output="json"), capture_output=True, text=True, check=True)
        expected_tokens = json.loads(check.stdout)["tokens"]
        served, commanded = [], []
        for rep in range(args.reps):
            say(f"(a) repetition {rep + 1} of {args.reps}")
            got = stream(client, request(seed, args.max_tokens, grammar))
            assert got.tokens == expected_tokens, "the server's tokens are not the command's"
            served.append(got.rate())
            commanded.append(command_rate(generate_command(
                model, daemon.target, grammar_file, seed=seed, max_tokens=args.max_tokens,
                threads=args.threads, output="text"), len(expected_tokens)))
    server_rate, command_rate_ = statistics.median(served), statistics.median(commanded)
    return [
        ("(a) one streamed request", f"{len(expected_tokens)} tokens, seed {seed}", "", ""),
        ("  sampler-worker generate", f"{command_rate_:.1f} tokens/s", "", ""),
        ("  sampler-worker serve", f"{server_rate:.1f} tokens/s", f"{server_rate / command_rate_:.3f}x",
         "target >= 0.97x"),
    ]


def concurrent(url: str, grammar: str, args: argparse.Namespace) -> tuple[float, list[Stream]]:
    """Median total tokens/s of `args.reps` rounds of four streamed requests at once; every stream."""
    rates: list[float] = []
    streams: list[Stream] = []
    with httpx.Client(base_url=url, timeout=300, limits=httpx.Limits(max_connections=4)) as client:
        for seed in range(1, 5):  # untimed: every mask of these requests made (see one_request)
            stream(client, request(seed, args.max_tokens, grammar))
        for rep in range(args.reps):
            with ThreadPoolExecutor(max_workers=4) as pool:
                started = time.perf_counter()
                got = list(pool.map(lambda seed: stream(client, request(seed, args.max_tokens, grammar)),
                                    range(1, 5)))
                ended = time.perf_counter()
            say(f"    round {rep + 1} of {args.reps}: {sum(len(s.tokens) for s in got)} tokens")
            rates.append(sum(len(s.tokens) for s in got) / (ended - started))
            streams += got
    return statistics.median(rates), streams


def latency(streams: list[Stream]) -> str:
    first = [(s.arrivals[0] - s.sent) * 1e3 for s in streams]
    between = [gap * 1e3 for s in streams for gap in s.gaps()]
    return (f"first token p50 {percentile(first, 0.5):.0f} / p99 {percentile(first, 0.99):.0f} ms; "
            f"between tokens p50 {percentile(between, 0.5):.1f} / p99 {percentile(between, 0.99):.1f} ms")


def leaks(url: str, live: Server, daemon: Constraintd, args: argparse.Namespace) -> list[tuple[str, ...]]:
    warm_up = 2 * len(KINDS)
    got = drive(url, count=warm_up, clients=4)
    idle(live)
    before = rss(live.process.pid), rss(daemon.process.pid)
    got += drive(url, count=args.leak_requests - warm_up, clients=4, first=warm_up)
    idle(live)
    after = rss(live.process.pid), rss(daemon.process.pid)
    assert got == expected(got), got
    text = live.metrics()
    open_generations = gauge(text, "sampler_worker_generations_active")
    held = gauge(text, "sampler_worker_constraintd_sessions_open")
    sessions = daemon.metric("constraintd_sessions_open")
    mib = 1 << 20
    return [
        (f"(c) {args.leak_requests} requests, 4 clients, --parallel 4",
         ", ".join(f"{n} {k}" for k, n in sorted(statuses(got).items())), "", ""),
        ("  open generations after (server)", f"{open_generations:g}", "", "target 0"),
        ("  constraintd sessions held after (server)", f"{held:g}", "", "target 0"),
        ("  constraintd sessions open after (constraintd)", f"{sessions:g}", "", "target 0"),
        ("  server RSS before / after", f"{before[0] / mib:.0f} / {after[0] / mib:.0f} MiB",
         f"{(after[0] - before[0]) / mib:+.1f} MiB", "flat"),
        ("  constraintd RSS before / after", f"{before[1] / mib:.0f} / {after[1] / mib:.0f} MiB",
         f"{(after[1] - before[1]) / mib:+.1f} MiB", "flat"),
    ]


def statuses(got: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for (_, status), n in got.items():
        key = f"HTTP {status}" if status else "no answer read"
        out[key] = out.get(key, 0) + n
    return out


def idle(live: Server) -> None:
    # a client gone before its answer leaves a generation that ends at its own pace: wait for it
    deadline = time.monotonic() + 120
    while gauge(live.metrics(), "sampler_worker_generations_active") and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3,
                        help="repetitions of (a) and rounds of (b) (default 3)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--leak-requests", type=int, default=200, help="requests of (c) (default 200)")
    parser.add_argument("--threads", type=int, default=default_threads(),
                        help="the model's threads, shared by a server's slots (default: one per core)")
    parser.add_argument("--quick", action="store_true", help="--reps 2 --max-tokens 32 --leak-requests 60")
    parser.add_argument("--parts", default="abc", help="which of (a), (b), (c) to run (default abc)")
    parser.add_argument("--overlap", default="auto", choices=("auto", "off", "ahead"),
                        help="the servers' --overlap (default auto)")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.max_tokens, args.leak_requests = 2, 32, 60
    model = reference.gemma_path()
    grammar = json_schema_to_gbnf(json.dumps(SCHEMA))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch, \
            constraintd(Path(scratch), model) as daemon:
        grammar_file = Path(scratch) / "schema.gbnf"
        grammar_file.write_text(grammar)
        rows: list[tuple[str, ...]] = [("measure", "value", "ratio", "target")]
        if "a" in args.parts:
            say("(a) one streamed request: server and command")
            rows += one_request(model, daemon, grammar_file, grammar, args)
        if "b" in args.parts:
            say("(b) four clients, --parallel 1")
            with server(model, daemon.target, parallel=1, threads=args.threads, overlap=args.overlap) as one:
                serial, serial_streams = concurrent(one.url, grammar, args)
        leak_rows: list[tuple[str, ...]] = []
        if "b" in args.parts or "c" in args.parts:
            with server(model, daemon.target, parallel=4, threads=args.threads, overlap=args.overlap) as four:
                if "b" in args.parts:
                    say("(b) four clients, --parallel 4")
                    parallel, parallel_streams = concurrent(four.url, grammar, args)
                if "c" in args.parts:
                    say(f"(c) {args.leak_requests} requests")
                    leak_rows = leaks(four.url, four, daemon, args)
        if "b" in args.parts:
            rows += [
                (f"(b) 4 clients at once, {args.max_tokens} tokens each, --threads {args.threads}",
                 "", "", ""),
                ("  --parallel 1: total", f"{serial:.1f} tokens/s", "", ""),
                ("  --parallel 1: latency", latency(serial_streams), "", ""),
                ("  --parallel 4: total", f"{parallel:.1f} tokens/s", f"{parallel / serial:.2f}x",
                 "target >= 1.5x"),
                ("  --parallel 4: latency", latency(parallel_streams), "", ""),
            ]
        rows += leak_rows
    print(f"sampler-worker serve, Gemma 3 270M, {os.cpu_count()} CPUs, medians of {args.reps}; "
          f"{time.perf_counter() - started:.0f} s in all")
    print(table(rows))


if __name__ == "__main__":
    main()
