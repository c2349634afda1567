# Contexts for the server's parallel generations: one loaded model, one llama.cpp context per slot.
#
# Contract:
# - `contexts(model, n)` gives n objects with the whole `Model` API (decode, reset, tokenize, piece, ...):
#   the model itself, then n - 1 `SharedContext`s that use its weights and vocabulary and own only a
#   llama.cpp context (its KV cache) of the same size. Weights are loaded once.
# - Each context is used by one thread at a time (the server hands a context to one generation and
#   takes it back when that generation's thread has ended); llama.cpp allows separate contexts of one
#   model to decode at once, and ctypes releases the GIL during `llama_decode`.
# - Threads: with n contexts decoding at once, each gets its share of the model's threads (at least one),
#   so n generations do not contend for more cores than one would use.
# - `SharedContext.close()` frees only its context; the weights are freed by the model's own close, after
#   every shared context is closed.
# Not done: llama.cpp's own batching (one context, n sequences, one decode per step for all of them):
# the generation loop (`generate`) decodes one sequence at a time.
from __future__ import annotations

from sampler_worker.model import Model, ModelError

__all__ = ["SharedContext", "contexts"]


class SharedContext(Model):
    """Another llama.cpp context over a loaded model's weights."""

    def __init__(self, model: Model, *, n_threads: int) -> None:
        # The model's attributes (its library handle, weights, vocabulary, metadata) are shared as they
        # are; `Model` has no public constructor from loaded weights, so they are copied here.
        vars(self).update(vars(model))
        ll = self._ll
        params = ll.llama_context_default_params()
        params.n_ctx = model.n_ctx
        params.n_batch = params.n_ubatch = model.n_batch
        params.n_threads = params.n_threads_batch = n_threads
        self._ctx = ll.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise ModelError(
                f"{self.path}: llama.cpp could not create another context of {model.n_ctx} tokens"
            )
        self.n_past = 0

    def close(self) -> None:
        """Free this context only (the weights are the model's)."""
        if getattr(self, "_ctx", None):
            self._ll.llama_free(self._ctx)
            self._ctx = None
        self._model = None


def _set_threads(model: Model, n_threads: int) -> None:
    model._ll.llama_set_n_threads(model._ctx, n_threads, n_threads)


def contexts(model: Model, n: int, *, threads: int) -> list[Model]:
    """The model's own context and n - 1 more over its weights, each with `threads // n` threads (>= 1).

    Raises:
        ValueError: n < 1.
        ModelError: llama.cpp cannot create a context.
    """
    if n < 1:
        raise ValueError(f"--parallel must be at least 1, not {n}")
    if n == 1:
        return [model]
    share = max(1, threads // n)
    _set_threads(model, share)
    made: list[Model] = [model]
    try:
        for _ in range(n - 1):
            made.append(SharedContext(model, n_threads=share))
    except BaseException:
        for context in made[1:]:
            context.close()
        raise
    return made
