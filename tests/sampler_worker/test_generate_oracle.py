"""sampler_worker.generate against llama-server's sampling, rebuilt from llama.cpp's own parts.

The reference is `common_sampler_sample(grammar_first = false)` + `common_sampler_accept`, step by step,
with llama.cpp's sampler chain (tests/oracle.py `LlamaSamplerChain`, built as `common_sampler_init`
builds it: the model's suppress tokens as -inf logit biases, then the samplers) and llama.cpp's grammar
sampler (`LlamaGrammar`, plain or lazy):
    draw with the chain; apply the grammar to that one token; if it is refused, apply the grammar to
    every token and run the whole chain again (same generator); accept the token in grammar and chain.
Ours: `generate` with a constraintd session, once without overlap and once with mask-ahead (the first
draw checked against a mask fetched while the model evaluated the token before). Compared: every token
id, and every step where the first draw was refused.

The identity matrix: 20 prompts (chat and raw) x 7 constraints (JSON mode, three JSON schemas, two GBNF
grammars, a lazy tool-call grammar) x 2 sampler settings (greedy; llama-server's defaults, temperature 0.8,
with a seed) = 280 generations of at most 24 tokens, in process, each generated twice (without overlap and
ahead): about 5,500 tokens and 1,700 rejected first draws a mode (the end-of-run table counts them), about 6
minutes of one core with the model on one thread. To fit CI, both sides take their logits from one
`LogitsCache`: the model's logits after each sequence of tokens, evaluated once, as llama-server evaluates
(the prompt in one batch, then one token per step; another branch is reached by cutting the context back to
the common prefix), so a side that parts from the other still gets the true logits of its own tokens and the
difference is found and reported in full. The reference's whole-vocabulary masks are kept by (constraint,
accepted tokens) in a `MaskCache`: llama.cpp computes each once. That the model's logits are llama.cpp's (the
`Llama` class with its default context) is tests/sampler_worker/test_model.py's
`test_logits_are_llama_cpp_pythons`; the generation through a Unix socket below runs the reference on a
llama.cpp model of its own, end to end (40 tokens, warmer sampling with a repetition penalty).

Tool calls (`test_tool_call_generation_is_llama_servers`): 3 chats x 3 requests (Llama 3.2's template with
tool_choice required, Qwen 2.5's with auto and required) x the 2 settings = 18 generations of at most 48
tokens; the reference's prompt, grammar, triggers and prefill come from llama.cpp's own chat layer.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from clients import Client, VocabHandle
from constraintd.engine.chat.requests import json_object_grammar
from constraintd.engine.schema.convert import json_schema_to_gbnf
from sampler_worker.chain import SamplerSettings
from sampler_worker.generate import Overlap, generate
from sampler_worker.model import Model
from sampler_worker.prompt import prompt_tokens
from sampler_worker.reasoning_budget import UNLIMITED, BudgetState, ReasoningBudget, utf8_complete
from sampler_worker.sidecar import PrivateConstraintd
from tests.conftest import OracleReport
from tests.oracle import LlamaGrammar, LlamaSamplerChain, LlamaVocab, grammar_allows
from tests.sampler_worker.llama_chain import llama_steps

N_CTX = 512
MAX_TOKENS = 24
# every case runs without overlap and with mask-ahead: the same tokens and rejection points are expected
OVERLAPS: tuple[Overlap, ...] = ("off", "ahead")
Logits = npt.NDArray[np.float32]

# (chat message, or None) and (raw prompt, or None): short, of many kinds, some that suit no constraint.
PROMPTS: list[tuple[str | None, str | None]] = [
    ("Tell me about a city you like.", None),
    ("What should I cook tonight?", None),
    ("Describe your favourite animal in a few words.", None),
    ("Will it rain tomorrow in Lisbon?", None),
    ("Give me one fact about the deep ocean.", None),
    ("Name a colour and say why you like it.", None),
    ("How are you feeling today?", None),
    ("Suggest a name for a small sailing boat.", None),
    ("What time is it in Tokyo right now?", None),
    ("Find bicycle repair shops near the station.", None),
    ("Work out 17 times 23.", None),
    ("Which planet is the largest?", None),
    ("Rate this film: a slow story about a lighthouse keeper.", None),
    ("List some fruits that are yellow.", None),
    (None, "Answer:"),
    (None, "Q: Is water wet?\nA:"),
    (None, "Output as JSON:\n"),
    (None, "The result is "),
    (None, "<start_of_turn>user\nPick a number.<end_of_turn>\n<start_of_turn>model\n"),
    (None, "Notes from the meeting on Tuesday:"),
]

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "celsius": {"type": "integer", "minimum": -50, "maximum": 50},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "celsius", "sunny"],
    "additionalProperties": False,
}
MOOD_SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["glad", "tired", "curious"]},
        "score": {"type": "number", "minimum": 0},
        "note": {"type": "string"},
    },
    "required": ["mood"],
}
WORDS_SCHEMA = {
    "type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "minItems": 1, "maxItems": 4
}
TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "tool": {"enum": ["search", "clock", "calculator"]},
        "input": {"type": "string", "maxLength": 30},
    },
    "required": ["tool", "input"],
}
VERDICT_GRAMMAR = """root ::= verdict ", " reason "."
verdict ::= "Yes" | "No" | "Maybe"
reason ::= [a-z] [a-z ]{0,40}
"""
RECORD_GRAMMAR = """root ::= line{1,3}
line ::= key ": " value "\\n"
key ::= [A-Z] [a-z]{1,10}
value ::= [0-9]{1,4} | "\\"" [^"\\n]{0,20} "\\""
"""
# The tool call may come after free text: the grammar starts at the first "{" (a hermes-style trigger).
TOOL_TRIGGER = r"[\s\S]*?(\{)[\s\S]*"


@dataclass(frozen=True)
class Constraint:
    name: str
    session: dict[str, object]  # keyword arguments of Client.session
    gbnf: str  # the same grammar, for llama.cpp
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()  # tokens the grammar accepts before the first step


def _schema(name: str, schema: Mapping[str, object]) -> Constraint:
    text = json.dumps(schema)
    return Constraint(name, {"json_schema": text}, json_schema_to_gbnf(text))


CONSTRAINTS = [
    Constraint("json-mode", {"json_object": True}, json_object_grammar()),
    _schema("schema-weather", WEATHER_SCHEMA),
    _schema("schema-mood", MOOD_SCHEMA),
    _schema("schema-words", WORDS_SCHEMA),
    Constraint("gbnf-verdict", {"gbnf": VERDICT_GRAMMAR}, VERDICT_GRAMMAR),
    Constraint("gbnf-record", {"gbnf": RECORD_GRAMMAR}, RECORD_GRAMMAR),
    Constraint(
        "lazy-tool-call",
        {"gbnf": json_schema_to_gbnf(json.dumps(TOOL_SCHEMA)), "trigger_patterns": [TOOL_TRIGGER]},
        json_schema_to_gbnf(json.dumps(TOOL_SCHEMA)),
        (TOOL_TRIGGER,),
    ),
]
SETTINGS: list[tuple[str, Callable[[int], SamplerSettings]]] = [
    ("greedy", lambda seed: SamplerSettings(seed=seed, temperature=0.0)),
    ("t0.8", lambda seed: SamplerSettings(seed=seed)),
]


@dataclass(frozen=True)
class Case:
    prompt: int  # index in PROMPTS
    constraint: Constraint
    settings_name: str
    settings: SamplerSettings

    @property
    def id(self) -> str:
        return f"p{self.prompt:02d}-{self.constraint.name}-{self.settings_name}"


# Prompt-major order: the cases of one prompt run one after the other and share its evaluation.
CASES = [
    Case(prompt, constraint, name, make(1000 + prompt))
    for prompt in range(len(PROMPTS))
    for constraint in CONSTRAINTS
    for name, make in SETTINGS
]


class LogitsCache:
    """The model's logits after a sequence of tokens (prompt + generated), computed once per sequence.

    Evaluated as llama-server evaluates: the prompt in one batch, then one token per step (a batch of
    generated tokens would give other bits). The context holds one sequence; another is reached by cutting
    it back to their common prefix and evaluating the rest one token at a time. Entries are kept for the
    current prompt only, and at most `limit` of them (a megabyte each).
    """

    def __init__(self, model: Model, *, limit: int = 160) -> None:
        self.model = model
        self.limit = limit
        self.prompt: tuple[int, ...] = ()
        self.context: list[int] = []  # the tokens the model's context holds
        self.entries: dict[tuple[int, ...], Logits] = {}
        self.evaluations = 0

    def after(self, prompt: Sequence[int], generated: Sequence[int]) -> Logits:
        key = (*prompt, *generated)
        if tuple(prompt) != self.prompt:
            self.prompt, self.context, self.entries = tuple(prompt), [], {}
        if key in self.entries:
            return self.entries[key]
        common = 0
        for ours, theirs in zip(self.context, key, strict=False):
            if ours != theirs:
                break
            common += 1
        if common < len(prompt):
            self.model.reset()
            logits = self.model.decode(prompt)
            self.evaluations += 1
            common = len(prompt)
        else:
            common = min(common, len(key) - 1)
            self.model.truncate(common)
            logits = self.model.decode(key[common : common + 1])
            self.evaluations += 1
            common += 1
        for token in key[common:]:
            logits = self.model.decode([token])
            self.evaluations += 1
        self.context = list(key)
        if len(self.entries) >= self.limit:
            del self.entries[next(iter(self.entries))]
        self.entries[key] = logits
        return logits


class CachedModel:
    """`generate`'s view of the model: its logits come from a `LogitsCache`."""

    def __init__(self, cache: LogitsCache) -> None:
        self.cache = cache
        self.n_vocab = cache.model.n_vocab
        self.suppress_tokens = cache.model.suppress_tokens
        self.prompt: list[int] = []
        self.generated: list[int] = []

    def reset(self) -> None:
        self.prompt, self.generated = [], []

    def decode(self, tokens: Sequence[int]) -> Logits:
        if not self.prompt:
            self.prompt = list(tokens)
        else:
            self.generated.extend(tokens)
        return self.cache.after(self.prompt, self.generated)

    def is_eog(self, token: int) -> bool:
        return self.cache.model.is_eog(token)

    def piece(self, token: int, *, special: bool = True) -> bytes:
        return self.cache.model.piece(token, special=special)


