"""llama.cpp's grammar sampler and a constraintd Matcher fed the same tokens, compared at every step.

Only oracle tests import this. The rules that keep the test process alive (tests/oracle.py) hold here:
llama.cpp only ever accepts a token its own mask allows, and never one whose acceptance would leave it
no stack (it throws across the C boundary and aborts): constraintd's `accept` refuses exactly those
(grammar/stacks.py and grammar/stack_sets.py hold it to llama.cpp's accept semantics), so a token our
accept refuses is never given to llama.cpp.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from constraintd.engine import Matcher, Vocab, unpack_mask
from tests import reference
from tests.oracle import LlamaGrammar, LlamaVocab

SAMPLES = Path(__file__).parent / "vectors" / "grammar-samples" / "samples.json"


@dataclass(frozen=True)
class SampleGrammar:
    name: str
    text: str
    samples: tuple[str, ...]
    trigger_patterns: tuple[str, ...] = ()
    trigger_texts: tuple[str, ...] = ()


def sample_grammars() -> list[SampleGrammar]:
    """llama.cpp's grammars (read from its tree) and ours, each with texts it accepts (samples.json)."""
    data = json.loads(SAMPLES.read_text())
    grammars_dir = reference.llama_cpp_dir() / "grammars"
    found = [
        SampleGrammar(name.removesuffix(".gbnf"), (grammars_dir / name).read_text(), tuple(texts))
        for name, texts in data["reference"].items()
    ]
    for case in data["custom"]:
        triggers = case.get("triggers", {})
        found.append(
            SampleGrammar(
                case["name"],
                case["grammar"],
                tuple(case["samples"]),
                tuple(triggers.get("patterns", ())),
                tuple(triggers.get("texts", ())),
            )
        )
    return found


@dataclass
class Tally:
    masks: int = 0
    identical_masks: int = 0
    verdicts: int = 0
    identical_verdicts: int = 0
    unacceptable: int = 0  # tokens llama.cpp's mask allows and its accept would throw on
    triggered: int = 0  # lazy grammars that saw their trigger
    accepted: int = 0  # tokens both accepted
    differences: list[str] = field(default_factory=list)


class Lockstep:
    """One llama.cpp grammar sampler and one Matcher, advanced together."""

    def __init__(self, llama: LlamaGrammar, matcher: Matcher, tally: Tally, rng: np.random.Generator) -> None:
        self.llama = llama
        self.matcher = matcher
        self.tally = tally
        self.rng = rng

    def compare(self, *, verdicts: int = 32) -> npt.NDArray[np.bool_]:
        """Compare the masks (and `allows` on a few tokens); returns llama.cpp's mask."""
        expected = self.llama.allowed()
        ours = unpack_mask(self.matcher.mask(), expected.size)
        self.tally.masks += 1
        if np.array_equal(expected, ours):
            self.tally.identical_masks += 1
        else:
            diff = np.flatnonzero(expected != ours)
            self.tally.differences.append(
                f"step {len(self.matcher.history)}: {diff.size} tokens differ, first "
                f"{[(int(t), bool(expected[t])) for t in diff[:5]]}"
            )
        for token in self.rng.integers(0, expected.size, size=verdicts).tolist():
            self.tally.verdicts += 1
            self.tally.identical_verdicts += self.matcher.allows(token) == expected[token]
        return expected

    def advance(self, token: int, allowed: npt.NDArray[np.bool_]) -> bool:
        """Accept `token` on both sides if llama.cpp can; False (nothing accepted) if it cannot."""
        if not allowed[token]:
            return False
        if not self.matcher.fork().accept(token):
            self.tally.unacceptable += 1
            return False
        self.llama.accept(token)
        waited = self.matcher.awaiting_trigger
        assert self.matcher.accept(token)
        self.tally.accepted += 1
        self.tally.triggered += waited and not self.matcher.awaiting_trigger
        return True

    def follow(self, tokens: Iterable[int], max_steps: int) -> None:
        """Compare, then accept the next token, until the tokens or steps run out or llama.cpp refuses."""
        iterator: Iterator[int] = iter(tokens)
        for _ in range(max_steps):
            allowed = self.compare()
            token = next(iterator, None)
            if token is None or not self.advance(token, allowed):
                return
        self.compare()

    def walk(self, max_steps: int) -> None:
        """Compare, then accept a random token llama.cpp allows, for up to `max_steps` tokens."""
        for _ in range(max_steps):
            allowed = self.compare()
            candidates = np.flatnonzero(allowed)
            for token in self.rng.permutation(candidates)[:8].tolist():
                if self.advance(token, allowed):
                    break
            else:
                return
        self.compare()


def byte_tokens(vocab: Vocab) -> dict[int, int] | None:
    """The token whose piece is exactly each byte, or None when the vocabulary lacks some byte."""
    found: dict[int, int] = {}
    for token, piece in enumerate(vocab.pieces):
        if len(piece) == 1 and token not in vocab.eog_ids:
            found.setdefault(piece[0], token)
    return found if len(found.keys() - {0}) == 255 else None


def open_vocab(name: str) -> tuple[LlamaVocab, Vocab]:
    path = reference.require(reference.gemma_path() if name == "gemma" else reference.vocab_path(name))
    return LlamaVocab(path), Vocab.from_gguf(path)
