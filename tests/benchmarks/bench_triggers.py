"""Trigger benchmark (a program, not a test): a lazy grammar's accept with 1 to 500 tools' trigger words.

    .venv/bin/python -m tests.benchmarks.bench_triggers                      # 1, 10, 100, 500 tools
    .venv/bin/python -m tests.benchmarks.bench_triggers --tools 1,100 --texts 3 --seed 1

Issue #18: many tools must not slow a generation. A chat request with tools gets a lazy grammar from
llama.cpp's chat layer: it allows everything until a trigger word, then replays from the match and holds
the text to a tool call. Qwen3-Coder's format triggers on `<tool_call>` and on `<function=NAME>` for every
tool, so a request with 500 tools waits on 501 words.

Workload, drawn from `--seed`: per tool count N, N tools with distinct names (a verb and a noun, as real
tool lists have) and a small object schema each; the Qwen3-Coder template's chat params for tool_choice
auto (grammar, lazy flag, trigger words), computed by the project's chat layer; the words made triggers
over the qwen2 vocabulary as the service makes them (`chat_triggers`: a preserved word that is one token
triggers on it, any other word is an escaped pattern). `--texts` texts: a few hundred tokens of prose made
of the vocabulary's plain word tokens (no trigger in it), then a call of one of the tools in Qwen3-Coder's
format, tokenized by llama.cpp's tokenizer.

Engines, on the same grammar, triggers and tokens, in turn on each text:
- llama.cpp's lazy grammar sampler (`llama_sampler_init_grammar_lazy_patterns`, then `llama_sampler_accept`
  per token, through llama-cpp-python). It walks first, in a forked child (llama.cpp aborts the process
  where a replay fails), and decides whether the text is kept: every token allowed once the grammar is
  triggered, and the end of generation allowed after the last;
- constraintd's `Matcher`, in process: a grammar compiled for each text, and (`constraintd, cached`) one
  grammar compiled for the tool count and a new matcher for each text, as the service's grammar cache
  serves a tool list it has seen;
- XGrammar's structural tag (one tag per tool, begun by `<function=NAME>`, triggered by the same words),
  compiled once for the tool count, over the waiting part of each text; `--no-xgrammar` leaves it out.
Per engine and tool count: p50 / p99 of an accept while the grammar waits (the prose), of the accept that
triggers it, and of an accept after it (the call), and of the compile (grammar and triggers to the first
token accepted); the ratio of the last tool count to the first for each engine, and the peers' time over
constraintd's. The check line says whether constraintd and llama.cpp agree on every kept text: both accept
every token, and the trigger fires at the same token.

Numbers depend on the machine and what else runs on it: compare the rows of one run.
Progress goes to stderr; the tables to stdout.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Final

import llama_cpp as ll
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from constraintd.chat_templates import chat_grammar_of  # noqa: E402
from constraintd.engine import Grammar, Matcher, Vocab  # noqa: E402
from constraintd.engine.chat.templates.template_inputs import ChatTool, parse_messages  # noqa: E402
from constraintd.service.chat import chat_triggers  # noqa: E402
from tests import reference  # noqa: E402
from tests.chat_oracle.cases import template_paths  # noqa: E402
from tests.oracle import LlamaVocab  # noqa: E402

TEMPLATE: Final = "Qwen3-Coder"
TOOL_COUNTS: Final = (1, 10, 100, 500)
CONSTRAINTD, LLAMA_CPP, XGRAMMAR = "constraintd", "llama.cpp", "XGrammar"
CACHED: Final = "constraintd, cached"  # one compiled grammar a tool count, a new matcher a text
WAITING, TRIGGER, AFTER, COMPILE = "waiting", "trigger", "after", "compile"
PERCENTILES: Final = (50, 99)
LABEL, CELL = 32, 24  # the tables' first column and the others

# names as real tool lists spell them: a verb and a noun, sometimes a qualifier (500 tools need 500)
# fmt: off
VERBS: Final = (
    "get", "list", "search", "create", "update", "delete", "fetch", "find", "send", "set", "check", "add",
    "remove", "cancel", "book", "schedule", "convert", "calculate", "translate", "summarize", "upload",
    "download", "query", "lookup", "validate", "generate", "resolve", "archive", "restore", "share",
)
NOUNS: Final = (
    "weather", "forecast", "flight", "hotel", "booking", "calendar_event", "email", "contact", "invoice",
    "order", "payment", "refund", "ticket", "issue", "pull_request", "commit", "branch", "file", "folder",
    "document", "spreadsheet", "user", "account", "password", "subscription", "product", "inventory",
    "shipment", "route", "location", "restaurant", "reservation", "recipe", "stock_price", "exchange_rate",
    "news", "article", "message", "channel", "meeting", "reminder", "task", "note", "photo", "video",
    "playlist", "song", "movie", "translation", "definition",
)
QUALIFIERS: Final = ("", "", "", "_by_id", "_details", "_status", "_history", "_summary", "s")
PARAMETERS: Final = (
    "query", "city", "id", "name", "date", "email", "url", "path", "user_id", "text", "location", "title",
    "symbol", "currency", "language", "category", "address", "order_id", "message", "keyword",
)
# fmt: on
OPTIONAL: Final = (("limit", "integer"), ("verbose", "boolean"), ("units", "string"), ("page", "integer"))
FREE_TOKENS: Final = 300  # about that many tokens of prose before the call
_PLAIN_WORD = re.compile(rb"^ [a-z]{2,12}$")

Clock = Callable[[], int]
CLOCKS: Final[dict[str, Clock]] = {"wall": time.perf_counter_ns, "cpu": time.process_time_ns}


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the workload -------------------------------------------------------------------------------------


def draw_tools(rng: random.Random, count: int) -> list[ChatTool]:
    """`count` tools with distinct names, each taking one required string and maybe an optional one."""
    names: set[str] = set()
    tools: list[ChatTool] = []
    while len(tools) < count:
        name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}{rng.choice(QUALIFIERS)}"
        if name in names:
            continue
        names.add(name)
        required = rng.choice(PARAMETERS)
        properties: dict[str, Any] = {required: {"type": "string", "description": f"The {required}."}}
        if rng.random() < 0.5:
            optional, kind = rng.choice(OPTIONAL)
            properties[optional] = {"type": kind}
        description = f"{name.replace('_', ' ').capitalize()}."
        parameters = {"type": "object", "properties": properties, "required": [required]}
        tools.append(ChatTool(name=name, description=description, parameters=parameters))
    return tools


@dataclass(frozen=True, slots=True)
class Triggered:
    """A lazy grammar of a chat request with tools, its triggers made over the vocabulary."""

    grammar: str
    words: tuple[str, ...]
    patterns: tuple[str, ...]
    tokens: tuple[int, ...]


def chat_grammar(source: str, tools: Sequence[ChatTool], vocab: Vocab) -> Triggered:
    params = chat_grammar_of(
        source,
        parse_messages([{"role": "user", "content": "Help me, please."}]),
        tools=tools,
        tool_choice="auto",
        now=0.0,
    )
    if not params.grammar_lazy:
        raise RuntimeError(f"{TEMPLATE}'s grammar for tool_choice auto is not lazy")
    words = tuple(t.value for t in params.grammar_triggers if t.kind == "word")
    others = tuple(t.pattern() for t in params.grammar_triggers if t.kind != "word")
    patterns, tokens = chat_triggers(words, params.preserved_tokens or (), vocab)
    return Triggered(params.grammar, words, (*patterns, *others), tokens)


def plain_words(vocab: Vocab) -> list[bytes]:
    """The vocabulary's plain word tokens: a space and 2 to 12 lowercase ASCII letters."""
    return [p for p in vocab.pieces if _PLAIN_WORD.match(p)]


