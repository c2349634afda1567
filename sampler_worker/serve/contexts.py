# Contexts for the server's parallel generations: one loaded model; with n > 1 slots, ONE llama.cpp
# context holding n sequences, decoded together as llama-server's slots are.
#
# Contract:
# - `contexts(model, 1)` is `[model]`: one slot is the model's own context, decoded as
#   `sampler-worker generate` decodes it (so its tokens are the command's).
# - `contexts(model, n > 1)` gives n `BatchedSequence`s over one `BatchedContext`: a context with
#   `n_seq_max = n`, each sequence with a KV cache of its own of the model's `n_ctx` (not unified: the
#   context's size is n times the model's), all the model's threads. Each slot has the whole `Model`
#   API the generation loop uses (decode, reset, tokenize, piece, ...); the weights are loaded once.
# - Lockstep: a sequence is active from its `reset()` (a generation starts) to its `release()` (it has
#   ended, however). `decode(tokens)` of a sequence waits until every active sequence has tokens to
#   decode, then ONE thread (the last to ask) puts all of them in one `llama_batch` (the tokens of
#   ongoing generations first, then prompts, chunked by `n_batch`), calls `llama_decode` once per
#   chunk, and hands each sequence the logits of its last token's row. The other threads wait.
# - No two threads ever call llama.cpp on the context at once: `llama_decode`, `llama_memory_seq_rm` and
#   the logits copies happen under the `_busy` flag or the lock, never both outside.
# - A released sequence's KV cells are removed (`llama_memory_seq_rm(seq, -1, -1)`), so its slot is
#   reused empty; `reset()` removes them too.
# - Batching changes the float reductions (the matrix products see another batch shape), so a sequence's
#   logits, and so its tokens, may differ from those of the same request run alone: with n > 1 a seeded
#   request is no longer token for token `sampler-worker generate`. Every token is still the sampler
#   chain's draw under the constraint.
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sampler_worker.model import Model, ModelError

__all__ = ["BatchedContext", "BatchedSequence", "contexts"]

Logits = npt.NDArray[np.float32]


class _Request:
    # One sequence's tokens to decode; `sent` of them are in the KV cache already (a chunked prompt).
    __slots__ = ("done", "error", "logits", "sent", "seq", "start", "tokens")

    def __init__(self, seq: int, start: int, tokens: Sequence[int]) -> None:
        self.seq = seq
        self.start = start  # the position of the first token
        self.tokens = tokens
        self.sent = 0
        self.logits: Logits | None = None
        self.error: BaseException | None = None
        self.done = False


