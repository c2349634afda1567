"""The registry (constraintd/service/registry.py): content-addressed vocabularies, shared grammars."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from constraintd.engine.grammar.compiled import Grammar
from constraintd.errors import (
    ConstraintdError,
    GrammarError,
    LimitError,
    NotFoundError,
    SchemaError,
    VocabError,
)
from constraintd.server.processes import ProcessPool
from constraintd.service.constraints import Constraint, ConstraintKind, prepare
from constraintd.service.limits import Limits
from constraintd.service.registry import Registry
from tests import reference
from tests.server.running import AB_PLUS, TINY_EOG, TINY_PIECES


def registry_with(**limits: int) -> Registry:
    return Registry(dataclasses.replace(Limits(), **limits))  # type: ignore[arg-type]


def test_the_same_content_gets_the_same_vocabulary() -> None:
    registry = Registry(Limits())
    first = registry.register_pieces(TINY_PIECES, TINY_EOG)
    again = registry.register_pieces(list(TINY_PIECES), list(TINY_EOG))
    assert again is first
    assert registry.vocab(first.content_hash) is first
    other = registry.register_pieces(TINY_PIECES, (0,))
    assert other.content_hash != first.content_hash
    assert registry.vocab_count == 2


def test_an_unknown_vocabulary_is_not_found() -> None:
    with pytest.raises(NotFoundError, match="unknown vocabulary 'nope': register it first"):
        Registry(Limits()).vocab("nope")


def test_vocabulary_limits() -> None:
    registry = registry_with(max_vocabs=1, max_vocab_size=len(TINY_PIECES))
    registry.register_pieces(TINY_PIECES, TINY_EOG)
    with pytest.raises(LimitError, match="1 vocabularies registered, the limit"):
        registry.register_pieces(TINY_PIECES, ())
    with pytest.raises(LimitError, match=f"a vocabulary of {len(TINY_PIECES) + 1} tokens is over the limit"):
        registry.register_pieces((*TINY_PIECES, b"x"), ())


def test_a_gguf_file_is_read_once_and_addressed_by_content(tmp_path: Path) -> None:
    source = reference.require(reference.vocab_path("llama-spm"))
    registry = Registry(Limits())
    vocab = registry.register_gguf(str(source))
    assert len(vocab) == 32000
    assert registry.register_gguf(str(source)) is vocab
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(source.read_bytes())
    assert registry.register_gguf(str(copy)) is vocab  # another file, the same content
    assert registry.register_gguf(copy) is vocab  # a path object as well as a string


def test_gguf_paths_are_confined_to_the_configured_directories(tmp_path: Path) -> None:
    allowed = tmp_path / "models"
    allowed.mkdir()
    registry = Registry(Limits(), gguf_dirs=[allowed])
    refused = "cannot read GGUF file .*: no such regular file in the directories"
    outside = reference.require(reference.vocab_path("llama-spm"))
    (allowed / "link.gguf").symlink_to(outside)
    for path in (outside, allowed / ".." / "elsewhere.gguf", allowed / "missing.gguf", allowed / "link.gguf"):
        with pytest.raises(VocabError, match=refused):
            registry.register_gguf(str(path))
    (allowed / "junk.gguf").write_bytes(b"not a gguf, and a secret after it")
    with pytest.raises(VocabError) as raised:
        registry.register_gguf(str(allowed / "junk.gguf"))
    assert str(raised.value) == f"GGUF file {str(allowed / 'junk.gguf')!r} is not a GGUF file"


def test_no_directories_reads_no_path_and_none_reads_any() -> None:
    path = str(reference.require(reference.vocab_path("llama-spm")))
    with pytest.raises(VocabError, match="started without --gguf-dir"):
        Registry(Limits(), gguf_dirs=()).register_gguf(path)
    assert len(Registry(Limits()).register_gguf(path)) == 32000


def test_a_gguf_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    big.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(LimitError, match="over the limit of 64 bytes"):
        registry_with(max_gguf_bytes=64).register_gguf(str(big))


def test_a_compiled_grammar_is_shared_by_key() -> None:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    constraint = Constraint(ConstraintKind.GBNF, AB_PLUS)
    assert registry.cached(constraint, vocab) is None
    compiled = registry.compile(constraint, vocab)
    assert registry.compile(Constraint(ConstraintKind.GBNF, AB_PLUS), vocab) is compiled
    assert registry.cached(constraint, vocab) is compiled
    lazy = registry.compile(dataclasses.replace(constraint, trigger_tokens=(3,)), vocab)
    assert lazy is not compiled and lazy.grammar.lazy


def test_concurrent_compiles_of_one_key_compile_once() -> None:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    constraint = Constraint(ConstraintKind.JSON_OBJECT)
    results: list[object] = []
    barrier = threading.Barrier(4)

    def compile_one() -> None:
        barrier.wait()
        results.append(registry.compile(constraint, vocab))

    threads = [threading.Thread(target=compile_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(r is results[0] for r in results)
    assert registry.grammar_count == 1


def test_the_grammar_cache_is_bounded() -> None:
    registry = registry_with(max_grammars=2)
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    grammars = [Constraint(ConstraintKind.GBNF, f'root ::= "{c}"') for c in "ab1"]
    first = registry.compile(grammars[0], vocab)
    for constraint in grammars[1:]:
        registry.compile(constraint, vocab)
    assert registry.grammar_count == 2
    assert registry.cached(grammars[0], vocab) is None  # the least recently used went
    assert first.grammar.vocab is vocab  # and still works for whoever holds it


@pytest.mark.parametrize(
    ("constraint", "error", "message"),
    [
        (Constraint(ConstraintKind.GBNF, 'root ::= "a'), GrammarError, "line 1"),
        (Constraint(ConstraintKind.GBNF, 'start ::= "a"'), GrammarError, "root"),
        (Constraint(ConstraintKind.GBNF, 'start ::= "a"', root="begin"), GrammarError, "begin"),
        (Constraint(ConstraintKind.JSON_SCHEMA, "{not json"), SchemaError, "invalid JSON"),
        (Constraint(ConstraintKind.OPENAI_REQUEST, "[]"), SchemaError, "a request must be a JSON object"),
    ],
    ids=["unterminated-literal", "no-root", "no-such-root", "schema-not-json", "request-not-object"],
)
def test_refused_constraints_raise_the_engine_error(
    constraint: Constraint, error: type[Exception], message: str
) -> None:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    with pytest.raises(error, match=message):
        registry.compile(constraint, vocab)
    assert registry.grammar_count == 0


def test_a_refused_constraint_is_remembered_not_compiled_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from constraintd.service import registry as registry_module

    prepared: list[Constraint] = []

    def counting(constraint: Constraint) -> object:
        prepared.append(constraint)
        return prepare(constraint)

    monkeypatch.setattr(registry_module, "prepare", counting)
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    schema = '{"type": "object", "properties": {"a": {"$ref": "#/x"}}}'  # a reference to nothing
    refused = Constraint(ConstraintKind.JSON_SCHEMA, schema)
    raised = []
    for _ in range(3):
        with pytest.raises(SchemaError) as caught:
            registry.compile(refused, vocab)
        raised.append(caught.value)
    assert len(prepared) == 1
    first, *again = raised
    for error in again:
        assert error is not first and error.__traceback__ is not first.__traceback__
        assert (str(error), error.args, vars(error)) == (str(first), first.args, vars(first))
    # other constraints still compile, and are not taken for the refused one
    assert registry.compile(Constraint(ConstraintKind.GBNF, AB_PLUS), vocab).grammar.vocab is vocab


def test_constraints_that_resolve_to_one_grammar_share_its_compiled_form() -> None:
    registry = Registry(Limits())
    vocab = registry.register_pieces(TINY_PIECES, TINY_EOG)
    asked = [
        Constraint(ConstraintKind.JSON_OBJECT),
        Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "object"}'),
        Constraint(ConstraintKind.OPENAI_REQUEST, '{"response_format": {"type": "json_object"}}'),
        Constraint(ConstraintKind.OLLAMA_REQUEST, '{"format": "json"}'),
    ]
    compiled = [registry.compile(constraint, vocab) for constraint in asked]
    assert all(c.grammar is compiled[0].grammar for c in compiled)
    assert registry.grammar_count == 1
    assert all(registry.cached(constraint, vocab) is c for constraint, c in zip(asked, compiled, strict=True))


def test_a_gguf_file_is_loaded_from_the_vocabulary_store_once_prepared(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from constraintd.service.vocab_store import VocabStore

    source = reference.require(reference.vocab_path("llama-spm"))
    blocker = tmp_path / "a-file"  # a directory that cannot be written, as a cache in a read-only image
    blocker.write_bytes(b"")
    store = VocabStore([blocker / "baked", tmp_path / "cache"])
    caplog.set_level("INFO", logger="constraintd.server")
    first = Registry(Limits(), vocab_store=store).register_gguf(str(source))
    # a new registry as in a new process: a new Vocab object, holding no tables yet
    again = Registry(Limits(), vocab_store=store).register_gguf(str(source))
    assert again is not first and again.content_hash == first.content_hash
    assert again.decoded() is not first.decoded()
    read, loaded = (r for r in caplog.records if r.name == "constraintd.server")
    assert (read.getMessage(), loaded.getMessage()) == ("vocabulary read", "vocabulary loaded")
    assert read.fields["saved_to"].startswith(str(tmp_path / "cache"))  # type: ignore[attr-defined]
    assert "not written" in read.fields["notes"][0]  # type: ignore[attr-defined]
    assert loaded.fields["loaded_from"] == read.fields["saved_to"]  # type: ignore[attr-defined]


def test_a_vocabulary_is_decoded_at_registration() -> None:
    vocab = Registry(Limits()).register_pieces(TINY_PIECES, TINY_EOG)
    decoded = vocab._decoded
    assert decoded is not None  # held already: built by the registration, not by a first compile
    # and the tables every mask and lookahead reads: not built later on the event loop by a first session
    assert decoded._fresh_table is not None and decoded._by_piece is not None


@pytest.mark.parametrize(("seconds", "warmed"), [(0.0, False), (5.0, True)], ids=["off", "on"])
def test_a_new_vocabulary_is_warmed_when_asked(seconds: float, warmed: bool) -> None:
    registry = Registry(Limits(), warm_seconds=seconds)
    # a vocabulary of its own per case: the verdicts are shared by every grammar on the same content
    vocab = registry.register_pieces([*TINY_PIECES, b"{", b"}", b'"', b":", str(seconds).encode()], TINY_EOG)
    assert (len(vocab.decoded().verdicts()) > 0) is warmed


@pytest.fixture
def processes() -> Iterator[ProcessPool]:
    pool = ProcessPool(1, time_limit=60.0, preload=[prepare.__module__])
    try:
        yield pool
    finally:
        pool.close()


def same_grammar(a: Grammar, b: Grammar) -> bool:
    # Rules and State have no __eq__ (a State belongs to its grammar's table): compare what they hold
    # (the compiled parts are the engine's, private to it: read here to compare two compiles)
    same_rules = all(getattr(a._rules, name) == getattr(b._rules, name) for name in a._rules.__slots__)
    assert a._initial is not None and b._initial is not None
    same_start = a._initial.stacks == b._initial.stacks
    return (
        (a.key, a.parsed, a._root_id, a.lazy) == (b.key, b.parsed, b._root_id, b.lazy)
        and same_rules
        and same_start
    )


COMPILED_ALIKE = {
    "gbnf": Constraint(ConstraintKind.GBNF, AB_PLUS),
    "token-by-text": Constraint(ConstraintKind.GBNF, 'root ::= "a" </s>'),  # parsed with the vocabulary
    "lazy": Constraint(ConstraintKind.GBNF, AB_PLUS, trigger_patterns=("b",), trigger_tokens=(3,)),
    "other-root": Constraint(ConstraintKind.GBNF, 'start ::= "a" x\nx ::= "b"', root="start"),
    "schema": Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "array", "items": {"enum": [1, "a"]}}'),
    "json-mode": Constraint(ConstraintKind.JSON_OBJECT),
    "request": Constraint(ConstraintKind.OLLAMA_REQUEST, '{"format": {"type": "string"}}'),
}


@pytest.mark.parametrize("name", list(COMPILED_ALIKE), ids=list(COMPILED_ALIKE))
def test_a_compile_in_a_worker_process_equals_one_in_this_process(processes: ProcessPool, name: str) -> None:
    constraint = COMPILED_ALIKE[name]
    here, there = Registry(Limits()), Registry(Limits(), processes=processes)
    compiled_here = here.compile(constraint, here.register_pieces(TINY_PIECES, TINY_EOG))
    compiled_there = there.compile(constraint, there.register_pieces(TINY_PIECES, TINY_EOG))
    assert same_grammar(compiled_there.grammar, compiled_here.grammar)
    assert compiled_there.warnings == compiled_here.warnings
    assert processes.pids  # it did run there


REFUSED_ALIKE = {
    "syntax": Constraint(ConstraintKind.GBNF, 'root ::= "a" [b'),
    "unknown-token": Constraint(ConstraintKind.GBNF, "root ::= </x>"),
    "syntax-before-token": Constraint(ConstraintKind.GBNF, 'root ::= "a" </s> (\nx ::= </x>'),
    "no-root": Constraint(ConstraintKind.GBNF, 'start ::= "a"'),
    "left-recursion": Constraint(ConstraintKind.GBNF, 'root ::= root "a" | "b"'),
    "bad-trigger": Constraint(ConstraintKind.GBNF, AB_PLUS, trigger_patterns=("(",)),
    "schema": Constraint(ConstraintKind.JSON_SCHEMA, '{"type": "object", "properties": {"a": {"$ref": 1}}}'),
    "request": Constraint(ConstraintKind.OPENAI_REQUEST, '{"messages": []}'),
}


@pytest.mark.parametrize("name", list(REFUSED_ALIKE), ids=list(REFUSED_ALIKE))
def test_a_compile_refused_in_a_worker_process_raises_what_this_process_raises(
    processes: ProcessPool, name: str
) -> None:
    constraint = REFUSED_ALIKE[name]
    here, there = Registry(Limits()), Registry(Limits(), processes=processes)
    with pytest.raises(ConstraintdError) as refused_here:
        here.compile(constraint, here.register_pieces(TINY_PIECES, TINY_EOG))
    with pytest.raises(ConstraintdError) as refused_there:
        there.compile(constraint, there.register_pieces(TINY_PIECES, TINY_EOG))
    assert type(refused_there.value) is type(refused_here.value)
    assert str(refused_there.value) == str(refused_here.value)
    assert vars(refused_there.value) == vars(refused_here.value)
    assert there.grammar_count == 0


def test_a_new_vocabulary_takes_the_slot_of_the_least_recently_used_unused_one() -> None:
    registry = registry_with(max_vocabs=2)
    used: set[str] = set()
    registry.watch_sessions(used.__contains__)
    first = registry.register_pieces(TINY_PIECES, TINY_EOG)
    second = registry.register_pieces(TINY_PIECES, ())
    registry.vocab(first.content_hash)  # first is now the more recently used
    used.add(first.content_hash)
    registry.compile(Constraint(ConstraintKind.GBNF, AB_PLUS), first)
    third = registry.register_pieces(TINY_PIECES, (0,))
    assert registry.vocab_count == 2 and registry.grammar_count == 0  # the grammars over `second` went too
    with pytest.raises(NotFoundError):
        registry.vocab(second.content_hash)
    assert registry.vocab(first.content_hash) is first and registry.vocab(third.content_hash) is third
    used.add(third.content_hash)
    with pytest.raises(LimitError, match="2 vocabularies registered, the limit, each used by open sessions"):
        registry.register_pieces(TINY_PIECES, (1,))
