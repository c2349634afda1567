"""A GPU-bound model stand-in for bench_worker.py (benchmark only): where the constraint's time hides.

On the machines users run, the forward pass is on a GPU and the CPU waits while it runs. This stand-in
replays the real model's logits (Gemma 3 270M, recorded once per prompt and seed along the constrained
generation's own tokens) from a forward pass that waits F ms without using the CPU, as a worker waits on
its GPU; one forward pass serves every generation of a batch at once, as a batched decode does. The
sampler chain, the grammar and constraintd are the real ones. A trajectory is replayed step by step
whatever token is drawn: the constrained paths draw exactly the recorded tokens (same seed, same
logits, same grammar), the unconstrained path draws its own tokens from the same logits, so every path
does the same sampling work per step.

Paths, per batch size N and forward time F:
- unconstrained: sample every generation, then the forward pass;
- off: sample every generation, one Step message accepting all their tokens (masks of the refused
  ones in the reply), a redraw on each refusal, one more Step for the redrawn tokens, then the forward
  pass: constraintd's round trip is on the critical path;
- ahead: one Step message accepting every token and asking every next mask (`mask_after`) is sent when
  the forward pass starts, on a thread of its own, and read when the worker needs the masks: each first
  draw is a bit test on its mask, and the refused ones are redrawn on their masks once every generation
  has drawn (as the worker's lockstep does).
With N = 1 the worker is `sampler_worker.generate` itself, in each overlap mode (auto too); with N > 1
the batch loop below (one Step a decode step for all the sessions, over the client's one Step stream).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from clients import Client, Session, VocabHandle
from clients.masks import mask_allows
from constraintd.engine.masks.bitmask import allowed_tokens
from sampler_worker.call_thread import CallThread, PendingCall
from sampler_worker.chain import SamplerChain, SamplerSettings
from sampler_worker.generate import Overlap, StepMask, generate
from sampler_worker.model import Model

Logits = npt.NDArray[np.float32]
# an ahead Step's answer for one session: whether its token was taken (None: none was sent), its next mask
Answer = tuple[bool | None, StepMask | None]


@dataclass(frozen=True)
class Trajectory:
    """The logits a real constrained generation met, step by step, and the prompt it started from."""

    prompt: tuple[int, ...]
    seed: int
    logits: tuple[Logits, ...]  # logits[i]: before token i (logits[0]: after the prompt)


def record(model: Model, prompt: Sequence[int], seed: int, session: Session, steps: int) -> Trajectory:
    """Run the real model constrained and keep the logits of every step."""
    kept: list[Logits] = []

    class Recording:
        n_vocab = model.n_vocab
        suppress_tokens = model.suppress_tokens

        def reset(self) -> None:
            model.reset()

        def decode(self, tokens: Sequence[int]) -> Logits:
            logits = model.decode(tokens)
            kept.append(np.array(logits, dtype=np.float32))
            return logits

        def is_eog(self, token: int) -> bool:
            return model.is_eog(token)

        def piece(self, token: int, *, special: bool = True) -> bytes:
            return model.piece(token, special=special)

    generation = generate(Recording(), prompt, SamplerSettings(seed=seed), session=session, max_tokens=steps)
    return Trajectory(tuple(prompt), seed, tuple(kept[: len(generation.tokens)]))


class ReplayModel:
    """One generation's model: each forward pass waits `seconds` (no CPU), then gives the next logits."""

    def __init__(self, model: Model, trajectory: Trajectory, seconds: float) -> None:
        self.n_vocab = model.n_vocab
        self.suppress_tokens = model.suppress_tokens
        self._model = model
        self._trajectory = trajectory
        self._seconds = seconds
        self._step = 0

    def reset(self) -> None:
        self._step = 0

    def decode(self, tokens: Sequence[int]) -> Logits:
        time.sleep(self._seconds)
        logits = self._trajectory.logits[min(self._step, len(self._trajectory.logits) - 1)]
        self._step += 1
        return logits.copy()

    def is_eog(self, token: int) -> bool:
        return self._model.is_eog(token)

    def piece(self, token: int, *, special: bool = True) -> bytes:
        return self._model.piece(token, special=special)


@dataclass
class BatchRun:
    """What one run of N generations made and cost, after the prompt."""

    tokens: int
    seconds: float
    waits: int  # times the worker waited on constraintd with the forward pass over
    wait_seconds: float
    rejections: int


def run_one(
    model: Model, trajectory: Trajectory, seconds: float, session: Session | None, overlap: Overlap
) -> BatchRun:
    """N = 1: `sampler_worker.generate` itself on the replayed model."""
    replay = ReplayModel(model, trajectory, seconds)
    started = time.perf_counter()
    generation = generate(
        replay, trajectory.prompt, SamplerSettings(seed=trajectory.seed), session=session,
        max_tokens=len(trajectory.logits), overlap=overlap,
    )
    counters = generation.counters
    elapsed = time.perf_counter() - started - counters.prompt_seconds
    if session is None:
        return BatchRun(len(generation.tokens), elapsed, 0, 0.0, 0)
    return BatchRun(
        len(generation.tokens), elapsed, counters.waits, counters.constraint_seconds, counters.rejections
    )


