# The engines the mask benchmark measures, behind one small interface: constraintd, llama.cpp's grammar
# sampler, XGrammar and llguidance, all built from the same vocabulary pieces and end-of-generation set.
#
# Contract:
# - `Engine.start(gbnf, schema)` compiles a grammar and returns a `Cursor` at its start, with the form the
#   engine was given: the GBNF text itself (XGrammar's parser needs an empty alternative written as `""`,
#   a rewrite of the notation only), or the JSON schema where the engine refuses that GBNF. `Refused` is
#   raised where it takes neither. A peer built `native` is given the JSON schema always (its own
#   converter, as its users would call it); its name carries NATIVE_SUFFIX.
# - `Cursor.compute_mask()` is the timed part: one whole-vocabulary mask in the engine's own output form
#   (a packed buffer; for llama.cpp, logits set to -inf by `llama_sampler_apply`). `mask_words()` turns the
#   last one into constraintd's packed layout and is not timed. `allows` leaves the state as it was
#   (None where the engine has no such question); `accept` advances.
# - The llama.cpp cursor is only ever given a token its last mask allowed: llama.cpp aborts otherwise.
# - XGrammar and llguidance are imported only when asked for, so the benchmark runs without them.
from __future__ import annotations

import contextlib
import ctypes
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

from constraintd.engine import Grammar, Matcher, Vocab, allocate_masks
from constraintd.engine.masks.warm import warm_vocabulary
from constraintd.errors import ConstraintdError
from tests.oracle import LlamaVocab, pack

Words = npt.NDArray[np.int32]

CONSTRAINTD: Final = "constraintd"
LLAMA_CPP: Final = "llama.cpp"
XGRAMMAR: Final = "XGrammar"
LLGUIDANCE: Final = "llguidance"

GBNF: Final = "GBNF"
JSON_SCHEMA: Final = "JSON schema"
NATIVE_SUFFIX: Final = " (schema)"  # a peer given the JSON schema, compiled by its own converter

# llama.cpp's llama_token_data, laid out as the C struct
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
# a rule whose first alternative is empty (`space ::= | " " | ...`): XGrammar wants `""` there
_EMPTY_FIRST_ALTERNATIVE = re.compile(r"(?m)^([A-Za-z0-9_-]+ ::=)[ \t]*\|")


class Refused(Exception):
    """The engine takes neither the GBNF nor the JSON schema."""


class Cursor(Protocol):
    def compute_mask(self) -> None: ...
    def mask_words(self) -> Words: ...
    def allows(self, token: int) -> bool | None: ...
    def accept(self, token: int) -> bool: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...


class Engine(Protocol):
    name: str
    setup_seconds: float

    def start(self, gbnf: str, schema: str) -> tuple[Cursor, str]: ...