def prose(rng: random.Random, words: Sequence[bytes], count: int) -> str:
    """`count` words in sentences and paragraphs: text with no trigger word in it."""
    out: list[str] = []
    length = 0
    for _ in range(count):
        word = rng.choice(words).decode()
        if not out or out[-1].endswith("\n"):
            word = word.lstrip()
        out.append(word.capitalize() if length == 0 else word)
        length += 1
        if length >= rng.randint(8, 20):
            out.append("." if rng.random() < 0.8 else ".\n\n")
            length = 0
    return "".join(out).rstrip(".\n") + "."


def call(tool: ChatTool, value: str) -> str:
    """A call of `tool` in Qwen3-Coder's format, with its required argument."""
    required = tool.parameters["required"][0]
    return (
        f"<tool_call>\n<function={tool.name}>\n<parameter={required}>\n{value}\n</parameter>\n"
        "</function>\n</tool_call>"
    )


@dataclass(frozen=True, slots=True)
class Text:
    tokens: list[int]
    tool: str


def draw_texts(
    rng: random.Random, tools: Sequence[ChatTool], words: Sequence[bytes], llama: LlamaVocab, count: int
) -> list[Text]:
    texts = []
    for _ in range(count):
        tool = rng.choice(tools)
        value = prose(rng, words, rng.randint(2, 6))
        body = prose(rng, words, rng.randint(FREE_TOKENS - 60, FREE_TOKENS + 60)) + "\n\n" + call(tool, value)
        texts.append(Text(llama.tokenize(body.encode()), tool.name))
    return texts


