"""GGUF files, read with the standard library and numpy as llama.cpp reads them.

    metadata  the key-value section of a GGUF file (tensor data is never read)
    reader    the vocabulary: token texts, attributes, the end-of-generation set, as `llama_vocab` loads them
    pieces    token text + attributes -> piece bytes, per tokenizer model (llama.cpp's `token_to_piece`)

Contract: a file llama.cpp loads gives byte for byte llama.cpp's pieces; a file it refuses is refused with
`VocabError`. Files are memory-mapped and only read.
"""
