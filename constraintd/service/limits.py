# The bounds the service keeps, whatever its callers send.
#
# Invariants:
# - Limits are a value: frozen, built once (by `constraintd serve`, the in-process client or a test) and
#   passed explicitly to the registry, the session store and the operations; nothing reads them from
#   module globals or the environment.
# - Every limit a caller can reach has a name here and a clear error when reached (LimitError for sizes and
#   counts, DeadlineError for time); `Limits()` holds defaults fit for a sidecar beside one model server.
# - An error message quotes at most `ECHO_CHARS` characters of anything a caller sent (`shown`; a path,
#   `PATH_ECHO_CHARS`): a 1 MB session id or path is not sent back, logged or kept whole in a refusal.
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ECHO_CHARS", "MIB", "PATH_ECHO_CHARS", "Limits", "shown"]

MIB = 1 << 20
GIB = 1 << 30
ECHO_CHARS = 64
PATH_ECHO_CHARS = 256


def shown(value: str | bytes, limit: int = ECHO_CHARS) -> str:
    """A caller's input as an error message quotes it: its repr, cut to `limit` characters of the value
    with an ellipsis when longer."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + "..."


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds a server keeps, whatever its callers send.

    Attributes:
        max_sessions: open sessions at once; CreateSession and Fork beyond it fail with RESOURCE_EXHAUSTED.
        max_vocabs: registered vocabularies at once.
        max_vocab_size: tokens in one vocabulary.
        max_gguf_bytes: size of a GGUF file RegisterVocab reads by path. Only its metadata is read (the
            file is memory-mapped), so this refuses what no model file is rather than bounding memory.
        max_grammar_bytes: size of a GBNF text, a JSON schema or a request body (UTF-8 bytes), with its
            lazy trigger patterns counted in.
        max_trigger_patterns: lazy trigger patterns of one constraint that are not literal words (each is
            looked for after every token a waiting grammar accepts; literal words are one automaton
            together, bounded by max_grammar_bytes).
        max_piece_bytes: length of one token's piece (or special-token text) in a registered vocabulary;
            the longest piece of the reference vocabularies is 512 bytes.
        max_tokens_per_call: token ids in one call: an Allows request, a session's replay, its trigger
            tokens, all the Allows operations of one Step message.
        max_prefill_bytes: size of a session's prefill text.
        max_stacks: parse stacks one session may hold (llama.cpp's grammars can blow up; this keeps one
            session from taking the process down); an accept that would exceed it fails.
        max_rollback: the rollback window: the steps (accepted tokens, and the prefill) a session remembers,
            so the most one Rollback, or several in a row, may undo; past it Rollback fails with
            INVALID_ARGUMENT and changes nothing. Without it a session held its whole trail, about 20
            bytes a token: a million tokens accepted or replayed held 20 MiB while open, and any number
            of sessions could. The window bounds that at about 20 bytes times 1.25 windows (the matcher
            trims in chunks of a quarter window): about 400 KiB a session at 16,384, whatever it accepts.
            A lazy grammar's steps while it waits for its trigger cost more (each keeps its own context,
            and the patterns' scan is kept every 64 tokens: under 3 MiB for a full window; a scan after
            every step made it 7 MiB with one short pattern), and its buffer is not
            the trail: it keeps each waiting token's piece and 12 bytes until the trigger (llama.cpp
            keeps the text too).
            Rollback's users need far less: speculative decoding undoes a draft's rejected tokens (a few
            to a few dozen: llama.cpp drafts at most 16 by default), a sampler undoes a token or a few;
            16,384 leaves a margin of hundreds of times that. A client that must go further back opens a
            session again with `replay` (the tokens it keeps).
        max_request_bytes: a gRPC message a client sends (gRPC's own default). gRPC refuses a larger one
            before the server reads it; one under it costs the event loop about a millisecond a MiB while
            gRPC Python gathers it, so this bounds what one request can stall every other session. A
            vocabulary over it goes in parts (RegisterVocabParts; the clients cut at 256 KiB).
        max_reply_bytes: a gRPC message the server sends (a Step's masks: 4 KiB to 32 KiB a session).
        max_vocab_bytes: a vocabulary sent in parts, all its parts together (a 262k-token vocabulary with
            its texts is about 5.4 MiB); it is read whole before it is parsed.
        max_step_ops: operations in one Step message.
        max_grammars: compiled grammars kept in the shared cache (least recently used are dropped; sessions
            keep using theirs), and refused constraints remembered.
        max_grammar_cache_bytes: bytes the registry's caches of compiled grammars and refused constraints
            hold together, as the grammars measure themselves (`Grammar.nbytes`: rules, states, masks); a
            grammar alone larger is compiled for its caller and not kept.
        default_ttl: seconds a session may stay idle when its creator did not say.
        max_ttl: the longest idle time a creator may ask for.
        compile_timeout: seconds a compile (conversion, grammar, vocabulary) may take before the caller
            gets DEADLINE_EXCEEDED.
        mask_timeout: seconds a whole-vocabulary mask may take (the first one of a grammar state is the
            slow one).
    """

    max_sessions: int = 10_000
    max_vocabs: int = 16
    max_vocab_size: int = 1 << 20
    max_gguf_bytes: int = 1024 * GIB
    max_grammar_bytes: int = 1 * MIB
    max_trigger_patterns: int = 64
    max_piece_bytes: int = 8 * 1024
    max_tokens_per_call: int = 1 << 20
    max_prefill_bytes: int = 64 * 1024
    max_stacks: int = 10_000
    max_rollback: int = 16_384
    max_request_bytes: int = 4 * MIB
    max_reply_bytes: int = 32 * MIB
    max_vocab_bytes: int = 64 * MIB
    max_step_ops: int = 4096
    max_grammars: int = 256
    max_grammar_cache_bytes: int = 512 * MIB
    default_ttl: float = 600.0
    max_ttl: float = 24 * 3600.0
    compile_timeout: float = 60.0
    mask_timeout: float = 30.0

    def __post_init__(self) -> None:
        # refused when the limits are made (`constraintd serve` exits with a usage error), not at the
        # first session, where the matcher would refuse it
        if self.max_rollback < 0:
            raise ValueError(f"max_rollback is a number of steps, 0 or more, not {self.max_rollback}")