# -- llama.cpp ----------------------------------------------------------------------------------------

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def llama_sampler(llama: LlamaVocab, triggered: Triggered) -> Any:
    patterns = (ctypes.c_char_p * max(1, len(triggered.patterns)))(*[p.encode() for p in triggered.patterns])
    tokens = (ll.llama_token * max(1, len(triggered.tokens)))(*triggered.tokens)
    return ll.llama_sampler_init_grammar_lazy_patterns(
        llama.vocab,
        triggered.grammar.encode(),
        b"root",
        patterns,
        len(triggered.patterns),
        tokens,
        len(triggered.tokens),
    )


class _OneToken:
    """llama.cpp's grammar applied to one candidate, as common_sampler_sample checks a drawn token."""

    def __init__(self) -> None:
        self.data = np.zeros(1, dtype=_TOKEN_DATA)
        self.array = ll.llama_token_data_array(
            data=self.data.ctypes.data_as(ll.llama_token_data_p), size=1, selected=-1, sorted=False
        )

    def allows(self, sampler: Any, token: int) -> bool:
        self.data["id"][0] = token
        self.data["logit"][0] = 0.0
        self.array.size = 1
        ll.llama_sampler_apply(sampler, ctypes.byref(self.array))
        return bool(np.isfinite(self.data["logit"][0]))


def llama_walk(
    llama: LlamaVocab, triggered: Triggered, tokens: Sequence[int], eog: int, clock: Clock
) -> dict[str, Any]:
    """Compile and walk one text with llama.cpp's lazy sampler, each accept timed; untimed between them,
    where it triggered (the first token after whose accept the end of generation is refused: a waiting
    grammar allows everything) and, once triggered, whether it allows the next token (llama.cpp aborts on
    a token it refuses) and the end of generation after the last."""
    one = _OneToken()
    # once untimed: a forked child's first compile pays for the pages it copies from its parent
    sampler = llama_sampler(llama, triggered)
    if not sampler:
        return {"error": "llama.cpp refused the grammar"}
    ll.llama_sampler_accept(sampler, tokens[0])
    ll.llama_sampler_free(sampler)
    started = clock()
    sampler = llama_sampler(llama, triggered)
    accept = ll.llama_sampler_accept
    accept(sampler, tokens[0])
    compile_ns = clock() - started
    times = [0]  # the first token's accept is the compile's
    trigger = None if one.allows(sampler, eog) else 0
    for at in range(1, len(tokens)):
        token = tokens[at]
        if trigger is not None and not one.allows(sampler, token):
            return {"trigger": trigger, "refused": at}
        started = clock()
        accept(sampler, token)
        times.append(clock() - started)
        if trigger is None and not one.allows(sampler, eog):
            trigger = at
    finished = one.allows(sampler, eog)
    ll.llama_sampler_free(sampler)
    refused = None if finished else len(tokens)
    return {"trigger": trigger, "refused": refused, "compile": compile_ns, "times": times}


def in_child(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`work()` in a forked child, its answer as JSON: llama.cpp aborts the process where a lazy grammar's
    replay fails, and one text must not end the run."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            answer = work()
        except BaseException as exc:  # the child reports everything, and never returns into the run
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"error": f"llama.cpp ended the process (status {status})"}
    reported: dict[str, Any] = json.loads(b"".join(chunks))
    return reported


