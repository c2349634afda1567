# The generations of a batched context, stepped together by one thread, as llama-server steps its slots.
#
# One step, for every generation running (each a "lane", one sequence of the `BatchedContext`):
#   1. one `llama_decode` carries the last token of every generating lane, then the prompts of the lanes
#      starting (chunked to the batch size; a prompt not done by this step goes on in the next one);
#   2. each lane whose logits came draws with its own chain (llama-server's, seeded: `SamplerChain`);
#   3. the first draws of all constrained lanes go to constraintd in ONE `Step` message (accept, or the
#      mask on a rejection); each rejected lane redraws under its mask with the same generator, and the
#      redraws go in one more `Step` message, each of which must be accepted: the generation loop's
#      reject-then-mask (`sampler_worker.generate`, overlap "off"), token for token, per lane;
#   4. each lane's chain accepts its token; the text, the stop strings and the end of generation are the
#      generation loop's (`TextStream`); the lane's `on_step` is called.
# Mask-ahead (`overlap="ahead"`), the generation loop's mode for many lanes: the tokens of step 3 are not
# sent then; the next step's ONE `Step` message carries every constrained lane's last token (a lane just
# started: none) and asks the mask of the state after it, on a thread of its own while `llama_decode` runs
# (the decode releases the interpreter lock). After the decode the stepping thread takes the masks (waiting
# only if they have not come), and each lane's first draw is checked with a bit of its mask, locally; the
# refused lanes redraw under their masks once every lane has drawn, with the same generator. So no
# constraintd round trip is on the step's critical path, and the draws are step 3's: the mask's bit and the
# single-token check are the same predicate. A lane's last token is accepted in one more `Step` message
# (without masks) before it ends.
# Only this thread calls llama.cpp on the context, and it does the sampling of every lane, so the lanes'
# Python work never takes turns with another thread's on the interpreter lock mid-step.
# A lane's reasoning budget is the generation loop's: its forcing in both draws; with a lazy grammar a
# token drawn inside the thinking block is neither checked nor accepted (ahead: the mask the lane holds
# stays good), and the end sequence of a block that ends so is accepted by the lane's session there and
# then, one call a token (rare: once a block), before the lane's next mask is asked.
#
# Contract:
# - `Lockstep.generate(slot, prompt, ...)` runs on the caller's thread (a request's worker thread) and
#   blocks until its lane has ended: it returns the `Generation`, or raises what ended the lane (the
#   sampler settings refused, a `GenerationError`, a constraintd error, or what `check` or `on_step`
#   raised: a cancelled request). An error of one lane ends that lane only; a failed decode ends the lanes
#   of that batch. Settings are checked on the caller's thread, before the lane is queued.
# - `check` is called before each of the lane's decodes, the prompt's included: a request cancelled while
#   its prompt is evaluated ends before the next chunk.
# - A lane's KV cells are removed when it ends, however it ends, and again when a lane starts on the slot.
# - Batching changes llama.cpp's float reductions, so a lane's tokens may differ from those of the same
#   request alone; each is still its chain's draw under its grammar (the tests check the texts).
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from constraintd.engine.masks.bitmask import allowed_tokens, mask_allows
from sampler_worker.call_thread import CallThread, PendingCall
from sampler_worker.chain import SamplerChain, SamplerSettings
from sampler_worker.generate import (
    GRAMMAR_STATES,
    ConstraintSession,
    Counters,
    Generation,
    GenerationError,
    Step,
    StepMask,
    TextStream,
    chain_settings,
    forced_logits,
)
from sampler_worker.model import ModelError
from sampler_worker.reasoning_budget import BudgetState, ReasoningBudget
from sampler_worker.serve.contexts import BatchedContext, Row, Slot

__all__ = ["Lockstep"]

Logits = npt.NDArray[np.float32]
Mask = npt.NDArray[np.int32]
Mode = Literal["off", "ahead"]
# the ahead Step's answer per lane: the mask of its state (a StepMask), or the exception that ends it
Ahead = list[tuple["_Lane", Any]]


