# What a session is asked to follow, and how each kind of ask becomes one GBNF grammar.
#
# Invariants:
# - A `Constraint` is a value that says everything a compile depends on except the vocabulary; its key
#   (with the vocabulary's hash) addresses the compiled grammar in the registry.
# - Turning a constraint into GBNF is the engine's work (the JSON-schema converter, JSON mode, request
#   resolution); this module only picks the engine function for the kind, from one table, and carries the
#   conversion's report along as the grammar's warnings (llama.cpp's warnings, then every other keyword the
#   grammar leaves unenforced, `pointer: keyword: reason`). It does no I/O and imports no grpc.
# - `strict` refuses a schema (given as a schema or inside a request) whose grammar would leave a keyword
#   unenforced. It changes no grammar, only whether one is given, so it is part of the constraint's key
#   (a refusal is cached by that key), and only when set, so every other key is what it always was.
# - `dialect` picks the JSON-schema converter's dialect ("llama.cpp", the default, or "extended": see
#   engine/schema/extended.py). It changes the grammar, so it is part of the key, and only when it is not
#   the default, for the same reason as `strict`.
# - `prepare` is the half of a compile that needs no vocabulary (the conversion, the GBNF parse, llama.cpp's
#   checks and the flattened `Rules`): a function of the constraint alone, whose product pickles, so the
#   server runs it in a worker process (processes.py). What it leaves undone the compile does, with the
#   same result and the same first error: the parse of a grammar that names a token by its text
#   (`<think>`), which needs the vocabulary, and the `Rules` of a grammar they refuse (`Grammar` checks its
#   trigger patterns first).
# - A chat request (CHAT: service/chat.py) resolves to a grammar, trigger words (made triggers over the
#   vocabulary where the grammar is built: `ResolvedGrammar.triggers`) and the settings its caller needs
#   (`ResolvedGrammar.chat`), which are no part of the grammar's key: requests that differ only in what
#   their grammar does not depend on (the messages, with the same tools) share one compiled grammar.
from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from constraintd.engine.chat import requests
from constraintd.engine.grammar.gbnf import ParsedGrammar, check_grammar, parse_gbnf
from constraintd.engine.grammar.stacks import Rules
from constraintd.engine.schema.convert import convert_json_schema
from constraintd.engine.schema.extended import DEFAULT_DIALECT
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import InputError, LimitError
from constraintd.service.chat import ChatRequest, ChatSettings, chat_triggers, resolve_chat

__all__ = ["Constraint", "ConstraintKind", "PreparedGrammar", "ResolvedGrammar", "prepare", "resolve"]


