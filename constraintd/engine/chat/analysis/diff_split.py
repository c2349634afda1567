# The text tools of llama.cpp's chat auto-parser (common/chat-auto-parser-helpers.cpp): what it uses to
# find a template's markers by rendering two conversations that differ in one point and comparing them.
#
# Contract:
# - `segments` cuts a text into markers (`<...>` or `[...]`, closed by the opener's own closer) and the text
#   between them, as segmentize_markers does; `diff_split` splits two renderings into their common prefix,
#   their common suffix and what is left of each between them, as calculate_diff_split does (segment by
#   segment first, then character by character where both ends are text).
# - Whitespace is C's isspace in the "C" locale (space, \t, \n, \v, \f, \r), never Unicode's: the templates'
#   non-ASCII spaces are text to llama.cpp.
# - Sans-IO: the renderings come from the caller (`compare_variants` takes a render function).
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "C_SPACE", "Segment", "VariantDiff", "compare_variants", "diff_split", "prune_whitespace",
    "segments", "trim_whitespace",
]

C_SPACE = " \t\n\v\f\r"
"""The characters C's isspace() takes in the "C" locale."""

_CLOSERS = {"<": ">", "[": "]"}


def trim_whitespace(text: str) -> str:
    """The text without its leading and trailing C whitespace (llama.cpp's trim_whitespace)."""
    return text.strip(C_SPACE)


@dataclass(frozen=True, slots=True)
class Segment:
    """A marker (`<...>`, `[...]`) or the text between markers."""

    marker: bool
    value: str


def segments(text: str) -> list[Segment]:
    """The text cut into markers and text, in order (segmentize_markers): an unclosed opener starts text."""
    out: list[Segment] = []
    opener = ""
    border = 0
    for at, char in enumerate(text):
        if not opener and char in _CLOSERS:
            if border < at:
                out.append(Segment(False, text[border:at]))
            border, opener = at, char
        elif opener and char == _CLOSERS[opener]:
            out.append(Segment(True, text[border:at + 1]))
            border, opener = at + 1, ""
    if border < len(text):
        out.append(Segment(False, text[border:]))
    return out


def prune_whitespace(parts: list[Segment]) -> list[Segment]:
    """The segments that are not only whitespace."""
    return [part for part in parts if trim_whitespace(part.value)]


@dataclass(frozen=True, slots=True)
class DiffSplit:
    """Two texts as prefix + left + suffix and prefix + right + suffix."""

    prefix: str = ""
    suffix: str = ""
    left: str = ""
    right: str = ""


def _common_prefix(left: str, right: str) -> int:
    n = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        n += 1
    return n


def _common_suffix(left: str, right: str) -> int:
    n = 0
    for a, b in zip(reversed(left), reversed(right), strict=False):
        if a != b:
            break
        n += 1
    return n


def diff_split(left: str, right: str) -> DiffSplit:
    """Where two renderings differ (calculate_diff_split, step for step: the segment walk from both ends,
    the one-segment-left cases, then the characters of the remainders where both ends are text)."""
    ls, rs = segments(left), segments(right)
    if not ls:
        return DiffSplit(right=right)
    if not rs:
        return DiffSplit(left=left)
    prefix, suffix = "", ""
    l_start, l_end, r_start, r_end = 0, len(ls) - 1, 0, len(rs) - 1
    left_done = right_done = False
    while l_start != l_end and r_start != r_end:
        advanced = False
        if ls[l_start] == rs[r_start]:
            prefix += ls[l_start].value
            l_start += 1
            r_start += 1
            advanced = True
        if ls[l_end] == rs[r_end]:
            suffix = ls[l_end].value + suffix
            if l_start != l_end:
                l_end -= 1
            else:
                left_done = True
            if r_start != r_end:
                r_end -= 1
            else:
                right_done = True
            advanced = True
        if not advanced:
            break
    if l_start == l_end and r_start != r_end:
        if ls[l_start] == rs[r_end]:
            suffix = rs[r_end].value + suffix
            r_end -= 1
            left_done = True
        elif ls[l_start] == rs[r_start]:
            prefix += rs[r_start].value
            r_start += 1
            left_done = True
    elif r_start == r_end and l_start != l_end:
        if ls[l_end] == rs[r_start]:
            suffix = ls[l_end].value + suffix
            l_end -= 1
            right_done = True
        elif ls[l_start] == rs[r_start]:
            prefix += ls[l_start].value
            l_start += 1
            right_done = True
    elif l_start == l_end and r_start == r_end and ls[l_start] == rs[r_start] and ls[l_start].marker:
        prefix += rs[r_start].value
        left_done = right_done = True

    text_suffix = not ls[l_end].marker and not rs[r_end].marker
    text_prefix = not rs[r_start].marker and not ls[l_start].marker
    rest_left = "".join(s.value for s in ls[l_start:l_end if left_done else l_end + 1])
    rest_right = "".join(s.value for s in rs[r_start:r_end if right_done else r_end + 1])
    suffix_len = _common_suffix(rest_left, rest_right) if text_suffix else 0
    prefix_len = _common_prefix(rest_left[:len(rest_left) - suffix_len],
                                rest_right[:len(rest_right) - suffix_len]) if text_prefix else 0
    prefix += rest_left[:prefix_len]
    suffix = rest_left[len(rest_left) - suffix_len:] + suffix
    only_left = rest_left[prefix_len:len(rest_left) - suffix_len]
    only_right = rest_right[prefix_len:len(rest_right) - suffix_len]
    if not only_left and not only_right:
        prefix, suffix = left, ""  # no difference: the whole text as the prefix
    if not only_left and only_right and len(left) <= len(right) and right.startswith(left):
        # left is all shared: the walk from both ends may have rotated the difference
        return DiffSplit(prefix=left, right=right[len(left):])
    return DiffSplit(prefix, suffix, only_left, only_right)


@dataclass(frozen=True, slots=True)
class VariantDiff:
    """Two renderings and where they differ."""

    diff: DiffSplit
    output_a: str
    output_b: str


Render = Callable[[Mapping[str, Any]], str]
"""Renders the template with these variables; raises whatever the template raises."""


def compare_variants(render: Render, context_a: Mapping[str, Any],
                     context_b: Mapping[str, Any]) -> VariantDiff | None:
    """Both renderings and their difference, or None where either fails (compare_variants)."""
    try:
        output_a = render(context_a)
        output_b = render(context_b)
    except Exception:  # llama.cpp's analysis takes any failure of a probe as "no answer"
        return None
    return VariantDiff(diff_split(output_a, output_b), output_a, output_b)