class _Lane:
    # One generation on one sequence; touched by the stepping thread only, between queueing and `done`.
    __slots__ = (
        "applies", "budget", "chain", "check", "counters", "done", "error", "lazy", "mask", "max_tokens",
        "model", "n_ctx", "n_past", "needs_mask", "on_step", "overlap", "pending", "prompt_tokens",
        "prompting", "rejected_at", "result", "sent", "seq", "session", "special", "stop_reason", "stream",
        "tokens", "unsent",
    )

    def __init__(
        self,
        slot: Slot,
        prompt: Sequence[int],
        chain: SamplerChain,
        *,
        session: ConstraintSession | None,
        max_tokens: int,
        stop: Sequence[str],
        on_step: Callable[[Step], None] | None,
        check: Callable[[], None] | None,
        counters: Counters,
        overlap: Mode = "off",
        special: frozenset[int] = frozenset(),
        budget: ReasoningBudget | None = None,
        lazy: bool = False,
    ) -> None:
        self.seq = slot.seq
        self.special = special
        self.n_ctx = slot.n_ctx
        self.model = slot.model
        self.chain = chain
        self.session = session
        self.max_tokens = max_tokens
        self.stream = TextStream(stop)
        self.on_step = on_step
        self.check = check
        self.counters = counters
        self.pending: list[int] = list(prompt)  # tokens to decode; `sent` of them are decoded already
        self.sent = 0
        self.n_past = 0
        self.prompting = True
        self.prompt_tokens = len(prompt)
        self.tokens: list[int] = []
        self.rejected_at: list[int] = []
        self.stop_reason = "max_tokens"
        self.done = threading.Event()
        self.result: Generation | None = None
        self.error: BaseException | None = None
        # mask-ahead: the mode, the mask of the session's state (for the next draw), whether it must be
        # asked, and the token taken and not yet sent to the session
        self.overlap: Mode = overlap if session is not None else "off"
        self.mask: StepMask | None = None
        self.needs_mask = self.overlap == "ahead"
        self.unsent: int | None = None
        self.budget = budget
        self.lazy = lazy
        self.applies = session is not None  # whether the session checks and takes this step's draw

    def logits_for_draw(self, logits: Logits) -> Logits:
        # the step's first part for this lane: whether its grammar applies, and the budget's forcing
        budget = self.budget
        self.applies = self.session is not None and (
            budget is None or not self.lazy or budget.state in GRAMMAR_STATES)
        forced = budget.forced_token() if budget is not None else None
        return logits if forced is None else forced_logits(logits, forced)

    def take(self, token: int, rejected: bool) -> bool:
        # the step's last part for this lane: the generation loop's; True when the lane has ended
        index = len(self.tokens)
        if rejected:
            self.rejected_at.append(index)
            self.counters.rejections += 1
        self.chain.accept(token)
        self.tokens.append(token)
        if self.budget is not None:
            self._budget_accept(token, index)
        last = index + 1 == self.max_tokens
        if self.model.is_eog(token):
            self.stop_reason = "eog"
            last = True
            delta = ""
        else:
            delta = self.stream.push(self.model.piece(token, special=token in self.special))
            if self.stream.found is not None:
                self.stop_reason = "stop"
                last = True
        if self.on_step is not None:
            self.on_step(Step(index, token, rejected, delta))
        if last:
            tail = self.stream.finish()
            if tail and self.on_step is not None:
                self.on_step(Step(len(self.tokens), None, False, tail))
            self.result = Generation(
                tokens=tuple(self.tokens), text=self.stream.text(), stop_reason=self.stop_reason,
                rejected_at=tuple(self.rejected_at), seed=self.chain.seed, prompt_tokens=self.prompt_tokens,
                counters=self.counters, overlap=self.overlap,
            )
            return True
        self.pending, self.sent = [token], 0
        if self.overlap == "ahead" and self.applies:
            self.unsent, self.needs_mask = token, True
        return False

    def _budget_accept(self, token: int, index: int) -> None:
        # common_sampler_accept: the budget takes the token; a block it ends hands its end to the grammar
        budget = self.budget
        assert budget is not None
        budget.accept(token)
        end = budget.end_match()
        if self.session is None or self.applies or budget.state != BudgetState.DONE or end is None:
            return
        started = time.perf_counter()
        for end_token in end:
            if not self.session.accept(end_token):
                raise GenerationError(f"step {index}: the grammar refused the end of the thinking block "
                                      f"(token {end_token})")
        self.counters.constraint_seconds += time.perf_counter() - started
        self.counters.waits += 1
        if self.overlap == "ahead":
            self.mask, self.needs_mask = None, True  # the state moved: the next mask is asked afresh