def _words(n_vocab: int) -> Words:
    return np.zeros((n_vocab + 31) // 32, dtype=np.int32)


# -- constraintd ------------------------------------------------------------------------------------


class ConstraintdCursor:
    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.matcher = Matcher(grammar)
        self.words = allocate_masks(1, grammar.n_vocab)  # a batch of one, as the peers' buffers

    def compute_mask(self) -> None:
        self.matcher.fill_mask(self.words, 0)

    def mask_words(self) -> Words:
        return self.words[0]

    def allows(self, token: int) -> bool | None:
        return self.matcher.allows(token)

    def accept(self, token: int) -> bool:
        return self.matcher.accept(token)

    def reset(self) -> None:
        self.matcher.reset()

    def close(self) -> None:
        pass


class ConstraintdEngine:
    name = CONSTRAINTD

    def __init__(self, vocab: Vocab) -> None:
        started = time.perf_counter()
        self.vocab = vocab
        # the per-vocabulary tables are built once and shared by every grammar, and the verdicts of the
        # rules every converted schema repeats are warmed, as a server does when it registers a vocabulary
        warm_vocabulary(vocab)
        self.setup_seconds = time.perf_counter() - started

    def start(self, gbnf: str, schema: str) -> tuple[Cursor, str]:
        try:
            return ConstraintdCursor(Grammar.from_gbnf(gbnf, self.vocab)), GBNF
        except ConstraintdError as exc:
            raise Refused(str(exc)) from exc


def constraintd_cache(cursor: Cursor) -> tuple[int, int, int, int]:
    """What constraintd's caches hold after a grammar's walks: (bytes of the grammar's finished masks,
    its interned states, bytes of the vocabulary's shared verdicts and of its table's run ends, the
    verdicts' count).

    Arrays only, not the dicts and objects around them (`MaskCache.nbytes`, `SharedVerdicts.nbytes`,
    `ColumnTable.run_end_bytes`).
    """
    assert isinstance(cursor, ConstraintdCursor)
    grammar = cursor.grammar
    masks = grammar._masks
    shared = masks.shared.nbytes + grammar._decoded.fresh_table().run_end_bytes
    return masks.nbytes, len(grammar._states), shared, len(masks.shared)


# -- llama.cpp ----------------------------------------------------------------------------------------


class LlamaCursor:
    """llama.cpp's grammar sampler over every token (`llama_sampler_apply`), and over one for `allows`."""

    def __init__(self, vocab: LlamaVocab, sampler: Any) -> None:
        self.n_vocab = vocab.n_vocab
        self.sampler = sampler
        self._all = np.zeros(self.n_vocab, dtype=_TOKEN_DATA)
        self._all["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._all_array = ll.llama_token_data_array(
            data=self._all.ctypes.data_as(ll.llama_token_data_p), size=self.n_vocab, selected=-1, sorted=False
        )
        # common_sampler_sample checks a drawn token by applying the grammar to it alone
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._one_array = ll.llama_token_data_array(
            data=self._one.ctypes.data_as(ll.llama_token_data_p), size=1, selected=-1, sorted=False
        )

    def compute_mask(self) -> None:
        self._all["logit"] = 0.0
        self._all_array.size = self.n_vocab
        ll.llama_sampler_apply(self.sampler, ctypes.byref(self._all_array))

    def mask_words(self) -> Words:
        return pack(np.isfinite(self._all["logit"]))

    def allows(self, token: int) -> bool | None:
        self._one["id"][0] = token
        self._one["logit"][0] = 0.0
        self._one_array.size = 1
        ll.llama_sampler_apply(self.sampler, ctypes.byref(self._one_array))
        return bool(np.isfinite(self._one["logit"][0]))

    def accept(self, token: int) -> bool:
        ll.llama_sampler_accept(self.sampler, token)
        return True

    def reset(self) -> None:
        ll.llama_sampler_reset(self.sampler)

    def close(self) -> None:
        if self.sampler:
            ll.llama_sampler_free(self.sampler)
            self.sampler = None


class LlamaEngine:
    name = LLAMA_CPP
    setup_seconds = 0.0  # the vocabulary is loaded anyway, to tokenize the documents

    def __init__(self, vocab: LlamaVocab) -> None:
        self.vocab = vocab

    def start(self, gbnf: str, schema: str) -> tuple[Cursor, str]:
        sampler = ll.llama_sampler_init_grammar(self.vocab.vocab, gbnf.encode(), b"root")
        if not sampler:
            raise Refused("llama_sampler_init_grammar returned NULL")
        return LlamaCursor(self.vocab, sampler), GBNF


# -- XGrammar -----------------------------------------------------------------------------------------


class XGrammarCursor:
    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self.matcher = matcher
        self.words = _words(n_vocab).reshape(1, -1)

    def compute_mask(self) -> None:
        self.matcher.fill_next_token_bitmask(self.words)

    def mask_words(self) -> Words:
        row: Words = self.words[0]
        return row

    def allows(self, token: int) -> bool | None:
        return None  # no question that leaves the matcher as it was; accept_token refuses without a change

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    def reset(self) -> None:
        self.matcher.reset()

    def close(self) -> None:
        pass


class XGrammarEngine:
    """XGrammar on raw byte pieces, its compiler on one thread as every other engine here.

    `native`: compile the JSON schema with XGrammar's own converter instead of the GBNF.
    """

    def __init__(self, pieces: Sequence[bytes], eog: Sequence[int], *, native: bool = False) -> None:
        import xgrammar

        started = time.perf_counter()
        self.name = XGRAMMAR + NATIVE_SUFFIX if native else XGRAMMAR
        self.native = native
        self.xgr: Any = xgrammar
        self.n_vocab = len(pieces)
        info = xgrammar.TokenizerInfo(
            list(pieces), xgrammar.VocabType.RAW, vocab_size=len(pieces), stop_token_ids=list(eog)
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.setup_seconds = time.perf_counter() - started

    def start(self, gbnf: str, schema: str) -> tuple[Cursor, str]:
        xgr = self.xgr
        compiled = None
        if not self.native:
            try:
                grammar = xgr.Grammar.from_ebnf(_EMPTY_FIRST_ALTERNATIVE.sub(r'\1 "" |', gbnf))
                compiled, form = self.compiler.compile_grammar(grammar), GBNF
            except RuntimeError:
                pass
        if compiled is None:
            try:
                compiled = self.compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
            except RuntimeError as exc:
                raise Refused(str(exc)) from exc
            form = JSON_SCHEMA
        return XGrammarCursor(xgr.GrammarMatcher(compiled), self.n_vocab), form


# -- llguidance ---------------------------------------------------------------------------------------


class LlguidanceCursor:
    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self.matcher = matcher
        self.words = _words(n_vocab)

    def compute_mask(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)

    def mask_words(self) -> Words:
        return self.words

    def allows(self, token: int) -> bool | None:
        return bool(self.matcher.validate_tokens([token]) == 1)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.consume_token(token))

    def reset(self) -> None:
        self.matcher.reset()

    def close(self) -> None:
        pass


class _Pieces:
    # what llguidance's TokenizerWrapper reads: the pieces, end of sequence, and a tokenizer
    def __init__(self, pieces: Sequence[bytes], eos: int, tokenize: Callable[[bytes], list[int]]) -> None:
        self.tokens = list(pieces)
        self.eos_token_id = eos
        self.bos_token_id = None
        self._tokenize = tokenize

    def __call__(self, text: bytes | str) -> list[int]:
        return self._tokenize(text if isinstance(text, bytes) else text.encode())


class LlguidanceEngine:
    """llguidance on the same pieces (`native`: its own JSON schema compiler instead of the GBNF)."""

    def __init__(
        self,
        pieces: Sequence[bytes],
        eog: Sequence[int],
        tokenize: Callable[[bytes], list[int]],
        *,
        native: bool = False,
    ) -> None:
        import llguidance

        started = time.perf_counter()
        self.name = LLGUIDANCE + NATIVE_SUFFIX if native else LLGUIDANCE
        self.native = native
        self.llg: Any = llguidance
        self.n_vocab = len(pieces)
        wrapper = llguidance.TokenizerWrapper(_Pieces(pieces, eog[0], tokenize))
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=len(pieces), eos_token=list(eog))
        self.setup_seconds = time.perf_counter() - started

    def start(self, gbnf: str, schema: str) -> tuple[Cursor, str]:
        llg = self.llg
        matcher = None
        if not self.native:
            with contextlib.suppress(ValueError):  # the GBNF-to-Lark conversion failed
                lark = llg.grammar_from("gbnf", gbnf)
                matcher, form = llg.LLMatcher(self.tokenizer, lark, log_level=0), GBNF
        if matcher is None or matcher.is_error():
            native = llg.grammar_from("json_schema", schema)
            matcher, form = llg.LLMatcher(self.tokenizer, native, log_level=0), JSON_SCHEMA
            if matcher.is_error():
                raise Refused(matcher.get_error())
        return LlguidanceCursor(matcher, self.n_vocab), form


def load_peers(
    pieces: Sequence[bytes],
    eog: Sequence[int],
    tokenize: Callable[[bytes], list[int]],
    *,
    inputs: Sequence[str] = (GBNF, JSON_SCHEMA),
) -> tuple[list[Engine], list[str]]:
    """XGrammar and llguidance, given the GBNF and/or the JSON schema; a note for each that is missing."""
    engines: list[Engine] = []
    missing: list[str] = []
    makers: tuple[tuple[str, Callable[[bool], Engine]], ...] = (
        (XGRAMMAR, lambda native: XGrammarEngine(pieces, eog, native=native)),
        (LLGUIDANCE, lambda native: LlguidanceEngine(pieces, eog, tokenize, native=native)),
    )
    for name, make in makers:
        try:
            engines.extend(make(form == JSON_SCHEMA) for form in inputs)
        except ImportError as exc:
            missing.append(f"{name} not installed ({exc})")
    return engines, missing