class MaskCache:
    """llama.cpp's grammar masks by (constraint, accepted tokens): the grammar's state is a function of
    them, and a rejected first draw in the grammar's first state comes back in case after case."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, tuple[int, ...]], npt.NDArray[np.uint8]] = {}

    def allowed(
        self, grammar: LlamaGrammar, constraint: str, accepted: Sequence[int]
    ) -> npt.NDArray[np.bool_]:
        key = (constraint, tuple(accepted))
        if key not in self.entries:
            self.entries[key] = np.packbits(grammar.allowed())
        return np.unpackbits(self.entries[key], count=grammar.vocab.n_vocab).astype(bool)


def reference(
    logits_after: Callable[[list[int]], Logits],
    vocab: LlamaVocab,
    prompt: list[int],
    settings: SamplerSettings,
    constraint: Constraint,
    suppressed: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    masks: MaskCache | None = None,
    budget: ReasoningBudget | None = None,
) -> tuple[list[int], list[int]]:
    """llama-server's tokens and rejection points; `logits_after(generated)` gives each step's logits.

    With a reasoning budget (its generation prompt accepted), as common_sampler_sample and _accept run it
    beside the grammar: its forcing applied first, the grammar (when lazy) neither checking nor accepting
    the thinking block's tokens, and fed the end sequence when the block ends."""
    grammar = LlamaGrammar.create(vocab, constraint.gbnf, trigger_patterns=constraint.trigger_patterns,
                                  trigger_tokens=constraint.trigger_tokens)
    assert grammar is not None
    for token in constraint.prefill:
        grammar.accept(token)
    # common_sampler_init: the model's suppress tokens join the logit biases
    bans = tuple((token, float("-inf")) for token in suppressed)
    settings = replace(settings, logit_bias=settings.logit_bias + bans)
    generated: list[int] = []
    fed: list[int] = []  # what the grammar accepted (the generated tokens, without a budget)
    rejected: list[int] = []
    lazy = bool(constraint.trigger_patterns or constraint.trigger_tokens)
    with LlamaSamplerChain(llama_steps(settings, vocab.n_vocab)) as chain, grammar:
        for token in prompt:
            chain.accept(token)
        for index in range(max_tokens):
            logits = logits_after(generated)
            applies = budget is None or not lazy or budget.state in (BudgetState.IDLE, BudgetState.DONE)
            forced = budget.forced_token() if budget is not None else None
            if forced is not None:
                only = np.arange(logits.size) == forced
                logits = np.where(only, logits, np.float32(-np.inf)).astype(np.float32)
            token = chain.sample(logits)
            if applies and not grammar_allows(grammar, token):
                rejected.append(index)
                allowed = grammar.allowed() if masks is None else masks.allowed(grammar, constraint.name, fed)
                token = chain.sample(np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32))
            if budget is not None:
                budget.accept(token)
                end = budget.end_match()
                if not applies and budget.state == BudgetState.DONE and end is not None:
                    for end_token in end:
                        grammar.accept(end_token)
                        fed.append(end_token)
            if applies:
                grammar.accept(token)
                fed.append(token)
            chain.accept(token)
            generated.append(token)
            if vocab.is_eog(token):
                break
    return generated, rejected


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Model]:
    # one thread: two threads spin against each other on a busy two-core machine
    with Model(gemma_path, n_ctx=N_CTX, n_threads=1) as model:
        yield model


