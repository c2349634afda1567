# Request bodies of the HTTP server, OpenAI's and Ollama's, and what a generation needs of them.
#
# Contract:
# - A body is validated by pydantic from its own JSON text; fields the server does not use are kept
#   (`extra="allow"`), as llama-server ignores what it does not read. The text itself, untouched, is what
#   goes to constraintd as `openai_request` / `ollama_request`: the constraint fields (`response_format`,
#   `json_schema`, `grammar`, `format`) are resolved there by the engine's `resolve_request`, so the
#   grammar is llama-server's byte for byte. `read_request` runs here first only to refuse a malformed
#   constraint before any work and to know whether the answer is JSON (the content rule applies). An OpenAI
#   chat completion whose constraint is a JSON schema or JSON mode is llama-server's chat with a
#   `response_format`: its session is made from a chat request with that schema (`Job.chat_schema`), whose
#   grammar is the chat params' response format (the generation prompt, space, the value bare or in a
#   ```json fence), as llama-server's; a GBNF `grammar` keeps its own.
# - Sampling fields are read as llama-server reads them (`temperature`, `top_k`, `top_p`, `min_p`,
#   `typical_p`, `seed`, `repeat_penalty`, `repeat_last_n`, `presence_penalty`, `frequency_penalty`;
#   `max_completion_tokens`, else `max_tokens`, else `n_predict`); a field that is absent or null keeps
#   llama-server's default (`SamplerSettings()`). Ollama's `options` carry the same names
#   (`num_predict` for the token budget); its own defaults are not applied: llama-server's are.
# - A chat completion's `tools` (`tool_choice`: auto, required, none, or {"type": "function", "function":
#   {"name": ...}}; `parallel_tool_calls`) make a `ToolRequest`: the messages as llama.cpp's chat layer
#   reads them (an assistant's `tool_calls`, a tool's answer), the tools, the choice. The grammar is then the
#   chat template's (sampler_worker.prompt.tool_chat, made where the prompt is), so tools beside a
#   `response_format`, `json_schema` or `grammar` are refused (llama-server refuses a grammar with tools).
#   `tools` on `/v1/completions` and on the Ollama endpoints is ignored.
# - An OpenAI chat completion's reasoning budget (a thinking template's) is read as llama-server reads it:
#   `reasoning_budget_tokens`, else `thinking_budget_tokens` (-1 or absent: the server's
#   `--reasoning-budget`), and `reasoning_budget_message` (absent: the server's); with `reasoning_control`
#   the block may be ended while the answer runs (`POST /v1/chat/completions/control`).
# - Not read: `n` > 1, `logprobs`, `echo`, images; a request that asks for them is refused or the field
#   ignored as noted on each model.
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from constraintd.engine.chat.params.chat_params import TOOL_CHOICES
from constraintd.engine.chat.requests import read_request
from constraintd.engine.chat.templates.template_inputs import ChatMessage as TemplateMessage
from constraintd.engine.chat.templates.template_inputs import ChatTool, parse_messages, parse_tools
from sampler_worker.chain import SamplerSettings
from sampler_worker.prompt import Message, chat_response_schema

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "Job",
    "OllamaChatRequest",
    "OllamaGenerateRequest",
    "RequestError",
    "ToolRequest",
    "job_from",
]


class RequestError(ValueError):
    """A request the server refuses before any work (a field out of range, an unsupported option).

    Attributes:
        param: the request field at fault (a dotted path), or None.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class _TextPart(_Body):
    type: str = "text"
    text: str = ""


class ChatMessage(_Body):
    """One message; its content is text, or a list of parts of which only the text parts are read."""

    role: str
    content: str | list[_TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        if any(part.type != "text" for part in self.content):
            raise RequestError("only text content parts are supported", param="messages")
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    # llama-server's names; None keeps its default
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class _OpenAIBody(_Sampling):
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n_predict: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    # constraint fields: read by `read_request` from the body's text, declared so they show in the schema
    response_format: Any = None
    json_schema: Any = None
    grammar: Any = None
    # an extension (llama-server's `/completion` has it): answer with the generated token ids too
    return_tokens: bool = False


class ChatCompletionRequest(_OpenAIBody):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage]
    # read by `_tool_request` as llama.cpp's chat layer reads them
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # with tools on a thinking template (llama-server's names; -1: the server's budget)
    reasoning_budget_tokens: int | None = None
    thinking_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None
    reasoning_control: bool = False


class CompletionRequest(_OpenAIBody):
    """`POST /v1/completions` (a single prompt; `echo` and `suffix` are not supported)."""

    prompt: str | list[str]


class OllamaOptions(_Sampling):
    num_predict: int | None = None
    stop: str | list[str] | None = None


class _OllamaBody(_Body):
    model: str = ""
    stream: bool = True  # Ollama streams unless told not to
    format: Any = None
    options: OllamaOptions | None = None


class OllamaChatRequest(_OllamaBody):
    """Ollama's `POST /api/chat`."""

    messages: list[ChatMessage]


