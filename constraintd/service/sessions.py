# The session store: open sessions by id, their idle deadlines, and the limits on them.
#
# Invariants:
# - A session id is 144 random bits from `secrets` (URL-safe text): holding the id is the only way in.
# - A session is a matcher over a shared compiled grammar; the store never shares a matcher between ids
#   (Fork copies). Every successful lookup pushes the idle deadline back by the session's TTL.
# - An expired session is gone whether or not the sweep (`reclaim`) has run yet: a lookup past the
#   deadline removes it and answers NotFoundError, so correctness never waits for the sweep.
# - The store counts its sessions per vocabulary (`uses_vocab`), so the registry never releases a vocabulary
#   an open session uses.
# - After `stop_opening` no session is opened or forked (UnavailableError); `release_all` drops the rest.
# - The clock is injected (monotonic seconds), so expiry is tested without sleeping.
# The store does no I/O and imports neither grpc nor asyncio; it runs on one thread (the event loop's, or
# the caller's in the in-process transport).
from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence

from constraintd.engine.matcher import Matcher
from constraintd.errors import (
    DeadlineError,
    InputError,
    LimitError,
    NotFoundError,
    PositionError,
    UnavailableError,
)
from constraintd.service.limits import Limits, shown
from constraintd.service.registry import CompiledConstraint

__all__ = ["Session", "SessionStore"]

ID_BYTES = 18
# a replay looks at its deadline once every this many tokens (a clock read is about 50 ns; a token tens of µs)
REPLAY_CHECK = 256


class Session:
    """One generation's grammar state: a matcher, its compiled constraint, and its idle deadline.

    `position` counts the tokens the matcher accepted (the prefill is not a token); it is kept here
    because `Matcher.position` counts the steps of its rollback window, and the count is read on every
    call.
    """

    __slots__ = ("compiled", "expires_at", "id", "matcher", "position", "ttl")

    def __init__(
        self,
        session_id: str,
        compiled: CompiledConstraint,
        matcher: Matcher,
        ttl: float,
        expires_at: float,
        position: int,
    ) -> None:
        self.id = session_id
        self.compiled = compiled
        self.matcher = matcher
        self.ttl = ttl
        self.expires_at = expires_at
        self.position = position

    def accept(self, token: int) -> bool:
        """The matcher's accept, counted."""
        accepted = self.matcher.accept(token)
        self.position += accepted
        return accepted

    def rollback(self, count: int) -> None:
        """Undoes the last `count` accepted tokens.

        Raises:
            InputError: more than were accepted, or more than the rollback window keeps (nothing changes).
        """
        if not 0 <= count <= self.position:
            raise InputError(
                f"cannot roll back {count} tokens: session {self.id} has accepted {self.position}"
            )
        window = self.matcher.max_rollback
        if window is not None and count > window:
            raise InputError(
                f"cannot roll back {count} tokens: session {self.id} keeps only its last {window} "
                "(the rollback window, max_rollback)"
            )
        self.matcher.rollback(count)  # refuses a rollback past what earlier rollbacks left of the window
        self.position -= count

    def check_position(self, position: int | None) -> None:
        """Raises PositionError unless `position` is None or the number of tokens accepted so far."""
        if position is not None and position != self.position:
            raise PositionError(f"session {self.id} has accepted {self.position} tokens, not {position}")