@pytest.fixture(scope="module")
def logits_cache(gemma: Model) -> LogitsCache:
    return LogitsCache(gemma)


@pytest.fixture(scope="module")
def mask_cache() -> MaskCache:
    return MaskCache()


@pytest.fixture(scope="module")
def llama_vocab(gemma_path: Path) -> Iterator[LlamaVocab]:
    with LlamaVocab(gemma_path) as vocab:
        yield vocab


@pytest.fixture(scope="module")
def local_client(gemma_path: Path) -> Iterator[tuple[Client, VocabHandle]]:
    with Client("local") as client:
        yield client, client.register_vocab(gguf=gemma_path)


def record(
    oracle_report: OracleReport, subject: str, ours: Sequence[int], ours_rejected: Sequence[int],
    expected: list[int], rejected: list[int],
) -> None:
    same = sum(a == b for a, b in zip(ours, expected, strict=False))
    identical = list(ours) == expected and list(ours_rejected) == rejected
    oracle_report.add("generations (tokens and rejections)", subject, identical=int(identical), total=1)
    oracle_report.add("generated tokens", subject, identical=same, total=max(len(expected), len(ours)))
    same_points = len(set(ours_rejected) & set(rejected))
    oracle_report.add("rejection points", subject, identical=same_points,
                      total=max(len(rejected), len(ours_rejected)))


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_generation_is_llama_servers(
    case: Case, gemma: Model, logits_cache: LogitsCache, mask_cache: MaskCache, llama_vocab: LlamaVocab,
    local_client: tuple[Client, VocabHandle], oracle_report: OracleReport,
) -> None:
    chat, raw = PROMPTS[case.prompt]
    tokens = prompt_tokens(gemma, prompt=raw, chat=chat)
    client, handle = local_client
    runs = {}
    for overlap in OVERLAPS:
        with client.session(handle, **case.constraint.session) as session:  # type: ignore[arg-type]
            model = CachedModel(logits_cache)
            runs[overlap] = generate(
                model, tokens, case.settings, session=session, max_tokens=MAX_TOKENS, overlap=overlap
            )
    expected, rejected = reference(
        lambda generated: logits_cache.after(tokens, generated), llama_vocab, tokens, case.settings,
        case.constraint, gemma.suppress_tokens, masks=mask_cache,
    )
    for overlap, ours in runs.items():
        record(oracle_report, f"gemma-3-270m local, overlap {overlap}", ours.tokens, ours.rejected_at,
               expected, rejected)
    for overlap, ours in runs.items():
        assert ours.overlap == overlap
        assert list(ours.tokens) == expected, f"overlap {overlap}"
        assert list(ours.rejected_at) == rejected, f"overlap {overlap}"


