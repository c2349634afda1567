"""sampler_worker.sidecar: a private constraintd on a Unix socket for one run."""

from __future__ import annotations

import shutil
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
