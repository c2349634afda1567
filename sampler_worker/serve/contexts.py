# Contexts for the server's parallel generations: one loaded model; with n > 1 slots, ONE llama.cpp context
# holding n sequences, decoded together as llama-server's slots are.
#
# Contract:
# - `contexts(model, 1)` is `[model]`: one slot is the model's own context, decoded by the generation loop
#   (`sampler_worker.generate`) as `sampler-worker generate` decodes it, so its tokens are the command's.
# - `contexts(model, n > 1, threads=t, groups=k)` gives n `Slot`s over min(n, k) `BatchedContext`s, each
#   with t // min(n, k) threads (at least one) and `n_seq_max` of its share of the n sequences. A context's
#   sequences share one unified KV cache of n times the model's `n_ctx` cells, each sequence held to the
#   model's `n_ctx` (the stepping thread refuses a token past it). k = 1 (the default) is llama-server's
#   layout: one context over every thread, one decode a step for all sequences, which is where batching
#   pays (a matrix product over four rows costs far less than four over one). k > 1 is for
#   cores shared with other work: ggml's threads meet at a barrier after every operation of a decode, and a
#   descheduled thread stalls the others there (on a loaded two-core machine a 4-sequence decode on two
#   threads took up to seconds); one-thread contexts have no barrier, and two contexts' steppers overlap
#   one's sampling with the other's decode.
#   Slots come interleaved over the contexts (slot i in context i % k). A slot has the model's tokenizer
#   and metadata (what a prompt needs); its generations are stepped by its context's `Lockstep` thread
#   (`sampler_worker.serve.lockstep`).
# - `BatchedContext.decode(rows)` is used by that one thread only: no two threads call llama.cpp on the
#   context at once. It puts every row's tokens in one `llama_batch` and calls `llama_decode` once, and
#   llama.cpp computes them as ONE graph (up to `n_batch` tokens), whatever the rows' order, the gaps
#   between their sequence ids, and a prompt's tokens among the others. That is why the cache is unified
#   (llama-server's default for its automatic slots): with a cache per sequence, llama.cpp splits a batch
#   into "equal" micro-batches of one token count per sequence and of consecutive, increasing sequence ids,
#   one graph each, so four one-token rows in the order 1, 0, 2, 3 cost two forward passes (a one-off
#   timing: about 90 ms on Gemma 3 270M on two cores, against 55 ms in order), and a prompt beside them
#   one more. The price, as
#   llama-server pays it: a token's attention runs over the cells of every sequence up to the highest one
#   in use (the others' masked out), not over its own sequence's alone; with long contexts on many slots
#   that grows, where the matrix products of a small context do not.
# - `clear(seq)` removes a sequence's KV cells, so a slot is reused empty.
# - Batching changes the float reductions (the matrix products see another batch shape), so a sequence's
#   logits, and so its tokens, may differ from those of the same request run alone.
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sampler_worker.model import Model, ModelError

__all__ = ["BatchedContext", "Row", "Slot", "contexts"]

Logits = npt.NDArray[np.float32]


class Row:
    """Tokens of one sequence for a batch: `tokens` at positions `start...`; logits wanted after the last.

    Attributes:
        seq: the sequence.
        start: the position of the first token.
        tokens: the tokens.
        logits: whether the logits after the last token are wanted.
    """

    __slots__ = ("logits", "seq", "start", "tokens")

    def __init__(self, seq: int, start: int, tokens: Sequence[int], *, logits: bool) -> None:
        self.seq = seq
        self.start = start
        self.tokens = tokens
        self.logits = logits


