"""JSON schema to GBNF, byte for byte llama.cpp's `json_schema_to_grammar`, and JSON as llama.cpp reads it.

    convert     the converter: a schema text -> the GBNF text, the warnings llama.cpp gives and the report
    keywords    the JSON Schema keywords and what the converter does with each (enforced, in part, never, ...)
    extended    the extended dialect (opt-in): what it enforces beyond llama.cpp, and its rules
    ecma_patterns   a `pattern` as ECMA-262 reads it, matched against the string's value (extended)
    number_ranges   integer and decimal bounds as exact GBNF (extended)
    report      the report: each keyword the grammar does not enforce, with its JSON pointer and why
    tree_reader the schema tree read for the types its grammars produce and its schemas accept
    raw_text    which patterns' grammars take a quote, backslash or control character unescaped
    nodes       the schema tree llama.cpp's converter walks (common/json-schema.cpp), with JSON pointers
    patterns    a `pattern` as GBNF (llama.cpp's regex subset)
    ranges      counted repetitions and integer ranges as GBNF
    rules       the fixed pieces of GBNF the converter writes (primitives, whitespace, string literals)
    json_text   JSON read and printed as nlohmann::ordered_json reads and prints it
    float_text  doubles printed as nlohmann's `dump()` prints them

Contract: a schema llama.cpp converts gives the same text; a schema it refuses raises `SchemaError` with
llama.cpp's reason and the JSON pointer of the node. The report never changes the text; strict conversion
refuses a schema whose report is not empty. With `dialect="extended"` the grammar is no longer llama.cpp's:
it enforces more (schema/extended.py), and the report names only what it still leaves unenforced.
"""
