"""Schema coverage benchmark (a program, not a test): which real schemas each engine compiles, and whether
its grammar takes the valid documents and refuses the invalid ones.

    .venv/bin/python -m tests.benchmarks.bench_schema_coverage                      # the MaskBench sample
    .venv/bin/python -m tests.benchmarks.bench_schema_coverage --corpus DIR         # another corpus too
    .venv/bin/python -m tests.benchmarks.bench_schema_coverage --schemas 50 --seed 1  # a quick subset
    .venv/bin/python -m tests.benchmarks.bench_schema_coverage --no-peers           # constraintd's modes only

Workload: corpora of MaskBench files (a JSON schema and example documents, each marked valid or not): the
MaskBench sample in tests/vectors/maskbench-sample, and each directory given with --corpus. Each document
is written compactly (`json.dumps(data, separators=(",", ":"), ensure_ascii=False)`) and matched, on its
bytes, against the grammar each engine compiles from the schema, in the same run:
- constraintd: llama.cpp's grammar (the converter, byte for byte llama.cpp's), matched by constraintd's
  matcher over a vocabulary of one token per byte;
- constraintd (strict): the same, but a schema whose report names a keyword the grammar does not enforce
  is refused;
- constraintd (extended), constraintd (extended, strict): the same two with the extended dialect
  (`dialect="extended"`: grammars that enforce more than llama.cpp's, and a report of what they still do not);
- llguidance: its own JSON-schema compiler, as its users call it (it refuses a keyword it does not
  implement), and llguidance (lenient), told to skip such keywords instead (`x-guidance: {lenient: true}`);
- XGrammar: its own JSON-schema compiler (`any_whitespace=True, strict_mode=False`: objects open to other
  properties, as JSON Schema has them).
The peers' tokenizer is one token per byte too, so the tokens never decide a verdict.

Per corpus and engine it prints: schemas compiled and refused; schemas passing (compiled, every valid
document taken and every invalid one refused); valid documents refused and invalid documents taken,
counted over the schemas the engine compiled; the time each engine took (compiles and matching, elapsed),
and the median compile (below) over the schemas it compiled; and the median compile of the extended
dialect against llama.cpp's over the schemas both compiled. Then, for
constraintd, how many of the valid documents it refused it takes once each object's properties are in the
order llama.cpp's grammar writes them (required ones first), and why strict conversion refused: the first
keyword each refused schema's report names. A peer that is not installed is "NOT MEASURED".

A compile is what a session needs before its first mask, from the schema's text: for constraintd, the
conversion (`convert_json_schema`) and `Grammar.from_gbnf` (parse, checks, the flattened rules, the
initial state and the closures it needs), the same calls for both dialects; for llguidance, `grammar_from`
and the `LLMatcher`; for XGrammar, `compile_json_schema` (its compiler's cache off, so no compile is served
from an earlier one). What depends on the vocabulary alone is set up before the run and not counted: the
peers' tokenizer tables, constraintd's decoded pieces and shared verdicts (warmed by one compile of a small
grammar). What an engine does per grammar and vocabulary is counted where the engine does it: XGrammar's
compile builds its token mask cache; constraintd builds its mask tables at the first mask, which is not
counted (nor is llguidance's first mask). How it is timed:
- after the documents are matched, each engine that compiled a schema compiles it `--repeat` times (default
  3) more; the schema's compile time is the least of them (the one other work on the machine disturbed
  least). The engines take turns, each repetition in another order (rotated by schema and repetition), so
  no engine always runs right after another's work (caches, the allocator);
- `--clock cpu` (the default): this process's CPU time (`time.process_time`, all its threads), steady on
  a busy machine; `--clock wall`: elapsed time (`time.perf_counter`);
- constraintd's parser keeps the elements of short char classes between grammars (a converter writes the
  same few in every grammar); they are forgotten before each timed compile, so each reads its classes as a
  process's first compile does;
- the garbage collector: what the loaded corpus and engines hold is frozen out of its sight before the run
  (`gc.freeze`, as `constraintd serve` does after its imports), and it collects before each timed compile,
  so no compile pays for another's garbage; it stays on during the compile, which pays for the collections
  its own allocations cause, as it would in the server.

`--schemas N` takes N files of each corpus drawn uniformly at random without replacement (the first N of
a permutation of all of them drawn from `--seed`, default 0). Progress goes to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Protocol

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from constraintd.engine import Grammar, Matcher, Vocab  # noqa: E402
from constraintd.engine.grammar.gbnf import forget_kept_classes  # noqa: E402
from constraintd.engine.schema.convert import convert_json_schema  # noqa: E402
from constraintd.errors import ConstraintdError, SchemaError  # noqa: E402

SAMPLE: Final = ROOT / "tests" / "vectors" / "maskbench-sample"
# one token per byte, and an end of generation; constraintd's vocabulary keeps token 0 for it
PEER_PIECES: Final = [bytes((b,)) for b in range(256)] + [b"<eos>"]
PEER_EOS: Final = 256
CONSTRAINTD_BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


class Refused(Exception):
    """The engine does not compile the schema."""


class Checker(Protocol):
    def accepts(self, document: str) -> bool: ...


class Engine(Protocol):
    name: str

    def compile(self, schema: str) -> Checker: ...


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    schema: str
    valid: tuple[str, ...]
    invalid: tuple[str, ...]
    reordered: tuple[str, ...]  # the valid documents, each object's properties in llama.cpp's order


def in_llama_order(value: Any, schema: Any, root: Any, depth: int = 0) -> Any:
    """`value` with each object's properties in the order llama.cpp's grammar writes them: the required
    ones first, then the others, each in the order of the schema's `properties`; the rest last. Follows
    `properties`, `items` and `$ref` into the document; nothing else."""
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str) and depth < 64:
        depth += 1
        target = root
        for token in schema["$ref"].removeprefix("#/").split("/"):
            target = target.get(token) if isinstance(target, dict) else None
        schema = target
    if not isinstance(schema, dict) or depth >= 64:
        return value
    if isinstance(value, dict):
        declared = schema.get("properties")
        declared = declared if isinstance(declared, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        order = list(declared)

        def rank(key: str) -> tuple[bool, int]:
            return key not in required, order.index(key) if key in order else len(order)

        return {key: in_llama_order(value[key], declared.get(key), root, depth + 1)
                for key in sorted(value, key=rank)}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [in_llama_order(item, schema["items"], root, depth + 1) for item in value]
    return value


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def read_corpus(directory: Path, *, count: int | None, seed: int) -> list[Case]:
    """`count` files of the corpus (all by default), the first of a permutation drawn from `seed`."""
    files = sorted(directory.glob("*.json"))
    random.Random(seed).shuffle(files)
    cases = []
    for path in files[:count]:
        entry = json.loads(path.read_text(encoding="utf-8"))
        texts: dict[bool, list[str]] = {True: [], False: []}
        reordered = []
        for test in entry.get("tests", ()):
            texts[bool(test["valid"])].append(_compact(test["data"]))
            if test["valid"]:
                reordered.append(_compact(in_llama_order(test["data"], entry["schema"], entry["schema"])))
        cases.append(Case(path.stem, json.dumps(entry["schema"]), tuple(texts[True]), tuple(texts[False]),
                          tuple(reordered)))
    return cases


# -- engines ------------------------------------------------------------------------------------------


class _ConstraintdChecker:
    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar

    def accepts(self, document: str) -> bool:
        matcher = Matcher(self.grammar)
        try:
            return matcher.accept_bytes(document.encode()) and matcher.is_complete()
        except ConstraintdError:  # too many stacks: not taken
            return False


class ConstraintdEngine:
    def __init__(self, *, strict: bool, dialect: str = "llama.cpp") -> None:
        self.strict = strict
        self.dialect = dialect
        modes = [mode for mode, on in (("extended", dialect == "extended"), ("strict", strict)) if on]
        self.name = f"constraintd ({', '.join(modes)})" if modes else "constraintd"
        self.first_unenforced: Counter[str] = Counter()  # strict: the keyword each refusal names

    def compile(self, schema: str) -> Checker:
        try:
            conversion = convert_json_schema(schema, dialect=self.dialect)
            if self.strict and conversion.unenforced:
                self.first_unenforced[conversion.unenforced[0].keyword] += 1
                # refuses, as a strict session would
                convert_json_schema(schema, strict=True, dialect=self.dialect)
                raise AssertionError("strict conversion took a schema its report names keywords of")
            return _ConstraintdChecker(Grammar.from_gbnf(conversion.grammar, CONSTRAINTD_BYTES))
        except (SchemaError, ConstraintdError) as exc:
            raise Refused(str(exc)) from exc


class _LlguidanceChecker:
    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher

    def accepts(self, document: str) -> bool:
        self.matcher.reset()
        taken = self.matcher.consume_tokens(list(document.encode()))
        return bool(taken) and bool(self.matcher.is_accepting())


class _BytePieces:
    # what llguidance's TokenizerWrapper reads: the pieces, end of sequence, and a tokenizer
    tokens = PEER_PIECES
    eos_token_id = PEER_EOS
    bos_token_id = None

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode())


class LlguidanceEngine:
    def __init__(self, *, lenient: bool) -> None:
        import llguidance

        self.llg: Any = llguidance
        self.lenient = lenient
        self.name = "llguidance (lenient)" if lenient else "llguidance"
        self.tokenizer = llguidance.LLTokenizer(
            llguidance.TokenizerWrapper(_BytePieces()), n_vocab=len(PEER_PIECES), eos_token=[PEER_EOS]
        )

    def compile(self, schema: str) -> Checker:
        if self.lenient:
            value = json.loads(schema)
            if isinstance(value, dict):
                schema = json.dumps({**value, "x-guidance": {**value.get("x-guidance", {}), "lenient": True}})
        try:
            grammar = self.llg.grammar_from("json_schema", schema)
            matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        except (ValueError, RuntimeError) as exc:
            raise Refused(str(exc)) from exc
        if matcher.is_error():
            raise Refused(matcher.get_error())
        return _LlguidanceChecker(matcher)


class _XGrammarChecker:
    def __init__(self, xgr: Any, compiled: Any) -> None:
        self.xgr = xgr
        self.compiled = compiled

    def accepts(self, document: str) -> bool:
        matcher = self.xgr.GrammarMatcher(self.compiled)
        return bool(matcher.accept_string(document.encode())) and bool(matcher.accept_token(PEER_EOS))


class XGrammarEngine:
    name = "XGrammar"

    def __init__(self) -> None:
        import xgrammar

        self.xgr: Any = xgrammar
        info = xgrammar.TokenizerInfo(PEER_PIECES, xgrammar.VocabType.RAW, vocab_size=len(PEER_PIECES),
                                      stop_token_ids=[PEER_EOS])
        # no cache: a repeated compile of the same schema (the timing pass) is a compile, not a look-up
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: str) -> Checker:
        try:
            compiled = self.compiler.compile_json_schema(schema, any_whitespace=True, strict_mode=False)
        except (RuntimeError, ValueError) as exc:
            raise Refused(str(exc)) from exc
        return _XGrammarChecker(self.xgr, compiled)


def load_engines(*, peers: bool = True) -> tuple[list[Engine], list[str]]:
    engines: list[Engine] = [ConstraintdEngine(strict=strict, dialect=dialect)
                             for dialect in ("llama.cpp", "extended") for strict in (False, True)]
    missing: list[str] = []
    if not peers:
        return engines, missing
    makers: tuple[tuple[str, Callable[[], list[Engine]]], ...] = (
        ("llguidance", lambda: [LlguidanceEngine(lenient=False), LlguidanceEngine(lenient=True)]),
        ("XGrammar", lambda: [XGrammarEngine()]),
    )
    for name, make in makers:
        try:
            engines.extend(make())
        except ImportError as exc:
            missing.append(f"{name}: NOT MEASURED (not installed: {exc})")
    return engines, missing


# -- the run ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    schemas: int = 0
    compiled: int = 0
    passing: int = 0
    valid: int = 0  # documents of compiled schemas
    valid_refused: int = 0
    invalid: int = 0
    invalid_taken: int = 0
    taken_reordered: int = 0  # valid documents refused, taken with their properties in llama.cpp's order
    seconds: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)  # an engine's exception other than a refusal
    compiled_cases: dict[str, bool] = field(default_factory=dict)  # case -> compiled (in `measure`)
    compile_seconds: dict[str, float] = field(default_factory=dict)  # case -> its least compile (timed apart)


def measure(engine: Engine, case: Case, tally: Tally) -> None:
    tally.schemas += 1
    started = time.perf_counter()
    try:
        checker = engine.compile(case.schema)
        refused = [i for i, text in enumerate(case.valid) if not checker.accepts(text)]
        refused_valid = len(refused)
        taken_invalid = sum(checker.accepts(text) for text in case.invalid)
        if isinstance(engine, ConstraintdEngine):
            tally.taken_reordered += sum(checker.accepts(case.reordered[i]) for i in refused)
    except Refused:
        return
    except Exception as exc:  # a peer's crash counts as a refusal, and is said
        tally.errors[type(exc).__name__] += 1
        return
    finally:
        tally.seconds += time.perf_counter() - started
    tally.compiled += 1
    tally.compiled_cases[case.name] = True
    tally.valid += len(case.valid)
    tally.invalid += len(case.invalid)
    tally.valid_refused += refused_valid
    tally.invalid_taken += taken_invalid
    tally.passing += refused_valid == 0 and taken_invalid == 0


CLOCKS: Final[dict[str, Callable[[], float]]] = {"cpu": time.process_time, "wall": time.perf_counter}


def time_compiles(engines: Sequence[Engine], case: Case, index: int, tallies: dict[str, Tally], *,
                  repeat: int, clock: Callable[[], float]) -> None:
    """The least of `repeat` compiles of the case by each engine that compiled it in `measure`, the engines
    in turns, each repetition in another order; the collector collects before each (see the docstring)."""
    timed = [engine for engine in engines if tallies[engine.name].compiled_cases.get(case.name)]
    for repetition in range(repeat):
        shift = (index + repetition) % len(timed) if timed else 0
        for engine in timed[shift:] + timed[:shift]:
            gc.collect()
            forget_kept_classes()  # no compile reads its classes from an earlier one's
            started = clock()
            try:
                engine.compile(case.schema)
            except Exception:  # compiled once already: a refusal now (a peer's error) is not timed
                continue
            seconds = clock() - started
            best = tallies[engine.name].compile_seconds
            best[case.name] = min(seconds, best.get(case.name, math.inf))


def _p50_ms(seconds: Iterable[float]) -> str:
    listed = list(seconds)
    return f"{1000 * statistics.median(listed):.2f}" if listed else "-"


def _share(part: int, whole: int) -> str:
    return f"{part:,} of {whole:,} ({100 * part / whole:.1f}%)" if whole else f"{part:,} of 0"


def print_table(title: str, cases: Sequence[Case], tallies: dict[str, Tally], missing: Sequence[str], *,
                clock: str, repeat: int) -> None:
    valid = sum(len(case.valid) for case in cases)
    invalid = sum(len(case.invalid) for case in cases)
    print(f"\n{title}: {len(cases):,} schemas, {valid:,} valid and {invalid:,} invalid documents")
    header = (f"{'engine':30} {'compiled':>9} {'refused':>8} {'passing':>18} {'valid refused':>24} "
              f"{'invalid taken':>24} {'seconds':>8} {'compile p50 ms':>15}")
    print(header)
    print("-" * len(header))
    for name, tally in tallies.items():
        errors = f"  ({sum(tally.errors.values())} errors: {dict(tally.errors)})" if tally.errors else ""
        print(f"{name:30} {tally.compiled:>9,} {tally.schemas - tally.compiled:>8,} "
              f"{_share(tally.passing, tally.schemas):>18} {_share(tally.valid_refused, tally.valid):>24} "
              f"{_share(tally.invalid_taken, tally.invalid):>24} {tally.seconds:>8.1f} "
              f"{_p50_ms(tally.compile_seconds.values()):>15}{errors}")
    for note in missing:
        print(note)
    default, extended = tallies.get("constraintd"), tallies.get("constraintd (extended)")
    if default is not None and extended is not None:
        both = default.compile_seconds.keys() & extended.compile_seconds.keys()
        p50s = [statistics.median(tally.compile_seconds[name] for name in both) if both else math.nan
                for tally in (extended, default)]
        print(f"compile (conversion and grammar) p50 over the {len(both):,} schemas both compiled: extended "
              f"{1000 * p50s[0]:.2f} ms, llama.cpp's {1000 * p50s[1]:.2f} ms, ratio {p50s[0] / p50s[1]:.2f}")
    print(f"compile: {clock} time, the least of {repeat} per schema (engines in turns, a collection before "
          "each)")
    for name, tally in tallies.items():
        if tally.valid_refused and name.startswith("constraintd"):
            share = _share(tally.taken_reordered, tally.valid_refused)
            print(f"{name}: {share} of its refused valid documents are taken with their properties in "
                  "llama.cpp's order (required first, then the schema's)")


def _versions() -> str:
    found = []
    for package in ("llguidance", "xgrammar"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    return ", ".join(found)


def run_corpus(title: str, cases: Sequence[Case], engines: Sequence[Engine], missing: Sequence[str], *,
               repeat: int, clock: str) -> None:
    tallies = {engine.name: Tally() for engine in engines}
    for engine in engines:
        if isinstance(engine, ConstraintdEngine):
            engine.first_unenforced.clear()
    for i, case in enumerate(cases, 1):
        print(f"\r{title}: {i}/{len(cases)} {case.name[:60]:60}", end="", file=sys.stderr, flush=True)
        for engine in engines:
            measure(engine, case, tallies[engine.name])
    print(file=sys.stderr)
    if repeat > 0:
        for i, case in enumerate(cases):
            print(f"\r{title}, compiles timed: {i + 1}/{len(cases)} {case.name[:60]:60}", end="",
                  file=sys.stderr, flush=True)
            time_compiles(engines, case, i, tallies, repeat=repeat, clock=CLOCKS[clock])
        print(file=sys.stderr)
    print_table(title, cases, tallies, missing, clock=clock, repeat=repeat)
    for engine in engines:
        if isinstance(engine, ConstraintdEngine) and engine.strict and engine.first_unenforced:
            firsts = engine.first_unenforced.most_common()
            common = ", ".join(f"{keyword} {count}" for keyword, count in firsts)
            print(f"{engine.name} refusals by the first keyword the report names: {common}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--corpus", type=Path, action="append", default=[], metavar="DIR",
                        help="a directory of MaskBench files, measured after the sample (repeatable)")
    parser.add_argument("--no-sample", action="store_true", help="leave out the MaskBench sample")
    parser.add_argument("--schemas", type=int, default=None, help="N files of each corpus (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="which N files (default 0)")
    parser.add_argument("--no-peers", action="store_true", help="measure constraintd's modes only")
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed compiles of each schema by each engine, the least kept (default 3; 0: "
                        "none)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time (default); wall: elapsed")
    args = parser.parse_args(argv)
    corpora = ([] if args.no_sample else [("MaskBench sample", SAMPLE)]) + [
        (str(directory.name), directory) for directory in args.corpus
    ]
    if not corpora:
        parser.error("no corpus: --no-sample needs --corpus")
    engines, missing = load_engines(peers=not args.no_peers)
    # what depends on the vocabulary alone (decoded pieces, shared verdicts) is set up before any compile
    Grammar.from_gbnf('root ::= "{" [a-z]* "}"', CONSTRAINTD_BYTES)
    print(f"schema coverage; seed {args.seed}; {_versions()}")
    for title, directory in corpora:
        cases = read_corpus(directory, count=args.schemas, seed=args.seed)
        gc.collect()
        gc.freeze()  # the corpus and the engines live through the run: out of the collector's sight
        run_corpus(title, cases, engines, missing, repeat=args.repeat, clock=args.clock)
        gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main())