class OllamaGenerateRequest(_OllamaBody):
    """Ollama's `POST /api/generate` (the chat template applies unless `raw`)."""

    prompt: str = ""
    system: str | None = None
    raw: bool = False


Dialect = Literal["openai", "ollama"]


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A chat with tools, as llama-server reads its request.

    Attributes:
        messages: the messages as llama.cpp's chat layer holds them (tool calls and tool answers kept).
        tools: the function tools offered.
        tool_choice: auto, required, none, or a tool's name (that tool alone, required).
        parallel_tool_calls: whether several calls may be made.
    """

    messages: tuple[TemplateMessage, ...]
    tools: tuple[ChatTool, ...]
    tool_choice: str
    parallel_tool_calls: bool


@dataclass(frozen=True, slots=True)
class Job:
    """One generation to run, as the request asks for it.

    Attributes:
        chat: the messages to render with the chat template, or None for a raw prompt.
        prompt: the raw prompt (when `chat` is None).
        settings: the sampler's settings.
        max_tokens: the most tokens to generate; None: until the context is full.
        stop: strings that end the generation.
        constraint: keyword arguments of `Client.session`, or None for free text.
        json_answer: whether the constraint asks for JSON (the content rule then shapes chat content).
        tools: a chat with tools (its grammar is the chat template's), or None.
        chat_schema: an OpenAI chat's response schema, whose grammar is the chat params' response format
            (`sampler_worker.prompt.chat_response_schema`), or None.
        reasoning_budget: an OpenAI chat's thinking block budget in tokens; -1: the server's; None: not an
            OpenAI chat completion (no budget: llama-server's API is OpenAI's).
        reasoning_budget_message: written before a forced end tag; None: the server's.
        reasoning_control: the thinking block may be ended while the answer runs.
    """

    chat: tuple[Message, ...] | None
    prompt: str
    settings: SamplerSettings
    max_tokens: int | None
    stop: tuple[str, ...]
    constraint: dict[str, Any] | None
    json_answer: bool
    tools: ToolRequest | None = None
    chat_schema: str | None = None
    reasoning_budget: int | None = None
    reasoning_budget_message: str | None = None
    reasoning_control: bool = False


_SETTING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "penalty_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def _settings(sampling: _Sampling | None) -> SamplerSettings:
    settings = SamplerSettings()
    if sampling is None:
        return settings
    given = {
        name: getattr(sampling, field_name)
        for field_name, name in _SETTING_FIELDS.items()
        if getattr(sampling, field_name) is not None
    }
    settings = replace(settings, **given)
    try:
        settings.check()
    except ValueError as exc:
        raise RequestError(str(exc)) from exc
    return settings


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _budget(*values: int | None) -> int | None:
    # the first value given; a negative one (llama-server's -1) means no limit but the context
    for value in values:
        if value is not None:
            return None if value < 0 else value
    return None


def _constraint(text: str, dialect: Dialect, honour_strict: bool) -> tuple[dict[str, Any] | None, bool]:
    # SchemaError (with the field's pointer) goes up as it is.
    # A body that asks for free text has no schema or grammar text (`resolve_request` reads it so too).
    from sampler_worker.cli import answers_json

    requested = read_request(text)
    if requested.text is None:
        return None, False
    constraint: dict[str, Any] = {f"{dialect}_request": text}
    if honour_strict and requested.asks_strict:
        constraint["strict"] = True  # structured outputs' promise: a schema the grammar cannot hold is a 400
    return constraint, answers_json(constraint)


def _messages(messages: list[ChatMessage]) -> tuple[Message, ...]:
    if not messages:
        raise RequestError("messages must not be empty", param="messages")
    return tuple(Message(m.role, m.text()) for m in messages)


def _tool_choice(choice: Any, tools: list[ChatTool]) -> str:
    # OpenAI's forms: a word, or {"type": "function", "function": {"name": ...}} (that tool alone)
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise RequestError(f"Invalid tool_choice: {json.dumps(choice)}", param="tool_choice")
    if name not in {tool.name for tool in tools}:
        raise RequestError(f"tool_choice names {name!r}, which is none of the tools", param="tool_choice")
    return name


def _tool_request(body: ChatCompletionRequest, text: str) -> ToolRequest | None:
    # ChatRequestError (llama.cpp's words for messages or tools it refuses) goes up as it is: a 400
    tools = parse_tools(body.tools)
    if not tools:
        return None
    if read_request(text).text is not None:
        raise RequestError("tools with a response_format, json_schema or grammar are not supported: the "
                           "grammar of a chat with tools is the chat template's", param="tools")
    return ToolRequest(
        messages=tuple(parse_messages(json.loads(text).get("messages"))), tools=tuple(tools),
        tool_choice=_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=bool(body.parallel_tool_calls))


def _reasoning(job: Job, body: ChatCompletionRequest) -> Job:
    budget = next((given for given in (body.reasoning_budget_tokens, body.thinking_budget_tokens)
                   if given is not None), -1)
    if budget < -1:
        raise RequestError(f"reasoning_budget_tokens must be -1 or more, not {budget}",
                           param="reasoning_budget_tokens")
    return replace(job, reasoning_budget=budget, reasoning_budget_message=body.reasoning_budget_message,
                   reasoning_control=body.reasoning_control)


def _job(
    text: str, dialect: Dialect, chat: tuple[Message, ...] | None, prompt: str, sampling: _Sampling | None,
    budget: int | None, stop: str | list[str] | None, honour_strict: bool,
) -> Job:
    constraint, json_answer = _constraint(text, dialect, honour_strict)
    return Job(chat=chat, prompt=prompt, settings=_settings(sampling), max_tokens=budget, stop=_stop(stop),
               constraint=constraint, json_answer=json_answer)


def job_from(body: BaseModel, text: str, *, honour_strict: bool = False) -> Job:
    """The generation a validated request body asks for.

    Args:
        body: one of the request models, validated from `text`.
        text: the body's JSON text, as received.
        honour_strict: a `response_format.json_schema.strict: true` refuses a schema the grammar cannot
            enforce in full (constraintd's strict), instead of generating under llama.cpp's grammar.

    Raises:
        RequestError: an unsupported option, or sampling settings out of range.
        SchemaError: a malformed or conflicting constraint field (the pointer names it).
    """
    if isinstance(body, _OpenAIBody):
        if body.n != 1:
            raise RequestError("only n = 1 is supported", param="n")
        budget = _budget(body.max_completion_tokens, body.max_tokens, body.n_predict)
        if isinstance(body, ChatCompletionRequest):
            tools = _tool_request(body, text)
            job = _job(text, "openai", _messages(body.messages), "", body, budget, body.stop, honour_strict)
            job = _reasoning(job, body)
            if tools is not None:
                return replace(job, tools=tools)
            # llama-server's chat completion with a response_format: the chat params' grammar (strict refuses
            # here, before any work)
            return replace(job, chat_schema=chat_response_schema(job.constraint))
        if isinstance(body, CompletionRequest):
            prompt = body.prompt
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise RequestError("only a single prompt is supported", param="prompt")
                prompt = prompt[0]
            return _job(text, "openai", None, prompt, body, budget, body.stop, honour_strict)
    if isinstance(body, _OllamaBody):
        options = body.options
        budget = _budget(options.num_predict if options else None)
        stop = options.stop if options else None
        if isinstance(body, OllamaChatRequest):
            return _job(text, "ollama", _messages(body.messages), "", options, budget, stop, honour_strict)
        if isinstance(body, OllamaGenerateRequest):
            if body.raw:
                return _job(text, "ollama", None, body.prompt, options, budget, stop, honour_strict)
            system = (Message("system", body.system),) if body.system else ()
            chat = (*system, Message("user", body.prompt))
            return _job(text, "ollama", chat, "", options, budget, stop, honour_strict)
    raise TypeError(f"not a request model: {type(body).__name__}")
