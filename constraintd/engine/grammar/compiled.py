# The compiled grammar: immutable, shareable by every matcher and thread, keyed by a content hash.
#
# Contract:
# - `Grammar.from_gbnf` refuses (GrammarError) exactly the grammars llama_sampler_init_grammar refuses
#   (parse errors, a missing root, left recursion), plus left recursion llama.cpp misses and never
#   returns from (grammar/stacks.py), and trigger patterns that cannot be compiled (grammar/triggers.py).
# - What is compiled never changes: the flattened rules, the initial stack set, the triggers. What it
#   learns while serving (interned states and their transitions, finished masks) lives in caches that
#   give the same answers whether warm or cold.
# - `key` is a SHA-256 over everything that defines the grammar's behaviour: the GBNF text (or the rules),
#   the root, the triggers and the vocabulary's content hash.
# - The public surface is what sessions and users read (vocabulary, root, laziness, key, the parsed rules);
#   the compiled parts only the engine reads (rules, states, masks, triggers, decoded pieces) are private
#   to it: the matcher and the mask caches read them, nothing outside the engine does.
# - `nbytes` is an estimate of the memory the grammar holds, for the caches that keep grammars (the service
#   registry): cheap to read (a sum of three numbers). Counted once, at the first read (the registry's,
#   right after the compile; a grammar no cache keeps never pays for it), from the sizes of the
#   containers and the counts of what they hold (not by walking every object): the parsed rules, the
#   flattened rules (element table, alternates, character classes, follow positions), the initial
#   state's stacks, the trigger programs, the key. Counted as it grows: the rules' closures (computed as
#   stacks meet them, grammar/stacks.py, and counted there as they are), the finished masks
#   and the stack-top verdicts kept for this grammar alone (their arrays), the states learned while
#   serving, at a flat `STATE_BYTES` each, and the moves `lookahead` memoized (at most MAX_AHEAD_MOVES), at
#   `MOVE_BYTES` each (those an accept memoizes are in the flat estimate of their state). Not counted: the
#   vocabulary and what it owns (decoded pieces, shared verdicts: bounded by its owner), the per-top
#   shortcuts to those verdicts, a learned state's memo tables past the flat estimate, and the allocator's
#   own overhead. A test holds the estimate to what tracemalloc sees a compile allocate.
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from constraintd.engine.grammar.gbnf import ParsedGrammar, check_grammar, parse_gbnf
from constraintd.engine.grammar.literal_moves import LiteralMoves
from constraintd.engine.grammar.stack_sets import State, StateTable
from constraintd.engine.grammar.stacks import (
    INT_BYTES,
    PAIR_BYTES,
    Rules,
    Stack,
    stacks_bytes,
)
from constraintd.engine.grammar.triggers import Triggers
from constraintd.engine.masks.ahead import AheadRun, Lookahead
from constraintd.engine.masks.cache import MaskCache
from constraintd.engine.vocab.decoded import DecodedVocab
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import LimitError

__all__ = ["Grammar"]

# Stacks the initial state may hold while compiling; a matcher's own `max_stacks` applies on top.
_COMPILE_STACK_LIMIT: Final = 1_000_000
# Stacks a state met while learning ahead may hold (a matcher's default `max_stacks`).
_AHEAD_STACK_LIMIT: Final = 10_000
# A state learned while serving, as `nbytes` counts it: the State, its stack set of a few short stacks, its
# by-top lists and memo tables with a few entries (a flat estimate, not a walk).
STATE_BYTES: Final = 2048
# A move memoized on a state, as `nbytes` counts it: a dict entry, its token, and a tuple of four.
MOVE_BYTES: Final = 192
# Moves `lookahead` memoizes for one grammar at most (grammar/literal_moves.py): about 400 kB.
MAX_AHEAD_MOVES: Final = 2048
# The share of each `lookahead` run that learns moves first (they rarely need all of it: the rest goes to
# the verdicts).
MOVES_SHARE: Final = 0.2
# A pointer slot (CPython, 64-bit); the other sizes are grammar/stacks.py's.
_SLOT_BYTES: Final = 8
# a trigger program's instruction (a small tuple)
_INSTRUCTION_BYTES: Final = 80