# Hotter than llama-server's defaults, top-k off and a repetition penalty: more rejections, the
# full-vocabulary sampler paths, and penalties fed by the prompt.
WARM = SamplerSettings(seed=12, temperature=1.3, top_k=0, top_p=0.98, min_p=0.02, repeat_penalty=1.1)
SOCKET_CHAT = "Describe a programmer as JSON."
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "languages"],
}
SOCKET_MAX_TOKENS = 40


@pytest.mark.oracle
@pytest.mark.slow
def test_generation_through_a_unix_socket_is_llama_servers(
    gemma: Model, gemma_path: Path, llama_vocab: LlamaVocab, oracle_report: OracleReport
) -> None:
    """The whole path: a private constraintd process, and the reference on a llama.cpp model of its own."""
    import llama_cpp

    tokens = prompt_tokens(gemma, chat=SOCKET_CHAT)
    schema = json.dumps(PERSON_SCHEMA)
    runs = {}
    with PrivateConstraintd() as server, Client(server.target) as client:
        handle = client.register_vocab(gguf=gemma_path)
        for overlap in OVERLAPS:
            with client.session(handle, json_schema=schema) as session:
                runs[overlap] = generate(
                    gemma, tokens, WARM, session=session, max_tokens=SOCKET_MAX_TOKENS, overlap=overlap
                )
    # llama.cpp's default context (flash attention on) through the Llama class, as llama-server runs it
    theirs = llama_cpp.Llama(
        model_path=str(gemma_path), n_ctx=N_CTX, n_threads=1, flash_attn=True, logits_all=True, verbose=False
    )

    def logits_after(generated: list[int]) -> Logits:
        theirs.eval(generated[-1:] if generated else tokens)  # one step at a time, as llama-server
        return np.array(theirs.scores[theirs.n_tokens - 1], dtype=np.float32)

    constraint = Constraint("schema-person", {}, json_schema_to_gbnf(schema))
    try:
        expected, rejected = reference(
            logits_after, llama_vocab, tokens, WARM, constraint, gemma.suppress_tokens,
            max_tokens=SOCKET_MAX_TOKENS,
        )
    finally:
        theirs.close()
    for overlap, ours in runs.items():
        record(oracle_report, f"gemma-3-270m unix, overlap {overlap}", ours.tokens, ours.rejected_at,
               expected, rejected)
    for overlap, ours in runs.items():
        assert list(ours.tokens) == expected, f"overlap {overlap}"
        assert list(ours.rejected_at) == rejected, f"overlap {overlap}"


