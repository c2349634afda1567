"""Resources of the sampler worker's tests: the C++ standard library, built from a small harness."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import types
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

import sampler_worker.prompt

_HARNESS = Path(__file__).with_name("libstdcxx_harness.cpp")


class LibStdCxx:
    """Runs `libstdcxx_harness.cpp` (std::mt19937, uniform_real_distribution, sort, partial_sort)."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def run(self, commands: Iterable[str]) -> list[list[str]]:
        """One line of output (split into words) per command."""
        text = "".join(f"{command}\n" for command in commands)
        result = subprocess.run([str(self.binary)], input=text, capture_output=True, text=True, check=True)
        return [line.split() for line in result.stdout.splitlines()]


@pytest.fixture(scope="session")
def libstdcxx(tmp_path_factory: pytest.TempPathFactory) -> LibStdCxx:
    """The harness compiled with the system C++ compiler (the one that compiled llama.cpp)."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.fail("a C++ compiler is needed (the same one that builds llama-cpp-python)")
    binary = tmp_path_factory.mktemp("libstdcxx") / "harness"
    subprocess.run([compiler, "-std=c++17", "-O2", "-o", str(binary), str(_HARNESS)], check=True)
    return LibStdCxx(binary)


# Real logits: Gemma 3 270M teacher-forced over these prompts, one row per prompt position.
GEMMA_PROMPTS = (
    "The capital of France is Paris. The capital of Italy is",
    'Answer in JSON. {"name": "Ada Lovelace", "born": 1815, "known_for": ["the first',
    "<start_of_turn>user\nWrite a haiku about the sea, then list three fish as a JSON array."
    "<end_of_turn>\n<start_of_turn>model\nWaves fold into foam,\nsalt wind carries gull voices,\n"
    'the tide keeps its time.\n\n["cod", "mackerel", "',
)


@pytest.fixture(scope="session")
def gemma_logits(gemma_path: Path) -> np.ndarray:
    """float32 logits of Gemma 3 270M at every position of `GEMMA_PROMPTS` (rows x 262,144)."""
    import llama_cpp

    from tests.oracle import quiet_logs

    quiet_logs()
    model = llama_cpp.Llama(
        model_path=str(gemma_path), n_ctx=256, logits_all=True, n_threads=2, verbose=False
    )
    rows = []
    for prompt in GEMMA_PROMPTS:
        tokens = model.tokenize(prompt.encode(), add_bos=True, special=True)
        model.reset()
        model.eval(tokens)
        rows.append(np.array(model.scores[: len(tokens)], dtype=np.float32))
    model.close()
    return np.concatenate(rows)


# A day on which the end-to-end tool-call tests' generations make their calls: templates print the date
# (Llama 3.2's "Today Date"), and Gemma 3 270M's answer, so whether it calls a tool within the test's
# tokens, changes with it.
TOOL_DAY = 1796212800.0  # 2026-12-02 12:00 UTC


@contextlib.contextmanager
def fixed_date(now: float = TOOL_DAY) -> Iterator[None]:
    """The worker's tool chats rendered at `now` (sampler_worker.prompt's clock), whatever today is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampler_worker.prompt, "time", types.SimpleNamespace(time=lambda: now))
        yield
