"""The sidecar shape without containers: `constraintd serve` and `sampler-worker generate` as two processes
that share nothing but a Unix socket in a temporary directory. The worker generates constrained JSON with
Gemma 3 270M; mid-run the server is killed (SIGKILL, no goodbye) and a new one is started on the same
socket path; the worker's client re-registers the vocabulary, re-creates the session with the accepted
tokens replayed, and the generation ends exactly as an uninterrupted run with the same seed does. The two
servers share a writable `--cache-dir`, as the sidecar's emptyDir: the first reads the vocabulary from the
GGUF and saves it there, the second loads it from there, and its answers are the same.

"Mid-run" is observed, never guessed from time: the first server's metrics endpoint counts the accepts
it answered (Accept calls, and the Step messages the client sends each accept in on its open stream);
once it has answered `KILL_AFTER_ACCEPTS`, the worker is frozen (SIGSTOP) so the count read then is the
first server's final word and the worker cannot finish in between; the server is killed and the worker
resumed, so the worker sees the outage as it is, then the second server starts. Waits are polls of a
process, a log file or the metrics endpoint, each bounded by a timeout.

Sizes: one reference run and one interrupted run of about 20 tokens each, `--threads 1`; the model load
dominates (tens of seconds on a loaded two-core machine)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

PROBE = Path(__file__).resolve().parents[2] / "deploy" / "grpc_health_probe.py"
CHAT = "Describe a cat as JSON"
SEED = 7
MAX_TOKENS = 40
KILL_AFTER_ACCEPTS = 3
START_TIMEOUT = 120.0
RUN_TIMEOUT = 600.0
POLL_SECONDS = 0.02
T = TypeVar("T")
RPC_SAMPLE = re.compile(r'^constraintd_rpcs_total\{method="(\w+)",code="(\w+)"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Server:
    """One `constraintd serve` process on a Unix socket, with its metrics on a loopback port."""

    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int

    def rpcs(self, method: str, code: str = "OK") -> int:
        """How many `method` calls the server has answered with `code`, from its metrics endpoint."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        counts = {(m, c): int(float(v)) for m, c, v in RPC_SAMPLE.findall(text)}
        return counts.get((method, code), 0)

    def accepts(self) -> int:
        """How many accepts the server answered: unary Accept calls and messages of the Step stream."""
        return self.rpcs("Accept") + self.rpcs("Step")


