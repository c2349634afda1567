"""sampler_worker.generate: the loop's protocol, with a scripted model and session.

(Token-for-token agreement with llama.cpp's chain and grammar sampler on Gemma 3 270M is in
test_generation_oracle.py.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import GenerationError, Step, generate

PIECES = [b"<eos>", b"a", b"b", b"\xc3", b"\xa9", b"STOP", b" ", b"<ctl>"]
EOS = 0
GREEDY = SamplerSettings(seed=1, temperature=0.0)


class ScriptedModel:
    """Logits that make token script[i] the most likely at step i (then EOS)."""

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)
        self.n_vocab = len(PIECES)
        self.suppress_tokens: tuple[int, ...] = ()
        self.evaluated: list[int] = []
        self.step = 0

    def reset(self) -> None:
        self.evaluated = []
        self.step = 0

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        self.evaluated.extend(tokens)
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        wanted = self.script[self.step] if self.step < len(self.script) else EOS
        logits[wanted] = 10.0
        logits[(wanted + 1) % self.n_vocab] = 5.0  # the runner-up, drawn when the grammar refuses
        self.step += 1
        return logits

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def piece(self, token: int, *, special: bool = True) -> bytes:
        if token == 7 and not special:
            return b""
        return PIECES[token]


class ScriptedSession:
    """Refuses the tokens in `refused` (answering with a mask of everything else), accepts the rest."""

    def __init__(self, refused: set[int], *, mask_allows: set[int] | None = None) -> None:
        self.refused = refused
        self.mask_allows = mask_allows
        self.accepted: list[int] = []

    def _mask(self) -> npt.NDArray[np.int32]:
        allowed = [t not in self.refused for t in range(len(PIECES))]
        if self.mask_allows is not None:
            allowed = [t in self.mask_allows for t in range(len(PIECES))]
        bits = np.zeros(32, dtype=np.uint8)
        bits[: len(allowed)] = allowed
        return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)

    def accept_or_mask(self, token: int) -> npt.NDArray[np.int32] | None:
        if token in self.refused:
            return self._mask()
        self.accepted.append(token)
        return None

    def accept(self, token: int) -> bool:
        if token in self.refused:
            return False
        self.accepted.append(token)
        return True


def test_stops_at_end_of_generation_without_its_text() -> None:
    model = ScriptedModel([1, 2, 1])
    result = generate(model, [1], GREEDY, max_tokens=10)
    assert result.tokens == (1, 2, 1, EOS)
    assert result.text == "aba"
    assert result.stop_reason == "eog"
    # the prompt, then every generated token but the last
    assert model.evaluated == [1, 1, 2, 1]


def test_stops_after_max_tokens_without_evaluating_the_last() -> None:
    model = ScriptedModel([1, 1, 1, 1])
    result = generate(model, [2], GREEDY, max_tokens=3)
    assert result.tokens == (1, 1, 1)
    assert result.stop_reason == "max_tokens"
    assert model.evaluated == [2, 1, 1]


def test_refused_draw_is_redrawn_on_the_mask() -> None:
    session = ScriptedSession(refused={2})
    result = generate(ScriptedModel([1, 2, 1]), [1], GREEDY, session=session, max_tokens=10)
    # step 1 wanted 2, which the grammar refuses; its runner-up 3 is drawn from the masked logits
    assert result.tokens == (1, 3, 1, EOS)
    assert result.rejected_at == (1,)
    assert session.accepted == [1, 3, 1, EOS]
    assert (result.counters.draws, result.counters.rejections, result.counters.masks) == (5, 1, 1)
    assert 0.0 < result.counters.prompt_seconds <= result.counters.model_seconds


def test_mask_allowing_nothing_is_an_error() -> None:
    session = ScriptedSession(refused={1}, mask_allows=set())
    with pytest.raises(GenerationError, match="allows no token"):
        generate(ScriptedModel([1]), [1], GREEDY, session=session)


def test_grammar_refusing_its_own_mask_is_an_error() -> None:
    session = ScriptedSession(refused={1, 2}, mask_allows={2})
    with pytest.raises(GenerationError, match="refused token 2"):
        generate(ScriptedModel([1]), [1], GREEDY, session=session)


def test_a_character_split_over_tokens_streams_once_whole() -> None:
    steps: list[Step] = []
    result = generate(ScriptedModel([1, 3, 4, 1]), [1], GREEDY, on_step=steps.append)
    assert [step.text for step in steps] == ["a", "", "é", "a", ""]
    assert result.text == "aéa"


def test_stop_string_cuts_the_text_and_is_held_back_while_partial() -> None:
    steps: list[Step] = []
    result = generate(ScriptedModel([1, 6, 5, 1]), [1], GREEDY, stop=[" STOP"], on_step=steps.append)
    assert result.stop_reason == "stop"
    assert result.tokens == (1, 6, 5)
    assert result.text == "a"
    assert [step.text for step in steps] == ["a", "", ""]


def test_held_back_text_that_is_no_stop_comes_out() -> None:
    steps: list[Step] = []
    result = generate(ScriptedModel([1, 6, 2]), [1], GREEDY, stop=[" STOP"], on_step=steps.append)
    assert result.text == "a b"
    assert "".join(step.text for step in steps) == "a b"


def test_special_tokens_add_no_text() -> None:
    result = generate(ScriptedModel([1, 7, 2]), [1], GREEDY)
    assert result.text == "ab"
    assert 7 in result.tokens


def test_prompt_feeds_the_penalties() -> None:
    # with a strong presence penalty on the prompt's token, greedy picks the runner-up instead
    settings = SamplerSettings(seed=1, temperature=0.0, presence_penalty=100.0, top_k=0, top_p=1.0, min_p=0.0)
    result = generate(ScriptedModel([1]), [1], settings, max_tokens=1)
    assert result.tokens == (2,)


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt"):
        generate(ScriptedModel([1]), [], GREEDY)


def test_seed_is_reported() -> None:
    assert generate(ScriptedModel([1]), [1], SamplerSettings(seed=77), max_tokens=1).seed == 77


def test_suppressed_tokens_are_never_drawn() -> None:
    model = ScriptedModel([1, 2])
    model.suppress_tokens = (2,)
    result = generate(model, [1], GREEDY, max_tokens=2)
    assert result.tokens == (1, 3)  # 2 is banned: its runner-up 3 comes instead
