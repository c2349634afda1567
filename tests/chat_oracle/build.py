"""Build and run the chat oracle: llama.cpp's chat layer (`common_chat_templates_apply`, `common_chat_parse`).

The chat layer is most of llama.cpp's `common/` library (chat.cpp, the PEG parsers, the auto-parser, its own
Jinja engine in common/jinja) and reaches into libllama, so unlike the schema oracle it is not compiled file
by file: the pinned source distribution's CMake project builds the static `llama-common` target (with libllama
and ggml in the same tree), with the portable CPU flags of tests/llama_wheel.sh and everything else off
(tests, examples, tools, server, OpenSSL, subprocesses, llguidance). About ten minutes on two cores.

Two caches under the reference cache, both filled atomically (built in a temporary folder beside their place,
then renamed into it; a lock file makes a concurrent build wait for the first instead of building twice):
- `llama-common/<key>`: the static libraries and the headers, keyed by a hash of the CMake flags, the
  compiler's version and the source distribution's archive. CMake's output goes to `<key>.log` beside it.
- `chat-oracle/<key>`: harness.cpp compiled and linked against them, keyed by the library's key, the harness
  and this file (seconds).

    python -m tests.chat_oracle.build      # build (or find) the harness and print its path
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests import reference
from tests.schema_oracle.build import COMPILER, HarnessBuildError, compiler_version, content_key

HARNESS_SOURCE = Path(__file__).with_name("harness.cpp")
WHEEL_SCRIPT = Path(__file__).parents[1] / "llama_wheel.sh"
# The parts of the vendored llama.cpp the CMake project needs for libllama and llama-common.
SOURCE_PARTS = ("CMakeLists.txt", "cmake/", "ggml/", "src/", "include/", "common/", "vendor/", "licenses/")
# Everything not needed for the chat layer is off; GGML_OPENMP off so that the harness links without
# libgomp (ggml's threading has no part in templates, grammars or parsing). -O1 rather than Release's -O3:
# the oracle's time goes to templates and parsers, not matrices, and it nearly halves the compile.
OWN_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_MTMD=OFF",
    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_SUBPROCESS=OFF", "-DLLAMA_LLGUIDANCE=OFF",
    "-DGGML_OPENMP=OFF",
)
HARNESS_FLAGS = ("-std=c++17", "-O1", "-g0", "-w")
TIMEOUT_SECONDS = 60.0

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmake_flags() -> tuple[str, ...]:
    """The CPU flags of the portable wheel (read from tests/llama_wheel.sh itself), then this oracle's own."""
    done = subprocess.run(["bash", str(WHEEL_SCRIPT), "--flags"], capture_output=True, text=True, check=True)
    return (*done.stdout.split(), *OWN_FLAGS)


def _cmake(*, progress: Progress = _stderr) -> str:
    """The machine's cmake, else the venv's; where there is neither, the `cmake` package from PyPI is
    installed into the venv, as a new user would."""
    venv_bin = str(Path(sys.executable).parent)
    found = shutil.which("cmake") or shutil.which("cmake", path=venv_bin)
    if found is None:
        progress("[chat oracle] no cmake on this machine: installing the `cmake` package into the venv")
        install = [sys.executable, "-m", "pip", "install", "--quiet", "cmake"]
        done = subprocess.run(install, capture_output=True, text=True)
        found = shutil.which("cmake", path=venv_bin)
        if done.returncode != 0 or found is None:
            raise HarnessBuildError(f"no cmake, and pip could not install it: {done.stderr[-2000:]}")
    return found


def _archive() -> Path:
    archive = reference.cache_dir() / f"{reference.SDIST_NAME}.tar.gz"
    if not archive.exists():
        raise reference.MissingReference(
            f"{archive} is missing (the chat oracle builds from the whole source distribution); "
            f"remove {reference.cache_dir() / reference.SDIST_NAME} and run `{reference.FETCH_COMMAND}`"
        )
    return archive


def library_key() -> str:
    """The cache key of the library: CMake flags, compiler and cmake versions, the sources' archive."""
    archive = hashlib.sha256()
    with _archive().open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            archive.update(block)
    cmake_version = subprocess.run([_cmake(), "--version"], capture_output=True, text=True).stdout
    return content_key([
        ("flags", " ".join(cmake_flags()).encode()), ("compiler", compiler_version().encode()),
        ("cmake", cmake_version.encode()), ("sources", archive.digest()),
    ])


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _copy_headers(source: Path, build: Path, include: Path) -> None:
    for folder, target in (("include", "llama"), ("ggml/include", "ggml"), ("common", "common"),
                           ("vendor", "vendor")):
        for header in (source / folder).rglob("*"):
            if header.suffix in (".h", ".hpp"):
                destination = include / target / header.relative_to(source / folder)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(header, destination)
    del build  # nothing generated is needed by the headers