class Grammar:
    """A GBNF grammar compiled against one vocabulary; immutable and shared by many `Matcher`s.

    Attributes:
        vocab: the vocabulary tokens are decided against.
        parsed: the rules as llama.cpp's parser produces them.
        root: the start rule's name.
        lazy: whether the grammar waits for a trigger (patterns or tokens were given).
        key: SHA-256 hex of the grammar's definition and the vocabulary's content.
    """

    __slots__ = (
        "__weakref__",
        "_ahead",
        "_ahead_turn",
        "_decoded",
        "_fixed_bytes",
        "_initial",
        "_literal_moves",
        "_masks",
        "_moves_ahead",
        "_root_id",
        "_rules",
        "_states",
        "_triggers",
        "key",
        "lazy",
        "parsed",
        "root",
        "vocab",
    )

    def __init__(
        self,
        parsed: ParsedGrammar,
        vocab: Vocab,
        *,
        root: str = "root",
        trigger_patterns: Sequence[str] = (),
        trigger_tokens: Sequence[int] = (),
        source: str | None = None,
        rules: Rules | None = None,
    ) -> None:
        """Compile parsed rules; prefer `from_gbnf`.

        Args:
            parsed: the rules (from `parse_gbnf`, or built by hand in the same shape).
            vocab: the vocabulary.
            root: the start rule.
            trigger_patterns: ECMAScript patterns that end a lazy grammar's wait.
            trigger_tokens: token ids that end it.
            source: the GBNF text the rules came from, for `key` (else the rules themselves are hashed).
            rules: `Rules(parsed)`, built by the caller after `check_grammar(parsed, root,
                left_recursion=False)` passed (the rules make that check where it may refuse; both
                need no vocabulary: a server does them in another process); then neither is done again.

        Raises:
            GrammarError: no such root, left recursion, malformed rules, or a bad trigger pattern.
        """
        # with `rules` given, the caller has checked `parsed` (and so `root` is one of its symbols); else
        # the rules are built at once, and make llama.cpp's left-recursion check where it may refuse
        if rules is None:
            self._root_id: int = check_grammar(parsed, root, left_recursion=False)
            rules = Rules(parsed)
        else:
            self._root_id = parsed.symbol_ids[root]
        self.parsed = parsed
        self.vocab = vocab
        self.root = root
        self._triggers = Triggers.compile(trigger_patterns, trigger_tokens)
        self.lazy: bool = bool(trigger_patterns or trigger_tokens)
        self._rules = rules
        self._states = StateTable(self._rules)
        # the states' memos lead from one to another (loops in the grammar are cycles between states):
        # when the grammar goes, they are dropped, so its states go with it, not at the next full
        # collection of the cyclic garbage collector, which would walk them all meanwhile
        weakref.finalize(self, self._states.release)
        self._initial: State | None = self._states.intern(
            self._rules.initial_stacks(self._root_id), _COMPILE_STACK_LIMIT
        )
        self._decoded: DecodedVocab = vocab.decoded()
        self._masks = MaskCache(self._states, self._decoded)
        self._ahead: Lookahead | None = None  # made on the first `lookahead`, with the next
        self._moves_ahead: Lookahead | None = None
        self._ahead_turn: deque[None] = deque((None,))
        self._literal_moves: LiteralMoves | None = None  # what they memoized (grammar/literal_moves.py)
        definition = source if source is not None else repr(parsed.rules)
        self.key: str = _key(definition, root, trigger_patterns, trigger_tokens, vocab.content_hash)
        self._fixed_bytes: int | None = None  # measured on the first `nbytes` (only caches of grammars ask)

    @classmethod
    def from_gbnf(
        cls,
        text: str,
        vocab: Vocab,
        *,
        root: str = "root",
        trigger_patterns: Sequence[str] = (),
        trigger_tokens: Sequence[int] = (),
    ) -> Grammar:
        """Parse and compile a GBNF grammar for `vocab` (llama_sampler_init_grammar[_lazy_patterns]).

        `<...>` token terminals are resolved with `vocab.token_for_text`. With trigger patterns or tokens
        the grammar is lazy: it allows everything until a trigger (see grammar/triggers.py).

        Raises:
            GrammarError: the text is not a grammar llama.cpp accepts (with line and column), it has no
                rule `root`, or a trigger pattern cannot be compiled.
        """
        parsed = parse_gbnf(text, token_id=vocab.token_for_text)
        return cls(
            parsed,
            vocab,
            root=root,
            trigger_patterns=trigger_patterns,
            trigger_tokens=trigger_tokens,
            source=text,
        )

    @property
    def n_vocab(self) -> int:
        """Tokens in the vocabulary."""
        return self._decoded.n_tokens

    def lookahead(
        self, seconds: float, *, pause: Callable[[], bool] | None = None, limit: int = _AHEAD_STACK_LIMIT
    ) -> AheadRun:
        """Learn, for up to `seconds` of this thread's CPU time, what this grammar's first steps will ask
        for: the moves of the tokens its forced literals admit (grammar/literal_moves.py), with up to
        MOVES_SHARE of the time, then the verdicts the masks of its first states will be composed from
        (masks/ahead.py). Both visit its reachable stacks breadth-first from the start, and stop early when
        `pause()` turns true (asked inside a top's walk too, at each column). Resumes where the last call
        stopped; changes no answer. A top whose walk meets a stack set above `limit` is left to the step
        that needs it. What it returns counts the verdicts' search (tops and stacks), and the time of
        both; it is finished when both are."""
        try:
            # one run at a time (as Lookahead.run, for the two searches together), and the searches made
            # inside it: two threads making them at once would each run its own, and keep one
            self._ahead_turn.pop()
        except IndexError:
            ahead, moves = self._ahead, self._moves_ahead
            if ahead is None or moves is None:
                return AheadRun(0, 0, 0.0, 0.0, False)
            return AheadRun(0, 0, 0.0, moves.spent + ahead.spent, moves.finished and ahead.finished)
        try:
            ahead, moves = self._searches(limit)
            return self._run_searches(ahead, moves, seconds, pause)
        finally:
            self._ahead_turn.append(None)

    def _searches(self, limit: int) -> tuple[Lookahead, Lookahead]:
        """The lookahead's two searches (made on its first call, with its turn held): the verdicts' and the
        literal moves'."""
        ahead, moves = self._ahead, self._moves_ahead
        if ahead is None or moves is None:
            assert self._initial is not None
            masks = self._masks

            def learn(stack: Stack, deadline: float) -> None:
                # a top past the limit is left to the session that meets it, under its own limit
                with contextlib.suppress(LimitError):
                    masks.learn(stack, limit, deadline=deadline)

            literal = self._literal_moves = LiteralMoves(
                self._states, self._decoded, limit=limit, most=MAX_AHEAD_MOVES
            )
            initial = self._initial.stacks
            ahead = self._ahead = Lookahead(self._rules, initial, learn, same=masks.same_stack)
            moves = self._moves_ahead = Lookahead(self._rules, initial, literal.learn)
        return ahead, moves

    def _run_searches(
        self, ahead: Lookahead, moves: Lookahead, seconds: float, pause: Callable[[], bool] | None
    ) -> AheadRun:
        # the vocabulary's index of pieces the moves read, built once for every grammar on it: not a cost of
        # this grammar's budget
        self._decoded.piece_index()
        paused = False

        def held() -> bool:
            # `pause`, held once it says so: a pause in the first search stops the second at once
            nonlocal paused
            paused = paused or (pause is not None and pause())
            return paused

        first = moves.run(seconds * MOVES_SHARE, pause=held)
        then = ahead.run(seconds - first.seconds, pause=held)
        if then.finished and not first.finished and then.seconds + first.seconds < seconds:
            # the verdicts are all learnt: the moves have what is left
            first = _joined(first, moves.run(seconds - first.seconds - then.seconds, pause=held))
        return AheadRun(
            then.tops,
            then.stacks,
            first.seconds + then.seconds,
            first.total + then.total,
            first.finished and then.finished,
        )

    @property
    def nbytes(self) -> int:
        """An estimate of the bytes this grammar holds (not its vocabulary's): what was compiled, the masks
        kept so far, and the states learned so far at `STATE_BYTES` each. See the module comment for what
        is counted and what is not. Cheap: it walks nothing."""
        if self._fixed_bytes is None:
            self._fixed_bytes = (
                _rules_bytes(self.parsed, self._rules)
                + _state_bytes(self._initial)
                + _triggers_bytes(self._triggers)
                + sys.getsizeof(self.key)
                + sys.getsizeof(self.root)
            )
        learned = max(len(self._states) - 1, 0)
        ahead = self._ahead.nbytes if self._ahead is not None else 0
        ahead += self._moves_ahead.nbytes if self._moves_ahead is not None else 0
        closures = self._rules.closure_bytes  # computed as stacks meet them (grammar/stacks.py)
        # the moves learnt ahead; those of accepts are in STATE_BYTES
        moves = self._literal_moves.count * MOVE_BYTES if self._literal_moves is not None else 0
        return self._fixed_bytes + closures + learned * STATE_BYTES + self._masks.nbytes + ahead + moves

    def __repr__(self) -> str:
        lazy = " lazy" if self.lazy else ""
        return f"<Grammar{lazy} root={self.root!r} {len(self.parsed.rules)} rules, {self.key[:12]}>"


