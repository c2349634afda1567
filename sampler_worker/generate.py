# The generation loop: llama-server's sampling step with the grammar held by constraintd.
#
# One step, as llama-server's `common_sampler_sample(grammar_first = false)` + `common_sampler_accept`:
#   1. draw t with the whole chain on the model's logits;
#   2. ask the session to accept t (one round trip); if it does, t is the token;
#   3. if not, the session answers with the mask of allowed tokens; every other token gets -inf and
#      the whole chain runs again with the same generator: t' must be accepted (else the grammar
#      contradicts its own mask: an error, never a silent skip);
#   4. the chain accepts the token (penalties remember it), then the model evaluates it.
# The chain is llama-server's for the settings, with the vocabulary's suppress tokens banned (as
# `common_sampler_init` adds them to the logit biases). Before the first step it accepts every
# prompt token (llama-server feeds the prompt to the sampler, so repetition penalties see it); the
# grammar does not see the prompt.
#
# Generation ends at an end-of-generation token (not part of the text), after `max_tokens` tokens, or
# when the text contains a stop string (the text is cut before it). Text is the tokens' pieces without
# special tokens (llama-server's default), decoded as UTF-8; a character split over tokens is streamed
# once complete, and a possible start of a stop string is held back until it is known not to be one.
#
# Invariant: `Generation.tokens` is exactly what llama-server would generate for the same prompt
# tokens, settings and grammar (the oracle tests compare token ids and rejection points).

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from constraintd.engine.masks.bitmask import unpack_mask
from sampler_worker.chain import SamplerChain, SamplerSettings

__all__ = ["Counters", "Generation", "GenerationError", "Step", "generate"]

Mask = npt.NDArray[np.int32]


class ConstraintSession(Protocol):
    """What the loop needs of a constraintd session (`clients.Session` has it)."""

    def accept_or_mask(self, token: int) -> Mask | None: ...

    def accept(self, token: int) -> bool: ...


class LogitModel(Protocol):
    """What the loop needs of a model (`sampler_worker.model.Model` has it)."""

    n_vocab: int
    suppress_tokens: tuple[int, ...]

    def reset(self) -> None: ...

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]: ...

    def is_eog(self, token: int) -> bool: ...

    def piece(self, token: int, *, special: bool = True) -> bytes: ...


class GenerationError(Exception):
    """The grammar and the sampler cannot agree (a mask that allows nothing, or its own token refused)."""


