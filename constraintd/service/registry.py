# The registry: vocabularies and compiled grammars, content-addressed and shared by every session.
#
# Invariants:
# - A vocabulary's id is its content hash: registering the same content twice (from pieces or from a GGUF
#   file) gives the same id and the same `Vocab` object. A GGUF file is read once per (path, size, mtime);
#   with a vocabulary store (`--cache-dir`), a vocabulary prepared there is loaded instead of read, and
#   one read is saved there (vocab_store.py: never a stale or damaged file, never an error to not save).
#   With `warm_seconds`, a new vocabulary's shared JSON verdicts are warmed (engine/masks/warm.py) before the
#   registration returns, so its first sessions' masks find them. Either way its decoded pieces (what
#   every grammar over it reads) are built at registration, not inside its first compile.
# - A GGUF file named by a caller is read only if it is a regular file (checked on the open descriptor,
#   before a byte is read: no FIFO, device or socket), under an allowed directory once symbolic links and
#   `..` are resolved, within `max_gguf_bytes`, and starts with GGUF's magic number. Every refusal of a path
#   answers the same message (a caller learns nothing of what exists outside the allowed directories), and
#   no refusal quotes the file's content. The server allows the directories it is given (none: no path);
#   the in-process client, whose caller could read any of its own files, passes no list: any path.
#   Whoever can write into an allowed directory can swap a file between the check and the read: the
#   directories are the operator's.
# - Two content-addressed caches: a constraint as asked (kind, text, root, triggers, vocabulary hash) ->
#   its compiled constraint; and a grammar (GBNF text, root, triggers, vocabulary hash) -> its compiled
#   `Grammar`, so constraints that resolve to the same GBNF (JSON mode asked three ways, a schema sent
#   as a schema and inside a request) share one compiled grammar. A constraint refused (an InputError:
#   GrammarError, SchemaError, a chat request refused; the same answer every time) is remembered too, and
#   asking again raises the same error without compiling: a large refused schema sent in a loop costs one
#   compile, a refused chat request one resolution. One key is worked on
#   once even when many callers ask at the same time (they wait for the first). The caches are the
#   engine's `LruCache` (engine/lru.py), under the registry's lock; a session keeps its own reference,
#   so dropping never harms a running session.
# - The caches are bounded by bytes as well as by count: together they hold at most
#   `max_grammar_cache_bytes` as their entries measure themselves (`Grammar.nbytes`: what was compiled,
#   the masks and states learned since; a refusal: its message and parts), and at most `max_grammars`
#   entries each. A grammar is charged once, in the grammar cache; a compiled constraint is charged its
#   own few bytes and goes when its grammar goes (nothing the bound lets go is kept alive by the other
#   cache), and a grammar alone over the bound is not kept at all. Grammars grow while serving (within
#   their own masks' and states' bounds): they are measured again at every compile, and the least
#   recently used go until the total fits (`cache_bytes` says the total now).
# - A refusal keeps only what answering it again needs: the error's class, its message and its parts
#   (never its traceback, cause or context, nor an attribute past its parts: nothing that holds the
#   parsed grammar or another intermediate object of the compile).
# - A vocabulary owns what is derived from it (its decoded pieces, the verdicts its grammars share): the
#   registry keeps one `Vocab` per content, so every grammar on that content shares them.
# - At most `max_vocabs` are registered. When a new one needs a slot, the least recently used vocabulary
#   (registered or looked up) that no open session uses is released (`watch_sessions` says which are
#   used); when every one is used, the registration fails (LimitError). So the bound holds memory without
#   locking out new vocabularies until a restart.
# - A compile is two halves. The first needs no vocabulary: the constraint's conversion to GBNF, the GBNF
#   parse, its checks and the flattened rules (`constraints.prepare`): nearly all of a large schema's
#   compile (the service benchmark's largest schemas: 50 to 170 ms each). Given a process pool, it runs in
#   a worker process, so it does not contend for this process's GIL, and a compile past its time limit is
#   stopped there (DeadlineError). The second builds the `Grammar` over the vocabulary, here: under a
#   millisecond, after loading the first half's product (5 to 13 ms for those schemas, in one piece).
#   Without a pool (`processes=None`: the in-process client, or a server told to) both run in the calling
#   thread. Either way the result and the errors are the same.
# - Every method is safe to call from worker threads and the event loop at once (one lock guards the maps;
#   the slow work runs outside it). The registry never imports grpc or asyncio: the in-process client
#   transport uses it as it is.
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from stat import S_ISREG
from typing import Any, Generic, Protocol, TypeVar

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.grammar.gbnf import parse_gbnf
from constraintd.engine.lru import LruCache
from constraintd.engine.masks.warm import warm_vocabulary
from constraintd.engine.vocab.vocab import TokenizerRules, Vocab
from constraintd.errors import (
    ConstraintdError,
    InputError,
    LimitError,
    NotFoundError,
    VocabError,
)
from constraintd.service.chat import ChatSettings
from constraintd.service.constraints import Constraint, PreparedGrammar, prepare
from constraintd.service.limits import PATH_ECHO_CHARS, Limits, shown
from constraintd.service.log_events import fields
from constraintd.service.vocab_store import VocabStore

