# The HTTP application: OpenAI's and Ollama's endpoints over `Generations` (FastAPI on uvicorn).
#
# Contract:
# - The app translates, it does not decide: a body is validated (bodies.py), its generation started
#   (generations.py), its events shaped into answers (answers.py); errors become HTTP answers in one
#   function (errors.py). Nothing here blocks the event loop.
# - A request's errors come before its first byte: a stream's response starts only once the constraintd
#   session is open (the `Started` event), so a bad grammar or schema is a 400, never a 200 stream
#   carrying an error. An error after that ends the stream with one error event.
# - A request the client abandons (a closed stream, a dropped connection while waiting, streamed or
#   not) cancels its generation, which ends at its next token (or before the next chunk of its prompt,
#   batched) and closes its constraintd session. Until a stream's response starts, the request's ASGI
#   channel is watched for the client's `http.disconnect`; a stream is then watched by its response.
#   Such a request is counted under status 499 (nginx's "client closed request"): its answer reaches
#   nobody, and it is neither the server's error nor the request's.
# - Each request has a deadline (`ServeState.timeout` seconds from its arrival), waiting in the queue
#   included.
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel

from sampler_worker.serve.answers import Answer, Usage, answer_for
from sampler_worker.serve.bodies import (
    ChatCompletionRequest,
    CompletionRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
    RequestError,
    job_from,
)
from sampler_worker.serve.errors import HttpError, http_error
from sampler_worker.serve.generations import Failed, Finished, Generations, Run, Started, Token
from sampler_worker.serve.metrics import CONTENT_TYPE, Metrics

__all__ = ["ServeState", "create_app"]


@dataclass(slots=True)
class ServeState:
    """What the app serves with.

    Attributes:
        generations: the model's contexts behind the queue.
        metrics: the counters `/metrics` shows.
        model_name: the model's name in `/v1/models` and in answers (any requested name is accepted).
        timeout: seconds a request may take, from its arrival to its last byte.
        honour_strict: OpenAI's `response_format.json_schema.strict: true` refuses (400) a schema the
            grammar cannot enforce in full, instead of generating under llama.cpp's grammar.
    """

    generations: Generations
    metrics: Metrics
    model_name: str
    timeout: float
    honour_strict: bool = False


# endpoint -> (path, request model)
ENDPOINTS: dict[str, tuple[str, type[BaseModel]]] = {
    "chat": ("/v1/chat/completions", ChatCompletionRequest),
    "completion": ("/v1/completions", CompletionRequest),
    "ollama_chat": ("/api/chat", OllamaChatRequest),
    "ollama_generate": ("/api/generate", OllamaGenerateRequest),
}


def _error_response(state: ServeState, endpoint: str, error: HttpError) -> JSONResponse:
    state.metrics.requests[endpoint, error.status] += 1
    body = error.ollama() if endpoint.startswith("ollama") else error.openai()
    return JSONResponse(body, status_code=error.status, headers=error.headers())


CLIENT_CLOSED_REQUEST = 499


def _gone(state: ServeState, endpoint: str) -> Response:
    # the client left before its answer: counted, and answered to nobody
    state.metrics.requests[endpoint, CLIENT_CLOSED_REQUEST] += 1
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def _client_left(watch: asyncio.Task[None]) -> bool:
    # the watch has ended on its own only when the client's `http.disconnect` came
    return watch.done() and not watch.cancelled() and watch.exception() is None


def _usage(run: Run) -> Usage:
    return Usage(run.tally.prompt_tokens, run.tally.tokens)


async def _stream(state: ServeState, endpoint: str, run: Run, answer: Answer) -> AsyncIterator[bytes]:
    try:
        for chunk in answer.opening():
            yield chunk
        async for event in run.events():
            if isinstance(event, Token):
                for chunk in answer.step(event.step.text, event.step.token):
                    yield chunk
            elif isinstance(event, Finished):
                for chunk in answer.closing(event.generation, _usage(run)):
                    yield chunk
            elif isinstance(event, Failed):
                error = http_error(event.error)
                body = error.ollama() if endpoint.startswith("ollama") else error.openai()
                for chunk in answer.failure(body):
                    yield chunk
    finally:
        # the client gone (this generator closed early) or the stream done: either way, stop the generation
        run.cancel()