# Tool calls: llama-server's own chat params (the chat oracle's "apply": tests/chat_oracle/harness.cpp) give
# the reference its prompt, grammar, triggers and preserved tokens; server-schema.cpp turns a trigger word
# into its token (one preserved token) or an escaped pattern, sampling.cpp prefills a non-lazy grammar with
# the generation prompt's tokens. Ours: sampler_worker.prompt.tool_chat, the session the service makes. Two
# templates that write JSON calls, on Gemma 3 270M: Llama 3.2's (calls after free text, no marker: tool_choice
# required; auto has no word to trigger on, so no grammar) and Qwen 2.5's (<tool_call> markers: auto is lazy,
# required prefilled). The template's stop strings cut the text, not the tokens: neither side is given them.
TOOL_TEMPLATES = {"llama3.2": "meta-llama-Llama-3.2-3B-Instruct", "qwen2.5": "Qwen-Qwen2.5-7B-Instruct",
                  "qwq": "Qwen-QwQ-32B", "qwen3": "Qwen-Qwen3-0.6B"}
TOOL_REQUESTS = (("llama3.2", "required"), ("qwen2.5", "auto"), ("qwen2.5", "required"))
# Thinking templates with a lazy tool grammar (tool_choice auto), where llama-server runs its reasoning
# budget beside the grammar (sampler_worker.reasoning_budget): QwQ's generation prompt opens the thinking
# block, so the grammar sees nothing until the block ends (no limit: never, in 48 tokens; 0: the end tag
# forced at once; 6: after six tokens); Qwen 3's leaves it to the model. With tool_choice required the grammar
# is not lazy and holds the thinking block itself: a budget (4) is then made only because it has a limit, and
# its forced end tag goes through the grammar's check like any draw. The budget's setup is llama-server's
# from llama.cpp's own chat params (tags, generation prompt) on the reference side, the service's on ours.
THINKING_REQUESTS = (("qwq", "auto", -1), ("qwq", "auto", 0), ("qwq", "auto", 6), ("qwen3", "auto", -1),
                     ("qwq", "required", 4))
TOOL_CHATS = ("What is the weather in Paris?", "Is it raining in Lisbon right now?", "Tell me a joke.")
TOOL_MAX_TOKENS = 48
# The request's time, the same on both sides (templates print the date): not a fixed time, as llama.cpp's
# strftime_now reads the clock (jinja/runtime.h), not the request's. Taken per case, just before llama.cpp
# renders it, and taken again if the day turned meanwhile (a run that crosses midnight).
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@dataclass(frozen=True)
class ToolCase:
    template: str
    tool_choice: str
    chat: int  # index in TOOL_CHATS
    settings_name: str
    settings: SamplerSettings
    budget: int | None = None  # the reasoning budget's tokens (-1: no limit); None: the case runs none

    @property
    def id(self) -> str:
        budget = "" if self.budget is None else f"-budget{self.budget}"
        return f"{self.template}-{self.tool_choice}{budget}-c{self.chat}-{self.settings_name}"


TOOL_CASES = [
    ToolCase(template, choice, chat, name, make(2000 + chat))
    for chat in range(len(TOOL_CHATS))
    for template, choice in TOOL_REQUESTS
    for name, make in SETTINGS
] + [
    ToolCase(template, choice, chat, name, make(3000 + chat), budget)
    for chat in range(2)
    for template, choice, budget in THINKING_REQUESTS
    for name, make in SETTINGS
]