__all__ = ["CompiledConstraint", "Offload", "Registry"]

log = logging.getLogger("constraintd.server")

# A GGUF file's fixed header: magic, version, tensor and key counts.
GGUF_HEADER_BYTES = 24

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")


class Offload(Protocol):
    """Where the vocabulary-free half of a compile runs: the server's compile processes
    (`constraintd.server.processes.ProcessPool`); without one, the calling thread."""

    def run(self, function: Callable[..., R], *args: Any, what: str = ...) -> R:
        """Runs `function(*args)` elsewhere and returns its result, or raises its `ConstraintdError`."""
        ...


@dataclass(frozen=True, slots=True)
class CompiledConstraint:
    """A constraint made ready for sessions: its compiled grammar, what its conversion warned about, and a
    chat request's settings (service/chat.py)."""

    grammar: Grammar
    warnings: tuple[str, ...]
    chat: ChatSettings | None = None

    @property
    def own_bytes(self) -> int:
        """Bytes of this constraint's own parts (its warnings, a chat request's settings), its grammar's not
        counted."""
        chat = 0 if self.chat is None else self.chat.nbytes
        return (sys.getsizeof(self) + sys.getsizeof(self.warnings) + sum(map(sys.getsizeof, self.warnings))
                + chat)

    @property
    def nbytes(self) -> int:
        """An estimate of the bytes it holds: its grammar's (`Grammar.nbytes`) and its own."""
        return self.grammar.nbytes + self.own_bytes


# Bad input is refused the same way every time for the same key (the key holds all a compile reads): a
# grammar (GrammarError), a schema or request (SchemaError), a chat request (InputError: a template that
# does not render, a tool_choice that names no tool, what is not ported, a request that asks for free text).
Refusal = InputError


def _kept(error: Refusal) -> Refusal:
    # the error again from its class, message and parts alone: no traceback (and the frames that hold
    # the parsed grammar), no cause or context, no attribute past its parts
    args = tuple(arg if isinstance(arg, str) else str(arg) for arg in error.args)
    return type(error).rebuilt(args, {name: getattr(error, name) for name in error.PARTS})


def _refusal_bytes(error: ConstraintdError) -> int:
    parts = vars(error)
    return (
        sys.getsizeof(error)
        + sys.getsizeof(error.args)
        + sum(map(sys.getsizeof, error.args))
        + sys.getsizeof(parts)
        + sum(sys.getsizeof(value) for value in parts.values())
    )


