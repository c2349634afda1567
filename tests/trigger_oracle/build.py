"""Build and run the trigger-pattern oracle: llama.cpp's `llama_grammar_trigger_pattern::find`.

The struct and its `find` are taken out of the reference's `src/llama-grammar.h` and `src/llama-grammar.cpp`
at build time (nothing else of llama.cpp is needed: `find` is std::regex_match of a `^...$` pattern against
the whole text, then std::regex_search, and the start of the first capture that matched something) and
compiled with harness.cpp, which feeds it patterns and texts. The binary is cached under the reference
cache, keyed by everything that goes into it, as the schema oracle's is.

    python -m tests.trigger_oracle.build      # build (or find) the harness and print its path
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests import reference
from tests.schema_oracle.build import (
    HarnessBuildError,
    compile_cached,
    compiler_version,
    content_key,
    extract_function,
)

HARNESS_SOURCE = Path(__file__).with_name("harness.cpp")
FLAGS = ("-std=c++17", "-O1", "-g0", "-w")
TIMEOUT_SECONDS = 60.0


def _generated_sources(llama_dir: Path) -> dict[str, str]:
    header = (llama_dir / "src" / "llama-grammar.h").read_text()
    found = re.search(r"^struct llama_grammar_trigger_pattern \{.*?^\};", header, re.MULTILINE | re.DOTALL)
    if found is None:
        raise HarnessBuildError("llama-grammar.h has no struct llama_grammar_trigger_pattern")
    source = (llama_dir / "src" / "llama-grammar.cpp").read_text()
    return {
        "trigger-pattern.inc": found.group(0) + "\n",
        "trigger-find.inc": extract_function(source, "llama_grammar_trigger_pattern::find") + "\n",
    }


def harness_binary(llama_dir: Path | None = None) -> Path:
    """The compiled harness, built on first use and cached by content.

    Raises:
        HarnessBuildError: no compiler, the reference changed shape, or the compile failed.
    """
    llama_dir = reference.require(llama_dir or reference.llama_cpp_dir())
    generated = _generated_sources(llama_dir)
    parts = [("harness.cpp", HARNESS_SOURCE.read_bytes()), ("build.py", Path(__file__).read_bytes())]
    parts += [(name, text.encode()) for name, text in sorted(generated.items())]
    parts += [("compiler", compiler_version().encode()), ("flags", " ".join(FLAGS).encode())]
    out_dir = reference.cache_dir() / "trigger-oracle" / content_key(parts)

    def build(work: Path) -> list[str]:
        for name, text in generated.items():
            (work / name).write_text(text)
        return [f"-I{work}", str(HARNESS_SOURCE)]

    return compile_cached(out_dir, build, FLAGS, "the trigger oracle")


def llama_find(binary: Path, cases: Sequence[tuple[bytes, Sequence[bytes]]]) -> list[list[int] | str]:
    """llama.cpp's answer for each (pattern, texts): the start per text (-1 for none, -2 where std::regex
    threw while matching), or "refused" where std::regex will not build the pattern."""
    data = bytearray()
    for pattern, texts in cases:
        data += struct.pack("<I", len(pattern)) + pattern + struct.pack("<I", len(texts))
        for text in texts:
            data += struct.pack("<I", len(text)) + text
    done = subprocess.run([str(binary)], input=bytes(data), capture_output=True, timeout=TIMEOUT_SECONDS)
    if done.returncode != 0:
        raise RuntimeError(f"the trigger oracle failed ({done.returncode}): {done.stderr[-2000:]!r}")
    lines = iter(done.stdout.decode().splitlines())
    answers: list[list[int] | str] = []
    for _, texts in cases:
        first = next(lines)
        if first.startswith("refused"):
            answers.append("refused")
            continue
        starts = [first, *(next(lines) for _ in texts[1:])]
        answers.append([-2 if line.startswith("error") else int(line) for line in starts])
    return answers


if __name__ == "__main__":
    print(harness_binary())
    sys.exit(0)