class BatchedContext:
    """One llama.cpp context of n sequences over a loaded model, decoded together.

    Args:
        model: the loaded model (its weights and vocabulary are used; its own context is not).
        n: the sequences (slots).
        threads: llama.cpp's threads for the context.

    Raises:
        ModelError: llama.cpp cannot create the context.
    """

    def __init__(self, model: Model, n: int, *, threads: int) -> None:
        self._ll = ll = model._ll
        params = ll.llama_context_default_params()
        params.n_ctx = model.n_ctx * n
        params.n_seq_max = n
        params.kv_unified = False  # each sequence its own cells: n_ctx_seq is the model's n_ctx
        params.n_batch = params.n_ubatch = model.n_batch
        params.n_threads = params.n_threads_batch = threads
        self._ctx = ll.llama_init_from_model(model._model, params)
        if not self._ctx:
            raise ModelError(
                f"{model.path}: llama.cpp could not create a context of {n} sequences of {model.n_ctx} tokens"
            )
        self.n_ctx_seq = int(ll.llama_n_ctx_seq(self._ctx))
        self._batch: Any = ll.llama_batch_init(model.n_batch, 0, 1)
        self._memory = ll.llama_get_memory(self._ctx)
        self.n = n
        self.n_batch = model.n_batch
        self.n_vocab = model.n_vocab
        self._lock = threading.Condition()
        self._active: set[int] = set()
        self._pending: dict[int, _Request] = {}
        self._busy = False  # a thread is in llama.cpp with the lock released
        self.sequences = [BatchedSequence(model, self, seq) for seq in range(n)]

    def close(self) -> None:
        """Free the context (idempotent; the weights are the model's)."""
        if self._ctx:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None

    # Each method below is called by the thread of the generation that holds the sequence.

    def begin(self, seq: int) -> None:
        """Empty the sequence's cells and count it among those a step waits for."""
        with self._lock:
            self._idle_context()
            self._ll.llama_memory_seq_rm(self._memory, seq, -1, -1)
            self._active.add(seq)
            self._lock.notify_all()

    def release(self, seq: int) -> None:
        """Remove the sequence's cells; the steps no longer wait for it."""
        with self._lock:
            self._idle_context()
            self._ll.llama_memory_seq_rm(self._memory, seq, -1, -1)
            self._active.discard(seq)
            self._pending.pop(seq, None)
            self._lock.notify_all()

    def decode(self, seq: int, start: int, tokens: Sequence[int]) -> Logits:
        """Decode `tokens` at positions `start...` of `seq` with every other active sequence's tokens.

        Raises:
            ModelError: llama.cpp fails to evaluate.
        """
        request = _Request(seq, start, tokens)
        with self._lock:
            self._active.add(seq)
            self._pending[seq] = request
            self._lock.notify_all()
            while not request.done:
                if self._busy or not self._active <= self._pending.keys():
                    self._lock.wait()
                    continue
                # every active sequence is waiting: this thread decodes for all of them
                requests = sorted(self._pending.values(), key=lambda r: len(r.tokens) - r.sent)
                self._busy = True
                self._lock.release()
                try:
                    self._step(requests)
                finally:
                    self._lock.acquire()
                    self._busy = False
                    for done in requests:
                        if done.done:
                            self._pending.pop(done.seq, None)
                    self._lock.notify_all()
        if request.error is not None:
            raise request.error
        assert request.logits is not None
        return request.logits

    def _idle_context(self) -> None:
        # with the lock held: wait until no thread is in llama.cpp
        while self._busy:
            self._lock.wait()

    def _step(self, requests: list[_Request]) -> None:
        # one llama_decode of up to n_batch tokens, ongoing generations' tokens first; never raises: a
        # failure is every request's of the step, so no thread waits forever
        taken: list[tuple[_Request, int]] = []
        try:
            rows = self._fill(requests, taken)
            status = self._ll.llama_decode(self._ctx, self._batch)
            if status != 0:
                raise ModelError(f"llama_decode failed with status {status}")
            for request, count in taken:
                request.sent += count
            for request, row in rows:
                pointer = self._ll.llama_get_logits_ith(self._ctx, row)
                request.logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(
                    np.float32, copy=True
                )
                request.done = True
        except BaseException as exc:
            for request, _ in taken:
                request.error = exc
                request.done = True

    def _fill(
        self, requests: list[_Request], taken: list[tuple[_Request, int]]
    ) -> list[tuple[_Request, int]]:
        # the batch's rows; returns the requests whose last token is in it, with its row
        batch = self._batch
        rows: list[tuple[_Request, int]] = []
        n = 0
        for request in requests:
            count = min(len(request.tokens) - request.sent, self.n_batch - n)
            if count <= 0:
                continue
            last = request.sent + count == len(request.tokens)
            for j in range(count):
                at = request.sent + j
                batch.token[n] = request.tokens[at]
                batch.pos[n] = request.start + at
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = request.seq
                batch.logits[n] = last and j == count - 1
                n += 1
            taken.append((request, count))
            if last:
                rows.append((request, n - 1))
        batch.n_tokens = n
        return rows


class BatchedSequence(Model):
    """One sequence of a `BatchedContext`, with the `Model` API the generation loop uses."""

    def __init__(self, model: Model, owner: BatchedContext, seq: int) -> None:
        # The model's attributes (its library handle, weights, vocabulary, metadata) are shared as they
        # are; `Model` has no public constructor from loaded weights, so they are copied here.
        vars(self).update(vars(model))
        self._ctx = None  # the owner's context is used only through the owner
        self._owner = owner
        self.seq = seq
        self.n_ctx = owner.n_ctx_seq
        self.n_past = 0

    def reset(self) -> None:
        """Empty this sequence (a generation starts): the owner's steps wait for it until `release()`."""
        self._owner.begin(self.seq)
        self.n_past = 0

    def release(self) -> None:
        """The generation has ended: remove its cells; the other sequences' steps go on without it."""
        self._owner.release(self.seq)
        self.n_past = 0

    def truncate(self, n_tokens: int) -> None:
        """Not supported: a slot's sequence is decoded from its start by each generation."""
        raise ModelError("a batched sequence cannot be cut back")

    def decode(self, tokens: Sequence[int]) -> Logits:
        """Evaluate `tokens` after this sequence's, in the owner's next step; the logits after the last.

        Raises:
            ModelError: no tokens, the sequence would overflow, or llama.cpp fails to evaluate.
        """
        if not tokens:
            raise ModelError("nothing to evaluate")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ModelError(f"the context of {self.n_ctx} tokens is full")
        logits = self._owner.decode(self.seq, self.n_past, list(tokens))
        self.n_past += len(tokens)
        return logits

    def close(self) -> None:
        """Free the owner's context (idempotent; the weights are the model's)."""
        self._owner.close()
        self._model = None


def contexts(model: Model, n: int, *, threads: int) -> list[Model]:
    """The model itself for one slot; for n > 1, the n sequences of one batched context.

    Raises:
        ValueError: n < 1.
        ModelError: llama.cpp cannot create the context.
    """
    if n < 1:
        raise ValueError(f"--parallel must be at least 1, not {n}")
    if n == 1:
        return [model]
    return list(BatchedContext(model, n, threads=threads).sequences)