async def _cancel_on_disconnect(request: Request, run: Run) -> None:
    # The body has been read: the next message of the request's channel is the client going away.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            run.cancel()
            return


async def _generate(state: ServeState, endpoint: str, request: Request) -> Response:
    arrived = time.monotonic()
    _, model = ENDPOINTS[endpoint]
    try:
        text = (await request.body()).decode("utf-8")
        body = model.model_validate_json(text)
        job = job_from(body, text, honour_strict=state.honour_strict)
        run = await state.generations.start(job, deadline=arrived + state.timeout)
    except Exception as exc:
        return _error_response(state, endpoint, http_error(exc))
    first: object = None
    streaming = False
    watch = asyncio.create_task(_cancel_on_disconnect(request, run))
    try:
        first = await run.next()
        if isinstance(first, Failed):
            if _client_left(watch):
                return _gone(state, endpoint)
            return _error_response(state, endpoint, http_error(first.error))
        assert isinstance(first, Started)
        streaming = bool(getattr(body, "stream", False))
        options = getattr(body, "stream_options", None)
        answer = answer_for(
            endpoint, state.model_name, json_answer=job.json_answer,
            return_tokens=bool(getattr(body, "return_tokens", False)),
            include_usage=bool(options is not None and options.include_usage), chat=first.chat, id=run.id,
        )
        if streaming:
            state.metrics.requests[endpoint, 200] += 1
            return StreamingResponse(_stream(state, endpoint, run, answer), media_type=answer.media_type)
        async for event in run.events():
            if isinstance(event, Finished):
                state.metrics.requests[endpoint, 200] += 1
                return JSONResponse(answer.whole(event.generation, _usage(run)))
            if isinstance(event, Failed):
                if _client_left(watch):
                    return _gone(state, endpoint)
                return _error_response(state, endpoint, http_error(event.error))
        raise AssertionError("a run ends with Finished or Failed")
    finally:
        watch.cancel()  # a stream's response listens to the channel from here
        # a streamed answer's generator owns the run from here; anything else (an error, a client gone
        # while waiting, a whole answer sent) ends it
        if not (isinstance(first, Started) and streaming):
            run.cancel()


def create_app(state: ServeState) -> FastAPI:
    """The FastAPI application serving `state`."""
    app = FastAPI(title="sampler-worker", docs_url=None, redoc_url=None, openapi_url=None)

    def route(endpoint: str) -> None:
        path, _ = ENDPOINTS[endpoint]

        async def handler(request: Request) -> Response:
            return await _generate(state, endpoint, request)

        handler.__name__ = endpoint
        app.add_api_route(path, handler, methods=["POST"], response_model=None)

    for endpoint in ENDPOINTS:
        route(endpoint)

    @app.post("/v1/chat/completions/control")
    async def control(request: Request) -> Response:
        # llama-server's control of a running chat completion: {"id": "chatcmpl-...", "action":
        # "reasoning_end"} ends its thinking block where its request set reasoning_control
        try:
            try:
                body = json.loads((await request.body()).decode("utf-8"))
            except json.JSONDecodeError as exc:
                raise RequestError(f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise RequestError("the body is not a JSON object")
            id, action = body.get("id"), body.get("action")
            answer = state.generations.control(id if isinstance(id, str) else "",
                                               action if isinstance(action, str) else "")
        except Exception as exc:
            return _error_response(state, "control", http_error(exc))
        state.metrics.requests["control", 200] += 1
        return JSONResponse(answer)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": state.model_name, "object": "model", "created": 0, "owned_by": "sampler-worker"}
        return {"object": "list", "data": [entry]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type=CONTENT_TYPE)

    return app
