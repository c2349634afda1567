"""The grammar engine: llama.cpp's GBNF grammar sampler, in Python (standard library and numpy only).

grammar = Grammar.from_gbnf(text, Vocab.from_gguf(path))
matcher = Matcher(grammar)
matcher.accept(token)          # False: rejected, nothing changed
words = matcher.mask()         # packed: token j is bit j % 32 of word j // 32
"""

from constraintd.engine.bitmask import allowed_tokens, apply_mask, mask_words, pack_mask, unpack_mask
from constraintd.engine.gbnf import GreType, ParsedGrammar, check_grammar, parse_gbnf
from constraintd.engine.grammar import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab import Vocab
from constraintd.errors import GrammarError, LimitError, TokenError, VocabError

__all__ = [
    "Grammar",
    "GrammarError",
    "GreType",
    "LimitError",
    "Matcher",
    "ParsedGrammar",
    "TokenError",
    "Vocab",
    "VocabError",
    "allowed_tokens",
    "apply_mask",
    "check_grammar",
    "mask_words",
    "pack_mask",
    "parse_gbnf",
    "unpack_mask",
]
