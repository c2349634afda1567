"""llama.cpp's hand-written chat formats (its common/parsers/*.cpp), one module each: the grammar side of a
format's chat params (grammar, lazy flag, triggers, preserved tokens, thinking tags), built call for call with
the PEG arena (chat/peg_arena.py) as llama.cpp builds it.

Contract: a format's `*_params` function gives what llama.cpp's `common_chat_params_init_*` gives for a
request on a template of that format, or raises NotImplementedError naming the part not ported.
"""
