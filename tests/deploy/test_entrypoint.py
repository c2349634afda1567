"""deploy/entrypoint.sh: `serve` gets a socket mode from the umask (0660 under the image's 0007, so the pod's
group may connect), CONSTRAINTD_SOCKET_MODE or a later --socket-mode replaces it, other commands are passed
as they are. Run with sh against a stand-in for the installed `constraintd` that prints its arguments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "entrypoint.sh"
INSTALLED = "/opt/constraintd/bin/constraintd"


def run(tmp_path: Path, *args: str, **env: str) -> list[str]:
    stand_in = tmp_path / "constraintd"
    stand_in.write_text('#!/bin/sh\necho "umask $(umask)"\nfor a in "$@"; do echo "$a"; done\n')
    stand_in.chmod(0o755)
    script = tmp_path / "entrypoint.sh"
    text = ENTRYPOINT.read_text()
    assert text.count(INSTALLED) == 2
    script.write_text(text.replace(INSTALLED, str(stand_in)))
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CONSTRAINTD_")} | env
    done = subprocess.run(
        ["sh", str(script), *args], env=environment, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, "0660"),
        ({"CONSTRAINTD_UMASK": "0000"}, "0666"),
        ({"CONSTRAINTD_UMASK": "0077"}, "0600"),
        ({"CONSTRAINTD_SOCKET_MODE": "0600"}, "0600"),
    ],
    ids=["image", "open-umask", "private-umask", "explicit"],
)
def test_serve_gets_the_socket_mode(tmp_path: Path, env: dict[str, str], mode: str) -> None:
    lines = run(tmp_path, "serve", "--listen", "unix:///run/constraintd/c.sock", **env)
    assert lines[1:] == ["serve", "--socket-mode", mode, "--listen", "unix:///run/constraintd/c.sock"]


def test_other_commands_pass_as_they_are(tmp_path: Path) -> None:
    assert run(tmp_path, "warm", "--vocab", "m.gguf") == ["umask 0007", "warm", "--vocab", "m.gguf"]
