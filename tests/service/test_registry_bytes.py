"""The registry's caches bounded by the bytes their entries measure (constraintd/service/registry.py),
and what a compiled grammar says it holds (`Grammar.nbytes`, constraintd/engine/grammar/compiled.py)."""

from __future__ import annotations

import dataclasses
import gc
import sys
import tracemalloc

import pytest

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.grammar.gbnf import ParsedGrammar
from constraintd.engine.grammar.stacks import Rules
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import GrammarError, SchemaError
from constraintd.service.constraints import Constraint, ConstraintKind
from constraintd.service.limits import Limits
from constraintd.service.registry import Registry
from tests.server.running import TINY_EOG, TINY_PIECES


def alternatives(n: int, *, tail: str = "") -> str:
    return "root ::= " + " | ".join(f'"a{i}"' for i in range(n)) + tail + "\n"


def refs(n: int) -> str:
    rules = "".join(f'r{i} ::= [a-z] "x{i}" r{i + 1}?\n' for i in range(n))
    return "root ::= " + " | ".join(f"r{i}" for i in range(n)) + "\n" + rules + f'r{n} ::= "e"\n'


def registry_with(**limits: int) -> Registry:
    return Registry(dataclasses.replace(Limits(), **limits))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [alternatives(5000), refs(500), 'root ::= "{" [a-z]+ ("," [a-z]+)* "}"'],
    ids=["alternatives", "references", "small"],
)
def test_a_grammar_measures_about_what_its_compile_allocates(text: str) -> None:
    vocab = Vocab(TINY_PIECES, TINY_EOG)
    vocab.decoded()
    gc.collect()
    tracemalloc.start()
    try:
        grammar = Grammar.from_gbnf(text, vocab)
        gc.collect()
        allocated = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # an estimate from counts, not a walk: within half and twice what the compile left allocated
    assert allocated / 2 <= grammar.nbytes <= allocated * 2


def test_a_grammar_counts_the_masks_and_states_it_learns() -> None:
    from constraintd.engine.matcher import Matcher

    vocab = Vocab(TINY_PIECES, TINY_EOG)
    grammar = Grammar.from_gbnf('root ::= "a" "b"+', vocab)
    compiled = grammar.nbytes
    matcher = Matcher(grammar)
    matcher.mask()
    assert matcher.accept(TINY_PIECES.index(b"a"))
    matcher.mask()
    assert grammar.nbytes > compiled


def test_a_large_grammar_is_evicted_when_the_byte_bound_is_reached() -> None:
    vocab_registry = registry_with()
    vocab = vocab_registry.register_pieces(TINY_PIECES, TINY_EOG)
    one = Grammar.from_gbnf(alternatives(3000, tail=' | "b0"'), vocab).nbytes
    registry = registry_with(max_grammar_cache_bytes=int(one * 2.5))
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    large = [Constraint(ConstraintKind.GBNF, alternatives(3000, tail=f' | "b{i}"')) for i in range(4)]
    for constraint in large:
        registry.compile(constraint, vocab)
    assert registry.grammar_count == 2  # by bytes: the count bound (256) is far
    assert registry.cache_bytes <= int(one * 2.5)
    assert registry.cached(large[0], vocab) is None and registry.cached(large[1], vocab) is None
    assert registry.cached(large[3], vocab) is not None
    # a small one fits beside them: the least recently used large one makes room only if needed
    registry.compile(Constraint(ConstraintKind.GBNF, 'root ::= "a"'), vocab)
    assert registry.cache_bytes <= int(one * 2.5)


def test_a_grammar_alone_over_the_bound_is_compiled_and_not_kept() -> None:
    registry = registry_with(max_grammar_cache_bytes=100_000)
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    constraint = Constraint(ConstraintKind.GBNF, alternatives(3000))
    compiled = registry.compile(constraint, vocab)
    assert compiled.grammar.nbytes > 100_000
    assert registry.grammar_count == 0 and registry.cached(constraint, vocab) is None
    assert registry.cache_bytes == 0


def test_the_reported_total_stays_under_the_bound_across_many_compiles() -> None:
    bound = 2_000_000
    registry = registry_with(max_grammar_cache_bytes=bound)
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    kept = 0
    for i in range(60):
        text = alternatives(50 * (i % 7 + 1), tail=f' | "c{i}"')
        registry.compile(Constraint(ConstraintKind.GBNF, text), vocab)
        # refused ones too, charged against the same bound
        with pytest.raises(GrammarError):
            registry.compile(Constraint(ConstraintKind.GBNF, text + f"bad{i} ::= missing{i}\n"), vocab)
        assert registry.cache_bytes <= bound
        kept = max(kept, registry.grammar_count)
    assert 1 < kept < 60  # some were dropped for bytes, and the bound is not so small it keeps nothing
    assert registry.refused_count == 60


def reachable(root: object) -> tuple[list[object], int]:
    # every object reachable from `root` (gc.get_referents), and their sizes added up
    seen: dict[int, object] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen[id(obj)] = obj
        todo.extend(gc.get_referents(obj))
    return list(seen.values()), sum(sys.getsizeof(obj) for obj in seen.values())


@pytest.mark.parametrize(
    ("text", "kind", "error"),
    [
        (alternatives(20_000, tail=" | missing"), ConstraintKind.GBNF, GrammarError),
        (alternatives(20_000, tail=' | "x'), ConstraintKind.GBNF, GrammarError),
        (
            '{"enum": [' + ", ".join(f'"s{i}"' for i in range(20_000)) + '], "$ref": "#/nowhere"}',
            ConstraintKind.JSON_SCHEMA,
            SchemaError,
        ),
    ],
    ids=["undefined-rule", "unterminated-literal", "schema-enum-bad-ref"],
)
def test_a_refused_huge_constraint_leaves_a_few_hundred_bytes(
    text: str, kind: ConstraintKind, error: type[Exception]
) -> None:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    constraint = Constraint(kind, text)
    with pytest.raises(error) as raised:
        registry.compile(constraint, vocab)
    assert raised.value.__traceback__ is not None  # the caller's error has its traceback; the kept one not
    del raised
    assert registry.refused_count == 1 and registry.grammar_count == 0
    [(_, kept)] = registry._refused.items()
    assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None
    objects, size = reachable(kept)
    assert not [obj for obj in objects if isinstance(obj, ParsedGrammar | Rules | Grammar)]
    assert size <= 1000, [(type(obj).__name__, sys.getsizeof(obj)) for obj in objects]
    assert registry.cache_bytes <= 1000
    # and asked again, the same error without a compile
    with pytest.raises(error, match=str(kept)[:20]):
        registry.compile(constraint, vocab)
