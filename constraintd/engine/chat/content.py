# The content rule: what llama-server answers as a message's content when a JSON schema shapes the answer.
#
# llama-server parses a structured answer (common/chat-auto-parser-generator.cpp, `autoparser::build_parser`
# when a response format is set) as the PEG
#     space ( "```json" space VALUE space "```" | space VALUE space ) end
# where VALUE is its JSON parser (common/peg-parser.cpp, `json()`), and the content is the text VALUE
# matched. It parses leniently (COMMON_PEG_PARSE_FLAG_LENIENT), the same way for every streamed chunk and
# for the final answer. What follows from that, and what this module reproduces:
# - A complete value is its own text exactly: no fence, no space around it.
# - A value still open where the text ends is its text so far, except that an escape sequence cut in half
#   (a lone `\`, or `\u` with fewer than four hex digits) is not content: the content stops before its
#   backslash. A number at the very end is open too (more digits may follow), and so is a top-level value
#   whose closing fence has not come in full.
# - A text that cannot be such an answer (text after the value, a fence that is not "```json", bad JSON)
#   has no content: "". llama-server skips such a chunk while streaming and refuses such a final answer
#   ("does not match the expected format"); `json_message` answers with the raw text instead.
# - Whitespace is C's `isspace` (space, \t, \n, \v, \f, \r), inside the value as around it; a string may hold
#   any character but `"` and `\` raw (llama.cpp's parser does not refuse control characters).
# Invariant: as text is appended, the content only grows (each content is a prefix of every later non-empty
# one), so a stream's next piece of content is a suffix. `ContentStream` relies on it.
# The scanner is incremental: it resumes where the last piece stopped (at the start of an unfinished number
# or literal, inside an unfinished string), so a stream costs time linear in its length.
from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["AnswerState", "ContentStream", "JsonAnswer", "json_content", "json_message", "parse_json_answer"]

_FENCE_OPEN = "```json"
_FENCE_CLOSE = "```"
_SPACE = re.compile(r"[ \t\n\v\f\r]*")
_STRING_RUN = re.compile(r'[^"\\]*')
_DIGITS = re.compile(r"[0-9]*")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
# After a number, llama.cpp's negative lookahead refuses any character that could have extended it.
_NUMBER_CONTINUATION = frozenset("0123456789.eE+-")
_LITERALS = {"t": "true", "f": "false", "n": "null"}


class AnswerState(enum.Enum):
    """Where a structured answer stands."""

    OPEN = "open"
    """More text may complete it (the value, or the closing fence, is unfinished)."""
    COMPLETE = "complete"
    """It parses as a whole now; more text could only be space (or would make it invalid)."""
    INVALID = "invalid"
    """No text appended can make it parse: it has no content."""


@dataclass(frozen=True, slots=True)
class JsonAnswer:
    """A structured answer's content as llama-server's parser finds it.

    Attributes:
        content: the JSON value's text (complete, or open as far as it can be content); "" when invalid.
        state: whether the answer is open, complete or invalid.
    """

    content: str
    state: AnswerState


class _Step(enum.Enum):
    DONE = 0  # the token is complete; the scan moved past it
    MORE = 1  # the text ends inside the token
    FAIL = 2  # the token cannot be completed


class _Phase(enum.Enum):
    LEAD = 0  # before the value: space, then perhaps the opening fence
    FENCE_SPACE = 1  # after "```json", the space before the value
    VALUE = 2  # inside the JSON value
    TRAIL = 3  # after the value: space, then (fenced) the closing fence or (unfenced) the end
    CLOSE = 4  # fenced: expecting "```"
    END = 5  # nothing more may come
    FAILED = 6


class _Expect(enum.Enum):
    """What the JSON value scanner expects next (the JSON grammar's positions)."""

    VALUE = 0  # space, then a value
    STRING = 1  # inside a string's body
    OBJECT_FIRST = 2  # after "{": space, then "}" or a key
    OBJECT_COLON = 3  # after a key: space, then ":"
    OBJECT_NEXT = 4  # after a member's value: space, then "," or "}"
    OBJECT_KEY = 5  # after ",": space, then a key
    ARRAY_FIRST = 6  # after "[": space, then "]" or a value
    ARRAY_NEXT = 7  # after an element: space, then "," or "]"


