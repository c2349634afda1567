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
# Mask-ahead (`overlap="ahead"`), as an in-process engine overlaps its mask with the forward pass: the
# token t is sent to the session (accept it, and answer the mask of the state after it) while the model
# evaluates t, so the reply travels and the mask is computed during the forward pass; at the next draw the
# first-draw check is a bit test on that mask, local, and a refusal redraws on the same mask at once. The
# tokens are step 2's and 3's: the grammar's single-token check and the mask's bit are the same predicate,
# and the generator is consumed the same way. The session accepts t as in step 2, only later; a refusal of
# a token its own mask allowed is a GenerationError at the next step. `overlap="auto"` runs the first
# PROBE_STEPS steps ahead. Where the forward pass hid the round trip and the mask (the steps waited on
# constraintd for at most AUTO_MARGIN of their time), it stays ahead: without overlap a step could only
# save those waits, and pays a round trip at every refused draw. Otherwise it runs the next PROBE_STEPS
# without overlap and keeps that only if its median step (sampling left out) was shorter by more than
# AUTO_MARGIN: ahead loses where masks cost more than the pass hides (new states on a fast model);
# smaller differences are the machine's noise over 8 steps, which would otherwise decide. A probe of the
# steps without overlap, run first, cost auto 5 points against ahead over a Unix socket on a CPU model
# (8 of 64 steps a round trip on each, and noise choosing off in 4 generations of 12).
#
# A reasoning budget (`budget`, sampler_worker.reasoning_budget), as common_sampler runs one beside the
# grammar: while it forces a token every other logit is -inf, in the first draw and in a redraw alike; with
# a lazy grammar (`grammar_lazy`) the session neither checks nor accepts a token drawn while the budget is
# in a thinking block (from IDLE or DONE it does), and when a block ends so, the session accepts the end
# sequence the budget reports (ahead: in one call, with the mask after it). The budget takes every token.
#
# `check`, if given, is called before each of the model's evaluations: before each chunk of the prompt (the
# n_batch tokens `Model.decode` evaluates in one llama_decode, each chunk then decoded alone, so the logits
# are those of one call) and before each token's. What it raises ends the generation there: a server's
# request cancelled during a long prompt stops before the prompt's next chunk.
#
# Generation ends at an end-of-generation token (not part of the text), after `max_tokens` tokens, or
# when the text contains a stop string (the text is cut before it). Text is the tokens' pieces without
# special tokens (llama-server's default), decoded as UTF-8; a character split over tokens is streamed
# once complete, and a possible start of a stop string is held back until it is known not to be one.
#
# Invariant: `Generation.tokens` is exactly what llama-server would generate for the same prompt
# tokens, settings and grammar (the oracle tests compare token ids and rejection points).

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from constraintd.engine.masks.bitmask import allowed_tokens, few_allowed_tokens, mask_allows
from sampler_worker.call_thread import CallThread, PendingCall
from sampler_worker.chain import SamplerChain, SamplerSettings
from sampler_worker.reasoning_budget import BudgetState, ReasoningBudget

__all__ = [
    "AUTO_MARGIN",
    "GRAMMAR_STATES",
    "OVERLAP_MODES",
    "PROBE_STEPS",
    "Counters",
    "Generation",
    "GenerationError",
    "Step",
    "StepMask",
    "TextStream",
    "chain_settings",
    "forced_logits",
    "generate",
]

Mask = npt.NDArray[np.int32]
Overlap = Literal["auto", "off", "ahead"]
OVERLAP_MODES: tuple[Overlap, ...] = ("auto", "off", "ahead")
# auto: steps run ahead, then (where they waited on constraintd) as many without overlap, before it decides
PROBE_STEPS = 8
# the reasoning budget's states in which a lazy grammar sees the tokens (llama.cpp's grammar_should_apply)
GRAMMAR_STATES = (BudgetState.IDLE, BudgetState.DONE)
# auto: the share of the probe's time ahead may wait on constraintd and stay; and how much shorter the
# median step without overlap must be for it to be kept instead of ahead
AUTO_MARGIN = 0.03


class StepMask(NamedTuple):
    """A step's mask, with the ids it allows where they are few (`few_allowed_tokens`; None where they are
    not, or were not looked for). Mask-ahead finds them on the thread that fetched the mask, while the
    forward pass runs: a refused draw, most often at a mask of a few tokens, then redraws on them at once."""

    words: Mask
    few: npt.NDArray[np.int64] | None

    @classmethod
    def of(cls, words: Mask, n_vocab: int) -> StepMask:
        return cls(words, few_allowed_tokens(words, n_vocab))

    def allowed(self, n_vocab: int) -> npt.NDArray[np.int64]:
        """The ids the mask allows, ascending."""
        return self.few if self.few is not None else allowed_tokens(self.words, n_vocab)


