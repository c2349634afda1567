"""A chat format's grammar, compiled over a byte vocabulary, and the two questions its tests ask of it."""

from __future__ import annotations

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.chat.formats import FormatParams
from constraintd.engine.chat.params.chat_params import format_grammar

# one token a byte (and an end of generation): a text is taken as its bytes
BYTES = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])


def grammar_text(made: FormatParams) -> str:
    """The GBNF a request with these params gets (empty: no grammar)."""
    return format_grammar(made).grammar


def format_matcher(made: FormatParams) -> Matcher:
    """A matcher of the request's grammar over BYTES."""
    return Matcher(Grammar.from_gbnf(grammar_text(made), BYTES))


def completes(matcher: Matcher, text: str) -> bool:
    """Whether the grammar takes `text` whole and may end there (the matcher itself is left as it was)."""
    fork = matcher.fork()
    return fork.accept_bytes(text.encode()) and fork.is_complete()


def takes(matcher: Matcher, text: str) -> bool:
    """Whether the grammar takes `text` as a beginning (the matcher itself is left as it was)."""
    return matcher.fork().accept_bytes(text.encode())
