"""The generated modules of constraintd.v1 are exactly what grpcio-tools makes of the .proto today."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
from google.rpc import status_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("constraintd/v1/constraintd.proto")
GENERATED = ("constraintd_pb2.py", "constraintd_pb2.pyi", "constraintd_pb2_grpc.py")
# Where google/rpc/status.proto is: googleapis-common-protos ships it beside its module, in site-packages.
GOOGLEAPIS = Path(status_pb2.__file__).parents[2]
# The well-known types it imports (google/protobuf/any.proto): grpc_tools ships them, and adds this include
# itself when run as `python -m grpc_tools.protoc`, as constraintd/v1/__init__.py says; `main` does not.
WELL_KNOWN = resources.files("grpc_tools") / "_proto"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"-I{GOOGLEAPIS}",
            f"-I{WELL_KNOWN}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(ROOT / "proto" / PROTO),
        ]
    )
    assert status == 0
    return out / PROTO.parent


@pytest.mark.parametrize("name", GENERATED, ids=GENERATED)
def test_generated_module_matches_the_proto(regenerated: Path, name: str) -> None:
    committed = (ROOT / PROTO.parent / name).read_text()
    assert committed == (regenerated / name).read_text(), (
        f"constraintd/v1/{name} is stale: regenerate it (see constraintd/v1/__init__.py)"
    )


def test_the_service_has_every_rpc() -> None:
    from constraintd.v1 import constraintd_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Constraintd"]
    assert pb.DESCRIPTOR.package == "constraintd.v1"
    assert [m.name for m in service.methods] == [
        "RegisterVocab",
        "RegisterVocabParts",
        "CreateSession",
        "Accept",
        "Allows",
        "Mask",
        "Rollback",
        "Fork",
        "Close",
        "Step",
    ]
    step = service.methods_by_name["Step"]
    assert step.client_streaming and step.server_streaming
    parts = service.methods_by_name["RegisterVocabParts"]
    assert parts.client_streaming and not parts.server_streaming
