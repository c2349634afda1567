"""llama-server's request layer and llama.cpp's chat layer: which constraint a request asks for, what its
answer's content is, and, for a chat with tools, the chat params and the message read back.

    requests  OpenAI and Ollama request bodies resolved to one constraint and its GBNF grammar, as
              llama-server and Ollama resolve them (`response_format`, `json_schema`, `grammar`, `format`)
    content   the content rule: the message content llama-server returns for a JSON-shaped answer,
              whole or streamed
    templates/  a chat template rendered as llama.cpp renders it: its inputs, its capabilities, the prompt
              and generation prompt, a continued final message
    analysis/  the auto-parser's analysis of a template: thinking tags, content, the tool-call format
    params/   the grammar side of llama.cpp's chat params (grammar, lazy flag, triggers, preserved tokens,
              stops, thinking tags), for the auto-parser's templates and the hand-written formats
    peg_arena  llama.cpp's PEG parser arena as far as its GBNF goes: a hand-written format builds its parser
              there, call for call, and the arena writes its grammar
    formats/  llama.cpp's hand-written formats (common/parsers), one module each, on the PEG arena
    parsing/  the assistant's message (content, reasoning content, tool calls) from a generated text,
              whole or a stream's text so far, and the parser settings that travel with a session

Contract: the grammar a request resolves to is the one llama-server would sample with, and a chat
template rendered by `chat_prompt` (with a renderer of llama.cpp's Jinja dialect) gives llama.cpp's prompt
and generation prompt; `chat_params` gives llama.cpp's grammar, lazy flag, triggers, stops and thinking
tags where it computes them, and `parse_message` its message from a generated text; both say NotPorted
where they do not.
"""
