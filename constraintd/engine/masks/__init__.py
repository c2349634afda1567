"""Whole-vocabulary masks: which tokens llama.cpp's grammar sampler leaves finite from a grammar state.

    bitmask         the packed layout (XGrammar, llguidance, vLLM): pack, unpack, apply to logits
    compute         one mask computed from a stack set, walking the vocabulary column by column in numpy
    cache           a grammar's masks cached by state, and the verdicts of stack tops shared per vocabulary
    structural_ids  ids of grammar positions: equal ids, equal verdicts, whatever grammar they come from
    warm            filling those caches ahead of time

Contract: a mask is exactly the set of tokens llama.cpp's apply leaves finite; caches never change an answer.
"""