# -- XGrammar -----------------------------------------------------------------------------------------


class XGrammarTags:
    """XGrammar's structural tag: one tag per tool, begun by `<function=NAME>`, its arguments' schema
    inside, triggered by the same per-tool words (a trigger must begin a tag: `<tool_call>` cannot be one)."""

    def __init__(self, pieces: Sequence[bytes], eog: Sequence[int]) -> None:
        import xgrammar

        self.xgr: Any = xgrammar
        info = xgrammar.TokenizerInfo(
            list(pieces), xgrammar.VocabType.RAW, vocab_size=len(pieces), stop_token_ids=list(eog)
        )
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, tools: Sequence[ChatTool]) -> Any:
        tags = [
            {
                "type": "tag",
                "begin": f"<function={tool.name}>",
                "content": {"type": "json_schema", "json_schema": tool.parameters},
                "end": "</function>",
            }
            for tool in tools
        ]
        triggers = [f"<function={tool.name}>" for tool in tools]
        tagged = {"type": "triggered_tags", "triggers": triggers, "tags": tags}
        tag = {"type": "structural_tag", "format": tagged}
        compiled = self.compiler.compile_structural_tag(json.dumps(tag))
        return self.xgr.GrammarMatcher(compiled)


# -- the run ------------------------------------------------------------------------------------------


Samples = dict[str, dict[str, list[int]]]  # engine -> measure -> nanoseconds


@dataclass
class CountRun:
    tools: int
    patterns: int = 0
    trigger_tokens: int = 0
    texts: int = 0
    kept: int = 0
    dropped: list[str] = field(default_factory=list)
    agreed: int = 0
    disagreed: list[str] = field(default_factory=list)
    tokens: int = 0
    samples: Samples = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, engine: str, measure: str, value: int) -> None:
        self.samples.setdefault(engine, {}).setdefault(measure, []).append(value)


def compile_constraintd(vocab: Vocab, triggered: Triggered) -> Grammar:
    return Grammar.from_gbnf(
        triggered.grammar, vocab, trigger_patterns=triggered.patterns, trigger_tokens=triggered.tokens
    )


def walk_constraintd(
    run: CountRun,
    vocab: Vocab,
    triggered: Triggered,
    tokens: Sequence[int],
    clock: Clock,
    cached: Grammar | None = None,
) -> tuple[int | None, bool]:
    """Compile (unless `cached`: a new matcher of that grammar) and walk one text; where the trigger fired
    and whether every token was accepted."""
    name = CONSTRAINTD if cached is None else CACHED
    started = clock()
    grammar = compile_constraintd(vocab, triggered) if cached is None else cached
    matcher = Matcher(grammar)
    ok = matcher.accept(tokens[0])
    run.add(name, COMPILE, clock() - started)
    trigger = None if matcher.awaiting_trigger else 0
    for at in range(1, len(tokens)):
        waiting = trigger is None
        started = clock()
        accepted = matcher.accept(tokens[at])
        ns = clock() - started
        ok = ok and accepted
        if not accepted:
            break
        if waiting and not matcher.awaiting_trigger:
            trigger = at
            run.add(name, TRIGGER, ns)
        else:
            run.add(name, WAITING if waiting else AFTER, ns)
    return trigger, ok and matcher.is_complete()


def walk_xgrammar(run: CountRun, matcher: Any, tokens: Sequence[int], trigger: int, clock: Clock) -> bool:
    """Walk the waiting part of one text (the tokens before the trigger's) from the matcher's start."""
    matcher.reset()
    ok = bool(matcher.accept_token(tokens[0]))
    for at in range(1, trigger):
        started = clock()
        accepted = bool(matcher.accept_token(tokens[at]))
        run.add(XGRAMMAR, WAITING, clock() - started)
        ok = ok and accepted
        if not accepted:
            break
    return ok