def _llama_regex_escape(word: str) -> str:
    # common.cpp's regex_escape
    return re.sub(r"[.^$|()*+?\[\]{}\\]", lambda m: "\\" + m.group(0), word)


def llama_chat_params(
    binary: Path, model: Model, source: str, request: Mapping[str, object]
) -> tuple[int, list[int], dict[str, Any]]:
    """The time llama.cpp rendered at (whole seconds), llama-server's prompt tokens, and llama.cpp's own chat
    params for a chat request (the chat oracle's "apply" of `request`'s fields on the template)."""
    from tests.chat_oracle.build import run_harness

    while True:
        now = int(time.time())
        answer = run_harness(binary, {
            "mode": "apply", "template": source, "bos_token": model.bos_text, "eos_token": model.eos_text,
            "reasoning_format": "auto", "now": now, **request,
        })
        if time.gmtime(now)[:3] == time.gmtime()[:3] and time.localtime(now)[:3] == time.localtime()[:3]:
            break
    assert "error" not in answer, answer
    prompt = answer["prompt"]
    if model.add_bos and prompt.startswith(model.bos_text):  # the tokenizer adds BOS itself
        prompt = prompt[len(model.bos_text):]
    return now, model.tokenize(prompt, add_special=True, parse_special=True), answer


def llama_generation_prefill(model: Model, answer: Mapping[str, Any]) -> list[int]:
    """common_sampler_init's prefill: the generation prompt's tokens, a leading space token dropped where the
    text starts with none."""
    tokens = model.tokenize(answer["generation_prompt"], add_special=False, parse_special=True)
    first = model.piece(tokens[0]) if tokens else b""
    if first[:1].isspace() and not answer["generation_prompt"][:1].isspace():
        tokens = tokens[1:]
    return tokens


def llama_tool_constraint(
    binary: Path, model: Model, case: ToolCase, source: str
) -> tuple[int, list[int], Constraint, ReasoningBudget | None]:
    """The time llama.cpp rendered at (whole seconds), and llama-server's prompt tokens, sampler grammar and
    reasoning budget for the case, from llama.cpp's own chat params."""
    now, tokens, answer = llama_chat_params(binary, model, source, {
        "messages": [{"role": "user", "content": TOOL_CHATS[case.chat]}], "tools": [WEATHER_TOOL],
        "tool_choice": case.tool_choice})

    def one_token(text: str) -> int | None:
        ids = model.tokenize(text, add_special=False, parse_special=True)
        return ids[0] if len(ids) == 1 else None

    preserved = {t for text in answer["preserved_tokens"] if (t := one_token(text)) is not None}
    patterns: list[str] = []
    trigger_tokens: list[int] = []
    for trigger in answer["grammar_triggers"]:
        assert trigger["type"] == "word", trigger  # the JSON-call formats trigger on words
        token = one_token(trigger["value"])
        if token is None:
            patterns.append(_llama_regex_escape(trigger["value"]))
        else:
            assert token in preserved
            trigger_tokens.append(token)
    generation_prefill = llama_generation_prefill(model, answer)
    prefill = [] if answer["grammar_lazy"] else generation_prefill
    budget = None
    if case.budget is not None:
        # server-common.cpp and server-schema.cpp: the tags tokenized, the first end tag forced (no message)
        start = model.tokenize(answer["thinking_start_tag"], add_special=False, parse_special=True)
        ends = [model.tokenize(tag, add_special=False, parse_special=True)
                for tag in answer["thinking_end_tags"]]
        # what makes sampling.cpp create the sampler
        assert start and ends and (answer["grammar_lazy"] or case.budget >= 0)
        budget = ReasoningBudget([start], ends, ends[0], UNLIMITED if case.budget < 0 else case.budget,
                                 complete=lambda token: utf8_complete(model.piece(token, special=False)))
        for token in generation_prefill:
            budget.accept(token)
    assert answer["grammar"]
    name = f"tools-{case.template}-{case.tool_choice}-c{case.chat}"
    return now, tokens, Constraint(name, {}, answer["grammar"], tuple(patterns), tuple(trigger_tokens),
                                   tuple(prefill)), budget


