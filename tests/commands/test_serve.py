"""`constraintd serve` (constraintd/commands/serve.py): its arguments become the server's configuration.
(The running process, its signals and its shutdown are tested in tests/server/test_lifecycle.py.)"""

from __future__ import annotations

import copy
import logging
import os
import sys
from pathlib import Path

import pytest

from constraintd.cli import build_parser, main
from constraintd.commands.serve import TOKEN_ENVIRONMENT, config_from
from constraintd.server.config import LogFormat, ServerConfig, TlsFiles
from constraintd.service.limits import Limits


def parse(*argv: str) -> ServerConfig:
    return config_from(build_parser().parse_args(["serve", *argv]))


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENVIRONMENT, raising=False)
    config = parse()
    assert config == ServerConfig()


def test_every_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENVIRONMENT, raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = parse(
        "--listen",
        "unix:///run/c.sock",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        "c.pem",
        "--tls-key",
        "c.key",
        "--tls-client-ca",
        "ca.pem",
        "--token-file",
        str(token),
        "--metrics",
        "127.0.0.1:9464",
        "--gguf-dir",
        "/models",
        "--cache-dir",
        "/var/cache/constraintd",
        "--cache-dir",
        "/cache",
        "--warm-seconds",
        "5",
        "--workers",
        "3",
        "--compile-processes",
        "2",
        "--compile-nice",
        "5",
        "--mask-workers",
        "4",
        "--lookahead-seconds",
        "0.5",
        "--grace",
        "2.5",
        "--no-uvloop",
        "--switch-interval",
        "0.002",
        "--log-format",
        "text",
        "--max-sessions",
        "7",
        "--max-vocabs",
        "2",
        "--max-vocab-size",
        "100",
        "--max-grammar-bytes",
        "1000",
        "--max-stacks",
        "50",
        "--max-request-bytes",
        "4096",
        "--max-reply-bytes",
        "8192",
        "--max-vocab-bytes",
        "65536",
        "--max-step-ops",
        "8",
        "--max-grammars",
        "9",
        "--max-grammar-cache-bytes",
        "10000000",
        "--max-rollback",
        "64",
        "--session-ttl",
        "11",
        "--max-session-ttl",
        "12",
        "--compile-timeout",
        "13",
        "--mask-timeout",
        "14",
    )
    assert config == ServerConfig(
        listen=("unix:///run/c.sock", "127.0.0.1:0"),
        tls=TlsFiles(Path("c.pem"), Path("c.key"), Path("ca.pem")),
        bearer_token="s3cret",
        metrics_listen="127.0.0.1:9464",
        gguf_dirs=(Path("/models"),),
        cache_dirs=(Path("/var/cache/constraintd"), Path("/cache")),
        warm_seconds=5.0,
        workers=3,
        compile_processes=2,
        compile_nice=5,
        mask_workers=4,
        lookahead_seconds=0.5,
        shutdown_grace=2.5,
        use_uvloop=False,
        switch_interval=0.002,
        log_format=LogFormat.TEXT,
        limits=Limits(
            max_sessions=7,
            max_vocabs=2,
            max_vocab_size=100,
            max_grammar_bytes=1000,
            max_stacks=50,
            max_request_bytes=4096,
            max_reply_bytes=8192,
            max_vocab_bytes=65536,
            max_step_ops=8,
            max_grammars=9,
            max_grammar_cache_bytes=10_000_000,
            max_rollback=64,
            default_ttl=11.0,
            max_ttl=12.0,
            compile_timeout=13.0,
            mask_timeout=14.0,
        ),
    )


def test_a_compile_nice_outside_the_range_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--compile-nice", "20")
    assert exited.value.code == 2
    assert "--compile-nice" in capsys.readouterr().err


def test_the_token_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENVIRONMENT, "from-env")
    assert parse().bearer_token == "from-env"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "c.key"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
    ],
    ids=["cert-without-key", "key-without-cert", "ca-without-tls"],
)
def test_inconsistent_tls_options_are_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_address_that_cannot_be_bound_exits_with_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = logging.getLogger("constraintd")  # the command configures it; give it back afterwards
    for name in ("handlers", "propagate", "level"):
        monkeypatch.setattr(logger, name, copy.copy(getattr(logger, name)))
    assert main(["serve", "--listen", "unix:///nonexistent/dir/s.sock", "--log-format", "text"]) == 1
    assert "cannot serve: cannot listen on unix:///nonexistent/dir/s.sock" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "\n  \n"], ids=["empty", "blank"])
def test_an_empty_token_file_is_an_error_not_an_open_server(
    tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_text(content)
    assert main(["serve", "--token-file", str(token), "--listen", f"unix://{tmp_path}/s.sock"]) == 2
    assert f"--token-file {token} is empty: it would let every caller in" in capsys.readouterr().err
    assert not (tmp_path / "s.sock").exists()  # it never listened


def test_the_socket_mode_is_octal() -> None:
    assert parse().socket_mode == 0o600
    assert parse("--socket-mode", "0660").socket_mode == 0o660
    with pytest.raises(SystemExit):
        parse("--socket-mode", "999")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_parent_pid_that_is_not_the_parent_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # this process (pytest) is not its own parent: the server refuses rather than wait on a process that
    # would never signal it
    assert main(["serve", "--parent-pid", str(os.getpid()), "--listen", f"unix://{tmp_path}/s.sock"]) == 2
    assert f"--parent-pid {os.getpid()} is not this process's parent" in capsys.readouterr().err
    assert not (tmp_path / "s.sock").exists()