def _joined(first: AheadRun, then: AheadRun) -> AheadRun:
    # two runs of one search, one after the other
    return AheadRun(
        first.tops + then.tops,
        first.stacks + then.stacks,
        first.seconds + then.seconds,
        then.total,
        then.finished,
    )


def _key(definition: str, root: str, patterns: Sequence[str], tokens: Sequence[int], vocab_hash: str) -> str:
    payload = json.dumps([definition, root, list(patterns), [int(t) for t in tokens], vocab_hash])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _rules_bytes(parsed: ParsedGrammar, rules: Rules) -> int:
    # ints past the small cached ones: the element values (shared by the parsed and flat tables), and a
    # position for every stack slot (positions are made anew)
    values = np.fromiter(rules.values, dtype=np.int64, count=len(rules.values))
    large_values = int(np.count_nonzero((values > 256) | (values < -5)))
    elements = len(rules.kinds)  # a pair each at most (a compile process's grammar shares equal ones)
    total = sys.getsizeof(parsed.rules) + sum(map(sys.getsizeof, parsed.rules)) + elements * PAIR_BYTES
    total += sys.getsizeof(parsed.symbol_ids) + sum(map(sys.getsizeof, parsed.symbol_ids))
    total += large_values * INT_BYTES
    total += sys.getsizeof(rules.kinds) + sys.getsizeof(rules.values) + sys.getsizeof(rules.rule_starts)
    total += sys.getsizeof(rules.alternates) + sum(map(sys.getsizeof, rules.alternates))
    # the tables by position (grammar/stacks.py): a tuple of shared classes, two arrays of machine ints
    total += sys.getsizeof(rules.classes) + sys.getsizeof(rules.after) + sys.getsizeof(rules.next_terminal)
    # each class object once: a literal character's is shared by its positions (grammar/stacks.py)
    for _, ranges in {id(klass): klass for klass in rules.classes if klass is not None}.values():
        total += PAIR_BYTES + sys.getsizeof(ranges) + len(ranges) * PAIR_BYTES
    return total


def _state_bytes(state: State | None) -> int:
    if state is None:
        return 0
    stacks = state.stacks
    total = STATE_BYTES + sys.getsizeof(stacks) + stacks_bytes(stacks)
    total += sys.getsizeof(state.by_top) + sum(map(sys.getsizeof, state.by_top.values()))
    return total + sys.getsizeof(state.token_tops) + len(state.token_tops) * PAIR_BYTES


def _triggers_bytes(triggers: Triggers) -> int:
    instructions = sum(len(pattern.program.code) for pattern in triggers.patterns)
    tokens = triggers.tokens
    total = instructions * _INSTRUCTION_BYTES + sys.getsizeof(tokens) + len(tokens) * INT_BYTES
    literals = triggers.literals
    if literals is not None:  # a dict per automaton state, its links, and the patterns ending there
        automaton = literals.automaton
        total += sum(map(sys.getsizeof, automaton.children)) + sys.getsizeof(automaton.children)
        total += sys.getsizeof(automaton.fail) + sys.getsizeof(automaton.match)
        total += sys.getsizeof(literals.found)
        total += sum(PAIR_BYTES for found in literals.found if found is not None)
    return total