class ConstraintSession(Protocol):
    """What the loop needs of a constraintd session (`clients.Session` has it)."""

    def accept_or_mask(self, token: int) -> Mask | None: ...

    def accept(self, token: int) -> bool: ...

    def accept_and_mask(self, token: int) -> tuple[bool, Mask]: ...

    def mask(self) -> Mask: ...


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
        masks: masks fetched (one per rejection; ahead, one per step).
        ahead_steps: steps whose first draw was checked against a mask fetched ahead.
        waits: times the generation waited on the constraint session with the model idle: every call
            without overlap; ahead, only when a reply had not come by the end of the forward pass.
        model_seconds: time in the model (prompt and tokens).
        prompt_seconds: the part of `model_seconds` spent on the prompt (llama-server's `prompt_ms`; the
            rest of the generation is its `predicted_ms`).
        sampler_seconds: time in the sampler chain.
        constraint_seconds: time spent waiting on the constraint session (the `waits`): the critical
            path's share of constraintd.
    """

    draws: int = 0
    rejections: int = 0
    masks: int = 0
    ahead_steps: int = 0
    waits: int = 0
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
        overlap: how the constraint ran when the generation ended: "off" or "ahead" (what auto chose, once
            it had probed both), "off" without a constraint.
    """

    tokens: tuple[int, ...]
    text: str
    stop_reason: str
    rejected_at: tuple[int, ...]
    seed: int | None
    prompt_tokens: int
    counters: Counters = field(default_factory=Counters)
    overlap: str = "off"


class TextStream:
    """Bytes in, text out: only whole UTF-8 characters, and nothing that might begin a stop string."""

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


class _Ahead:
    """The session's calls of mask-ahead decoding, each made on a thread of its own while the caller goes on
    (the model's forward pass releases the GIL, as a gRPC wait does); a reply is awaited only when needed."""

    def __init__(self, session: ConstraintSession, counters: Counters, n_vocab: int) -> None:
        self._session = session
        self._counters = counters
        self._n_vocab = n_vocab
        self._thread = CallThread("mask-ahead")
        self._pending: PendingCall[tuple[bool, StepMask | None]] | None = None
        # what a refusal of the pending call's tokens means (None: it only asks the mask)
        self._refusal: str | None = None

    def ask_mask(self) -> None:
        """Fetch the mask of the session's state as it is."""
        session, n_vocab = self._session, self._n_vocab
        self._pending = self._thread.submit(lambda: (True, StepMask.of(session.mask(), n_vocab)))
        self._refusal = None

    def send(self, token: int, *, mask: bool = True) -> None:
        """Accept `token` and (with `mask`) fetch the mask of the state after it."""
        session, n_vocab = self._session, self._n_vocab
        if mask:

            def accept_and_mask() -> tuple[bool, StepMask | None]:
                taken, words = session.accept_and_mask(token)
                return taken, StepMask.of(words, n_vocab)

            self._pending = self._thread.submit(accept_and_mask)
        else:
            self._pending = self._thread.submit(lambda: (session.accept(token), None))
        self._refusal = f"the grammar refused token {token}, which its own mask allowed"

    def send_many(self, index: int, tokens: Sequence[int], *, mask: bool = True) -> None:
        """Accept `tokens` in order, after the pending call (settled first: its refusal is not lost), and
        (with `mask`) fetch the mask of the state after them."""
        self.settle(index)
        session, n_vocab = self._session, self._n_vocab

        def accept_all() -> tuple[bool, StepMask | None]:
            if not all(session.accept(token) for token in tokens):
                return False, None
            return True, StepMask.of(session.mask(), n_vocab) if mask else None

        self._pending = self._thread.submit(accept_all)
        self._refusal = f"the grammar refused the end of the thinking block (tokens {list(tokens)})"

    def settle(self, index: int) -> StepMask | None:
        """The pending call's mask (None when none was asked), waiting for it if it has not come.

        Raises:
            GenerationError: the session refused the token sent, which the mask before it allowed.
        """
        pending = self._pending
        if pending is None:
            return None
        self._pending = None
        counters = self._counters
        if not pending.done():
            counters.waits += 1
            started = time.perf_counter()
            taken, mask = pending.result()
            counters.constraint_seconds += time.perf_counter() - started
        else:
            taken, mask = pending.result()
        if not taken:
            raise GenerationError(f"step {index}: {self._refusal}")
        return mask

    def close(self) -> None:
        self._thread.close()


