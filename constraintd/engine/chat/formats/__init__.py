"""llama.cpp's hand-written chat formats (its common/parsers/*.cpp), one module each: the grammar side of a
format's chat params (grammar, lazy flag, triggers, preserved tokens, thinking tags), built call for call with
the PEG arena (chat/peg_arena.py) as llama.cpp builds it.

Contract: a format's `*_params` function gives what llama.cpp's `common_chat_params_init_*` gives for a
request on a template of that format, or raises NotImplementedError naming the part not ported.
"""

from __future__ import annotations

from typing import Protocol

from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["FormatParams"]


class FormatParams(Protocol):
    """What a format's `*_params` gives: the parser whose grammar the request gets (None: no grammar),
    whether that grammar is lazy, its trigger words, the thinking tags and the preserved tokens (a format with
    additional stops gives them as `additional_stops` too)."""

    @property
    def arena(self) -> PegArena | None: ...
    @property
    def grammar_lazy(self) -> bool: ...
    @property
    def trigger_words(self) -> tuple[str, ...]: ...
    @property
    def supports_thinking(self) -> bool: ...
    @property
    def thinking_start_tag(self) -> str: ...
    @property
    def thinking_end_tags(self) -> tuple[str, ...]: ...
    @property
    def preserved_tokens(self) -> tuple[str, ...]: ...
