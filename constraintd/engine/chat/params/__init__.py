"""The grammar side of llama.cpp's chat params (common_chat_params): grammar, lazy flag, triggers,
preserved tokens, stops, thinking tags.

    chat_params  the chat params of a request, for the auto-parser's templates and the hand-written formats
              (chat/formats/), where ported
    json_tool_grammar  the tool-call grammar of templates that write JSON calls, and of the tag formats
              whose arguments are JSON
    tagged_tool_grammar  the tool-call grammar of the tag formats whose arguments are tagged one by one

Contract: where ported, byte for byte what llama.cpp computes; elsewhere NotPorted, never a grammar that
differs.
"""