@pytest.fixture(scope="module")
def chat_oracle_binary() -> Path:
    from tests.chat_oracle.build import harness_binary

    return harness_binary()


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("case", TOOL_CASES, ids=[case.id for case in TOOL_CASES])
def test_tool_call_generation_is_llama_servers(
    case: ToolCase, gemma: Model, logits_cache: LogitsCache, mask_cache: MaskCache, llama_vocab: LlamaVocab,
    local_client: tuple[Client, VocabHandle], chat_oracle_binary: Path, oracle_report: OracleReport,
) -> None:
    from constraintd.engine.chat.templates.template_inputs import parse_tools
    from sampler_worker.prompt import tool_chat
    from tests.chat_oracle.cases import template_paths

    source = next(p for p in template_paths() if p.stem == TOOL_TEMPLATES[case.template]).read_text()
    now, tokens, constraint, llama_budget = llama_tool_constraint(chat_oracle_binary, gemma, case, source)
    client, handle = local_client
    runs = {}
    for overlap in OVERLAPS:
        # each run on a session of its own, made by the service from the chat request
        with tool_chat(client, handle, gemma, TOOL_CHATS[case.chat], parse_tools([WEATHER_TOOL]),
                       tool_choice=case.tool_choice, template=source, now=now) as chat:
            assert chat.prompt == tokens  # the prompt, with the tools, is llama-server's
            assert chat.session is not None
            budget = None if case.budget is None else chat.reasoning_budget(gemma, case.budget)
            assert (budget is None) == (llama_budget is None)
            runs[overlap] = generate(CachedModel(logits_cache), tokens, case.settings, session=chat.session,
                                     max_tokens=TOOL_MAX_TOKENS, overlap=overlap, special=chat.preserved,
                                     budget=budget, grammar_lazy=chat.settings.grammar_lazy)
    expected, rejected = reference(
        lambda generated: logits_cache.after(tokens, generated), llama_vocab, tokens, case.settings,
        constraint, gemma.suppress_tokens, max_tokens=TOOL_MAX_TOKENS, masks=mask_cache, budget=llama_budget,
    )
    for overlap, ours in runs.items():
        record(oracle_report, f"gemma-3-270m tools {case.template} {case.tool_choice}, overlap {overlap}",
               ours.tokens, ours.rejected_at, expected, rejected)
    for overlap, ours in runs.items():
        assert list(ours.tokens) == expected, f"overlap {overlap}"
        assert list(ours.rejected_at) == rejected, f"overlap {overlap}"


# The end of a thinking block, handed to a lazy grammar: llama-server feeds the end sequence to the grammar
# when its reasoning budget ends the block, as a trigger may sit on it. No ported tool format triggers
# there, so a grammar that does (`</think>` is its trigger, and it then wants " Answer: yes") is driven by
# scripted logits that think, close the block and answer " no.": the answer is refused only where the end
# tag reached the grammar. Once with a natural end, once with the end forced by a budget of 4.
THINKING_GRAMMAR = 'root ::= "</think>" " Answer: yes."'


class ScriptedModel:
    """`generate`'s model whose logits after each step favour the script's next token (then EOS), over
    seeded noise, so that a refused token is redrawn among the grammar's in a fixed order."""

    def __init__(self, gemma: Model, script: Sequence[int]) -> None:
        self.gemma = gemma
        self.script = list(script)
        self.n_vocab = gemma.n_vocab
        self.suppress_tokens = gemma.suppress_tokens
        self.noise = np.random.default_rng(7).standard_normal(gemma.n_vocab).astype(np.float32)
        self.eos = gemma.tokenize(gemma.eos_text, add_special=False, parse_special=True)[0]
        self.generated: int | None = None  # tokens decoded after the prompt

    def logits_after(self, generated: Sequence[int]) -> Logits:
        logits = self.noise.copy()
        index = len(generated)
        logits[self.script[index] if index < len(self.script) else self.eos] = 20.0
        return logits

    def reset(self) -> None:
        self.generated = None

    def decode(self, tokens: Sequence[int]) -> Logits:
        self.generated = 0 if self.generated is None else self.generated + len(tokens)
        return self.logits_after(range(self.generated))

    def is_eog(self, token: int) -> bool:
        return self.gemma.is_eog(token)

    def piece(self, token: int, *, special: bool = True) -> bytes:
        return self.gemma.piece(token, special=special)