class _Once(Generic[K, V]):
    """Keys being computed right now: the first caller computes, the others wait for its result."""

    def __init__(self) -> None:
        self._pending: dict[K, Future[V]] = {}

    def run(self, lock: threading.Lock, key: K, compute: Callable[[], V]) -> V:
        with lock:
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                pending = self._pending[key] = Future()
        if not owner:
            return pending.result()
        try:
            value = compute()
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        else:
            pending.set_result(value)
            return value
        finally:
            with lock:
                del self._pending[key]


class Registry:
    """Vocabularies by content hash, and the shared cache of compiled grammars."""

    def __init__(
        self,
        limits: Limits,
        *,
        gguf_dirs: Sequence[Path] | None = None,
        vocab_store: VocabStore | None = None,
        warm_seconds: float = 0.0,
        processes: Offload | None = None,
    ) -> None:
        self._limits = limits
        self._processes = processes
        self._warm_seconds = warm_seconds
        # None: any path (the in-process client reads its own process's files); empty: no path at all
        self._gguf_dirs = None if gguf_dirs is None else tuple(Path(d).resolve() for d in gguf_dirs)
        self._refusal = (
            "no such regular file"
            if self._gguf_dirs is None
            else "no such regular file in the directories this server reads vocabularies from"
            if self._gguf_dirs
            else "this server reads no GGUF files (it was started without --gguf-dir)"
        )
        self._store = vocab_store
        self._lock = threading.Lock()
        # least recently registered or looked up first: the order a slot is taken back in
        self._vocabs: OrderedDict[str, Vocab] = OrderedDict()
        self._in_use: Callable[[str], bool] = lambda vocab_hash: True
        self._gguf_hashes: dict[tuple[str, int, int], str] = {}
        bound, count = limits.max_grammar_cache_bytes, limits.max_grammars
        self._compiled: LruCache[str, CompiledConstraint] = LruCache(bound, max_entries=count)
        self._refused: LruCache[str, Refusal] = LruCache(bound, max_entries=count)
        self._grammars: LruCache[str, Grammar] = LruCache(bound, max_entries=count)
        self._loading: _Once[tuple[str, int, int], Vocab] = _Once()
        self._resolving: _Once[str, CompiledConstraint] = _Once()
        self._compiling: _Once[str, Grammar] = _Once()

    def watch_sessions(self, in_use: Callable[[str], bool]) -> None:
        """Tells the registry which vocabularies open sessions use (by content hash): those it keeps when
        a new vocabulary needs a slot. Until told, it keeps every vocabulary (a full registry refuses)."""
        self._in_use = in_use

    @property
    def vocab_count(self) -> int:
        return len(self._vocabs)

    @property
    def grammar_count(self) -> int:
        return len(self._grammars)

    @property
    def refused_count(self) -> int:
        return len(self._refused)

    @property
    def cache_bytes(self) -> int:
        """What the grammar caches hold now, as their entries measure themselves: the grammars (with the
        masks and states they learned since they were kept), the compiled constraints' own parts, the
        refusals. At most `max_grammar_cache_bytes` after every compile; it may grow past that between
        compiles as grammars learn, each within its own bounds. Walks the entries (a few hundred)."""
        with self._lock:
            return self._cache_bytes()

    def _cache_bytes(self) -> int:
        # under the lock
        grammars = sum(grammar.nbytes for _, grammar in self._grammars.items())
        return grammars + self._compiled.size + self._refused.size

    def vocab(self, vocab_id: str) -> Vocab:
        """The registered vocabulary with this id.

        Raises:
            NotFoundError: no vocabulary has this id (never registered, or the server restarted).
        """
        with self._lock:
            found = self._vocabs.get(vocab_id)
            if found is not None:
                self._vocabs.move_to_end(vocab_id)
                return found
        raise NotFoundError(f"unknown vocabulary {shown(vocab_id)}: register it first")

    def register_pieces(
        self,
        pieces: Sequence[bytes],
        eog_ids: Sequence[int],
        *,
        token_texts: Sequence[str] | None = None,
        token_attrs: Sequence[int] | None = None,
        tokenizer: TokenizerRules | None = None,
    ) -> Vocab:
        """Registers a vocabulary given token by token; slow for a large one (run it off the event loop).

        Raises:
            LimitError: too many tokens, a piece longer than `max_piece_bytes`, or too many vocabularies
                registered.
            VocabError: the pieces do not make a vocabulary.
        """
        self.check_size(len(pieces))
        self._check_pieces(pieces, "piece")
        self._check_pieces(token_texts or (), "token text")
        vocab = Vocab(pieces, eog_ids, token_texts=token_texts, token_attrs=token_attrs, tokenizer=tokenizer)
        return self._keep(vocab)

    def register_gguf(self, path: str | os.PathLike[str]) -> Vocab:
        """Registers the vocabulary of a GGUF file (read once per file version).

        Only a regular file is read, under one of the allowed directories once symbolic links and `..`
        are resolved (any path, for a registry given no list: the in-process client's own files), and
        no larger than `max_gguf_bytes`. Does not say why a path was refused (it may not exist, or not
        be allowed), and quotes nothing of a file that is not GGUF.

        Raises:
            VocabError: the path is not a file this registry may read, or not a GGUF vocabulary.
            LimitError: too many tokens or bytes, a piece longer than `max_piece_bytes`, or every
                vocabulary slot held by open sessions.
        """
        resolved, stat = self._gguf_file(os.fspath(path))
        key = (str(resolved), stat.st_size, stat.st_mtime_ns)
        known = self._gguf_hashes.get(key)
        if known is not None:
            with self._lock:
                found = self._vocabs.get(known)
                if found is not None:
                    self._vocabs.move_to_end(known)
                    return found

        def load() -> Vocab:
            vocab = self._read_gguf(resolved)
            self.check_size(len(vocab))
            self._check_pieces(vocab.pieces, "piece")
            kept = self._keep(vocab)
            with self._lock:
                self._gguf_hashes[key] = kept.content_hash
            return kept

        return self._loading.run(self._lock, key, load)

    def _gguf_file(self, path: str) -> tuple[Path, os.stat_result]:
        # One answer for every path refused, whatever the reason (the reason goes to the server's log):
        # a caller must not learn which files exist outside the allowed directories.
        refused = VocabError(f"cannot read GGUF file {shown(path, PATH_ECHO_CHARS)}: {self._refusal}")
        try:
            resolved = Path(os.path.expanduser(path)).resolve()
        except (OSError, ValueError, RuntimeError):  # too long, a NUL byte, a symbolic link loop
            self._log_refusal(path, "unresolvable")
            raise refused from None
        if self._gguf_dirs is not None and not any(resolved.is_relative_to(d) for d in self._gguf_dirs):
            self._log_refusal(path, "outside the allowed directories")
            raise refused
        # stat before opening: opening a FIFO blocks, a device (/dev/zero) never ends; O_NONBLOCK and
        # O_NOFOLLOW keep the open itself from blocking or following a link put there in between
        try:
            fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            self._log_refusal(path, exc.strerror or "cannot open")
            raise refused from None
        try:
            stat = os.fstat(fd)
            if not S_ISREG(stat.st_mode):
                self._log_refusal(path, "not a regular file")
                raise refused
            if stat.st_size > self._limits.max_gguf_bytes:
                limit = self._limits.max_gguf_bytes
                raise LimitError(
                    f"GGUF file {shown(path, PATH_ECHO_CHARS)} is over the limit of {limit} bytes"
                )
            # the magic number checked here, so a file that is not GGUF is refused without a byte of it
            # quoted (/proc/self/environ is a regular file of size 0: read nothing from it either)
            if stat.st_size < GGUF_HEADER_BYTES or os.pread(fd, 4, 0) != b"GGUF":
                raise VocabError(f"GGUF file {shown(path, PATH_ECHO_CHARS)} is not a GGUF file")
        except OSError as exc:
            self._log_refusal(path, exc.strerror or "cannot read")
            raise refused from None
        finally:
            os.close(fd)
        return resolved, stat

    def _log_refusal(self, path: str, reason: str) -> None:
        log.warning("GGUF path refused", extra=fields(path=shown(path, PATH_ECHO_CHARS), reason=reason))

    def _read_gguf(self, path: Path) -> Vocab:
        if self._store is None:
            return Vocab.from_gguf(path)
        started = time.perf_counter()
        opened = self._store.open_gguf(path)
        log.info(
            "vocabulary loaded" if opened.loaded_from is not None else "vocabulary read",
            extra=fields(
                gguf=str(path),
                tokens=len(opened.vocab),
                seconds=round(time.perf_counter() - started, 3),
                loaded_from=str(opened.loaded_from) if opened.loaded_from else None,
                saved_to=str(opened.saved_to) if opened.saved_to else None,
                notes=list(opened.notes),
            ),
        )
        return opened.vocab

    def cached(self, constraint: Constraint, vocab: Vocab) -> CompiledConstraint | None:
        """The compiled constraint if it is in the cache already; never compiles."""
        return self._recent(self._compiled, constraint.key(vocab.content_hash))

    def compile(self, constraint: Constraint, vocab: Vocab) -> CompiledConstraint:
        """The compiled constraint, from the cache or compiled now (slow: run it off the event loop).

        Raises:
            GrammarError, SchemaError: the constraint does not compile (with where).
            InputError: a request that asks for no constraint, or a chat request refused.
            DeadlineError: its worker process ran past the compile time limit (it is stopped).
            UnavailableError: its worker process died, or the pool is closed.
        """
        key = constraint.key(vocab.content_hash)
        found = self._recent(self._compiled, key)
        if found is not None:
            return found
        refused = self._recent(self._refused, key)
        if refused is not None:
            raise _kept(refused)

        def build() -> CompiledConstraint:
            try:
                prepared = self._prepare(constraint)
                grammar = self._grammar(prepared, vocab)
            except InputError as error:
                kept = _kept(error)
                with self._lock:
                    self._refused.put(key, kept, _refusal_bytes(kept))
                    self._fit()
                raise
            compiled = CompiledConstraint(grammar, prepared.resolved.warnings, prepared.resolved.chat)
            with self._lock:
                # not kept when its grammar was not (alone over the bound): it would keep it alive uncharged
                if self._grammars.peek(prepared.resolved.key(vocab.content_hash)) is grammar:
                    self._compiled.put(key, compiled, compiled.own_bytes)
                    self._fit()
            return compiled

        return self._resolving.run(self._lock, key, build)

    def _prepare(self, constraint: Constraint) -> PreparedGrammar:
        if self._processes is None:
            return prepare(constraint)
        return self._processes.run(prepare, constraint, what="compiling the constraint")

    def _grammar(self, prepared: PreparedGrammar, vocab: Vocab) -> Grammar:
        resolved = prepared.resolved
        key = resolved.key(vocab.content_hash)
        found = self._recent(self._grammars, key)
        if found is not None:
            return found

        def build() -> Grammar:
            # from_gbnf is parse_gbnf then Grammar(parsed, ..., source=text): with the parse done, the rest
            parsed = prepared.parsed
            if parsed is None:
                parsed = parse_gbnf(resolved.gbnf, token_id=vocab.token_for_text)
            patterns, tokens = resolved.triggers(vocab)  # a chat request's words made triggers here
            grammar = Grammar(
                parsed,
                vocab,
                root=resolved.root,
                trigger_patterns=patterns,
                trigger_tokens=tokens,
                source=resolved.gbnf,
                rules=prepared.rules,
            )
            with self._lock:
                self._fit(self._grammars.put(key, grammar, grammar.nbytes))
            return grammar

        return self._compiling.run(self._lock, key, build)

    def _recent(self, cache: LruCache[str, V], key: str) -> V | None:
        with self._lock:
            return cache.get(key)

    def _fit(self, dropped_now: Sequence[tuple[str, Grammar]] = ()) -> None:
        # Under the lock. The grammars measured again (they learn masks and states while serving), then the
        # least recently used go until the three caches together fit the bound: grammars first (and the
        # compiled constraints over them), refusals (a few hundred bytes each) when no grammar is left.
        # `dropped_now`: the grammars a put has just dropped.
        bound = self._limits.max_grammar_cache_bytes
        dropped = [*dropped_now, *self._grammars.remeasure(lambda grammar: grammar.nbytes)]
        while self._grammars.size + self._compiled.size + self._refused.size > bound:
            if len(self._grammars):
                dropped.extend(self._grammars.drop_oldest())
            elif self._refused.drop_oldest():
                continue
            else:
                break
        if dropped:
            gone = {id(grammar) for _, grammar in dropped}
            for key, compiled in self._compiled.items():
                if id(compiled.grammar) in gone:
                    self._compiled.pop(key)

    def _keep(self, vocab: Vocab) -> Vocab:
        key = vocab.content_hash
        with self._lock:
            known = self._vocabs.get(key)
            if known is not None:
                return known
            if len(self._vocabs) >= self._limits.max_vocabs:
                self._release_one()
            self._vocabs[key] = vocab
        # every grammar over it reads its decoded pieces, and every mask and lookahead their table from a
        # fresh start: built here, at registration, and not inside the first compile, where the pieces held
        # the GIL for tens of milliseconds in one piece, nor by the first session's lookahead, which built
        # the table on the event loop (0.47 s on a 262k-token vocabulary); and the pieces' sorted index
        decoded = vocab.decoded()
        decoded.fresh_table()
        decoded.piece_index()
        self._warm(vocab)
        return vocab

    def _release_one(self) -> None:
        # Under the lock. The least recently used vocabulary no open session uses gives up its slot, and
        # the compiled grammars over it with it (they hold it): the caches are cleared, since they are
        # keyed by content hash alone; the other vocabularies' grammars are compiled again on next use.
        # A session opened on it meanwhile (its compile was running) keeps it alive, unregistered.
        unused = next((key for key in self._vocabs if not self._in_use(key)), None)
        if unused is None:
            raise LimitError(
                f"{len(self._vocabs)} vocabularies registered, the limit, each used by open sessions"
            )
        released = self._vocabs.pop(unused)
        for path_key in [k for k, h in self._gguf_hashes.items() if h == unused]:
            del self._gguf_hashes[path_key]
        self._compiled.clear()
        self._grammars.clear()
        log.info("vocabulary released", extra=fields(vocab_id=unused, tokens=len(released)))

    def _warm(self, vocab: Vocab) -> None:
        # the verdicts every JSON grammar on this vocabulary shares, computed before its first session
        if self._warm_seconds <= 0:
            return
        report = warm_vocabulary(vocab, seconds=self._warm_seconds)
        log.info(
            "vocabulary warmed",
            extra=fields(
                tokens=len(vocab),
                masks=report.masks,
                verdicts=report.verdicts,
                verdict_bytes=report.verdict_bytes,
                seconds=round(report.seconds, 3),
                complete=report.complete,
            ),
        )

    def _check_pieces(self, pieces: Sequence[bytes] | Sequence[str], what: str) -> None:
        # every Allows and Accept of a token walks its piece: one of 48 MiB held the event loop for seconds
        limit = self._limits.max_piece_bytes
        for token, piece in enumerate(pieces):
            size = len(piece.encode("utf-8", "surrogatepass") if isinstance(piece, str) else piece)
            if size > limit:
                raise LimitError(
                    f"the {what} of token {token} is {size} bytes, over the limit of {limit} bytes a piece"
                )

    def check_size(self, size: int) -> None:
        """Raises LimitError for a vocabulary of more than `max_vocab_size` tokens (before it is read)."""
        if size > self._limits.max_vocab_size:
            raise LimitError(
                f"a vocabulary of {size} tokens is over the limit of {self._limits.max_vocab_size}"
            )
