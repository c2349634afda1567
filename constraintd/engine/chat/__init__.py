"""llama-server's request layer: which constraint a request asks for, and what its answer's content is.

    requests  OpenAI and Ollama request bodies resolved to one constraint and its GBNF grammar, as
              llama-server and Ollama resolve them (`response_format`, `json_schema`, `grammar`, `format`)
    content   the content rule: the message content llama-server returns for a JSON-shaped answer,
              whole or streamed
    template_inputs  what llama.cpp's chat layer gives a chat template: OpenAI messages and tools read and
              rewritten for the template's capabilities, and the other variables it sets; llama.cpp's
              tojson and printing of values (the rendering itself is the caller's)

Contract: the grammar a request resolves to is the one llama-server would sample with, and a chat
template rendered with `template_context`'s variables gives llama.cpp's prompt.
"""