def forced_logits(logits: npt.NDArray[np.float32], token: int) -> npt.NDArray[np.float32]:
    """The reasoning budget's `apply` while it forces `token`: every other logit -inf."""
    forced = np.full_like(logits, -np.inf)
    forced[token] = logits[token]
    return forced


def _off_wins(probe: dict[str, list[float]]) -> bool:
    """auto's choice after its probe: whether the steps without overlap were clearly the shorter."""
    return statistics.median(probe["off"]) < statistics.median(probe["ahead"]) * (1 - AUTO_MARGIN)


def chain_settings(settings: SamplerSettings | None, suppressed: Sequence[int]) -> SamplerSettings:
    """The settings with the vocabulary's suppress tokens banned, as `common_sampler_init` appends them to
    the user's logit biases (-inf)."""
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
    overlap: Overlap = "off",
    counters: Counters | None = None,
    check: Callable[[], None] | None = None,
    special: frozenset[int] = frozenset(),
    budget: ReasoningBudget | None = None,
    grammar_lazy: bool = False,
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
        overlap: "off" (draw, accept, on a refusal mask and redraw), "ahead" (the next mask fetched while
            the model evaluates a token), or "auto" (probe both, keep the faster). The tokens are the same.
        counters: count into these (read them as the generation goes, or after it failed); new ones
            when None. The generation's own are these.
        check: called before each evaluation of the model, each chunk of the prompt included; what it
            raises ends the generation (a cancelled request). The tokens are the same.
        special: special tokens whose text is written into the text (llama-server's preserved tokens of a
            chat with tools); every other special token adds nothing.
        budget: llama-server's reasoning budget for the chat (`ToolChat.reasoning_budget`), with the
            generation prompt's tokens accepted; it takes each token, forces the end of a thinking block
            whose budget is spent, and, with `grammar_lazy`, keeps the block from the session.
        grammar_lazy: whether the session's grammar is lazy (see the module's comment on the budget).

    Returns:
        The generation.

    Raises:
        GenerationError: a mask that allows no token, or a masked redraw the grammar refuses.
        ValueError: the sampler settings are refused (see SamplerSettings.check), no prompt, or an
            unknown overlap mode.
        BaseException: what `check` or `on_step` raised.
    """
    if not prompt:
        raise ValueError("the prompt has no tokens")
    if overlap not in OVERLAP_MODES:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_MODES)}, not {overlap!r}")
    chain = SamplerChain.from_settings(chain_settings(settings, model.suppress_tokens))
    counters = counters if counters is not None else Counters()
    ahead = _Ahead(session, counters, model.n_vocab) if session is not None and overlap != "off" else None
    try:
        return _run(model, prompt, chain, counters, session, ahead, overlap, max_tokens, stop, on_step, check,
                    special, budget, grammar_lazy)
    finally:
        if ahead is not None:
            ahead.close()


def _decode_prompt(
    model: LogitModel, prompt: Sequence[int], check: Callable[[], None] | None
) -> npt.NDArray[np.float32]:
    if check is None:
        return model.decode(prompt)
    # `Model.decode` splits a prompt into chunks of its n_batch tokens, one llama_decode each: the same
    # chunks, one call each, give the same logits, and `check` runs between them. A model without
    # n_batch (a stand-in) evaluates the prompt in one call.
    size = int(getattr(model, "n_batch", 0)) or len(prompt)
    for start in range(0, len(prompt), size):
        check()
        logits = model.decode(prompt[start : start + size])
    return logits


def _run(
    model: LogitModel,
    prompt: Sequence[int],
    chain: SamplerChain,
    counters: Counters,
    session: ConstraintSession | None,
    ahead: _Ahead | None,
    overlap: Overlap,
    max_tokens: int,
    stop: Sequence[str],
    on_step: Callable[[Step], None] | None,
    check: Callable[[], None] | None,
    special: frozenset[int],
    budget: ReasoningBudget | None,
    grammar_lazy: bool,
) -> Generation:
    stream = TextStream(stop)
    tokens: list[int] = []
    rejected_at: list[int] = []
    clock = time.perf_counter
    mode = "ahead" if overlap != "off" else "off"
    probe: dict[str, list[float]] = {"off": [], "ahead": []}  # auto: each mode's step times
    probing = ahead is not None and overlap == "auto"
    waited_before = counters.constraint_seconds  # auto: what the probe ahead waits is counted from here

    started = clock()
    model.reset()
    if ahead is not None and mode == "ahead":
        ahead.ask_mask()  # the first mask is computed while the prompt is evaluated
    logits = _decode_prompt(model, prompt, check)
    counters.model_seconds = counters.prompt_seconds = clock() - started
    for token in prompt:
        chain.accept(token)

    stop_reason = "max_tokens"
    for index in range(max_tokens):
        step_started = started = clock()
        sampled_before = counters.sampler_seconds
        # common_sampler_sample: the budget's forcing first; the grammar only where it applies
        applies = session is not None and (
            budget is None or not grammar_lazy or budget.state in GRAMMAR_STATES)
        forced = budget.forced_token() if budget is not None else None
        if forced is not None:
            logits = forced_logits(logits, forced)
        token = chain.sample(logits)
        counters.sampler_seconds += clock() - started
        counters.draws += 1
        rejected = False
        mask: StepMask | None = None
        if not applies:
            pass
        elif ahead is not None and mode == "ahead":
            mask = ahead.settle(index)
            assert mask is not None  # ahead, every call asks the mask
            counters.masks += 1
            counters.ahead_steps += 1
            if not mask_allows(mask.words, token):
                rejected = True
        elif session is not None:
            started = clock()
            words = session.accept_or_mask(token)
            counters.constraint_seconds += clock() - started
            counters.waits += 1
            if words is not None:
                mask = StepMask(words, None)
                counters.masks += 1
                rejected = True
        if rejected:
            assert mask is not None
            rejected_at.append(index)
            counters.rejections += 1
            allowed = mask.allowed(model.n_vocab)
            if not allowed.size:
                raise GenerationError(f"step {index}: the grammar allows no token")
            started = clock()
            token = chain.sample(logits, allowed_ids=allowed)
            counters.sampler_seconds += clock() - started
            counters.draws += 1
            if mode == "off":
                assert session is not None
                started = clock()
                taken = session.accept(token)
                counters.constraint_seconds += clock() - started
                counters.waits += 1
                if not taken:
                    raise GenerationError(
                        f"step {index}: the grammar refused token {token}, which its own mask allowed"
                    )
        chain.accept(token)
        tokens.append(token)
        replay: tuple[int, ...] = ()
        if budget is not None:
            # common_sampler_accept: a block the budget ends hands its end tag to the grammar it was kept from
            budget.accept(token)
            if session is not None and not applies and budget.state == BudgetState.DONE:
                replay = budget.end_match() or ()
        last = index + 1 == max_tokens
        if model.is_eog(token):
            stop_reason = "eog"
            last = True
            delta = ""
        else:
            delta = stream.push(model.piece(token, special=token in special))
            if stream.found is not None:
                stop_reason = "stop"
                last = True
        if replay:
            if ahead is not None and mode == "ahead":
                ahead.send_many(index, replay, mask=not last)
            else:
                assert session is not None
                started = clock()
                for end_token in replay:
                    if not session.accept(end_token):
                        raise GenerationError(f"step {index}: the grammar refused the end of the thinking "
                                              f"block (token {end_token})")
                counters.constraint_seconds += clock() - started
                counters.waits += 1
        elif ahead is not None and mode == "ahead" and applies:
            ahead.send(token, mask=not last)  # travels while the model evaluates the token
        if on_step is not None:
            on_step(Step(index, token, rejected, delta))
        if last:
            break
        if check is not None:
            check()
        started = clock()
        logits = model.decode([token])
        counters.model_seconds += clock() - started
        if probing:
            assert ahead is not None
            # the step's time but its sampling: that is the same work in either mode, and it varies with
            # where the generation is (a refused draw is sampled twice), which would otherwise decide
            sampling = counters.sampler_seconds - sampled_before
            probe[mode].append(clock() - step_started - sampling)
            if index + 1 == PROBE_STEPS:
                if counters.constraint_seconds - waited_before <= AUTO_MARGIN * sum(probe["ahead"]):
                    probing = False  # the forward pass hid constraintd: nothing to win without overlap
                else:
                    ahead.settle(index)  # the session has the token; the mask is not needed
                    mode = "off"
            elif index + 1 == 2 * PROBE_STEPS:
                probing = False
                if not _off_wins(probe):
                    mode = "ahead"  # the next step's mask travels now
                    ahead.ask_mask()
    if ahead is not None:
        ahead.settle(len(tokens))  # the last token's accept
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
        overlap=mode if session is not None else "off",
    )
