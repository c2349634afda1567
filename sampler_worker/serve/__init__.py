"""`sampler-worker serve`: an OpenAI- and Ollama-compatible HTTP server over the sampler worker.

    bodies       request bodies (pydantic) and the generation each asks for; constraints go to constraintd
                 whole, resolved there by the engine's request resolution (llama-server's grammar)
    generations  a bounded queue in front of the model's contexts; each generation on a worker thread,
                 cancelled at its next token when its client goes, with a deadline
    contexts     one loaded model; n > 1 slots are sequences of one llama.cpp context per model thread
    lockstep     the generations of one such context, stepped together by one thread: one decode and one
                 constraintd Step message per step for all of them
    answers      OpenAI's and Ollama's answer objects, whole and streamed, with the content rule
    tool_messages  a chat with tools' message as llama-server answers it: tool calls whole, or the deltas
                 of the text's successive readings, streamed
    errors       exceptions as HTTP answers (OpenAI's error object, Ollama's)
    metrics      the counters of /metrics, in Prometheus's text format
    app          the FastAPI application
    command      the command line, and the process's startup, serve and shutdown steps

Contract: with one slot, a seeded request generates exactly the tokens of `sampler-worker generate` with
the same prompt, settings and constraint (both run `sampler_worker.generate.generate`); a chat with tools
is prepared as `sampler-worker generate --tools` prepares it (`sampler_worker.prompt.tool_chat`).
"""

from sampler_worker.serve.app import ServeState, create_app
from sampler_worker.serve.command import add_parser, run_serve, serving

__all__ = ["ServeState", "add_parser", "create_app", "run_serve", "serving"]