def _run_end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where a run of `pattern` (which matches the empty string too) starting at `pos` ends."""
    match = pattern.match(text, pos)
    return match.end() if match else pos


def _scan_string(text: str, pos: int) -> tuple[_Step, int]:
    """Scan a string's body from `pos`; DONE ends past the closing quote, MORE where content stops."""
    end = len(text)
    while True:
        pos = _run_end(_STRING_RUN, text, pos)
        if pos >= end:
            return _Step.MORE, pos
        if text[pos] == '"':
            return _Step.DONE, pos + 1
        escape = text[pos + 1 : pos + 2]
        if not escape:
            return _Step.MORE, pos  # a lone backslash: not content yet
        if escape in _SIMPLE_ESCAPES:
            pos += 2
        elif escape == "u":
            digits = text[pos + 2 : pos + 6]
            if any(d not in _HEX_DIGITS for d in digits):
                return _Step.FAIL, pos
            if len(digits) < 4:
                return _Step.MORE, pos  # `\u` cut short: not content yet
            pos += 6
        else:
            return _Step.FAIL, pos


def _scan_number(text: str, pos: int) -> tuple[_Step, int]:
    """llama.cpp's `json_number`: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? !([0-9.eE+-])."""
    end = len(text)
    if text[pos] == "-":
        pos += 1
    if pos >= end:
        return _Step.MORE, pos
    if text[pos] == "0":
        pos += 1
    elif "1" <= text[pos] <= "9":
        pos = _run_end(_DIGITS, text, pos + 1)
    else:
        return _Step.FAIL, pos
    if pos < end and text[pos] == ".":
        digits_end = _run_end(_DIGITS, text, pos + 1)
        if digits_end == pos + 1:
            # The fraction has no digit yet: open at the end of the text, else the lookahead sees the ".".
            return (_Step.MORE if digits_end >= end else _Step.FAIL), pos
        pos = digits_end
    if pos < end and text[pos] in "eE":
        digits_start = pos + 1
        if digits_start < end and text[digits_start] in "+-":
            digits_start += 1
        digits_end = _run_end(_DIGITS, text, digits_start)
        if digits_end == digits_start:
            return (_Step.MORE if digits_end >= end else _Step.FAIL), pos
        pos = digits_end
    if pos >= end:
        return _Step.MORE, pos  # the lookahead needs the next character
    if text[pos] in _NUMBER_CONTINUATION:
        return _Step.FAIL, pos
    return _Step.DONE, pos


def _scan_literal(text: str, pos: int) -> tuple[_Step, int]:
    word = _LITERALS[text[pos]]
    seen = text[pos : pos + len(word)]
    if seen == word:
        return _Step.DONE, pos + len(word)
    if word.startswith(seen) and pos + len(seen) == len(text):
        return _Step.MORE, pos
    return _Step.FAIL, pos