def library_dir(*, progress: Progress = _stderr) -> Path:
    """The built `llama-common` with libllama and ggml: `lib/*.a` and `include/{llama,ggml,common,vendor}`.

    Raises:
        HarnessBuildError: no cmake or compiler, or the build failed (the log says why).
    """
    root = reference.cache_dir() / "llama-common"
    key = library_key()
    final = root / key
    if (final / "BUILD-INFO").exists():
        return final
    with _locked(root / f"{key}.lock"):
        if (final / "BUILD-INFO").exists():  # built by the process that held the lock before us
            return final
        log = root / f"{key}.log"
        progress(f"[chat oracle] building llama.cpp's llama-common (static, portable flags) into {final}; "
                 f"about ten minutes on two cores, once per machine; CMake's output: {log}")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{key}.") as tmp, log.open("w") as out:
            work = Path(tmp)
            source = reference.extract_llama_cpp(_archive(), work / "src", SOURCE_PARTS)
            build = work / "build"
            niced = ["nice", "-n", "10"] if shutil.which("nice") else []
            jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(min(2, os.cpu_count() or 1)))
            steps = (
                [_cmake(), "-S", str(source), "-B", str(build), *cmake_flags()],
                [*niced, _cmake(), "--build", str(build), "--target", "llama-common", "-j", jobs],
            )
            for step in steps:
                out.write(f"$ {' '.join(step)}\n")
                out.flush()
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT)
                if done.returncode != 0:
                    raise HarnessBuildError(f"building llama-common failed ({done.returncode}); see {log}")
            result = work / "result"
            (result / "lib").mkdir(parents=True)
            for library in sorted(build.rglob("*.a")):
                shutil.copyfile(library, result / "lib" / library.name)
            _copy_headers(source, build, result / "include")
            seconds = time.monotonic() - started
            (result / "BUILD-INFO").write_text(
                f"flags {' '.join(cmake_flags())}\ncompiler {compiler_version().splitlines()[0]}\n"
                f"seconds {seconds:.0f}\n"
            )
            if final.exists():
                shutil.rmtree(final)  # a half result from an older layout: BUILD-INFO is written last
            os.replace(result, final)
        progress(f"[chat oracle] llama-common built in {seconds:.0f} s")
    return final


def harness_binary(*, progress: Progress = _stderr) -> Path:
    """The harness, linked against `library_dir()`, built on first use and cached by content.

    Raises:
        HarnessBuildError: no cmake or compiler, or a build failed.
    """
    library = library_dir(progress=progress)
    key = content_key([
        ("library", library.name.encode()), ("harness.cpp", HARNESS_SOURCE.read_bytes()),
        ("build.py", Path(__file__).read_bytes()), ("flags", " ".join(HARNESS_FLAGS).encode()),
    ])
    out_dir = reference.cache_dir() / "chat-oracle" / key
    binary = out_dir / "harness"
    if binary.exists():
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        include = library / "include"
        includes = [f"-I{include / part}" for part in ("common", "llama", "ggml", "vendor")]
        libraries = sorted(str(path) for path in (library / "lib").glob("*.a"))
        command = [
            COMPILER, *HARNESS_FLAGS, *includes, str(HARNESS_SOURCE), "-o", str(Path(tmp) / "harness"),
            "-Wl,--start-group", *libraries, "-Wl,--end-group", "-lpthread", "-ldl", "-lm",
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise HarnessBuildError(f"compiling the chat oracle failed:\n{done.stderr[-4000:]}")
        os.replace(Path(tmp) / "harness", binary)  # atomic: a concurrent build finds a whole binary or none
    return binary


class OracleCrash(RuntimeError):
    """The harness died (a signal, or an exit code other than its own)."""


def run_harness(binary: Path, request: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's answer to one request: a dict, with "error" where llama.cpp threw.

    Raises:
        OracleCrash: the harness crashed or timed out.
    """
    try:
        done = subprocess.run([str(binary)], input=json.dumps(request).encode(), capture_output=True,
                              timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as exc:
        raise OracleCrash(f"the chat oracle timed out after {TIMEOUT_SECONDS} s") from exc
    if done.returncode != 0:
        raise OracleCrash(f"the chat oracle failed ({done.returncode}): {done.stderr[-2000:]!r}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


if __name__ == "__main__":
    print(harness_binary())
    sys.exit(0)