def run_count(
    count: int,
    *,
    source: str,
    vocab: Vocab,
    llama: LlamaVocab,
    words: Sequence[bytes],
    n_texts: int,
    seed: int,
    clock: Clock,
    xgr: XGrammarTags | None,
    warm: bool,
) -> CountRun:
    rng = random.Random(f"{seed}/{count}")
    tools = draw_tools(rng, count)
    triggered = chat_grammar(source, tools, vocab)
    texts = draw_texts(rng, tools, words, llama, n_texts)
    run = CountRun(count, len(triggered.patterns), len(triggered.tokens), len(texts))
    eog = min(vocab.eog_ids)
    if warm:
        # untimed: the vocabulary's tables each engine builds at its first grammar
        walk_constraintd(CountRun(count), vocab, triggered, texts[0].tokens, clock)
        llama_walk(llama, triggered, texts[0].tokens, eog, clock)
    cached = compile_constraintd(vocab, triggered)
    xgr_matcher = None
    if xgr is not None:
        _progress(f"[{count} tools] XGrammar's compile")
        started = clock()
        xgr_matcher = xgr.compile(tools)
        run.add(XGRAMMAR, COMPILE, clock() - started)
    xgr_failed = 0
    for number, text in enumerate(texts):
        _progress(f"[{count} tools] text {number + 1}/{len(texts)}, {len(text.tokens)} tokens")
        gc.collect()
        # llama.cpp first: it decides whether the text is kept. The others take turns after it.
        walk = in_child(lambda: llama_walk(llama, triggered, text.tokens, eog, clock))  # noqa: B023
        if "error" in walk or walk["refused"] is not None or walk["trigger"] is None:
            walk.pop("times", None)
            run.dropped.append(f"{text.tool}: {walk}")
            continue
        trigger = int(walk["trigger"])
        run.add(LLAMA_CPP, COMPILE, walk["compile"])
        for at, ns in enumerate(walk["times"][1:], start=1):
            run.add(LLAMA_CPP, WAITING if at < trigger else TRIGGER if at == trigger else AFTER, ns)
        walks: dict[str, tuple[int | None, bool]] = {}
        for engine in (CONSTRAINTD, CACHED) if number % 2 == 0 else (CACHED, CONSTRAINTD):
            walks[engine] = walk_constraintd(
                run, vocab, triggered, text.tokens, clock, cached if engine == CACHED else None
            )
        if xgr_matcher is not None:
            xgr_failed += not walk_xgrammar(run, xgr_matcher, text.tokens, trigger, clock)
        run.kept += 1
        run.tokens += len(text.tokens)
        if all(walk == (trigger, True) for walk in walks.values()):
            run.agreed += 1
        else:
            run.disagreed.append(f"{text.tool}: llama.cpp triggered at {trigger}; constraintd {walks}")
    if xgr_failed:
        run.notes.append(f"XGrammar refused a waiting token in {xgr_failed} texts")
    return run


# -- the report ---------------------------------------------------------------------------------------


def _percentile(values: Sequence[int], q: int) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def _time(ns: float, unit: float) -> str:
    if ns != ns:
        return "—"
    value = ns / unit
    return f"{value:.3g}" if value < 1000 else f"{value:,.0f}"


def _ratio(a: float, b: float) -> str:
    if a != a or b != b or b == 0:
        return "—"
    ratio = a / b
    return f"{ratio:,.0f}×" if ratio >= 100 else f"{ratio:.3g}×"


