"""Resources of the engine's oracle tests: vocabularies loaded by llama.cpp and by constraintd, once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from constraintd.engine import Vocab

if TYPE_CHECKING:  # llama.cpp is imported only by the oracle tests that use these
    from tests.oracle import LlamaVocab

OpenVocab = Callable[[str], "tuple[LlamaVocab, Vocab]"]


@pytest.fixture(scope="session")
def oracle_vocab() -> Iterator[OpenVocab]:
    """`oracle_vocab(name)`: (llama.cpp's, constraintd's) vocabulary `name` ("qwen2", ..., "gemma")."""
    from tests.lockstep import open_vocab

    opened: dict[str, tuple[LlamaVocab, Vocab]] = {}

    def get(name: str) -> tuple[LlamaVocab, Vocab]:
        if name not in opened:
            opened[name] = open_vocab(name)
        return opened[name]

    yield get
    for llama_vocab, _ in opened.values():
        llama_vocab.close()
