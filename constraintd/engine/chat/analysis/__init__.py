"""llama.cpp's chat auto-parser's analysis of a template: what it finds by rendering probe conversations
that differ in one point and comparing them.

    diff_split  the auto-parser's text tools: markers and text, where two renderings differ
    reasoning  a template's thinking tags
    template_analysis  the whole analysis: reasoning, content, the tool-call format (JSON calls' fields,
              the tag formats' function, argument and call id markers), preserved tokens, the patches of
              known templates

Contract: the analysis is llama.cpp's (autoparser::analyze_template) for the same template and renderer.
"""
