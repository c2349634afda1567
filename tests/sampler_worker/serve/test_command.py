"""sampler_worker.serve.command: `--listen`, and `sampler-worker serve` as a process."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sampler_worker.cli import build_parser
from sampler_worker.serve.command import Listen, parse_listen


@pytest.mark.parametrize(("text", "listen"), [
    ("127.0.0.1:8080", Listen("127.0.0.1", 8080)),
    (":9000", Listen("127.0.0.1", 9000)),
    ("[::1]:0", Listen("::1", 0)),
    ("unix:///tmp/sw.sock", Listen(path="/tmp/sw.sock")),
    ("unix:relative.sock", Listen(path="relative.sock")),
], ids=["host-port", "port", "ipv6", "unix-url", "unix-path"])
def test_listen(text: str, listen: Listen) -> None:
    assert parse_listen(text) == listen


@pytest.mark.parametrize("text", ["8080", "host:", "unix:", "host:http"])
def test_listen_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"listen|socket path"):
        parse_listen(text)


def test_serve_options() -> None:
    args = build_parser().parse_args(["serve", "--listen", "127.0.0.1:0", "--parallel", "2",
                                      "--constraintd", "local"])
    got = (args.command, args.listen, args.parallel, args.constraintd)
    assert got == ("serve", Listen(port=0), 2, "local")
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.listen, defaults.parallel, defaults.constraintd, defaults.max_queue) == (
        Listen(), 1, None, 8)


def test_a_bad_parallel_is_refused_before_loading() -> None:
    done = subprocess.run([sys.executable, "-m", "sampler_worker", "serve", "--parallel", "0",
                           "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--parallel must be at least 1" in done.stderr


@pytest.mark.slow  # loads the model in a process of its own
def test_the_command_serves_until_sigterm(gemma_path: Path) -> None:
    command = [sys.executable, "-m", "sampler_worker", "serve", "--model", str(gemma_path), "--listen",
               "127.0.0.1:0", "--constraintd", "local", "--n-ctx", "512"]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stderr is not None
            for line in process.stderr:  # blocks until the server says where it listens
                if line.startswith("listening on "):
                    url = line.split()[-1]
                    break
            else:
                pytest.fail(f"the server exited ({process.wait()}) without listening")
            assert httpx.get(f"{url}/health", timeout=60).json() == {"status": "ok"}
            answer = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
            assert answer.json()["usage"]["completion_tokens"] == 2
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()


def test_a_chat_template_that_cannot_be_read_is_refused_before_loading(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--chat-template", str(tmp_path / "t.jinja")])
    assert args.chat_template == tmp_path / "t.jinja"
    done = subprocess.run([sys.executable, "-m", "sampler_worker", "serve", "--chat-template",
                           str(tmp_path / "missing.jinja"), "--listen", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "missing.jinja: No such file or directory" in done.stderr
