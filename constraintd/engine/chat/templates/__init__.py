"""A chat template rendered as llama.cpp's chat layer renders it: what the template is given, what it can
take, and the prompt it makes.

    template_inputs  what llama.cpp's chat layer gives a chat template: OpenAI messages and tools read and
              rewritten for the template's capabilities, and the other variables it sets
    caps      a template's capabilities, found as llama.cpp finds them (probe conversations over tracked
              values; the renderer reports what the template reads)
    prompt    the prompt and generation prompt of llama.cpp's chat params, through the caller's renderer
    continuation  continuing the final message (continue_final_message): the chat split before rendering,
              the generation prompt continued after, as the request's format does
    jinja_values  values as llama.cpp's Jinja writes them (tojson, the string filter, printing)

Contract: with a renderer of llama.cpp's Jinja dialect (the caller's: no I/O here), the prompt and
generation prompt are llama.cpp's.
"""