class BatchedContext:
    """One llama.cpp context of n sequences over a loaded model, decoded together.

    Args:
        model: the loaded model (its weights and vocabulary are used; its own context is not).
        n: the sequences.
        threads: llama.cpp's threads for the context.

    Raises:
        ModelError: llama.cpp cannot create the context.
    """

    def __init__(self, model: Model, n: int, *, threads: int) -> None:
        self._ll = ll = model._ll
        self._ctx = ll.llama_init_from_model(model._model, self._params(model, n, threads))
        if not self._ctx:
            raise ModelError(
                f"{model.path}: llama.cpp could not create a context of {n} sequences of {model.n_ctx} tokens"
            )
        self.n = n
        self.n_ctx_seq = model.n_ctx  # each sequence's share of the unified cache
        self.n_batch = model.n_batch
        self.n_vocab = model.n_vocab
        self._batch: Any = ll.llama_batch_init(model.n_batch, 0, 1)
        self._memory = ll.llama_get_memory(self._ctx)

    def _params(self, model: Model, n: int, threads: int) -> Any:
        # llama.cpp's context parameters: one unified cache of n sequences of the model's n_ctx
        params = self._ll.llama_context_default_params()
        params.n_ctx = model.n_ctx * n
        params.n_seq_max = n
        params.kv_unified = True  # one graph a decode, whatever the rows (the module's comment)
        params.n_batch = params.n_ubatch = model.n_batch
        params.n_threads = params.n_threads_batch = threads
        return params

    def close(self) -> None:
        """Free the context (idempotent; the weights are the model's)."""
        if self._ctx:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None

    def clear(self, seq: int) -> None:
        """Remove every cell of the sequence."""
        self._ll.llama_memory_seq_rm(self._memory, seq, -1, -1)

    def decode(self, rows: Sequence[Row]) -> list[Logits | None]:
        """Evaluate the rows in one `llama_decode`; the logits after each row's last token, if wanted.

        Raises:
            ModelError: more than `n_batch` tokens, or llama.cpp fails to evaluate.
        """
        batch = self._batch
        n = 0
        wanted: list[int] = []
        for row in rows:
            count = len(row.tokens)
            if n + count > self.n_batch:
                raise ModelError(f"a batch holds at most {self.n_batch} tokens")
            for j, token in enumerate(row.tokens):
                batch.token[n] = token
                batch.pos[n] = row.start + j
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = row.seq
                batch.logits[n] = row.logits and j == count - 1
                n += 1
            wanted.append(n - 1 if row.logits else -1)
        batch.n_tokens = n
        status = self._ll.llama_decode(self._ctx, batch)
        if status != 0:
            raise ModelError(f"llama_decode failed with status {status}")
        out: list[Logits | None] = []
        for index in wanted:
            if index < 0:
                out.append(None)
                continue
            pointer = self._ll.llama_get_logits_ith(self._ctx, index)
            out.append(np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32, copy=True))
        return out


class Slot:
    """One sequence of a `BatchedContext`: the model's tokenizer and metadata, and the sequence's id.

    Attributes:
        seq: the sequence.
        batched: the context it is a sequence of.
        n_ctx: tokens the sequence holds.
    """

    def __init__(self, model: Model, batched: BatchedContext, seq: int) -> None:
        self.model = model
        self.batched = batched
        self.seq = seq
        self.n_ctx = batched.n_ctx_seq
        self.chat_template = model.chat_template
        self.bos_text = model.bos_text
        self.eos_text = model.eos_text
        self.add_bos = model.add_bos
        self.add_eos = model.add_eos

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """The model's tokenizer (see `Model.tokenize`)."""
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def piece(self, token: int, *, special: bool = True) -> bytes:
        """The token's text (see `Model.piece`)."""
        return self.model.piece(token, special=special)


def contexts(model: Model, n: int, *, threads: int, groups: int = 1) -> list[Model] | list[Slot]:
    """The model itself for one slot; for n > 1, the n sequences of min(n, groups) batched contexts.

    Raises:
        ValueError: n < 1, or groups < 1.
        ModelError: llama.cpp cannot create a context.
    """
    if n < 1:
        raise ValueError(f"--parallel must be at least 1, not {n}")
    if groups < 1:
        raise ValueError(f"--contexts must be at least 1, not {groups}")
    if n == 1:
        return [model]
    groups = min(n, groups)
    made: list[BatchedContext] = []
    try:
        for group in range(groups):
            size = n // groups + (1 if group < n % groups else 0)
            made.append(BatchedContext(model, size, threads=max(1, threads // groups)))
    except BaseException:
        for batched in made:
            batched.close()
        raise
    return [Slot(model, made[i % groups], i // groups) for i in range(n)]