@dataclass(slots=True)
class Counters:
    """What a generation cost.

    Attributes:
        draws: runs of the sampler chain (first draws and masked redraws).
        rejections: first draws the grammar refused.
        masks: masks fetched (one per rejection).
        model_seconds: time in the model (prompt and tokens).
        prompt_seconds: the part of `model_seconds` spent on the prompt (llama-server's `prompt_ms`; the
            rest of the generation is its `predicted_ms`).
        sampler_seconds: time in the sampler chain.
        constraint_seconds: time in calls to the constraint session.
    """

    draws: int = 0
    rejections: int = 0
    masks: int = 0
    model_seconds: float = 0.0
    prompt_seconds: float = 0.0
    sampler_seconds: float = 0.0
    constraint_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token, as it is streamed.

    Attributes:
        index: position in the generation (0 first).
        token: the token id; None for the last event of a generation that had text held back (a
            possible start of a stop string that turned out not to be one).
        rejected: whether the first draw was refused and this token is the masked redraw.
        text: the text this step makes final (possibly empty: an incomplete character, a possible
            start of a stop string, a special token).
    """

    index: int
    token: int | None
    rejected: bool
    text: str


@dataclass(frozen=True, slots=True)
class Generation:
    """A finished generation.

    Attributes:
        tokens: generated token ids (an end-of-generation token included, when it ended the text).
        text: the text (without special tokens, cut before a stop string).
        stop_reason: "eog", "max_tokens" or "stop".
        rejected_at: indices of the steps whose first draw the grammar refused.
        seed: the seed the sampler used.
        prompt_tokens: how many tokens the prompt had.
        counters: what it cost.
    """

    tokens: tuple[int, ...]
    text: str
    stop_reason: str
    rejected_at: tuple[int, ...]
    seed: int | None
    prompt_tokens: int
    counters: Counters = field(default_factory=Counters)


class _TextStream:
    # Bytes in, text out: only whole UTF-8 characters, and nothing that might begin a stop string.
    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = [s for s in stop if s]
        self.data = b""
        self.sent = 0  # characters of the decoded text already streamed
        self.found: int | None = None  # where a stop string starts, once one has appeared

    def push(self, piece: bytes) -> str:
        self.data += piece
        text = self.data.decode("utf-8", errors="ignore") if self._complete() else self._complete_prefix()
        for stop in self.stop:
            at = text.find(stop)
            if at >= 0 and (self.found is None or at < self.found):
                self.found = at
        end = self.found if self.found is not None else len(text) - self._held_back(text)
        delta = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return delta

    def _complete(self) -> bool:
        try:
            self.data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    def _complete_prefix(self) -> str:
        for cut in range(1, 4):
            try:
                return self.data[:-cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
        return self.data.decode("utf-8", errors="replace")

    def _held_back(self, text: str) -> int:
        # the longest end of the text that is the beginning of a stop string
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def finish(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        end = self.found if self.found is not None else len(text)
        delta = text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return delta

    def text(self) -> str:
        text = self.data.decode("utf-8", errors="replace")
        return text[: self.found] if self.found is not None else text


def _with_suppressed_tokens(settings: SamplerSettings | None, suppressed: Sequence[int]) -> SamplerSettings:
    # common_sampler_init appends the vocabulary's suppress tokens to the user's logit biases (-inf).
    settings = settings or SamplerSettings()
    if not suppressed:
        return settings
    bans = tuple((token, float("-inf")) for token in suppressed)
    return replace(settings, logit_bias=settings.logit_bias + bans)


def generate(
    model: LogitModel,
    prompt: Sequence[int],
    settings: SamplerSettings | None = None,
    *,
    session: ConstraintSession | None = None,
    max_tokens: int = 256,
    stop: Sequence[str] = (),
    on_step: Callable[[Step], None] | None = None,
) -> Generation:
    """Generate from `prompt` with llama-server's sampler chain, constrained by `session` if given.

    Args:
        model: the model (its context is reset first).
        prompt: prompt token ids (see sampler_worker.prompt).
        settings: sampling parameters (llama-server's defaults when None).
        session: a constraintd session; None generates unconstrained.
        max_tokens: the most tokens to generate.
        stop: strings that end the generation (the text is cut before them).
        on_step: called after each token with what it adds to the text (streaming).

    Returns:
        The generation.

    Raises:
        GenerationError: a mask that allows no token, or a masked redraw the grammar refuses.
        ValueError: the sampler settings are refused (see SamplerSettings.check), or no prompt.
    """
    if not prompt:
        raise ValueError("the prompt has no tokens")
    chain = SamplerChain.from_settings(_with_suppressed_tokens(settings, model.suppress_tokens))
    counters = Counters()
    stream = _TextStream(stop)
    tokens: list[int] = []
    rejected_at: list[int] = []
    clock = time.perf_counter

    started = clock()
    model.reset()
    logits = model.decode(prompt)
    counters.model_seconds = counters.prompt_seconds = clock() - started
    for token in prompt:
        chain.accept(token)

    stop_reason = "max_tokens"
    for index in range(max_tokens):
        started = clock()
        token = chain.sample(logits)
        counters.sampler_seconds += clock() - started
        counters.draws += 1
        rejected = False
        if session is not None:
            started = clock()
            mask = session.accept_or_mask(token)
            counters.constraint_seconds += clock() - started
            if mask is not None:
                rejected = True
                rejected_at.append(index)
                counters.rejections += 1
                counters.masks += 1
                allowed = unpack_mask(mask, model.n_vocab)
                if not allowed.any():
                    raise GenerationError(f"step {index}: the grammar allows no token")
                started = clock()
                token = chain.sample(logits, allowed=allowed)
                counters.sampler_seconds += clock() - started
                counters.draws += 1
                started = clock()
                taken = session.accept(token)
                counters.constraint_seconds += clock() - started
                if not taken:
                    raise GenerationError(
                        f"step {index}: the grammar refused token {token}, which its own mask allowed"
                    )
        chain.accept(token)
        tokens.append(token)
        if model.is_eog(token):
            stop_reason = "eog"
            if on_step is not None:
                on_step(Step(index, token, rejected, ""))
            break
        delta = stream.push(model.piece(token, special=False))
        if on_step is not None:
            on_step(Step(index, token, rejected, delta))
        if stream.found is not None:
            stop_reason = "stop"
            break
        if index + 1 < max_tokens:
            started = clock()
            logits = model.decode([token])
            counters.model_seconds += clock() - started
    tail = stream.finish()
    if tail and on_step is not None:
        on_step(Step(len(tokens), None, False, tail))
    return Generation(
        tokens=tuple(tokens),
        text=stream.text(),
        stop_reason=stop_reason,
        rejected_at=tuple(rejected_at),
        seed=chain.seed,
        prompt_tokens=len(prompt),
        counters=counters,
    )
