"""llama.cpp's hand-written chat formats (its common/parsers/*.cpp), one module each: the grammar side of a
format's chat params (grammar, lazy flag, triggers, preserved tokens, thinking tags), built call for call with
the PEG arena (chat/peg_arena.py) as llama.cpp builds it.

Contract: a format's `*_params` function gives what llama.cpp's `common_chat_params_init_*` gives for a
request on a template of that format, or raises NotImplementedError naming the part not ported.
"""

from __future__ import annotations

from dataclasses import dataclass

from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["FormatParams"]


@dataclass(frozen=True, slots=True)
class FormatParams:
    """What a format's `*_params` gives: the request's parser (llama.cpp builds one for every request: the
    message parser runs it on the generated text), whether its grammar is written (`writes_grammar`: False
    where the request gets none, as with no tools to call), whether that grammar is lazy, its trigger words,
    the thinking tags and preserved tokens, and where the format has them, additional stops, its prompt's
    message delimiters ((role, text) pairs) and trigger patterns (llama.cpp's pattern triggers, after the
    words)."""

    arena: PegArena | None  # None: no parser (a caller's hand-made params; every format builds one)
    grammar_lazy: bool
    trigger_words: tuple[str, ...]
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    preserved_tokens: tuple[str, ...]
    additional_stops: tuple[str, ...] = ()
    message_delimiters: tuple[tuple[str, str], ...] = ()
    trigger_patterns: tuple[str, ...] = ()
    writes_grammar: bool = True
