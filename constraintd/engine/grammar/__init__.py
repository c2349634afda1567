"""GBNF grammars: llama.cpp's `llama-grammar.cpp`, from text to the pushdown stacks a matcher walks.

    elements    llama.cpp's grammar element kinds (`GreType`), the one numbering every module reads
    gbnf        the parser (llama.cpp's rule ids and messages)
    checks      what a parsed grammar is refused for (missing rules, left recursion), with the messages table
    stacks      the flattened rule table and the pushdown stacks over it (llama.cpp's semantics, literally)
    stack_sets  stack sets interned as states that memoize their transitions (the fast path of accept)
    utf8        UTF-8 decoded as llama.cpp's grammar decodes it, partial sequences included
    triggers    lazy grammars: trigger tokens and patterns, the buffer replayed from the match
    compiled    `Grammar`: the immutable compiled grammar over one vocabulary, shared by every matcher

Contract: the same grammar text and tokens give the same accepts and the same refusals as llama.cpp.
"""
