"""sampler_worker.generate: the loop's protocol, with a scripted model and session.

(Token-for-token agreement with llama.cpp's chain and grammar sampler on Gemma 3 270M is in
test_generation_oracle.py.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from constraintd.engine.masks.bitmask import allowed_tokens, pack_mask
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import PROBE_STEPS, GenerationError, Overlap, Step, StepMask, generate

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

    def accept_and_mask(self, token: int) -> tuple[bool, npt.NDArray[np.int32]]:
        return self.accept(token), self._mask()

    def mask(self) -> npt.NDArray[np.int32]:
        return self._mask()


class SlowSession(ScriptedSession):
    """Accepts everything; its calls take `plain` seconds, or `with_mask` when they answer a mask."""

    def __init__(self, *, plain: float, with_mask: float) -> None:
        super().__init__(refused=set())
        self.plain = plain
        self.with_mask = with_mask

    def accept_or_mask(self, token: int) -> npt.NDArray[np.int32] | None:
        time.sleep(self.plain)
        return super().accept_or_mask(token)

    def accept(self, token: int) -> bool:
        time.sleep(self.plain)
        return super().accept(token)

    def accept_and_mask(self, token: int) -> tuple[bool, npt.NDArray[np.int32]]:
        time.sleep(self.with_mask)
        return super().accept(token), self._mask()

    def mask(self) -> npt.NDArray[np.int32]:
        time.sleep(self.with_mask)
        return self._mask()


class SlowModel(ScriptedModel):
    """A ScriptedModel whose every decode takes `seconds` without the CPU (as a GPU-bound forward pass)."""

    def __init__(self, script: Sequence[int], seconds: float) -> None:
        super().__init__(script)
        self.seconds = seconds

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        time.sleep(self.seconds)
        return super().decode(tokens)


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


MODES: tuple[Overlap, ...] = ("off", "ahead", "auto")


def test_a_step_mask_finds_the_ids_of_few_allowed_tokens_when_it_is_made() -> None:
    n = 100_000
    few, many = np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
    few[[3, 4_000, 99_999]] = True
    many[[5, 6]] = False
    for allowed, found in ((few, True), (many, False)):
        words = pack_mask(allowed)
        mask = StepMask.of(words, n)
        assert (mask.few is not None) is found
        assert mask.allowed(n).tolist() == np.flatnonzero(allowed).tolist()
        assert StepMask(words, None).allowed(n).tolist() == allowed_tokens(words, n).tolist()


@pytest.mark.parametrize("overlap", MODES)
def test_refused_draw_is_redrawn_on_the_mask(overlap: Overlap) -> None:
    session = ScriptedSession(refused={2})
    result = generate(ScriptedModel([1, 2, 1]), [1], GREEDY, session=session, max_tokens=10, overlap=overlap)
    # step 1 wanted 2, which the grammar refuses; its runner-up 3 is drawn from the masked logits
    assert result.tokens == (1, 3, 1, EOS)
    assert result.rejected_at == (1,)
    assert session.accepted == [1, 3, 1, EOS]
    # without overlap a mask is fetched per refusal; ahead (auto's first PROBE_STEPS), one per step
    ahead = overlap != "off"
    masks = 4 if ahead else 1
    assert (result.counters.draws, result.counters.rejections, result.counters.masks) == (5, 1, masks)
    assert result.counters.ahead_steps == (4 if ahead else 0)
    assert result.overlap == ("ahead" if ahead else "off")
    assert 0.0 < result.counters.prompt_seconds <= result.counters.model_seconds


@pytest.mark.parametrize("overlap", MODES)
def test_mask_allowing_nothing_is_an_error(overlap: Overlap) -> None:
    session = ScriptedSession(refused={1}, mask_allows=set())
    with pytest.raises(GenerationError, match="allows no token"):
        generate(ScriptedModel([1]), [1], GREEDY, session=session, overlap=overlap)


@pytest.mark.parametrize("overlap", MODES)
def test_grammar_refusing_its_own_mask_is_an_error(overlap: Overlap) -> None:
    session = ScriptedSession(refused={1, 2}, mask_allows={2})
    with pytest.raises(GenerationError, match="refused token 2"):
        generate(ScriptedModel([1]), [1], GREEDY, session=session, overlap=overlap)


def test_ahead_the_constraint_waits_only_when_its_reply_is_later_than_the_forward_pass() -> None:
    script = [1, 2] * 6
    hidden = generate(
        SlowModel(script, 0.02), [1], GREEDY, session=SlowSession(plain=0.0, with_mask=0.002), overlap="ahead"
    )
    assert hidden.tokens == (*script, EOS) and hidden.counters.ahead_steps == len(script) + 1
    # only the last token's accept (no forward pass after it) may be waited for
    assert hidden.counters.waits <= 1
    exposed = generate(
        SlowModel(script, 0.0), [1], GREEDY, session=SlowSession(plain=0.0, with_mask=0.01), overlap="ahead"
    )
    assert exposed.tokens == hidden.tokens and exposed.counters.waits >= len(script)
    assert exposed.counters.constraint_seconds >= 0.005 * len(script)


def test_auto_stays_ahead_where_the_forward_pass_hides_constraintd() -> None:
    script = [1, 2] * (PROBE_STEPS + 4)
    # a long forward pass hides a slow mask: ahead from the first step to the last, no probe without it
    session = SlowSession(plain=0.005, with_mask=0.005)
    gpu_like = generate(SlowModel(script, 0.01), [1], GREEDY, session=session, overlap="auto")
    assert gpu_like.overlap == "ahead" and gpu_like.counters.ahead_steps == len(script) + 1
    assert gpu_like.tokens == (*script, EOS)


def test_auto_probes_without_overlap_where_ahead_waited_and_keeps_the_faster() -> None:
    script = [1, 2] * (PROBE_STEPS + 4)
    # masks far slower than plain accepts, and a forward pass too short to hide them: off wins
    cpu_like = generate(
        SlowModel(script, 0.001), [1], GREEDY, session=SlowSession(plain=0.0, with_mask=0.02), overlap="auto"
    )
    assert cpu_like.overlap == "off" and cpu_like.counters.ahead_steps == PROBE_STEPS
    # ahead waits on every step, but a step without overlap waits as long and evaluates besides: ahead
    # again after the probe
    slow_calls = generate(
        SlowModel(script, 0.003), [1], GREEDY, session=SlowSession(plain=0.01, with_mask=0.01), overlap="auto"
    )
    assert slow_calls.overlap == "ahead"
    assert slow_calls.counters.ahead_steps == len(script) + 1 - PROBE_STEPS
    assert cpu_like.tokens == slow_calls.tokens == (*script, EOS)


def test_an_unknown_overlap_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="overlap must be one of"):
        generate(ScriptedModel([1]), [1], GREEDY, overlap="sideways")  # type: ignore[arg-type]


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


class BatchedModel(ScriptedModel):
    """A ScriptedModel that evaluates at most `n_batch` tokens a call, as `Model.decode` splits a prompt."""

    n_batch = 4

    def __init__(self, script: Sequence[int]) -> None:
        super().__init__(script)
        self.calls: list[list[int]] = []

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        assert len(tokens) <= self.n_batch
        self.calls.append(list(tokens))
        return super().decode(tokens)


class Cancelled(Exception):
    pass


def test_check_runs_before_each_chunk_of_the_prompt_and_ends_the_generation() -> None:
    model = BatchedModel([1])
    prompt = list(range(1, 7)) * 2  # 12 tokens: three chunks of 4
    checks = 0

    def check() -> None:
        nonlocal checks
        checks += 1
        if checks == 2:
            raise Cancelled

    with pytest.raises(Cancelled):
        generate(model, prompt, GREEDY, max_tokens=5, check=check)
    assert model.calls == [prompt[:4]]  # cancelled during its prompt: the rest is never evaluated


def test_check_runs_before_each_token_evaluated() -> None:
    model = BatchedModel([1, 2, 1, 2, 1])
    calls = 0

    def check() -> None:
        nonlocal calls
        calls += 1

    result = generate(model, [1, 2, 3, 4, 5], GREEDY, max_tokens=3, check=check)
    assert len(result.tokens) == 3
    assert model.calls[:2] == [[1, 2, 3, 4], [5]]
    assert calls == len(model.calls) == 4  # two chunks of the prompt, then the first two tokens
