"""The exec-probe health check (deploy/grpc_health_probe.py) against a real grpc server's standard health
service: SERVING, NOT_SERVING, an unknown service, no server, a server that never answers, TCP, TLS.

The probe runs as the kubelet and Docker run it: a separate `python3 -I -S` process (standard library
only), judged by its exit status."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

PROBE = Path(__file__).resolve().parents[2] / "deploy" / "grpc_health_probe.py"
SERVICE = "constraintd.v1.Constraintd"


@dataclass(frozen=True, slots=True)
class HealthServer:
    unix: str
    tcp: str
    tls: str
    unix_tls: str
    ca: Path
    servicer: health.HealthServicer


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=constraintd.test", "-addext",
         "subjectAltName=DNS:constraintd.test,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HealthServer]:
    if shutil.which("openssl") is None:
        pytest.fail("the TLS cases need the openssl command (Debian package openssl)")
    directory = tmp_path_factory.mktemp("probe")
    cert, key = self_signed(directory)
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, grpc_server)
    unix = f"unix://{directory / 'health.sock'}"
    grpc_server.add_insecure_port(unix)
    tcp_port = grpc_server.add_insecure_port("127.0.0.1:0")
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    tls_port = grpc_server.add_secure_port("127.0.0.1:0", credentials)
    unix_tls = f"unix://{directory / 'health-tls.sock'}"
    grpc_server.add_secure_port(unix_tls, credentials)
    grpc_server.start()
    try:
        yield HealthServer(unix, f"127.0.0.1:{tcp_port}", f"127.0.0.1:{tls_port}", unix_tls, cert, servicer)
    finally:
        grpc_server.stop(None).wait()


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", str(PROBE), *args],
                          capture_output=True, text=True, timeout=60, check=False)


CASES = [
    # (address kind, extra arguments, exit status, what stdout or stderr says)
    ("unix", [], 0, "status: SERVING"),
    ("tcp", [], 0, "status: SERVING"),
    ("unix", ["--service", SERVICE], 4, "is NOT_SERVING"),
    ("unix", ["--service", "no.such.Service"], 3, "NOT_FOUND"),
    ("tls", ["--tls-ca", "{ca}", "--tls-server-name", "constraintd.test"], 0, "status: SERVING"),
    ("tls", ["--tls"], 2, "TLS handshake"),  # the self-signed certificate is not trusted
    ("tls", ["--tls-no-verify"], 0, "status: SERVING"),
    ("tcp", ["--tls-ca", "{ca}"], 2, "TLS handshake"),  # a plaintext port
    ("unix_tls", ["--tls-no-verify"], 0, "status: SERVING"),  # as the TCP overlay's probes ask
    ("unix_tls", ["--tls-ca", "{ca}", "--tls-server-name", "constraintd.test"], 0, "status: SERVING"),
]


@pytest.mark.parametrize(
    ("kind", "extra", "status", "says"), CASES,
    ids=["unix", "tcp", "not-serving", "unknown-service", "tls", "tls-untrusted", "tls-no-verify",
         "tls-to-plaintext", "unix-tls-no-verify", "unix-tls"])
def test_probe_exit_status(server: HealthServer, kind: str, extra: list[str], status: int, says: str) -> None:
    address = {"unix": server.unix, "tcp": server.tcp, "tls": server.tls, "unix_tls": server.unix_tls}[kind]
    done = run_probe("--addr", address, *(arg.format(ca=server.ca) for arg in extra))
    assert (done.returncode, says in done.stdout + done.stderr) == (status, True), done.stderr


def test_probe_follows_a_status_change(server: HealthServer) -> None:
    before = run_probe("--addr", server.unix, "--service", "flipping")
    server.servicer.set("flipping", health_pb2.HealthCheckResponse.SERVING)
    after = run_probe("--addr", server.unix, "--service", "flipping")
    assert (before.returncode, after.returncode) == (3, 0)


def test_probe_without_a_server(tmp_path: Path) -> None:
    done = run_probe("--addr", f"unix://{tmp_path / 'absent.sock'}")
    assert done.returncode == 2
    assert "cannot connect" in done.stderr


def test_probe_times_out_on_a_silent_server() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        done = run_probe("--addr", f"127.0.0.1:{silent.getsockname()[1]}", "--timeout", "0.3")
    assert done.returncode == 2
    assert "no answer" in done.stderr


@pytest.mark.parametrize("args", [["--addr", "nonsense"], ["--bogus"], []], ids=["address", "flag", "none"])
def test_probe_refuses_bad_arguments(args: list[str]) -> None:
    assert run_probe(*args).returncode == 1
