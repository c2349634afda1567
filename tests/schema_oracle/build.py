"""Build and run the JSON-schema oracle: llama.cpp's `json_schema_to_grammar`, compiled from the reference.

llama-cpp-python does not expose llama.cpp's `common/` library, so the schema tests compile its converter
themselves, with g++, against the few `common/` files it needs (the converter, its schema model, the
`common_json` wrapper of nlohmann::json, the trie and the UTF-8 reader) and the vendored nlohmann header.
`common.h` (which would pull in all of llama.cpp) is replaced by a three-function shim whose bodies are
copied, at build time, out of the reference's own `common.cpp`; `ggml.h` by a `GGML_ASSERT` that aborts.

The binary is cached under the reference cache, keyed by a hash of every source that goes into it and the
compiler's version, so it is compiled once per machine (about a minute), not once per test run.

    python -m tests.schema_oracle.build      # build (or find) the harness and print its path
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests import reference

HARNESS_SOURCE = Path(__file__).with_name("harness.cpp")
# The files of the reference's `common/` the converter is built from, copied next to the shims so that
# `#include "common.h"` inside them finds the shim rather than the real header beside them.
COMMON_FILES = (
    "json-schema-to-grammar.cpp", "json-schema-to-grammar.h", "json-schema.cpp", "json-schema.h",
    "json.cpp", "json.h", "trie.cpp", "trie.h", "unicode.cpp", "unicode.h",
)
COMPILED = ("json-schema-to-grammar.cpp", "json-schema.cpp", "json.cpp", "trie.cpp", "unicode.cpp")
# Taken verbatim from common.cpp: the only parts of common.h the converter uses.
STRING_FUNCTIONS = ("string_join", "string_split", "string_repeat")
COMPILER = os.environ.get("CXX", "g++")
FLAGS = ("-std=c++17", "-O1", "-g0", "-w")
TIMEOUT_SECONDS = 20.0

_COMMON_SHIM = """\
// Shim for llama.cpp's common.h: the converter needs only these (bodies copied from common.cpp).
#pragma once
#include <string>
#include <vector>
std::string string_join(const std::vector<std::string> & values, const std::string & separator);
std::vector<std::string> string_split(const std::string & str, const std::string & delimiter);
std::string string_repeat(const std::string & str, size_t n);
"""

_GGML_SHIM = """\
// Shim for ggml.h: json.cpp only needs GGML_ASSERT (nlohmann's JSON_ASSERT).
#pragma once
#include <cstdio>
#include <cstdlib>
#define GGML_ASSERT(x) \\
    do { if (!(x)) { std::fprintf(stderr, "GGML_ASSERT(%s) failed\\n", #x); std::abort(); } } while (0)
"""


class HarnessBuildError(RuntimeError):
    """The oracle harness could not be built (no compiler, or the reference sources changed shape)."""


def extract_function(source: str, name: str) -> str:
    """The full definition of the function `name` (free, or `type::member`) in a C++ source, signature
    through closing brace."""
    match = re.search(rf"^[^\n;{{}}]*\b{name}\([^;{{}}]*\)[^;{{}}()]*\{{", source, re.MULTILINE)
    if match is None:
        raise HarnessBuildError(f"the reference source has no definition of {name}")
    depth = 0
    for pos in range(match.end() - 1, len(source)):
        if source[pos] == "{":
            depth += 1
        elif source[pos] == "}":
            depth -= 1
            if depth == 0:
                return source[match.start() : pos + 1]
    raise HarnessBuildError(f"unbalanced braces in {name}")


def _generated_sources(llama_dir: Path) -> dict[str, str]:
    common_cpp = (llama_dir / "common" / "common.cpp").read_text()
    bodies = "\n\n".join(extract_function(common_cpp, name) for name in STRING_FUNCTIONS)
    return {
        "common.h": _COMMON_SHIM,
        "ggml.h": _GGML_SHIM,
        "common-strings.cpp": f'#include "common.h"\n#include <sstream>\n\n{bodies}\n',
    }


def compiler_version() -> str:
    try:
        done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise HarnessBuildError(f"no C++ compiler ({COMPILER}): {exc}") from exc
    return done.stdout


def _key(llama_dir: Path, generated: dict[str, str]) -> str:
    parts = [("harness.cpp", HARNESS_SOURCE.read_bytes()), ("build.py", Path(__file__).read_bytes())]
    parts += [(name, (llama_dir / "common" / name).read_bytes()) for name in COMMON_FILES]
    parts += [("json.hpp", (llama_dir / "vendor" / "nlohmann" / "json.hpp").read_bytes())]
    parts += [(name, text.encode()) for name, text in sorted(generated.items())]
    parts += [("compiler", compiler_version().encode()), ("flags", " ".join(FLAGS).encode())]
    return content_key(parts)


def content_key(parts: list[tuple[str, bytes]]) -> str:
    """A cache key of named inputs: each name and its length go into the hash, so no two lists collide."""
    digest = hashlib.sha256()
    for name, data in parts:
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]


def harness_binary(llama_dir: Path | None = None) -> Path:
    """The compiled harness, built on first use and cached by content.

    Raises:
        HarnessBuildError: no compiler, or the compile failed.
    """
    llama_dir = reference.require(llama_dir or reference.llama_cpp_dir())
    generated = _generated_sources(llama_dir)

    def build(work: Path) -> list[str]:
        for name in COMMON_FILES:
            shutil.copyfile(llama_dir / "common" / name, work / name)
        for name, text in generated.items():
            (work / name).write_text(text)
        shutil.copyfile(HARNESS_SOURCE, work / "harness.cpp")
        sources = [str(work / name) for name in (*COMPILED, "common-strings.cpp", "harness.cpp")]
        return [f"-I{work}", f"-I{llama_dir / 'vendor'}", *sources]

    out_dir = reference.cache_dir() / "schema-oracle" / _key(llama_dir, generated)
    return compile_cached(out_dir, build, FLAGS, "the schema oracle")


def compile_cached(
    out_dir: Path, prepare: Callable[[Path], list[str]], flags: Sequence[str], what: str
) -> Path:
    """`out_dir`/harness, compiled unless it is there: `prepare(work)` writes the sources into a fresh
    folder beside it and gives the compiler's arguments (includes and sources); the binary is moved into
    place at once, so a concurrent build finds a whole binary or none.

    Raises:
        HarnessBuildError: the compile failed.
    """
    binary = out_dir / "harness"
    if binary.exists():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        work = Path(tmp)
        command = [COMPILER, *flags, *prepare(work), "-o", str(work / "harness")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise HarnessBuildError(f"compiling {what} failed:\n{done.stderr[-4000:]}")
        os.replace(work / "harness", binary)
    return binary


@dataclass(frozen=True, slots=True)
class OracleAnswer:
    """What llama.cpp made of one input."""

    code: int  # 0 grammar, 2 refused, 3 not JSON, 4 other exception; negative: killed by that signal
    out: bytes  # the grammar, or the exception's message
    err: bytes  # llama.cpp's stderr (its "WARNING: JSON schema conversion was incomplete: ..." line)

    @property
    def crashed(self) -> bool:
        return self.code < 0 or self.code not in (0, 2, 3, 4)

    @property
    def warnings(self) -> str:
        """The text after llama.cpp's warning prefix, "" when it printed none."""
        prefix = b"WARNING: JSON schema conversion was incomplete: "
        for line in self.err.split(b"\n"):
            if line.startswith(prefix):
                return line[len(prefix) :].decode("utf-8", "replace")
        return ""


def run_harness(binary: Path, data: bytes, *, mode: str = "convert") -> OracleAnswer:
    """Run llama.cpp on one input (a schema for "convert", any JSON for "dump")."""
    try:
        done = subprocess.run([str(binary), mode], input=data, capture_output=True, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as exc:
        return OracleAnswer(code=-9, out=b"", err=b"timed out: " + (exc.stderr or b""))
    return OracleAnswer(code=done.returncode, out=done.stdout, err=done.stderr)


if __name__ == "__main__":
    print(harness_binary())
    sys.exit(0)