def run_batch(
    model: Model,
    trajectories: Sequence[Trajectory],
    seconds: float,
    client: Client | None,
    handle: VocabHandle | None,
    schema: str,
    mode: str,
) -> BatchRun:
    """N > 1 generations in lockstep: one forward pass (waiting `seconds`) a step for all of them.

    `mode`: "unconstrained", "off" or "ahead" (see the module's docstring).
    """
    count = len(trajectories)
    chains = [SamplerChain.from_settings(SamplerSettings(seed=t.seed)) for t in trajectories]
    for chain, trajectory in zip(chains, trajectories, strict=True):
        for token in trajectory.prompt:
            chain.accept(token)
    sessions: list[Session] = []
    if mode != "unconstrained":
        assert client is not None and handle is not None
        sessions = [client.session(handle, json_schema=schema) for _ in range(count)]
    steps = min(len(t.logits) for t in trajectories)
    pool = CallThread("step")
    pending: PendingCall[list[Answer]] | None = None
    waits, wait_seconds, rejections, tokens = 0, 0.0, 0, 0
    clock = time.perf_counter

    def step_ahead(items: list[tuple[Session, int | None]], mask_after: bool) -> list[Answer]:
        # on the step thread, as the worker's lockstep does: each mask's ids found where they are few
        assert client is not None
        return [
            (outcome.accepted, None if outcome.mask is None else StepMask.of(outcome.mask, model.n_vocab))
            for outcome in client.step(items, mask_after=mask_after)
        ]

    def settle() -> list[Answer]:
        nonlocal pending, waits, wait_seconds
        assert pending is not None
        call, pending = pending, None
        if not call.done():
            waits += 1
            started = clock()
            outcomes = call.result()
            wait_seconds += clock() - started
            return outcomes
        return call.result()

    try:
        if mode == "ahead":  # the first masks travel while the prompts are evaluated
            pending = pool.submit(partial(step_ahead, [(s, None) for s in sessions], False))
        time.sleep(seconds)  # the prompts' forward pass (not timed, as llama-server's predicted_ms)
        started = clock()
        masks: list[StepMask | None] = [None] * count
        if mode == "ahead":
            masks = [mask for _, mask in settle()]
        for step in range(steps):
            drawn: list[int] = []
            refused: list[tuple[int, StepMask]] = []
            for index, chain in enumerate(chains):
                logits = trajectories[index].logits[step].copy()
                token = chain.sample(logits)
                if mode == "ahead":
                    mask = masks[index]
                    assert mask is not None
                    if not mask_allows(mask.words, token):
                        refused.append((index, mask))
                drawn.append(token)
            # the refused draws redrawn together, after every first draw (as the worker's lockstep does), on
            # the recorded logits themselves (the same values): a copy of each kept until then would grow
            # the heap by a megabyte a refusal, which the allocator gives back and takes again each step
            for index, mask in refused:
                rejections += 1
                recorded = trajectories[index].logits[step]
                drawn[index] = chains[index].sample(recorded, allowed_ids=mask.allowed(model.n_vocab))
            if mode == "off":
                assert client is not None
                called = clock()
                outcomes = client.step(list(zip(sessions, drawn, strict=True)), mask_on_reject=True)
                waits += 1
                wait_seconds += clock() - called
                redrawn: list[tuple[Session, int]] = []
                for index, outcome in enumerate(outcomes):
                    if not outcome.accepted:
                        assert outcome.mask is not None
                        rejections += 1
                        logits = trajectories[index].logits[step].copy()
                        allowed = allowed_tokens(outcome.mask, model.n_vocab)
                        drawn[index] = chains[index].sample(logits, allowed_ids=allowed)
                        redrawn.append((sessions[index], drawn[index]))
                if redrawn:
                    called = clock()
                    again = client.step(redrawn, mask_on_reject=False)
                    waits += 1
                    wait_seconds += clock() - called
                    if not all(outcome.accepted for outcome in again):
                        raise RuntimeError("the grammar refused a token its own mask allowed")
            for chain, token in zip(chains, drawn, strict=True):
                chain.accept(token)
            tokens += count
            if mode == "ahead":
                items: list[tuple[Session, int | None]] = list(zip(sessions, drawn, strict=True))
                # the last tokens' accepts ask no mask: no draw follows them (as `generate` does)
                pending = pool.submit(partial(step_ahead, items, step + 1 < steps))
            if step + 1 < steps:
                time.sleep(seconds)  # the batch's forward pass, while the Step travels
            if mode == "ahead":
                answers = settle()
                if not all(accepted for accepted, _ in answers):
                    raise RuntimeError("the grammar refused a token its own mask allowed")
                masks = [mask for _, mask in answers]
        elapsed = clock() - started
    finally:
        pool.close()
        for session in sessions:
            session.close()
    return BatchRun(tokens, elapsed, waits, wait_seconds, rejections)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