class Lockstep:
    """The generations of one `BatchedContext`, stepped together by a thread of its own.

    Args:
        batched: the context; its sequences are the slots the callers hold.
        client: the constraintd client (`clients.Client`) whose sessions the generations hold: a step's
            constraint calls are its `step` messages.
        overlap: "off" (each step's draws checked by a `Step` message, then the rejected ones' masked
            redraws by another) or "ahead" (every lane's mask fetched during the decode). The draws are the
            same.

    Raises:
        ValueError: an unknown overlap mode.
    """

    def __init__(self, batched: BatchedContext, *, client: Any, overlap: Mode = "off") -> None:
        if overlap not in ("off", "ahead"):
            raise ValueError(f"a batched context's overlap is off or ahead, not {overlap!r}")
        self._batched = batched
        self._client = client
        self.overlap: Mode = overlap
        self._ahead = CallThread("lockstep-ahead") if overlap == "ahead" else None
        self._lanes: list[_Lane] = []  # the stepping thread's
        self._arrivals: list[_Lane] = []
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="lockstep", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """End the stepping thread (lanes still running fail) and wait for it."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        if self._ahead is not None:
            self._ahead.close()

    def generate(
        self,
        slot: Slot,
        prompt: Sequence[int],
        settings: SamplerSettings | None = None,
        *,
        session: ConstraintSession | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        on_step: Callable[[Step], None] | None = None,
        check: Callable[[], None] | None = None,
        counters: Counters | None = None,
        special: frozenset[int] = frozenset(),
        budget: ReasoningBudget | None = None,
        grammar_lazy: bool = False,
    ) -> Generation:
        """Generate on the slot's sequence with the other slots' generations; blocks until it has ended.

        The arguments are `sampler_worker.generate.generate`'s (the model is the slot), plus `check`,
        called before each decode of this generation.

        Raises:
            ValueError: no prompt, or the sampler settings are refused.
            GenerationError: the grammar and the sampler cannot agree.
            ModelError: the context overflows or llama.cpp fails.
            BaseException: what `check` or `on_step` raised, or a constraintd error.
        """
        if not prompt:
            raise ValueError("the prompt has no tokens")
        chain = SamplerChain.from_settings(chain_settings(settings, slot.model.suppress_tokens))
        for token in prompt:
            chain.accept(token)
        lane = _Lane(
            slot, prompt, chain, session=session, max_tokens=max_tokens, stop=stop, on_step=on_step,
            check=check, counters=counters if counters is not None else Counters(), overlap=self.overlap,
            special=special, budget=budget, lazy=grammar_lazy,
        )
        with self._cond:
            if self._closing:
                raise ModelError("the server is shutting down")
            self._arrivals.append(lane)
            self._cond.notify_all()
        lane.done.wait()
        if lane.error is not None:
            raise lane.error
        assert lane.result is not None
        return lane.result

    # The stepping thread.

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._lanes and not self._arrivals and not self._closing:
                        self._cond.wait()
                    if self._closing:
                        return
                    arrivals, self._arrivals = self._arrivals, []
                for lane in arrivals:
                    self._batched.clear(lane.seq)
                    self._lanes.append(lane)
                self._step()
        finally:
            with self._cond:
                self._closing = True
                left, self._arrivals = self._lanes + self._arrivals, []
            for lane in left:
                self._end(lane, ModelError("the server is shutting down"))

    def _end(self, lane: _Lane, error: BaseException | None = None) -> None:
        if lane in self._lanes:
            self._lanes.remove(lane)
        self._batched.clear(lane.seq)
        lane.error = error
        lane.done.set()

    def _guarded(self, lane: _Lane, call: Callable[[], Any]) -> bool:
        # runs `call`; an exception ends the lane: False
        try:
            call()
        except BaseException as exc:
            self._end(lane, exc)
            return False
        return True

    def _step(self) -> None:
        for lane in list(self._lanes):
            if lane.check is not None:
                self._guarded(lane, lane.check)
        rows: list[Row] = []
        taken: list[tuple[_Lane, int, bool]] = []
        room = self._batched.n_batch
        for lane in sorted(self._lanes, key=lambda lane: lane.prompting):  # generating lanes first
            count = min(len(lane.pending) - lane.sent, room)
            if count <= 0:
                break
            if lane.n_past + count > lane.n_ctx:
                self._end(lane, ModelError(f"the context of {lane.n_ctx} tokens is full"))
                continue
            last = lane.sent + count == len(lane.pending)
            rows.append(Row(lane.seq, lane.n_past, lane.pending[lane.sent : lane.sent + count], logits=last))
            taken.append((lane, count, last))
            room -= count
        if not rows:
            return
        ahead = self._send_ahead([lane for lane, _, _ in taken])
        clock = time.perf_counter
        started = clock()
        try:
            logits = self._batched.decode(rows)
        except BaseException as exc:
            self._settle(ahead)  # the sessions are closed once their lanes end: not while a Step is out
            for lane, _, _ in taken:
                self._end(lane, exc)
            return
        elapsed = clock() - started
        for lane, answer in self._settle(ahead):
            if isinstance(answer, BaseException):
                self._end(lane, answer)
            else:
                lane.mask = answer
        ready: list[tuple[_Lane, Logits]] = []
        for (lane, count, last), row in zip(taken, logits, strict=True):
            if lane.done.is_set():  # ended by its ahead Step
                continue
            lane.n_past += count
            lane.sent += count
            lane.counters.model_seconds += elapsed
            if lane.prompting:
                lane.counters.prompt_seconds += elapsed
            if last:
                assert row is not None
                lane.prompting = False
                ready.append((lane, row))
        if ready:
            self._sample(ready)

    def _draw(self, lane: _Lane, logits: Logits, allowed: npt.NDArray[np.int64] | None = None) -> int:
        # `allowed`: the ids a redraw's mask allows (None: the first draw)
        started = time.perf_counter()
        token = lane.chain.sample(logits, allowed_ids=allowed)
        lane.counters.sampler_seconds += time.perf_counter() - started
        lane.counters.draws += 1
        return token

    # Mask-ahead.

    def _send_ahead(self, lanes: list[_Lane]) -> PendingCall[Ahead] | None:
        # one Step message, on the ahead thread: each lane's unsent token accepted and its next mask asked
        items = [lane for lane in lanes if lane.needs_mask]
        if not items:
            return None
        batch = [(lane.session, lane.unsent) for lane in items]
        for lane in items:
            lane.needs_mask, lane.unsent = False, None
        assert self._ahead is not None
        return self._ahead.submit(partial(self._exchange_ahead, items, batch))

    def _exchange_ahead(self, lanes: list[_Lane], batch: list[tuple[Any, int | None]]) -> Ahead:
        # on the ahead thread; a failed message is redone item by item, so an error stays its lane's
        try:
            outcomes = self._client.step(batch, mask_on_reject=False, mask_after=True)
            return [(lane, self._ahead_answer(lane, token, outcome.accepted, outcome.mask))
                    for lane, (_, token), outcome in zip(lanes, batch, outcomes, strict=True)]
        except Exception:
            return [(lane, self._ahead_alone(lane, token))
                    for lane, (_, token) in zip(lanes, batch, strict=True)]

    def _ahead_answer(self, lane: _Lane, token: int | None, accepted: bool | None, mask: Mask | None) -> Any:
        # on the ahead thread: the ids a redraw would need are found here when they are few
        if token is not None and not accepted:
            return GenerationError(
                f"step {len(lane.tokens) - 1}: the grammar refused token {token}, which its own mask allowed"
            )
        if mask is None:
            return GenerationError(f"step {len(lane.tokens)}: constraintd answered no mask")
        return StepMask.of(mask, self._batched.n_vocab)

    def _ahead_alone(self, lane: _Lane, token: int | None) -> Any:
        session = lane.session
        assert session is not None
        try:
            if token is None:
                return self._ahead_answer(lane, None, None, session.mask())
            accepted, mask = session.accept_and_mask(token)
            return self._ahead_answer(lane, token, accepted, mask)
        except Exception as exc:
            return exc

    def _settle(self, ahead: PendingCall[Ahead] | None) -> Ahead:
        # the ahead Step's answers, waiting for them only if they have not come during the decode
        if ahead is None:
            return []
        waited = not ahead.done()
        started = time.perf_counter()
        answers = ahead.result()
        share = (time.perf_counter() - started) / len(answers) if waited else 0.0
        for lane, _ in answers:
            lane.counters.masks += 1
            lane.counters.waits += waited
            lane.counters.constraint_seconds += share
        return answers

    def _sample(self, ready: list[tuple[_Lane, Logits]]) -> None:
        if self.overlap == "ahead":
            self._sample_ahead(ready)
            return
        first: list[tuple[_Lane, Logits, int]] = []
        for lane, logits in ready:
            try:
                logits = lane.logits_for_draw(logits)
                first.append((lane, logits, self._draw(lane, logits)))
            except BaseException as exc:
                self._end(lane, exc)
        checked = [(lane, token) for lane, _, token in first if lane.applies]
        answers = dict(zip([id(lane) for lane, _ in checked], self._accept(checked, masks=True), strict=True))
        final: list[tuple[_Lane, int, bool]] = []
        redrawn: list[tuple[_Lane, int]] = []
        for lane, logits, token in first:
            answer = answers.get(id(lane))
            if answer is None:  # unconstrained, or accepted
                final.append((lane, token, False))
                continue
            if isinstance(answer, BaseException):
                self._end(lane, answer)
                continue
            lane.counters.masks += 1
            try:
                allowed = allowed_tokens(answer, self._batched.n_vocab)
                if not allowed.size:
                    raise GenerationError(f"step {len(lane.tokens)}: the grammar allows no token")
                redrawn.append((lane, self._draw(lane, logits, allowed)))
            except BaseException as exc:
                self._end(lane, exc)
        for (lane, token), answer in zip(redrawn, self._accept(redrawn, masks=False), strict=True):
            if isinstance(answer, BaseException):
                self._end(lane, answer)
            else:
                final.append((lane, token, True))
        for lane in self._take(final):
            self._end(lane)

    def _sample_ahead(self, ready: list[tuple[_Lane, Logits]]) -> None:
        final: list[tuple[_Lane, int, bool]] = []
        refused: list[tuple[_Lane, Logits, StepMask]] = []
        for lane, logits in ready:
            try:
                logits = lane.logits_for_draw(logits)
                token = self._draw(lane, logits)
                if lane.applies:
                    mask, lane.mask = lane.mask, None
                    assert mask is not None  # every constrained lane's was asked with its decode
                    lane.counters.ahead_steps += 1
                    if not mask_allows(mask.words, token):
                        refused.append((lane, logits, mask))
                        continue
                final.append((lane, token, False))
            except BaseException as exc:
                self._end(lane, exc)
        # The refused draws are redrawn together, after every lane's first draw: each lane has its own
        # chain, so the order changes no token, and a redraw right after another runs on a warm interpreter
        # (after a first draw's pass over the vocabulary it took twice as long).
        for lane, logits, mask in refused:
            try:
                allowed = mask.allowed(self._batched.n_vocab)
                if not allowed.size:
                    raise GenerationError(f"step {len(lane.tokens)}: the grammar allows no token")
                final.append((lane, self._draw(lane, logits, allowed), True))
            except BaseException as exc:
                self._end(lane, exc)
        ended = self._take(final)
        # a lane's last token: accepted by its session (one Step message for them all) before the lane ends
        last = [(lane, lane.tokens[-1]) for lane in ended if lane.applies]
        answers = {id(lane): answer for (lane, _), answer in zip(last, self._accept(last, masks=False),
                                                                  strict=True)}
        for lane in ended:
            answer = answers.get(id(lane))
            self._end(lane, answer if isinstance(answer, BaseException) else None)

    def _take(self, final: list[tuple[_Lane, int, bool]]) -> list[_Lane]:
        # each lane takes its token (the step's last part); the lanes that have ended with it
        ended: list[_Lane] = []
        for lane, token, rejected in final:
            done = False

            def take(lane: _Lane = lane, token: int = token, rejected: bool = rejected) -> None:
                nonlocal done
                done = lane.take(token, rejected)

            if self._guarded(lane, take) and done:
                ended.append(lane)
        return ended

    def _accept(self, items: list[tuple[_Lane, int]], *, masks: bool) -> list[Any]:
        # One Step message for the items: per item None (accepted), the mask (rejected, `masks`), or the
        # exception that ends its lane. A failed message is redone item by item, so an error stays its lane's.
        if not items:
            return []
        started = time.perf_counter()
        try:
            batch = [(lane.session, token) for lane, token in items]
            outcomes = self._client.step(batch, mask_on_reject=masks)
            answers = [self._answer(lane, token, outcome.accepted, outcome.mask, masks)
                       for (lane, token), outcome in zip(items, outcomes, strict=True)]
        except Exception:
            answers = [self._alone(lane, token, masks) for lane, token in items]
        share = (time.perf_counter() - started) / len(items)
        for lane, _ in items:
            lane.counters.constraint_seconds += share
            lane.counters.waits += 1
        return answers

    @staticmethod
    def _answer(lane: _Lane, token: int, accepted: bool | None, mask: Mask | None, masks: bool) -> Any:
        if accepted:
            return None
        if masks and mask is not None:
            return mask
        return GenerationError(
            f"step {len(lane.tokens)}: the grammar refused token {token}, which its own mask allowed"
        )

    @classmethod
    def _alone(cls, lane: _Lane, token: int, masks: bool) -> Any:
        session = lane.session
        assert session is not None
        try:
            if masks:
                return session.accept_or_mask(token)
            return cls._answer(lane, token, session.accept(token), None, masks)
        except Exception as exc:
            return exc
