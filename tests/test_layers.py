"""Layers only look down (STYLE.md, Architecture 8; ARCHITECTURE.md).

    constraintd.errors, constraintd.v1     the error tree and the wire messages: the floor
    constraintd.engine                     decides (standard library and numpy: tests/engine/test_imports.py)
    constraintd.chat_templates             the engine's chat layer's renderer: llama.cpp's Jinja on Jinja2
    constraintd.service                    sessions over the engine: no grpc, no asyncio
    constraintd.server                     the gRPC shell: the only place grpc is imported on the server side
    constraintd.commands, constraintd.cli  the command line
    clients                                the client: never the server; the service core only in its
                                           in-process transport; grpc only in its gRPC transport
    sampler_worker                         the model and the sampler: the client and the engine, never the
                                           server nor the service core

Every import in every module (at the top or inside a function) is read from the source and checked
against the table below, so a change that reaches up a layer fails here with the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("constraintd", "clients", "sampler_worker")

# What each part of the project may import of the project (prefixes of dotted module names). The first
# matching part (longest prefix) of a module decides.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "constraintd.errors": (),
    "constraintd.v1": ("constraintd.v1",),
    "constraintd.engine": ("constraintd.engine", "constraintd.errors"),
    "constraintd.chat_templates": ("constraintd.engine", "constraintd.errors"),
    "constraintd.service": ("constraintd.service", "constraintd.chat_templates", "constraintd.engine",
                            "constraintd.errors", "constraintd.v1.constraintd_pb2"),
    "constraintd.server": ("constraintd.server", "constraintd.service", "constraintd.engine",
                           "constraintd.errors", "constraintd.v1"),
    "constraintd.commands": ("constraintd",),
    "constraintd.cli": ("constraintd",),
    "constraintd.__main__": ("constraintd",),
    "constraintd": ("constraintd.errors",),  # the package's own __init__
    "clients.transports.local": ("clients", "constraintd.service", "constraintd.engine", "constraintd.errors",
                                 "constraintd.v1.constraintd_pb2"),
    "clients.transports.grpc": ("clients", "constraintd.engine", "constraintd.errors", "constraintd.v1"),
    "clients": ("clients", "constraintd.engine", "constraintd.errors", "constraintd.v1.constraintd_pb2"),
    "sampler_worker": ("sampler_worker", "clients", "constraintd.chat_templates", "constraintd.engine",
                       "constraintd.errors"),
}
# Third-party modules only some parts may import.
RESTRICTED = {
    # sampler_worker.sidecar asks its private server's health service whether it is up yet.
    "grpc": ("constraintd.server", "constraintd.v1", "clients.transports.grpc", "sampler_worker.sidecar"),
    "grpc_health": ("constraintd.server", "sampler_worker.sidecar"),
    "grpc_reflection": ("constraintd.server",),
    "grpc_status": ("constraintd.server", "clients.transports.grpc"),
    # google.rpc.Status and its details: the wire form of an error. The service core writes it
    # (service/status.py, for the server and for a Step's results on every transport), the client reads
    # it (clients/status.py); the error tree itself and the engine know nothing of the wire.
    "google": ("constraintd.v1", "constraintd.service", "constraintd.server", "clients"),
    "asyncio": ("constraintd.server", "constraintd.commands", "clients", "sampler_worker"),
    "llama_cpp": ("sampler_worker",),
    "jinja2": ("constraintd.chat_templates",),
}
PROJECT = ("constraintd", "clients", "sampler_worker")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, with its line; `from a import b` counts as `a.b` (b may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def rule_for(module: str, table: dict[str, tuple[str, ...]]) -> str | None:
    matches = [part for part in table if module == part or module.startswith(part + ".")]
    return max(matches, key=len) if matches else None


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when it may."""
    top = imported.split(".")[0]
    if top in PROJECT:
        part = rule_for(importer, MAY_IMPORT)
        if part is None:
            return f"{importer} belongs to no layer"
        # `from constraintd.engine import Grammar` reads as constraintd.engine.Grammar: inside the engine.
        if not within(imported, MAY_IMPORT[part]):
            return f"{part} may not import {imported}"
        return None
    allowed = RESTRICTED.get(top)
    if allowed is not None and not within(importer, allowed):
        return f"{importer} may not import {top}"
    return None


SOURCES = sorted(
    p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if not p.name.endswith("_pb2_grpc.py")
    and not p.name.endswith("_pb2.py")
)


def test_every_module_is_in_a_layer() -> None:
    assert len(SOURCES) > 50
    assert [module_name(p) for p in SOURCES if rule_for(module_name(p), MAY_IMPORT) is None] == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_look_down(path: Path) -> None:
    importer = module_name(path)
    bad = [
        f"line {line}: {why}" for line, imported in imports(path) if (why := violations(importer, imported))
    ]
    assert not bad, f"{path.relative_to(ROOT)} reaches up a layer: {bad}"


@pytest.mark.parametrize(
    ("importer", "imported", "allowed"),
    [
        ("constraintd.engine.matcher", "constraintd.engine.grammar.compiled.Grammar", True),
        ("constraintd.engine.matcher", "constraintd.service.registry.Registry", False),
        ("constraintd.engine.matcher", "grpc", False),
        ("constraintd.service.registry", "constraintd.server.processes.ProcessPool", False),
        ("constraintd.service.operations", "constraintd.v1.constraintd_pb2", True),
        ("constraintd.service.operations", "constraintd.v1.constraintd_pb2_grpc", False),
        ("constraintd.service.sessions", "asyncio", False),
        ("constraintd.server.servicer", "grpc", True),
        ("constraintd.service.status", "google.rpc.status_pb2", True),
        ("constraintd.service.status", "grpc_status.rpc_status", False),
        ("constraintd.errors", "google.rpc.status_pb2", False),
        ("constraintd.engine.matcher", "google.protobuf.message", False),
        ("clients.status", "google.rpc.error_details_pb2", True),
        ("clients.transports.local", "constraintd.service.operations.Operations", True),
        ("clients.transports.local", "constraintd.server.config.ServerConfig", False),
        ("clients.client", "constraintd.service.registry.Registry", False),
        ("clients.client", "grpc", False),
        ("clients.transports.grpc", "grpc", True),
        ("sampler_worker.cli", "constraintd.server.lifecycle", False),
        ("sampler_worker.cli", "constraintd.engine.chat.content.json_message", True),
        ("sampler_worker.prompt", "constraintd.chat_templates.render_template", True),
        ("sampler_worker.prompt", "jinja2", False),
        ("constraintd.service.chat", "constraintd.chat_templates.chat_prompt_of", True),
        ("constraintd.chat_templates", "constraintd.service.registry", False),
    ],
    ids=lambda v: str(v),
)
def test_the_rule_itself(importer: str, imported: str, allowed: bool) -> None:
    assert (violations(importer, imported) is None) is allowed
