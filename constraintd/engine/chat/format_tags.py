# Which hand-written format a request's chat params are of, and whether its parse is ported: llama.cpp's
# chat builder names each tag (reasoning, content, tool-open, tool-name, tool-args, tool-arg-name, ... in
# chat-peg-parser.h), and so does the PEG arena (chat/peg_arena.py: PegArena.tag's name, as each format's
# builder calls spell it), so the parse reads a tag's name from the arena itself.
#
# Contract:
# - `format_of(preserved_tokens)` names the hand-written format whose chat params preserve these tokens (each
#   format's first preserved token is its own), or None.
# - `tag_names(format, arena)` is what the arena leaves unnamed (nothing, for a ported format), or refuses a
#   format whose parse is not ported (not in PARSED) or an arena with a tag without a name.
from __future__ import annotations

from typing import Final

from constraintd.engine.chat.peg_arena import PegArena

__all__ = ["PARSED", "format_of", "tag_names"]

# each format's first preserved token (chat/formats/*: the preserved_tokens its *_params gives)
_FIRST_PRESERVED: Final = {
    "<tool_call>": "qwen3-coder", "<|channel>": "gemma4", "[THINK]": "ministral-3",
    "<|tool_calls_section_begin|>": "kimi-k2", "<|open|>": "kimi-k3", "｜DSML｜": "deepseek-v3.2",
    "<|tool_call_start|>": "lfm2", "<|START_OF_TURN_TOKEN|>": "cohere2-moe",
    "<|message_sep|>\n\n": "gigachat-v3", "]<]minimax[>[": "minimax-m3", "<think>": "ling-3",
    ">>>all": "functionary-v3.2", "<|start|>": "muse-glimmer", "<|channel|>": "gpt-oss",
    "<function": "minicpm5",
}


def format_of(preserved_tokens: tuple[str, ...] | None) -> str | None:
    """The hand-written format whose chat params preserve these tokens, or None."""
    return _FIRST_PRESERVED.get(preserved_tokens[0]) if preserved_tokens else None


# the formats whose parse is ported: llama.cpp's standard mapper, or gemma4's or minimax-m3's own
PARSED: Final = frozenset({
    "qwen3-coder", "ministral-3", "kimi-k2", "kimi-k3", "deepseek-v3.2", "gemma4", "lfm2", "cohere2-moe",
    "gigachat-v3", "gpt-oss", "functionary-v3.2", "ling-3", "minicpm5", "muse-glimmer", "minimax-m3"})


def tag_names(format_name: str, arena: PegArena) -> dict[int, str]:
    """The names of the tags `arena` (a request's parser of the format `format_name`) leaves unnamed: none,
    the arena naming each tag itself.

    Raises:
        NotImplementedError: the format's parse is not ported, or a tag of the arena has no name.
    """
    unnamed = any(arena.kind(parser) == "tag" and not arena.text(parser) for parser in range(len(arena)))
    if format_name not in PARSED or unnamed:
        raise NotImplementedError(f"the parser of the {format_name} format")
    return {}
