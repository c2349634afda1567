"""The container image (deploy/Dockerfile), built and run for real where a Docker daemon is reachable
(the test starts none; without one it is skipped, saying why).

It is built as a host that reaches only Debian's archive and the package index would build it: on the
local base (deploy/base/build-base.sh, made here if absent) with the wheels fetched on the host, and the
GPT-2 vocabulary prepared at build time (`deploy/build-image.sh --local-base --wheelhouse --warm-vocab
ggml-vocab-gpt-2.gguf`). Then it runs as the Kubernetes manifests run it:
read-only root, every capability dropped, no privilege escalation, the socket directory a mounted volume,
a model directory mounted read-only. The image's health check must pass, the service must run as a
non-root user, and a client on the host must complete a constrained session through the socket: a JSON
schema over the GPT-2 vocabulary (50,257 tokens, read by the server from the mounted GGUF), fed the tokens
llama.cpp's tokenizer gives for a conforming answer, then end of generation. That vocabulary must be loaded
from the image's prepared cache (the mounted GGUF found by its metadata), and one not prepared must be
read from its file although the cache cannot be written. `docker stop` must end it cleanly (exit 0)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clients import Client, unpack_mask
from tests import reference
from tests.oracle import LlamaVocab

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TAG = "constraintd:test"
SOCKET_DIR = "/run/constraintd"
CACHE_DIR = "/var/cache/constraintd"
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
ANSWER = b'{"answer": "yes"}'
# Seconds: building from scratch (base image, wheels, venv) on two shared cores; the first health check.
BUILD_TIMEOUT = 1800
HEALTHY_TIMEOUT = 120


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("docker") is None:
        pytest.skip("no docker command (Debian package docker.io)")
    info = docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    if info.returncode != 0:
        last_line = (info.stderr.strip().splitlines() or ["docker info failed"])[-1]
        pytest.skip(f"no Docker daemon reachable: {last_line}")
    build = subprocess.run(
        ["bash", str(ROOT / "deploy" / "build-image.sh"), "--local-base", "--wheelhouse", "--tag", TAG,
         "--warm-vocab", str(reference.require(reference.vocab_path("gpt-2")))],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False,
        env={**os.environ, "PYTHON": sys.executable})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return TAG


@pytest.fixture(scope="module")
def container(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A running container, and the host directory mounted as its socket directory."""
    sockets = tmp_path_factory.mktemp("sockets")
    sockets.chmod(0o777)  # the service (uid 65532) creates its socket here
    models = reference.require(reference.vocab_path("gpt-2")).parent
    # A client that is not root is not in the socket's group: open the socket to everyone then.
    umask = [] if os.geteuid() == 0 else ["--env", "CONSTRAINTD_UMASK=0000"]
    run = docker("run", "--detach", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                 "--volume", f"{sockets}:{SOCKET_DIR}", "--volume", f"{models}:/models:ro", *umask, image,
                 "serve", f"--listen=unix://{SOCKET_DIR}/constraintd.sock", "--gguf-dir=/models",
                 f"--cache-dir={CACHE_DIR}", "--log-format=json")
    cid = run.stdout.strip()
    try:
        yield cid, sockets
    finally:
        docker("rm", "--force", cid, check=False)


def wait_for_health(cid: str) -> str:
    """The first health status Docker reports for the container, read from its event stream."""
    since = docker("inspect", "--format", "{{.Created}}", cid).stdout.strip()
    until = str(int(time.time()) + HEALTHY_TIMEOUT)
    events = docker("events", "--since", since, "--until", until, "--filter", f"container={cid}",
                    "--filter", "event=health_status", "--format", "{{.Status}}",
                    timeout=HEALTHY_TIMEOUT + 30, check=False)
    statuses = [line for line in events.stdout.splitlines() if line.startswith("health_status")]
    return statuses[0] if statuses else "no health status reported"


def log_events(cid: str) -> list[dict[str, Any]]:
    """The server's JSON log lines."""
    logs = docker("logs", cid)
    lines = (logs.stderr + logs.stdout).splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def test_image_has_no_build_tools(image: str) -> None:
    found = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                   "for t in gcc cc g++ make pip pip3; do command -v $t; done; true").stdout
    assert found == ""


def test_container_serves_a_constrained_session(container: tuple[str, Path]) -> None:
    cid, sockets = container
    # The first check runs one interval after the start; the event stream ends at the first status.
    status = wait_for_health(cid)
    logs = docker("logs", cid).stderr + docker("logs", cid).stdout
    assert status == "health_status: healthy", logs[-3000:]
    process = docker("exec", cid, "cat", "/proc/1/status").stdout
    uid_line = next(line for line in process.splitlines() if line.startswith("Uid:"))
    assert uid_line.split()[1:] == ["65532"] * 4
    socket_file = sockets / "constraintd.sock"
    assert socket_file.stat().st_uid == 65532

    with LlamaVocab(reference.vocab_path("gpt-2")) as llama:
        tokens = llama.tokenize(ANSWER)
        (forbidden,) = llama.tokenize(b"x")
        (eog,) = llama.eog_ids()
        n_vocab = llama.n_vocab
    with Client(f"unix://{socket_file}") as client:
        vocab = client.register_vocab(gguf="/models/ggml-vocab-gpt-2.gguf")
        with client.session(vocab, json_schema=SCHEMA) as session:
            mask = session.accept_or_mask(forbidden)
            assert mask is not None
            allowed = unpack_mask(mask, n_vocab)
            assert (bool(allowed[forbidden]), bool(allowed[tokens[0]])) == (False, True)
            assert [session.accept(t) for t in tokens] == [True] * len(tokens)
            assert session.is_complete()
            assert session.accept(eog)
            assert session.history == (*tokens, eog)
        assert client.register_vocab(gguf="/models/ggml-vocab-llama-spm.gguf").size == 32000  # not prepared

    events = {e["event"]: e for e in log_events(cid) if e["event"].startswith("vocabulary ")}
    assert events["vocabulary loaded"]["loaded_from"].startswith(f"{CACHE_DIR}/vocab-")
    assert events["vocabulary loaded"]["gguf"] == "/models/ggml-vocab-gpt-2.gguf"
    read = events["vocabulary read"]
    assert (read["gguf"], read["saved_to"]) == ("/models/ggml-vocab-llama-spm.gguf", None)
    assert "not written" in read["notes"][0]

    docker("stop", cid)
    state = docker("inspect", "--format", "{{.State.ExitCode}}", cid).stdout.strip()
    assert state == "0", docker("logs", cid).stderr[-3000:]
