"""The assistant's message (content, reasoning content, tool calls) read from a generated text, whole or as
a stream's text so far, as llama.cpp's chat parser reads it.

    message_parser  the entry point, `parse_message`; the auto-parser's templates read by a direct scan
    message_scan  the scan the message parsers read a text with (llama.cpp's lenient parse: what the text
              ends inside stands)
    tagged_message_parser  the calls of the tag formats whose arguments are tagged
    peg_parse  a hand-written format's text read with its request's PEG arena, as llama.cpp's parser runs
              it, and the message its mapper makes of the tagged nodes
    gemma4_message, minimax_m3_message  the two formats whose mappers are their own
    chat_format  a request's parser settings as one value that travels (JSON both ways): what reads its
              answer back where the template is not at hand

Contract: where ported, llama.cpp's message (common_chat_parse, whole or is_partial), or its refusal;
elsewhere NotPorted.
"""