def print_report(runs: Sequence[CountRun], engines: Sequence[str]) -> None:
    counts = [run.tools for run in runs]
    print()
    print("Workload:")
    for run in runs:
        tools = f"{run.tools} tool" if run.tools == 1 else f"{run.tools} tools"
        print(
            f"  {tools}: {run.patterns} trigger patterns, {run.trigger_tokens} trigger tokens; "
            f"{run.kept} of {run.texts} texts kept ({run.tokens} tokens)"
        )
        for why in run.dropped:
            print(f"    dropped (llama.cpp does not accept it whole): {why}")
        for note in run.notes:
            print(f"    {note}")
    pairs = [(LLAMA_CPP, CONSTRAINTD), (LLAMA_CPP, CACHED), (XGRAMMAR, CONSTRAINTD)]
    for measure, title, unit in (
        (WAITING, "accept while waiting (the prose), µs", 1e3),
        (TRIGGER, "the accept that triggers (its replay included), µs", 1e3),
        (AFTER, "accept after the trigger (the call), µs", 1e3),
        (COMPILE, "compile: grammar and triggers to the first token accepted, ms", 1e6),
    ):
        print()
        print(f"{title}: p50 / p99 by tool count")
        last = f"p50 {counts[-1]}/{counts[0]}"
        heads = [f"{n} tool" if n == 1 else f"{n} tools" for n in counts]
        print(f"  {'':<{LABEL}}" + "".join(f"{head:>{CELL}}" for head in heads) + f"{last:>14}")
        for engine in engines:
            values = [run.samples.get(engine, {}).get(measure, []) for run in runs]
            if not any(values):
                continue
            p50s = [_percentile(v, 50) for v in values]
            cells = [f"{_time(_percentile(v, 50), unit)} / {_time(_percentile(v, 99), unit)}" for v in values]
            ratio = _ratio(p50s[-1], p50s[0]) if len(runs) > 1 else ""
            print(f"  {engine:<{LABEL}}" + "".join(f"{c:>{CELL}}" for c in cells) + f"{ratio:>14}")
        for peer, ours in pairs:
            cells = []
            for run in runs:
                theirs_values = run.samples.get(peer, {}).get(measure, [])
                ours_values = run.samples.get(ours, {}).get(measure, [])
                cells.append(
                    " / ".join(
                        _ratio(_percentile(theirs_values, q), _percentile(ours_values, q))
                        for q in PERCENTILES
                    )
                )
            if any(c != "— / —" for c in cells):
                label = f"{peer} ÷ {ours}"
                print(f"  {label:<{LABEL}}" + "".join(f"{c:>{CELL}}" for c in cells))
    print()
    agreed = sum(run.agreed for run in runs)
    kept = sum(run.kept for run in runs)
    verdict = "agree" if agreed == kept else "DISAGREE"
    print(
        f"Check: constraintd and llama.cpp {verdict} on {agreed} of {kept} kept texts "
        "(every token accepted, the trigger fired at the same token, the end of generation allowed after)"
    )
    for run in runs:
        for why in run.disagreed:
            print(f"  {run.tools} tools: {why}")


def _versions() -> str:
    found = []
    for package in ("llama-cpp-python", "xgrammar", "numpy"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} missing")
    return ", ".join(found)


def _counts(text: str) -> tuple[int, ...]:
    counts = tuple(int(part) for part in text.split(","))
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("tool counts are positive integers, comma-separated")
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--tools", type=_counts, default=TOOL_COUNTS, help="tool counts (default 1,10,100,500)"
    )
    parser.add_argument("--texts", type=int, default=10, help="texts per tool count (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="the tools and texts drawn (default 0)")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="wall: elapsed time (default; a microsecond's accept is below the CPU clock's "
        "resolution and cost); cpu: this process's CPU time",
    )
    parser.add_argument("--no-xgrammar", action="store_true", help="leave XGrammar out")
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    source = next(p for p in template_paths() if p.stem == TEMPLATE).read_text()
    path = reference.require(reference.vocab_path("qwen2"))
    _progress("loading the qwen2 vocabulary")
    llama = LlamaVocab(path)
    vocab = Vocab.from_gguf(path)
    words = plain_words(vocab)
    xgr = None
    engines = [CONSTRAINTD, CACHED, LLAMA_CPP]
    if not args.no_xgrammar:
        try:
            xgr = XGrammarTags(vocab.pieces, sorted(vocab.eog_ids))
            engines.append(XGRAMMAR)
        except ImportError:
            _progress("XGrammar is not installed: left out")
    print(
        f"Lazy grammars of {TEMPLATE}'s tool calls (tool_choice auto) over qwen2; seed {args.seed}, "
        f"{args.texts} texts a tool count; {args.clock} time; Python {platform.python_version()}, "
        f"{os.cpu_count()} cores; {_versions()}"
    )
    gc.freeze()  # what lives through the run is out of the collector's sight
    runs = [
        run_count(
            count,
            source=source,
            vocab=vocab,
            llama=llama,
            words=words,
            n_texts=args.texts,
            seed=args.seed,
            clock=clock,
            xgr=xgr,
            warm=number == 0,
        )
        for number, count in enumerate(args.tools)
    ]
    print_report(runs, engines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
