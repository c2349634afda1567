# Lazy grammars: unconstrained until a trigger token or a trigger pattern, as llama_grammar_accept_impl.
#
# Contract:
# - While a lazy grammar awaits its trigger every token is allowed (llama.cpp's apply returns at once)
#   and accepted tokens are buffered: their ids, and their pieces appended to one byte buffer.
# - A trigger token ends the wait: the buffer is dropped and that token is accepted by the grammar.
# - Otherwise, after each buffered token, each pattern in order is looked for in the whole buffer
#   (llama_grammar_trigger_pattern::find); at the first that matches, the wait ends and every buffered
#   token that reaches past the match start is replayed into the grammar, the first one cut to start
#   there (`Triggers.replay`).
# - Patterns are ECMAScript regular expressions over bytes (std::regex on a std::string). `find` follows
#   llama.cpp: a pattern written `^...$` is first matched against the whole buffer (std::regex_match),
#   and every pattern is then searched anywhere (std::regex_search); the start is that of the first
#   capture group that matched something, else that of the whole match.
# - Python's `re` runs the patterns after `_translate` rewrites the few constructs that differ: `.` does
#   not match "\r" either, and `$` only matches at the very end. Refused (GrammarError) rather than
#   matched differently: `[]` and `[^]` (an empty and a full class in ECMAScript), `\u`/`\c` escapes, and
#   anything Python's `re` cannot compile. Not covered: std::regex's own quirks with constructs outside
#   ECMAScript (`(?P<..>`, inline flags, lookbehind: std::regex refuses them, `re` accepts them).
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from constraintd.errors import GrammarError

__all__ = ["BufferedToken", "TriggerPattern", "Triggers"]

# (token id, start, end) of a buffered piece in the buffer
BufferedToken = tuple[int, int, int]

# ECMAScript constructs outside a class, rewritten for Python's `re` (which reads bytes here).
_OUTSIDE_CLASS: Final = {ord("."): rb"[^\n\r]", ord("$"): rb"\Z"}
# Characters literal inside an ECMAScript class that Python's `re` reads as (future) set operators.
_ESCAPE_IN_CLASS: Final = frozenset(b"[&~|")


def _translate(pattern: str) -> bytes:
    source = pattern.encode("utf-8")
    out = bytearray()
    in_class = False
    pos = 0
    while pos < len(source):
        byte = source[pos]
        if byte == ord("\\"):
            escaped = source[pos + 1 : pos + 2]
            if not escaped:
                raise GrammarError(f"trigger pattern ends with a lone backslash: {pattern!r}")
            if escaped in (b"u", b"c"):
                raise GrammarError(
                    f"trigger pattern escape \\{escaped.decode()} is not supported: {pattern!r}"
                )
            out += source[pos : pos + 2]
            pos += 2
            continue
        if in_class:
            if byte == ord("]"):
                in_class = False
                out.append(byte)
            elif byte in _ESCAPE_IN_CLASS:
                out += b"\\" + bytes((byte,))
            else:
                out.append(byte)
        elif byte == ord("["):
            rest = source[pos + 1 : pos + 3]
            if rest.startswith(b"]") or rest == b"^]":
                raise GrammarError(f"trigger pattern class [] or [^] is not supported: {pattern!r}")
            in_class = True
            out.append(byte)
            if rest.startswith(b"^"):
                out.append(ord("^"))
                pos += 1
        else:
            out += _OUTSIDE_CLASS.get(byte, bytes((byte,)))
        pos += 1
    return bytes(out)


@dataclass(frozen=True, slots=True)
class TriggerPattern:
    """One trigger pattern, compiled.

    Attributes:
        pattern: the ECMAScript pattern as given.
        regex: its translation for Python's `re`, over bytes.
        whole: whether it is written `^...$` (then first matched against the whole buffer).
    """

    pattern: str
    regex: re.Pattern[bytes]
    whole: bool

    @classmethod
    def compile(cls, pattern: str) -> TriggerPattern:
        """Compile an ECMAScript trigger pattern.

        Raises:
            GrammarError: the pattern is not a regular expression, or uses a construct not supported.
        """
        try:
            regex = re.compile(_translate(pattern))
        except re.error as exc:
            raise GrammarError(f"invalid trigger pattern {pattern!r}: {exc}") from exc
        return cls(pattern, regex, pattern.startswith("^") and pattern.endswith("$"))

    def find(self, buffer: bytes) -> int:
        """Where the constrained text starts in `buffer`, or -1 when the pattern does not match."""
        found = self.regex.fullmatch(buffer) if self.whole else None
        if found is None:
            found = self.regex.search(buffer)
            if found is None:
                return -1
        for group in range(1, (self.regex.groups or 0) + 1):
            start, end = found.span(group)
            if end - start > 0:
                return start
        return found.start()


@dataclass(frozen=True, slots=True)
class Triggers:
    """What ends a lazy grammar's wait."""

    patterns: tuple[TriggerPattern, ...]
    tokens: frozenset[int]

    @classmethod
    def compile(cls, patterns: Sequence[str], tokens: Sequence[int]) -> Triggers:
        """Compile the patterns.

        Raises:
            GrammarError: a pattern cannot be compiled.
        """
        return cls(tuple(TriggerPattern.compile(p) for p in patterns), frozenset(int(t) for t in tokens))

    def replay(self, buffer: bytes, buffered: Sequence[BufferedToken]) -> list[tuple[int, bytes]] | None:
        """The (token, piece) pairs to replay if a pattern now matches `buffer`, else None."""
        for pattern in self.patterns:
            start = pattern.find(buffer)
            if start >= 0:
                return [
                    (token, buffer[max(begin, start) : end]) for token, begin, end in buffered if end > start
                ]
        return None
