"""Vocabularies as llama.cpp's grammar sees them: token id -> the bytes the grammar matches.

    vocab         `Vocab`: pieces (llama.cpp's `token_to_piece`), the end-of-generation set, content hash
    decoded       the pieces decoded as the grammar decodes them, laid out for whole-vocabulary masks
    token_lookup  the one token llama.cpp's tokenizer makes of a text (GBNF `<...>` terminals)
    gguf/         a GGUF file's vocabulary, read as llama.cpp's loader reads it

Contract: everything here is a pure function of a vocabulary's content; nothing writes files (saving
prepared vocabularies is the service's, `constraintd.service.vocab_store`).
"""

from constraintd.engine.vocab.vocab import TokenizerRules, Vocab

__all__ = ["TokenizerRules", "Vocab"]
