"""Check a text against a GBNF grammar: accepted or not, complete or not, and where it first fails.

    constraintd check --grammar FILE [--vocab GGUF] [--root NAME] [TEXT | -]

The text (standard input when it is `-` or left out) is fed to the grammar one UTF-8 character at a
time, as llama.cpp's grammar takes text (llama_grammar_accept_str). Token terminals (`<[id]>`,
`<|im_end|>`) match tokens, never text: a text reaching one stops there. `--vocab` names the model
vocabulary that `<...>` terminals are looked up in (without it, only `<[id]>` terminals are known).

Exit status, for scripts:
    0  accepted, and complete (the grammar may end here)
    3  accepted, but incomplete (a prefix of something the grammar accepts)
    1  rejected: the byte offset, line and column of the first character refused are printed, with
       the characters that could have come there instead; also for bytes that are not UTF-8, or NUL
    2  usage error, a file that cannot be read, or a grammar llama.cpp refuses (with its line and column)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.grammar.utf8 import sequence_length
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import InputError

PROG = "constraintd check"
ACCEPTED, REJECTED, USAGE, INCOMPLETE = 0, 1, 2, 3
# Characters offered as "expected" when a text is refused: printable ASCII and the usual whitespace.
_PROBES = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r"]
_MAX_EXPECTED = 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--grammar", metavar="FILE", required=True, help="the GBNF grammar")
    parser.add_argument("--vocab", metavar="GGUF", help="the vocabulary `<...>` token terminals name")
    parser.add_argument("--root", metavar="NAME", default="root", help="the start rule (default: root)")
    parser.add_argument(
        "text",
        metavar="TEXT",
        nargs="?",
        default="-",
        help="the text to check (`-`, the default: standard input)",
    )


def byte_vocab() -> Vocab:
    """One token per byte (token b's piece is the byte b): a vocabulary that needs no file."""
    return Vocab([bytes((b,)) for b in range(256)])


def run(args: argparse.Namespace) -> int:
    try:
        grammar_text = Path(args.grammar).read_text(encoding="utf-8")
        vocab = Vocab.from_gguf(args.vocab) if args.vocab else byte_vocab()
        # an argument's bytes as given (os.fsencode undoes the surrogate escapes of undecodable bytes)
        text = sys.stdin.buffer.read() if args.text == "-" else os.fsencode(args.text)
        grammar = Grammar.from_gbnf(grammar_text, vocab, root=args.root)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"{PROG}: cannot read the input: {exc}", file=sys.stderr)
        return USAGE
    except InputError as exc:
        print(f"{PROG}: {args.grammar}: {exc}", file=sys.stderr)
        return USAGE
    matcher = Matcher(grammar)
    offset = 0
    while offset < len(text):
        char = text[offset : offset + max(1, sequence_length(text[offset]))]
        try:
            shown = char.decode("utf-8")
        except UnicodeDecodeError:
            return _rejected(text, offset, "bytes that are not UTF-8", matcher)
        if char == b"\0":  # llama.cpp reads text as a C string: a NUL ends it
            return _rejected(text, offset, "a NUL byte (never matched)", matcher)
        if not matcher.accept_bytes(char):
            return _rejected(text, offset, f"{shown!r} is not allowed here", matcher)
        offset += len(char)
    if matcher.is_complete():
        print("accepted: complete")
        return ACCEPTED
    print("accepted: incomplete (the grammar expects more)")
    expected = _expected(matcher)
    if expected:
        print(f"  next: {expected}")
    return INCOMPLETE


def _rejected(text: bytes, offset: int, reason: str, matcher: Matcher) -> int:
    line_start = text.rfind(b"\n", 0, offset) + 1
    line = text.count(b"\n", 0, offset) + 1
    column = len(text[line_start:offset].decode("utf-8", errors="replace")) + 1
    print(f"rejected at byte {offset} (line {line}, column {column}): {reason}")
    line_end = text.find(b"\n", offset)
    shown = text[line_start : line_end if line_end >= 0 else len(text)].decode("utf-8", errors="replace")
    print(f"  {shown}")
    print(f"  {' ' * (column - 1)}^")
    expected = _expected(matcher)
    print(f"  expected: {expected}" if expected else "  expected: nothing more (the text should end here)")
    return REJECTED


def _expected(matcher: Matcher) -> str:
    allowed = [repr(c) for c in _PROBES if matcher.fork().accept_bytes(c.encode())]
    if len(allowed) > _MAX_EXPECTED:
        allowed = [*allowed[:_MAX_EXPECTED], "..."]
    if not allowed and any(matcher.stacks):
        allowed.append("a character outside ASCII, or a token")
    if matcher.is_complete():
        allowed.append("the end of the text")
    return ", ".join(allowed)