def wait_until(what: str, timeout: float, ready: Callable[[], T | None]) -> T:
    """Polls `ready()` until it returns something other than None; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while (value := ready()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL_SECONDS)
    return value


def start_server(socket_path: Path, log: Path, *, gguf_dir: Path, cache_dir: Path | None = None) -> Server:
    """Starts `constraintd serve` and returns once its health service says SERVING over the socket."""
    command = [sys.executable, "-m", "constraintd", "serve", "--listen", f"unix://{socket_path}",
               "--metrics", "127.0.0.1:0", "--log-format", "json", "--log-level", "INFO",
               "--gguf-dir", str(gguf_dir)]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink)

    def metrics_port() -> int | None:
        if process.poll() is not None:
            pytest.fail(f"constraintd exited with {process.returncode} before serving:\n{log.read_text()}")
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and line.endswith("}"):
                event = json.loads(line)
                if event.get("event") == "serving":
                    return int(event["metrics_port"])
        return None

    server = Server(process, log, wait_until("constraintd to serve", START_TIMEOUT, metrics_port))
    probe = subprocess.run([sys.executable, "-I", "-S", str(PROBE), "--addr", f"unix://{socket_path}"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    return server


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def worker_command(model: Path, socket_path: Path) -> list[str]:
    return [sys.executable, "-m", "sampler_worker", "generate", "--model", str(model), "--chat", CHAT,
            "--json", "--seed", str(SEED), "--max-tokens", str(MAX_TOKENS), "--threads", "1",
            "--constraintd", f"unix://{socket_path}", "--output", "json"]


def finished(worker: subprocess.Popen[bytes], stdout: Path, stderr: Path) -> dict[str, Any]:
    try:
        worker.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not finish within {RUN_TIMEOUT:g} s:\n{stderr.read_text()[-2000:]}")
    assert worker.returncode == 0, stderr.read_text()[-2000:]
    report: dict[str, Any] = json.loads(stdout.read_text())
    return report


@contextmanager
def scratch() -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    """A short directory under /tmp (a socket path must stay short) and the processes to stop at the end."""
    directory = Path(tempfile.mkdtemp(prefix="sidecar-", dir="/tmp"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield directory, processes
    finally:
        for process in reversed(processes):
            stop(process)
        shutil.rmtree(directory, ignore_errors=True)


def run_uninterrupted(model: Path) -> dict[str, Any]:
    with scratch() as (directory, processes):
        socket_path = directory / "constraintd.sock"
        server = start_server(socket_path, directory / "server.log", gguf_dir=model.resolve().parent)
        processes.append(server.process)
        stdout, stderr = directory / "worker.json", directory / "worker.log"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            worker = subprocess.Popen(worker_command(model, socket_path), stdout=out, stderr=err)
        processes.append(worker)
        return finished(worker, stdout, stderr)


@pytest.mark.slow
def test_generation_survives_a_server_killed_and_restarted_mid_run(gemma_path: Path) -> None:
    reference = run_uninterrupted(gemma_path)
    assert len(reference["tokens"]) > KILL_AFTER_ACCEPTS + 2, "too short a run to interrupt in the middle"

    with scratch() as (directory, processes):
        socket_path = directory / "constraintd.sock"
        cache = directory / "cache"
        models = gemma_path.resolve().parent
        first = start_server(socket_path, directory / "first.log", gguf_dir=models, cache_dir=cache)
        processes.append(first.process)
        stdout, stderr = directory / "worker.json", directory / "worker.log"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            worker = subprocess.Popen(worker_command(gemma_path, socket_path), stdout=out, stderr=err)
        processes.append(worker)

        def mid_run() -> bool | None:
            if worker.poll() is not None:
                pytest.fail(f"the worker ended before the kill:\n{stderr.read_text()[-2000:]}")
            return True if first.accepts() >= KILL_AFTER_ACCEPTS else None

        wait_until(f"{KILL_AFTER_ACCEPTS} accepts on the first server", RUN_TIMEOUT, mid_run)
        worker.send_signal(signal.SIGSTOP)
        accepts_before_kill = first.accepts()
        assert worker.poll() is None, "the worker finished before it could be interrupted"
        first.process.kill()
        first.process.wait(timeout=30)
        assert socket_path.is_socket(), "the killed server's socket file should be left behind"
        worker.send_signal(signal.SIGCONT)

        # over the stale socket
        second = start_server(socket_path, directory / "second.log", gguf_dir=models, cache_dir=cache)
        processes.append(second.process)
        report = finished(worker, stdout, stderr)

        assert (report["tokens"], report["content"]) == (reference["tokens"], reference["content"])
        assert (report["text"], report["rejected_at"]) == (reference["text"], reference["rejected_at"])
        assert accepts_before_kill < len(report["tokens"]) + len(report["rejected_at"]), (
            "the first server answered every accept: the kill did not land mid-run")
        # the client found its vocabulary and session gone, registered and rebuilt them on the new server,
        # and the rest of the generation was answered there
        assert second.rpcs("RegisterVocab") == 1
        assert second.rpcs("CreateSession") == 1
        assert second.accepts() >= 1
        assert accepts_before_kill + second.accepts() >= len(report["tokens"])
        # the first server read the vocabulary and saved it in the shared cache; the second loaded it
        (read,) = vocabulary_events(first.log)
        (loaded,) = vocabulary_events(second.log)
        assert (read["event"], loaded["event"]) == ("vocabulary read", "vocabulary loaded")
        assert read["saved_to"] == loaded["loaded_from"] and read["saved_to"].startswith(str(cache))


def vocabulary_events(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text(errors="replace").splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
    return [e for e in events if e.get("event") in ("vocabulary read", "vocabulary loaded")]