class SessionStore:
    """Open sessions by id, with idle TTLs and a bound on how many are open."""

    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._limits = limits
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        # open sessions per vocabulary (content hash): the registry keeps these vocabularies
        self._per_vocab: dict[str, int] = {}
        self._opening = True

    def __len__(self) -> int:
        return len(self._sessions)

    def uses_vocab(self, vocab_hash: str) -> bool:
        """Whether an open session (or one expired but not yet swept) uses this vocabulary. Safe to call
        from another thread (the registry's, releasing a vocabulary): one dictionary read."""
        return self._per_vocab.get(vocab_hash, 0) > 0

    def open(
        self,
        compiled: CompiledConstraint,
        *,
        ttl: float = 0.0,
        prefill: bytes = b"",
        replay: Sequence[int] = (),
    ) -> Session:
        """Opens a session on a compiled constraint, takes the prefill text, then accepts `replay`.

        Args:
            compiled: the shared compiled constraint.
            ttl: idle seconds before the session is reclaimed; 0 means the default; capped by the maximum.
            prefill: text taken as already generated (llama.cpp's llama_grammar_accept_str).
            replay: tokens to accept at once (a client rebuilding a session it lost).

        Raises:
            UnavailableError: the store stopped opening sessions (shutting down).
            LimitError: as many sessions are open as allowed, or the prefill is too long.
            InputError: the grammar rejects the prefill or a replayed token.
            TokenError: a replayed token outside the vocabulary.
        """
        self._check_opening()
        matcher = self.start(compiled, prefill=prefill, replay=replay)
        return self.adopt(compiled, matcher, ttl=ttl, replayed=len(replay))

    def start(
        self,
        compiled: CompiledConstraint,
        *,
        prefill: bytes = b"",
        replay: Sequence[int] = (),
        deadline: float | None = None,
    ) -> Matcher:
        """A new matcher past the prefill and the replayed tokens, not yet a session: it touches nothing
        of the store, so a long replay may run in a worker thread. Raises as `open`, and DeadlineError
        when the prefill or the replay is still running at `deadline` (time.monotonic()): the work stops
        there."""
        if len(prefill) > self._limits.max_prefill_bytes:
            raise LimitError(
                f"a prefill of {len(prefill)} bytes is over the limit of {self._limits.max_prefill_bytes}"
            )
        limits = self._limits
        matcher = Matcher(compiled.grammar, max_stacks=limits.max_stacks, max_rollback=limits.max_rollback)
        if prefill and not matcher.accept_bytes(prefill, deadline=deadline):
            raise InputError(f"the grammar rejects the prefill {shown(prefill)}")
        for position, token in enumerate(replay):
            if deadline is not None and position % REPLAY_CHECK == 0 and time.monotonic() > deadline:
                raise DeadlineError(f"replaying the tokens ran past its time limit at token {position}")
            if not matcher.accept(token):
                raise InputError(f"the grammar rejects replayed token {token} at position {position}")
        return matcher

    def adopt(
        self, compiled: CompiledConstraint, matcher: Matcher, *, ttl: float = 0.0, replayed: int | None = None
    ) -> Session:
        """Opens a session on a matcher from `start`.

        Args:
            compiled: the constraint `matcher` was started on.
            matcher: a matcher from `start`.
            ttl: as `open`.
            replayed: the number of tokens `start` replayed, when the caller has them (the session's
                position: the prefill is not a token); None asks the matcher (`Matcher.position`: every
                token it accepted, also those its rollback window no longer keeps; it counts the steps
                the window keeps).

        Raises:
            UnavailableError, LimitError: as `open`.
        """
        self._check_opening()
        position = matcher.position if replayed is None else replayed
        return self._add(compiled, matcher, ttl, position)

    def now(self) -> float:
        """The store's clock: pass it to `get` as `now` for many lookups at one moment (a Step batch)."""
        return self._clock()

    def get(self, session_id: str, *, position: int | None = None, now: float | None = None) -> Session:
        """The open session with this id, its idle deadline pushed back.

        Args:
            session_id: the session's id.
            position: when given, the number of tokens the caller believes the session has accepted.
            now: the clock's reading to use (`now()`); None reads the clock.

        Raises:
            NotFoundError: no open session has this id (never opened, closed, or expired).
            PositionError: `position` is given and differs from the session's.
        """
        session = self._sessions.get(session_id)
        if now is None:
            now = self._clock()
        if session is None or session.expires_at <= now:
            if session is not None:
                self._remove(session_id)
            raise NotFoundError(f"no open session {shown(session_id)} (closed, expired, or never opened)")
        session.expires_at = now + session.ttl
        if position is not None and position != session.position:
            session.check_position(position)  # raises, with the message
        return session

    def fork(self, session_id: str, *, position: int | None = None) -> Session:
        """Opens a new session in the state of an open one (same grammar, same accepted tokens).

        Raises:
            NotFoundError, PositionError: as `get`.
            UnavailableError, LimitError: as `open`.
        """
        parent = self.get(session_id, position=position)
        self._check_opening()
        return self._add(parent.compiled, parent.matcher.fork(), parent.ttl, parent.position)

    def close(self, session_id: str) -> None:
        """Closes a session.

        Raises:
            NotFoundError: no open session has this id.
        """
        self.get(session_id)
        self._remove(session_id)

    def reclaim(self) -> int:
        """Removes every session past its idle deadline; returns how many."""
        now = self._clock()
        expired = [sid for sid, session in self._sessions.items() if session.expires_at <= now]
        for sid in expired:
            self._remove(sid)
        return len(expired)

    def stop_opening(self) -> None:
        """From now on, opening or forking a session fails with UnavailableError."""
        self._opening = False

    def release_all(self) -> int:
        """Drops every session; returns how many there were."""
        count = len(self._sessions)
        self._sessions.clear()
        self._per_vocab.clear()
        return count

    def _check_opening(self) -> None:
        if not self._opening:
            raise UnavailableError("the server is shutting down and opens no new sessions")
        if len(self._sessions) >= self._limits.max_sessions:
            self.reclaim()
            if len(self._sessions) >= self._limits.max_sessions:
                raise LimitError(f"{len(self._sessions)} sessions are open, the limit")

    def _add(self, compiled: CompiledConstraint, matcher: Matcher, ttl: float, position: int) -> Session:
        limits = self._limits
        ttl = min(ttl or limits.default_ttl, limits.max_ttl)
        session_id = secrets.token_urlsafe(ID_BYTES)
        session = Session(session_id, compiled, matcher, ttl, self._clock() + ttl, position)
        self._sessions[session_id] = session
        vocab_hash = compiled.grammar.vocab.content_hash
        self._per_vocab[vocab_hash] = self._per_vocab.get(vocab_hash, 0) + 1
        return session

    def _remove(self, session_id: str) -> None:
        session = self._sessions.pop(session_id)
        vocab_hash = session.compiled.grammar.vocab.content_hash
        left = self._per_vocab[vocab_hash] - 1
        if left:
            self._per_vocab[vocab_hash] = left
        else:
            del self._per_vocab[vocab_hash]
