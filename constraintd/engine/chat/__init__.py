"""llama-server's request layer: which constraint a request asks for, and what its answer's content is.

    requests  OpenAI and Ollama request bodies resolved to one constraint and its GBNF grammar, as
              llama-server and Ollama resolve them (`response_format`, `json_schema`, `grammar`, `format`)
    content   the content rule: the message content llama-server returns for a JSON-shaped answer,
              whole or streamed
    template_inputs  what llama.cpp's chat layer gives a chat template: OpenAI messages and tools read and
              rewritten for the template's capabilities, and the other variables it sets
    caps      a template's capabilities, found as llama.cpp finds them (probe conversations over tracked
              values; the renderer reports what the template reads)
    prompt    the prompt and generation prompt of llama.cpp's chat params, through the caller's renderer
    continuation  continuing the final message (continue_final_message): the chat split before rendering,
              the generation prompt continued after, as the request's format does
    jinja_values  values as llama.cpp's Jinja writes them (tojson, the string filter, printing)
    diff_split  the auto-parser's text tools: markers and text, where two renderings differ
    reasoning  a template's thinking tags, found by the auto-parser's probe conversations
    template_analysis  the auto-parser's analysis: reasoning, content, the tool-call format (JSON calls'
              fields, the tag formats' function, argument and call id markers), preserved tokens, the
              patches of known templates
    json_tool_grammar  the tool-call grammar of templates that write JSON calls, and of the tag formats
              whose arguments are JSON
    tagged_tool_grammar  the tool-call grammar of the tag formats whose arguments are tagged one by one
    peg_arena  llama.cpp's PEG parser arena as far as its GBNF goes: a hand-written format builds its parser
              there, call for call, and the arena writes its grammar
    formats   llama.cpp's hand-written formats (common/parsers), one module each: their chat params' grammar
              side, on the PEG arena
    chat_params  the grammar side of llama.cpp's chat params (grammar, lazy flag, triggers, preserved
              tokens, stops, thinking tags), for the auto-parser's templates and the hand-written formats,
              where ported
    message_scan  the scan the message parsers read a text with (llama.cpp's partial parse: what the text
              ends inside stands)
    message_parser  the assistant's message (content, reasoning content, tool calls) from a whole generated
              text, as llama.cpp's chat parser reads it on the auto-parser's templates, where ported
    tagged_message_parser  the calls of the tag formats whose arguments are tagged, for message_parser
    peg_parse  a hand-written format's text read with its request's PEG arena, as llama.cpp's parser runs
              it, and the message its mapper makes of the tagged nodes
    gemma4_message, minimax_m3_message  the two formats whose mappers are their own
    chat_format  a request's parser settings as one value that travels (JSON both ways): what reads its
              answer back where the template is not at hand

Contract: the grammar a request resolves to is the one llama-server would sample with, and a chat
template rendered by `chat_prompt` (with a renderer of llama.cpp's Jinja dialect) gives llama.cpp's prompt
and generation prompt; `chat_params` gives llama.cpp's grammar, lazy flag, triggers, stops and thinking
tags where it computes them, and `parse_message` its message from a generated text; both say NotPorted
where they do not.
"""
