"""llama.cpp itself, through llama-cpp-python's low-level API: the reference the oracle tests compare against.

Only tests and benchmarks import this module. Everything here calls the C library; nothing is copied
from a previous run. Two rules keep the test process alive, because llama.cpp aborts where constraintd
answers an error:
- `LlamaGrammar.accept` is only called with a token the current mask allows (llama.cpp throws across the
  C boundary otherwise, which aborts the process);
- a grammar llama.cpp refuses comes back as `None` from `LlamaGrammar.create` (the C API returns NULL).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
_LOG_CALLBACK = None


def quiet_logs() -> None:
    """Silence llama.cpp's logging (it writes every vocabulary load to stderr)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = ll.llama_log_callback(lambda level, text, user_data: None)
        ll.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


class LlamaVocab:
    """A GGUF loaded by llama.cpp with `vocab_only` (or fully, for a model): pieces, eog, tokenizer."""

    def __init__(self, path: str | Path, *, vocab_only: bool = True) -> None:
        quiet_logs()
        ll.llama_backend_init()
        params = ll.llama_model_default_params()
        params.vocab_only = vocab_only
        self.path = str(path)
        self.model = ll.llama_model_load_from_file(self.path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> LlamaVocab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def piece(self, token: int, *, special: bool = True) -> bytes:
        """`llama_token_to_piece(token, lstrip=0, special)`: the bytes the grammar sampler matches."""
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_token_to_piece(self.vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def pieces(self, *, special: bool = True) -> list[bytes]:
        return [self.piece(t, special=special) for t in range(self.n_vocab)]

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def eog_ids(self) -> frozenset[int]:
        return frozenset(t for t in range(self.n_vocab) if self.is_eog(t))

    def tokenize(self, text: bytes, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        size = len(text) + 16
        buf = (ll.llama_token * size)()
        n = ll.llama_tokenize(self.vocab, text, len(text), buf, size, add_special, parse_special)
        if n < 0:
            size = -n
            buf = (ll.llama_token * size)()
            n = ll.llama_tokenize(self.vocab, text, len(text), buf, size, add_special, parse_special)
        return list(buf[:n])


class LlamaGrammar:
    """llama.cpp's grammar sampler (plain or lazy) over a whole vocabulary."""

    def __init__(self, vocab: LlamaVocab, sampler: int) -> None:
        self.vocab = vocab
        self.sampler = sampler
        self._data = np.zeros(vocab.n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(vocab.n_vocab, dtype=np.int32)
        self._array = ll.llama_token_data_array(
            data=self._data.ctypes.data_as(ll.llama_token_data_p),
            size=vocab.n_vocab,
            selected=-1,
            sorted=False,
        )

    @classmethod
    def create(
        cls,
        vocab: LlamaVocab,
        text: str,
        *,
        root: str = "root",
        trigger_patterns: Sequence[str] = (),
        trigger_tokens: Sequence[int] = (),
    ) -> LlamaGrammar | None:
        """The sampler, or None where llama.cpp refuses the grammar."""
        if trigger_patterns or trigger_tokens:
            patterns = (ctypes.c_char_p * max(1, len(trigger_patterns)))(
                *[p.encode() for p in trigger_patterns]
            )
            tokens = (ll.llama_token * max(1, len(trigger_tokens)))(*trigger_tokens)
            sampler = ll.llama_sampler_init_grammar_lazy_patterns(
                vocab.vocab, text.encode(), root.encode(),
                patterns, len(trigger_patterns), tokens, len(trigger_tokens),
            )
        else:
            sampler = ll.llama_sampler_init_grammar(vocab.vocab, text.encode(), root.encode())
        if not sampler:
            return None
        return cls(vocab, sampler)

    def close(self) -> None:
        if self.sampler:
            ll.llama_sampler_free(self.sampler)
            self.sampler = 0

    def __enter__(self) -> LlamaGrammar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def allowed(self) -> npt.NDArray[np.bool_]:
        """One bool per token: True where the grammar sampler leaves the logit finite."""
        self._data["logit"] = 0.0
        self._data["p"] = 0.0
        self._array.size = self.vocab.n_vocab
        self._array.selected = -1
        self._array.sorted = False
        ll.llama_sampler_apply(self.sampler, ctypes.byref(self._array))
        # apply works in place on our buffer and never reorders it
        return np.isfinite(self._data["logit"])

    def accept(self, token: int) -> None:
        """Advance; only call with a token `allowed()` just allowed (llama.cpp aborts otherwise)."""
        ll.llama_sampler_accept(self.sampler, token)


def pack(allowed: npt.NDArray[np.bool_]) -> npt.NDArray[np.int32]:
    """A bool-per-token array in constraintd's packed layout (bit j % 32 of word j // 32)."""
    n_words = (allowed.size + 31) // 32
    bits = np.zeros(n_words * 32, dtype=np.uint8)
    bits[: allowed.size] = allowed
    return np.packbits(bits, bitorder="little").view("<u4").astype(np.int32, copy=False)


def candidates(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.void]:
    """Every token as llama.cpp's `llama_token_data` (id, logit, p = 0), in vocabulary order, unsorted: what
    `llama_sampler_sample` builds from a context's logits."""
    data = np.zeros(logits.size, dtype=_TOKEN_DATA)
    data["id"] = np.arange(logits.size, dtype=np.int32)
    data["logit"] = logits
    return data


class LlamaSamplerChain:
    """llama.cpp's own sampler chain (`llama_sampler_chain_init` + `llama_sampler_init_*`).

    Built from a list of (name, arguments) steps, named after llama.cpp's constructors:
    `("top_k", (k,))`, `("top_p", (p, min_keep))`, `("min_p", (p, min_keep))`, `("typical", (p, min_keep))`,
    `("temp", (t,))`, `("temp_ext", (t, delta, exponent))`, `("penalties", (n_vocab, last_n, repeat, freq,
    present))`, `("logit_bias", (n_vocab, [(token, bias), ...]))`, `("greedy", ())`, `("dist", (seed,))`.
    `sample(logits)` applies the chain to every token (ids in vocabulary order, unsorted, as
    `llama_sampler_sample` builds them) and returns the selected id without accepting it.
    """

    def __init__(self, steps: Sequence[tuple[str, tuple[object, ...]]]) -> None:
        quiet_logs()
        self.chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        self._keep: list[object] = []
        for name, args in steps:
            if name == "logit_bias":
                n_vocab, biases = args
                entries = (ll.llama_logit_bias * max(1, len(biases)))(
                    *[ll.llama_logit_bias(token, bias) for token, bias in biases]
                )
                self._keep.append(entries)
                sampler = ll.llama_sampler_init_logit_bias(n_vocab, len(biases), entries)
            else:
                sampler = getattr(ll, f"llama_sampler_init_{name}")(*args)
            ll.llama_sampler_chain_add(self.chain, sampler)
        self._data = np.zeros(0, dtype=_TOKEN_DATA)

    def close(self) -> None:
        if self.chain:
            ll.llama_sampler_free(self.chain)
            self.chain = None

    def __enter__(self) -> LlamaSamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, logits: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.void], int]:
        """Apply the chain; the candidates it leaves (id, logit, p) and the selected position."""
        self._data = candidates(logits)
        size, selected = self.apply_to(self._data)
        return self._data[:size].copy(), selected

    def apply_to(self, data: npt.NDArray[np.void]) -> tuple[int, int]:
        """Apply the chain to candidates built by `candidates`, in place (llama.cpp's own work on a draw,
        without the Python that builds them); how many it leaves and the selected position."""
        array = ll.llama_token_data_array(
            data=data.ctypes.data_as(ll.llama_token_data_p), size=data.size, selected=-1, sorted=False,
        )
        ll.llama_sampler_apply(self.chain, ctypes.byref(array))
        return int(array.size), int(array.selected)

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        data, selected = self.apply(logits)
        return int(data["id"][selected])

    def accept(self, token: int) -> None:
        ll.llama_sampler_accept(self.chain, token)

    def seed(self) -> int:
        return int(ll.llama_sampler_get_seed(self.chain))


def grammar_allows(grammar: LlamaGrammar, token: int) -> bool:
    """llama-server's check of one drawn token: the grammar sampler applied to that token alone."""
    data = np.zeros(1, dtype=_TOKEN_DATA)
    data["id"] = token
    data["logit"] = 1.0
    array = ll.llama_token_data_array(
        data=data.ctypes.data_as(ll.llama_token_data_p), size=1, selected=-1, sorted=False
    )
    ll.llama_sampler_apply(grammar.sampler, ctypes.byref(array))
    return bool(np.isfinite(data["logit"][0]))
