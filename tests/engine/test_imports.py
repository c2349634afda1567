"""The engine has no I/O: its modules import only the standard library, numpy and constraintd itself,
and none of the standard library's networking, concurrency or logging modules (STYLE.md, Architecture 1)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "constraintd" / "engine"

# Standard-library modules that would bring I/O, threads or an event loop into the engine.
FORBIDDEN_STDLIB = frozenset({
    "asyncio", "concurrent", "http", "logging", "multiprocessing", "selectors", "signal", "socket",
    "socketserver", "ssl", "subprocess", "threading", "urllib",
})
ALLOWED_THIRD_PARTY = frozenset({"numpy"})
ALLOWED_PROJECT = ("constraintd.engine", "constraintd.errors")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside the engine package
                found.append((node.lineno, "constraintd.engine"))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def offending(module: str) -> bool:
    top = module.split(".")[0]
    if top == "constraintd":
        return not module.startswith(ALLOWED_PROJECT)
    if top in sys.stdlib_module_names:
        return top in FORBIDDEN_STDLIB
    return top not in ALLOWED_THIRD_PARTY


def test_engine_has_modules() -> None:
    assert sorted(ENGINE.rglob("*.py")), "the engine package is empty"


@pytest.mark.parametrize("path", sorted(ENGINE.rglob("*.py")), ids=lambda p: str(p.relative_to(ENGINE)))
def test_engine_imports_no_io(path: Path) -> None:
    bad = [f"line {line}: {module}" for line, module in imported_modules(path) if offending(module)]
    assert not bad, f"{path.name} imports what the engine must not: {bad}"


@pytest.mark.parametrize(
    ("module", "bad"),
    [("numpy", False), ("re", False), ("constraintd.errors", False), ("asyncio", True),
     ("grpc", True), ("constraintd.server", True), ("logging", True)],
    ids=["numpy", "re", "errors", "asyncio", "grpc", "server", "logging"],
)
def test_offending_rule(module: str, bad: bool) -> None:
    assert offending(module) is bad