class ConstraintKind(enum.Enum):
    GBNF = "gbnf"
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    OPENAI_REQUEST = "openai_request"
    OLLAMA_REQUEST = "ollama_request"
    CHAT = "chat"


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint as a client asked for it.

    Attributes:
        kind: what `text` is.
        text: the GBNF text, the JSON schema, or the request body (JSON text; a chat request's is
            `ChatRequest.to_text()`); empty for JSON mode.
        root: the GBNF start symbol (GBNF only).
        trigger_patterns: lazy-grammar patterns (llama.cpp's grammar_trigger_patterns).
        trigger_tokens: lazy-grammar trigger tokens.
        strict: refuse a JSON schema (JSON_SCHEMA, or the schema of a request) whose grammar would leave a
            keyword unenforced, instead of reporting it in the warnings. Nothing else reads it.
        dialect: the JSON-schema dialect for JSON_SCHEMA and the schema of a request: "llama.cpp" (the
            default: llama.cpp's grammar) or "extended" (enforces more; engine/schema/extended.py).
    """

    kind: ConstraintKind
    text: str = ""
    root: str = "root"
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    strict: bool = False
    dialect: str = DEFAULT_DIALECT

    def key(self, vocab_hash: str) -> str:
        """Content hash of this constraint over the vocabulary with `vocab_hash`."""
        texts: tuple[str, ...] = (self.kind.value, self.text, self.root, vocab_hash)
        if self.strict:
            texts = (*texts, "strict")
        if self.dialect != DEFAULT_DIALECT:
            texts = (*texts, "dialect", self.dialect)
        return _digest(b"constraint", texts, self.trigger_patterns, self.trigger_tokens)

    def check_size(self, max_bytes: int) -> None:
        """Raises LimitError when the text is larger than `max_bytes` (UTF-8)."""
        size = len(self.text.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise LimitError(f"the {self.kind.value} is {size} bytes, over the limit of {max_bytes}")


@dataclass(frozen=True, slots=True)
class ResolvedGrammar:
    """A constraint as one GBNF grammar, ready to compile over a vocabulary.

    Attributes:
        trigger_words: a chat request's trigger words, made triggers over the vocabulary (`triggers`).
        preserved: a chat request's preserved tokens (which trigger words may be tokens).
        chat: a chat request's settings (service/chat.py); no part of the key.
    """

    gbnf: str
    root: str = "root"
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    trigger_words: tuple[str, ...] = ()
    preserved: tuple[str, ...] = ()
    chat: ChatSettings | None = None

    def key(self, vocab_hash: str) -> str:
        """Content hash of the grammar (text, root, triggers) over the vocabulary with `vocab_hash`: two
        constraints that resolve to the same grammar share one compiled grammar."""
        texts: tuple[str, ...] = (self.gbnf, self.root, vocab_hash)
        if self.trigger_words:  # only then: every other key is what it always was
            texts = (*texts, "words", *self.trigger_words, "preserved", *self.preserved)
        return _digest(b"grammar", texts, self.trigger_patterns, self.trigger_tokens)

    def triggers(self, vocab: Vocab) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The grammar's trigger patterns and tokens over `vocab`, its trigger words made triggers.

        Raises:
            InputError: a trigger word that is one token and not a preserved one.
        """
        if not self.trigger_words:
            return self.trigger_patterns, self.trigger_tokens
        patterns, tokens = chat_triggers(self.trigger_words, self.preserved, vocab)
        return (*patterns, *self.trigger_patterns), (*tokens, *self.trigger_tokens)


def _digest(tag: bytes, texts: tuple[str, ...], patterns: tuple[str, ...], tokens: tuple[int, ...]) -> str:
    # Every part is written with its length first, so different parts never give the same stream.
    digest = hashlib.sha256(b"constraintd " + tag + b" 1")
    for part in (*texts, *patterns):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    digest.update(len(patterns).to_bytes(8, "little"))
    digest.update(len(tokens).to_bytes(8, "little"))
    for token in tokens:
        digest.update(token.to_bytes(8, "little", signed=True))
    return digest.hexdigest()


def _gbnf(constraint: Constraint) -> ResolvedGrammar:
    return ResolvedGrammar(
        constraint.text, constraint.root, constraint.trigger_patterns, constraint.trigger_tokens
    )


def _json_schema(constraint: Constraint) -> ResolvedGrammar:
    conversion = convert_json_schema(constraint.text, strict=constraint.strict, dialect=constraint.dialect)
    return ResolvedGrammar(
        conversion.grammar,
        "root",
        constraint.trigger_patterns,
        constraint.trigger_tokens,
        conversion.report,
    )


def _json_object(constraint: Constraint) -> ResolvedGrammar:
    return ResolvedGrammar(
        requests.json_object_grammar(), "root", constraint.trigger_patterns, constraint.trigger_tokens
    )


def _request(constraint: Constraint) -> ResolvedGrammar:
    resolved = requests.resolve_request(constraint.text, strict=constraint.strict,
                                        dialect=constraint.dialect)
    if resolved.gbnf is None:
        raise InputError(f"the {constraint.kind.value} asks for free text: there is no constraint to hold")
    return ResolvedGrammar(
        resolved.gbnf,
        resolved.root,
        constraint.trigger_patterns,
        constraint.trigger_tokens,
        resolved.warnings,
    )


def _chat(constraint: Constraint) -> ResolvedGrammar:
    try:
        request = ChatRequest.from_text(constraint.text)
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"not a chat request: {exc}") from None
    grammar, settings = resolve_chat(request)
    return ResolvedGrammar(
        grammar,
        "root",
        settings.trigger_patterns,
        (),
        trigger_words=settings.trigger_words,
        preserved=settings.preserved_tokens,
        chat=settings,
    )


_RESOLVERS: dict[ConstraintKind, Callable[[Constraint], ResolvedGrammar]] = {
    ConstraintKind.GBNF: _gbnf,
    ConstraintKind.JSON_SCHEMA: _json_schema,
    ConstraintKind.JSON_OBJECT: _json_object,
    ConstraintKind.OPENAI_REQUEST: _request,
    ConstraintKind.OLLAMA_REQUEST: _request,
    ConstraintKind.CHAT: _chat,
}


def resolve(constraint: Constraint) -> ResolvedGrammar:
    """The GBNF grammar (with root, triggers and warnings) a constraint stands for.

    Raises:
        SchemaError: a JSON schema or a request body the engine refuses (with its JSON pointer), or, with
            `strict`, a schema whose grammar would leave a keyword unenforced (the keyword's pointer).
        InputError: a request body that is not JSON or asks for nothing this service can constrain; a chat
            request refused (service/chat.py: resolve_chat).
    """
    return _RESOLVERS[constraint.kind](constraint)


@dataclass(frozen=True, slots=True)
class PreparedGrammar:
    """A constraint resolved to GBNF and parsed: what a compile needs that does not depend on a vocabulary.

    Attributes:
        resolved: the grammar text, root, triggers and the conversion's warnings.
        parsed: its rules; None when the text names a token by its text, which only a vocabulary resolves.
        rules: `Rules(parsed)`, built after `check_grammar(parsed, root, left_recursion=False)` passed
            (the rules make that check; what `Grammar` takes to do neither again); None without `parsed`.
    """

    resolved: ResolvedGrammar
    parsed: ParsedGrammar | None
    rules: Rules | None = None


def _one_per_element(parsed: ParsedGrammar) -> ParsedGrammar:
    # The same rules with one tuple per distinct element, shared by every place it occurs (the pickle the
    # server loads then holds each once). A grammar is mostly the same few characters; a pair per element
    # made 550,000 small objects of a grammar of 70,000 alternatives, loaded in the server, and the few
    # objects allocated meanwhile that outlived them pinned the small-object allocator's arenas they shared
    # (an arena goes back to the system only once every object in it is freed). Done here, in the compile
    # process, not in the parser: it costs a dictionary lookup an element (a fifth of a parse).
    elements: dict[tuple[int, int], tuple[int, int]] = {}
    one = elements.setdefault
    return dataclasses.replace(parsed, rules=tuple(tuple(map(one, rule, rule)) for rule in parsed.rules))


class _NeedsVocabulary(Exception):
    """A `<text>` token terminal met while parsing without a vocabulary."""


def _token_by_text(text: str) -> int | None:
    raise _NeedsVocabulary(text)


def prepare(constraint: Constraint) -> PreparedGrammar:
    """The constraint's GBNF grammar, parsed and flattened as far as that needs no vocabulary (slow for a
    large schema).

    Raises:
        SchemaError, InputError: as `resolve`.
        GrammarError: the GBNF text is refused (line, column), or its rules are (no root, left recursion),
            as `Grammar.from_gbnf` refuses them.
    """
    resolved = resolve(constraint)
    try:
        parsed = parse_gbnf(resolved.gbnf, token_id=_token_by_text)
    except _NeedsVocabulary:
        return PreparedGrammar(resolved, None)  # parsed again, whole, with the vocabulary
    # what Grammar does first: the rules make llama.cpp's left-recursion check where it may refuse
    check_grammar(parsed, resolved.root, left_recursion=False)
    parsed = _one_per_element(parsed)
    return PreparedGrammar(resolved, parsed, Rules(parsed))  # refused as Grammar refuses, before its triggers