class _AnswerScanner:
    """The lenient PEG above as a resumable state machine over a growing text.

    Positions are relative to `_text`, which holds the text from absolute offset `_base` on; a stream
    drops what it no longer needs (`forget_before`), so each piece costs time in its own length.
    """

    __slots__ = ("_base", "_cut", "_expect", "_fenced", "_key", "_phase", "_pos", "_stack", "_text",
                 "_value_end", "_value_start")

    def __init__(self) -> None:
        self._text = ""
        self._base = 0
        self._pos = 0
        self._phase = _Phase.LEAD
        self._fenced = False
        self._expect = _Expect.VALUE
        self._key = False  # the open string is an object key
        self._stack: list[str] = []  # the open containers, "{" or "["
        self._value_start: int | None = None
        self._value_end: int | None = None
        self._cut: int | None = None  # where an open string's content stops (a cut escape); None: at the end

    def feed(self, piece: str) -> None:
        self._text += piece
        while self._phase is not _Phase.FAILED and self._PHASES[self._phase](self):
            pass

    def state(self) -> AnswerState:
        if self._phase is _Phase.FAILED:
            return AnswerState.INVALID
        complete = self._phase is _Phase.END or (self._phase is _Phase.TRAIL and not self._fenced)
        return AnswerState.COMPLETE if complete else AnswerState.OPEN

    def content_bounds(self) -> tuple[int, int] | None:
        """The absolute start and end of the content; None when there is none (invalid, or not begun)."""
        if self._phase is _Phase.FAILED or self._value_start is None:
            return None
        if self._value_end is not None:
            end = self._value_end
        else:
            end = self._cut if self._cut is not None else len(self._text)
        return self._value_start + self._base, end + self._base

    def slice(self, start: int, end: int) -> str:
        """The text between two absolute offsets (not before what was forgotten)."""
        return self._text[start - self._base : end - self._base]

    def forget_before(self, offset: int) -> None:
        """Drop the text before an absolute offset, keeping all the scan still needs."""
        drop = min(offset - self._base, self._pos)
        if drop <= 0:
            return
        self._text = self._text[drop:]
        self._base += drop
        self._pos -= drop
        if self._value_start is not None:
            self._value_start -= drop
        if self._value_end is not None:
            self._value_end -= drop
        if self._cut is not None:
            self._cut -= drop

    def answer(self) -> JsonAnswer:
        bounds = self.content_bounds()
        return JsonAnswer(self.slice(*bounds) if bounds else "", self.state())

    # Each phase step returns True when it moved on to another phase (run the next step), False when it
    # needs more text or failed.

    def _skip_space(self) -> bool:
        """Skip space at the position; False when the text ends there."""
        self._pos = _run_end(_SPACE, self._text, self._pos)
        return self._pos < len(self._text)

    def _fail(self) -> bool:
        self._phase = _Phase.FAILED
        return False

    def _lead(self) -> bool:
        self._skip_space()
        rest = self._text[self._pos : self._pos + len(_FENCE_OPEN)]
        if rest == _FENCE_OPEN:
            self._fenced = True
            self._pos += len(_FENCE_OPEN)
            self._phase = _Phase.FENCE_SPACE
            return True
        if _FENCE_OPEN.startswith(rest) and self._pos + len(rest) == len(self._text):
            return False  # perhaps the fence, perhaps not yet
        self._value_start = self._pos
        self._phase = _Phase.VALUE
        return True

    def _fence_space(self) -> bool:
        if not self._skip_space():
            return False
        self._value_start = self._pos
        self._phase = _Phase.VALUE
        return True

    def _value(self) -> bool:
        while True:
            step = self._EXPECTS[self._expect](self)
            if step is _Step.MORE:
                return False
            if step is _Step.FAIL:
                return self._fail()
            if self._value_end is not None:
                self._phase = _Phase.TRAIL
                return True

    def _trail(self) -> bool:
        if self._fenced:
            self._skip_space()
            self._phase = _Phase.CLOSE
            return True
        if self._skip_space():
            return self._fail()  # unfenced: only space may follow the value
        return False

    def _close(self) -> bool:
        self._skip_space()  # more space may have come; a partial fence is not space, so this keeps it
        rest = self._text[self._pos : self._pos + len(_FENCE_CLOSE)]
        if rest == _FENCE_CLOSE:
            self._pos += len(_FENCE_CLOSE)
            self._phase = _Phase.END
            return True
        if _FENCE_CLOSE.startswith(rest) and self._pos + len(rest) == len(self._text):
            return False
        return self._fail()

    def _end(self) -> bool:
        if self._pos < len(self._text):
            return self._fail()
        return False

    _PHASES: ClassVar[dict[_Phase, Callable[[_AnswerScanner], bool]]] = {
        _Phase.LEAD: _lead,
        _Phase.FENCE_SPACE: _fence_space,
        _Phase.VALUE: _value,
        _Phase.TRAIL: _trail,
        _Phase.CLOSE: _close,
        _Phase.END: _end,
    }

    # The JSON value scanner: each step consumes one token (or space) and says DONE, MORE or FAIL.
    # On MORE the position stays where scanning resumes: the token's start for numbers and literals
    # (short: scanned again), the last complete character for strings and space.

    def _value_done(self) -> None:
        if not self._stack:
            self._value_end = self._pos
        else:
            self._expect = _Expect.OBJECT_NEXT if self._stack[-1] == "{" else _Expect.ARRAY_NEXT

    def _open(self, bracket: str, expect: _Expect) -> _Step:
        self._stack.append(bracket)
        self._pos += 1
        self._expect = expect
        return _Step.DONE

    def _close_container(self) -> _Step:
        self._stack.pop()
        self._pos += 1
        self._value_done()
        return _Step.DONE

    def _start_string(self, *, key: bool) -> _Step:
        self._pos += 1
        self._key = key
        self._expect = _Expect.STRING
        return _Step.DONE

    def _expect_value(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        char = self._text[self._pos]
        if char == "{":
            return self._open("{", _Expect.OBJECT_FIRST)
        if char == "[":
            return self._open("[", _Expect.ARRAY_FIRST)
        if char == '"':
            return self._start_string(key=False)
        if char == "-" or "0" <= char <= "9":
            step, end = _scan_number(self._text, self._pos)
        elif char in _LITERALS:
            step, end = _scan_literal(self._text, self._pos)
        else:
            return _Step.FAIL
        if step is _Step.DONE:
            self._pos = end
            self._value_done()
        return step

    def _expect_string(self) -> _Step:
        step, end = _scan_string(self._text, self._pos)
        self._pos = end
        if step is _Step.MORE:
            self._cut = end if end < len(self._text) else None
        elif step is _Step.DONE:
            self._cut = None
            if self._key:
                self._expect = _Expect.OBJECT_COLON
            else:
                self._value_done()
        return step

    def _expect_object_first(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        char = self._text[self._pos]
        if char == "}":
            return self._close_container()
        if char == '"':
            return self._start_string(key=True)
        return _Step.FAIL

    def _expect_object_colon(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        if self._text[self._pos] != ":":
            return _Step.FAIL
        self._pos += 1
        self._expect = _Expect.VALUE
        return _Step.DONE

    def _expect_object_next(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        char = self._text[self._pos]
        if char == ",":
            self._pos += 1
            self._expect = _Expect.OBJECT_KEY
            return _Step.DONE
        if char == "}":
            return self._close_container()
        return _Step.FAIL

    def _expect_object_key(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        if self._text[self._pos] != '"':
            return _Step.FAIL
        return self._start_string(key=True)

    def _expect_array_first(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        if self._text[self._pos] == "]":
            return self._close_container()
        self._expect = _Expect.VALUE
        return _Step.DONE

    def _expect_array_next(self) -> _Step:
        if not self._skip_space():
            return _Step.MORE
        char = self._text[self._pos]
        if char == ",":
            self._pos += 1
            self._expect = _Expect.VALUE
            return _Step.DONE
        if char == "]":
            return self._close_container()
        return _Step.FAIL

    _EXPECTS: ClassVar[dict[_Expect, Callable[[_AnswerScanner], _Step]]] = {
        _Expect.VALUE: _expect_value,
        _Expect.STRING: _expect_string,
        _Expect.OBJECT_FIRST: _expect_object_first,
        _Expect.OBJECT_COLON: _expect_object_colon,
        _Expect.OBJECT_NEXT: _expect_object_next,
        _Expect.OBJECT_KEY: _expect_object_key,
        _Expect.ARRAY_FIRST: _expect_array_first,
        _Expect.ARRAY_NEXT: _expect_array_next,
    }


def parse_json_answer(raw: str) -> JsonAnswer:
    """Parse a structured answer as llama-server does when a JSON schema or JSON mode is set.

    Args:
        raw: the model's answer text so far (after any reasoning), decoded.

    Returns:
        The content (the JSON value's text, without fence or surrounding space) and the answer's state.
    """
    scanner = _AnswerScanner()
    scanner.feed(raw)
    return scanner.answer()


def json_content(raw: str) -> str:
    """The content of a structured answer: the value once complete, the open part while it is open.

    An escape sequence cut in half is not content; an answer that cannot parse has none ("").
    """
    return parse_json_answer(raw).content


def json_message(raw: str) -> str:
    """The content of a finished (non-streamed) structured answer: the parsed content, or the raw text
    when that is empty (llama-server's `to_json_oaicompat_chat` falls back to the raw text the same way).

    Where llama-server refuses a final answer that does not parse, this returns the raw text.
    """
    return parse_json_answer(raw).content or raw


class ContentStream:
    """The content of a streamed structured answer, piece by piece, as llama-server streams its deltas.

    `push` appends the next piece of generated text and returns only what it added to the content.
    While the text has no content (an opening fence, an answer that cannot parse) nothing is added, as
    llama-server skips a chunk whose parse is empty. Each push costs time in the piece's length (and the
    unfinished token's), not the answer's. Does no I/O; not thread-safe.
    """

    __slots__ = ("_emitted", "_end", "_pieces", "_scanner")

    def __init__(self) -> None:
        self._scanner = _AnswerScanner()
        self._pieces: list[str] = []  # the raw text pushed
        self._emitted: list[str] = []  # the growth returned
        self._end: int | None = None  # absolute offset where the content streamed so far ends

    def push(self, piece: str) -> str:
        """Append `piece` to the answer; return the growth of the content (often "")."""
        self._pieces.append(piece)
        self._scanner.feed(piece)
        bounds = self._scanner.content_bounds()
        if bounds is None or bounds[0] == bounds[1]:
            return ""
        start, end = bounds
        # The content only grows (module contract): what is new lies past where the last growth ended.
        emitted_end = start if self._end is None else self._end
        growth = self._scanner.slice(emitted_end, end) if end > emitted_end else ""
        self._end = max(emitted_end, end)
        self._scanner.forget_before(self._end)
        if growth:
            self._emitted.append(growth)
        return growth

    @property
    def content(self) -> str:
        """The content streamed so far (the concatenation of every growth returned)."""
        return "".join(self._emitted)

    @property
    def text(self) -> str:
        """The raw answer text pushed so far."""
        return "".join(self._pieces)

    @property
    def state(self) -> AnswerState:
        """Whether the answer so far is open, complete or invalid."""
        return self._scanner.state()
