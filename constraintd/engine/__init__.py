"""The grammar engine: llama.cpp's GBNF grammar sampler and JSON-schema converter, in Python.

Standard library and numpy only; no I/O. The usual path::

    grammar = Grammar.from_gbnf(json_schema_to_gbnf(schema_text), Vocab.from_gguf(path))
    matcher = Matcher(grammar)
    matcher.accept(token)          # False: rejected, nothing changed
    words = matcher.mask()         # packed: token j is bit j % 32 of word j // 32
"""

from constraintd.engine.chat.content import ContentStream, json_content, json_message
from constraintd.engine.chat.requests import (
    AnswerFormat,
    RequestGrammar,
    json_object_grammar,
    resolve_request,
)
from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.grammar.elements import GreType
from constraintd.engine.grammar.gbnf import ParsedGrammar, check_grammar, parse_gbnf
from constraintd.engine.masks.bitmask import (
    allocate_masks,
    allowed_tokens,
    apply_mask,
    mask_words,
    pack_mask,
    unpack_mask,
)
from constraintd.engine.matcher import Matcher
from constraintd.engine.schema.convert import SchemaConversion, convert_json_schema, json_schema_to_gbnf
from constraintd.engine.vocab.vocab import Vocab
from constraintd.errors import (
    ConstraintdError,
    GrammarError,
    InputError,
    LimitError,
    SchemaError,
    TokenError,
    VocabError,
)

__all__ = [
    "AnswerFormat",
    "ConstraintdError",
    "ContentStream",
    "Grammar",
    "GrammarError",
    "GreType",
    "InputError",
    "LimitError",
    "Matcher",
    "ParsedGrammar",
    "RequestGrammar",
    "SchemaConversion",
    "SchemaError",
    "TokenError",
    "Vocab",
    "VocabError",
    "allocate_masks",
    "allowed_tokens",
    "apply_mask",
    "check_grammar",
    "convert_json_schema",
    "json_content",
    "json_message",
    "json_object_grammar",
    "json_schema_to_gbnf",
    "mask_words",
    "pack_mask",
    "parse_gbnf",
    "resolve_request",
    "unpack_mask",
]