@pytest.mark.oracle
@pytest.mark.parametrize("limit", [-1, 4], ids=["natural-end", "budget-4"])
@pytest.mark.parametrize("overlap", OVERLAPS)
def test_the_end_of_a_thinking_block_reaches_a_lazy_grammar_as_llama_servers(
    limit: int, overlap: Overlap, gemma: Model, llama_vocab: LlamaVocab,
    local_client: tuple[Client, VocabHandle],
) -> None:
    def tokens(text: str) -> list[int]:
        return gemma.tokenize(text, add_special=False, parse_special=True)

    think, end = tokens("<think>"), tokens("</think>")
    script = [*tokens(" Let me think about the weather today."), *end, *tokens(" Answer: no.")]
    prompt = gemma.tokenize("Is it sunny?", add_special=True, parse_special=True)
    model = ScriptedModel(gemma, script)

    def budget() -> ReasoningBudget:
        made = ReasoningBudget([think], [end], end, UNLIMITED if limit < 0 else limit,
                               complete=lambda token: utf8_complete(gemma.piece(token, special=False)))
        for token in think:  # the generation prompt ends in the start tag
            made.accept(token)
        return made

    settings = SamplerSettings(seed=5, temperature=0.0)
    client, handle = local_client
    with client.session(handle, gbnf=THINKING_GRAMMAR, trigger_patterns=["</think>"]) as session:
        ours = generate(model, prompt, settings, session=session, max_tokens=40, overlap=overlap,
                        budget=budget(), grammar_lazy=True)
    expected, rejected = reference(
        model.logits_after, llama_vocab, prompt, settings,
        Constraint("thinking-trigger", {}, THINKING_GRAMMAR, ("</think>",)), gemma.suppress_tokens,
        max_tokens=40, budget=budget())
    assert list(ours.tokens) == expected and list(ours.rejected_at) == rejected
    # the grammar was triggered by the end tag and held the answer
    text = b"".join(gemma.piece(token, special=False) for token in expected).decode()
    assert rejected and text.endswith("</think> Answer: yes."), text


# Chats with a response format: llama-server makes the grammar of a chat completion's JSON schema (or JSON
# mode, its {"type": "object"}) from its chat params, not from the converter alone: the generation prompt
# (prefilled), space, then the value bare or in a ```json fence (`generate --chat --json/--schema` and serve's
# chat completions). The reference's prompt, grammar and prefill are llama.cpp's chat layer's; ours come from
# the session the service makes of the chat request. Gemma's GGUF has no template: ChatML.
CHAT_SCHEMAS = (("json-mode", {"type": "object"}), ("schema-weather", WEATHER_SCHEMA),
                ("schema-mood", MOOD_SCHEMA))
CHAT_JSON_CASES = [(chat, name, schema, settings_name, make(4000 + chat))
                   for chat in range(4) for name, schema in CHAT_SCHEMAS for settings_name, make in SETTINGS]


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize(("chat", "name", "schema", "settings_name", "settings"), CHAT_JSON_CASES,
                         ids=[f"c{c[0]}-{c[1]}-{c[3]}" for c in CHAT_JSON_CASES])
def test_chat_response_format_generation_is_llama_servers(
    chat: int, name: str, schema: dict[str, Any], settings_name: str, settings: SamplerSettings, gemma: Model,
    logits_cache: LogitsCache, mask_cache: MaskCache, llama_vocab: LlamaVocab,
    local_client: tuple[Client, VocabHandle], chat_oracle_binary: Path, oracle_report: OracleReport,
) -> None:
    from constraintd.engine.chat.templates.prompt import CHATML_TEMPLATE
    from sampler_worker.prompt import tool_chat

    message, _ = PROMPTS[chat]
    assert message is not None
    now, tokens, answer = llama_chat_params(chat_oracle_binary, gemma, CHATML_TEMPLATE, {
        "messages": [{"role": "user", "content": message}], "json_schema": schema})
    assert answer["grammar"] and not answer["grammar_lazy"]
    constraint = Constraint(f"chat-{name}", {}, answer["grammar"],
                            prefill=tuple(llama_generation_prefill(gemma, answer)))
    client, handle = local_client
    runs = {}
    for overlap in OVERLAPS:
        with tool_chat(client, handle, gemma, message, [], json_schema=json.dumps(schema), now=now) as made:
            assert made.prompt == tokens and made.session is not None
            runs[overlap] = generate(CachedModel(logits_cache), tokens, settings, session=made.session,
                                     max_tokens=MAX_TOKENS, overlap=overlap, special=made.preserved)
    expected, rejected = reference(
        lambda generated: logits_cache.after(tokens, generated), llama_vocab, tokens, settings, constraint,
        gemma.suppress_tokens, masks=mask_cache)
    for overlap, ours in runs.items():
        record(oracle_report, f"gemma-3-270m chat response format, overlap {overlap}", ours.tokens,
               ours.rejected_at, expected, rejected)
    for overlap, ours in runs.items():
        assert list(ours.tokens) == expected, f"overlap {overlap}"
        assert list(ours.rejected_at) == rejected, f"overlap {overlap}"
