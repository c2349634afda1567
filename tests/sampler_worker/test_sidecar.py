"""sampler_worker.sidecar: a private constraintd on a Unix socket for one run."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys

import pytest

from clients import Client
from sampler_worker.sidecar import PrivateConstraintd, SidecarError


@pytest.mark.slow
def test_serves_on_a_private_socket_and_cleans_up() -> None:
    with PrivateConstraintd() as server:
        assert server.target.startswith("unix:///tmp/")
        assert (server.directory / "constraintd.sock").exists()
        process = server.process
        with Client(server.target) as client:
            vocab = client.register_vocab(pieces=[b"a", b"b", b"</s>"], eog=[2])
            with client.session(vocab, gbnf='root ::= "a" "b"') as session:
                assert not session.accept(1)
                assert session.accept(0)
                assert session.accept(1)
                assert session.accept(2)
    assert process is not None and process.poll() is not None
    assert not server.directory.exists()


def test_a_server_that_dies_at_start_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setattr(sys, "executable", false)
    server = PrivateConstraintd(startup_timeout=30)
    with pytest.raises(SidecarError, match="exited with status 1"):
        server.__enter__()
    assert not server.directory.exists()


# A worker stand-in: starts a private constraintd, says its pid once it serves, then waits for stdin.
_WORKER = """
import sys
from sampler_worker.sidecar import PrivateConstraintd
with PrivateConstraintd() as server:
    print(server.process.pid, server.directory, flush=True)
    sys.stdin.read()
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_server_dies_with_a_worker_killed_by_sigkill() -> None:
    command = [sys.executable, "-c", _WORKER]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as worker:
        assert worker.stdout is not None
        pid_text, directory = worker.stdout.readline().split()
        watch = os.pidfd_open(int(pid_text))  # readable once the process has ended (reaped or not)
        try:
            worker.kill()  # no goodbye: the context's cleanup never runs
            worker.wait(timeout=30)
            ended, _, _ = select.select([watch], [], [], 60)
            assert ended, "the private constraintd outlived its worker"
        finally:
            os.close(watch)
            shutil.rmtree(directory, ignore_errors=True)
