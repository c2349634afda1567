# What llama.cpp's chat layer hands a chat template: the messages and tools as it rewrites them, and the
# other variables it sets (common/chat.cpp's common_chat_templates_apply_jinja and
# common_chat_template_direct_apply_impl, and the per-format message adjustments of common/chat parsers).
#
# Contract:
# - `parse_messages` reads OpenAI chat messages as common_chat_msgs_parse_oaicompat does, refusing what it
#   refuses with its words; `parse_tools` reads OpenAI tools as common_chat_tools_parse_oaicompat does.
# - `template_context` is the whole set of variables the template renders with, in llama.cpp's order of
#   rewrites, for a template whose capabilities (`TemplateCaps`, llama.cpp's jinja::caps) are given:
#     1. every message as common_chat_msg::to_json_oaicompat writes it: content "" where there is none,
#        `reasoning_content`, `name`, `tool_call_id` only when not empty, tool calls as
#        {"type", "function": {"name", "arguments"}, "id"} with the arguments as the request's text;
#     2. content parts joined by newlines for a template that reads content only as a string, a string
#        made one text part for a template that reads it only as parts;
#     3. `developer` read as `system` (not for gpt-oss's channel templates); a first system message folded
#        into the next one (or dropped) for a template without a system role; tool-call arguments parsed
#        into objects for a template that reads them as objects;
#     4. the variables: messages, bos_token, eos_token, enable_thinking, tools (only when there are tools),
#        datetime and date_string (llama.cpp's today, from `now`), the caller's chat_template_kwargs, and
#        add_generation_prompt (only when true: otherwise the template sees it undefined, as in llama.cpp);
#        a boolean `preserve_reasoning` also set as preserve_thinking and the negated clear_thinking,
#        truncate_history_thinking and drop_thinking, a `reasoning_effort` also as reasoning_strength;
#     5. the message rewrites of the specialised formats whose prompt llama.cpp renders from adjusted
#        messages (Ministral 3's content blocks, LFM2's and gpt-oss's `thinking`, the older Gemma 4
#        templates' `tool_responses`, StepFun's trimmed contents).
# Nothing here renders a template: the renderer is the caller's (sampler_worker.prompt);
# chat/templates/prompt.py renders through it, and chat/templates/jinja_values.py writes values as
# llama.cpp's Jinja does.
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from constraintd.errors import InputError

__all__ = [
    "ChatMessage",
    "ChatRequestError",
    "ChatTool",
    "ContentPart",
    "TemplateCaps",
    "ToolCall",
    "format_time",
    "parse_messages",
    "parse_tools",
    "template_context",
]


class ChatRequestError(InputError):
    """Messages or tools llama.cpp's chat layer refuses, with its reason."""


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    """What a template does with its input, as llama.cpp's jinja::caps detects it (its defaults here)."""

    supports_tools: bool = True
    supports_tool_calls: bool = True
    supports_system_role: bool = True
    supports_parallel_tool_calls: bool = True
    supports_preserve_reasoning: bool = False
    supports_reasoning_effort: bool = False
    supports_string_content: bool = True
    supports_typed_content: bool = False
    supports_object_arguments: bool = False

    @classmethod
    def from_map(cls, caps: Mapping[str, bool]) -> TemplateCaps:
        """From llama.cpp's `caps.to_map()` names; a missing name keeps its default."""
        names = {f.name for f in fields(cls)}
        return cls(**{name: bool(value) for name, value in caps.items() if name in names})


@dataclass(frozen=True, slots=True)
class ContentPart:
    """A typed content part: `text` or `media_marker`."""

    type: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call of an assistant message; arguments as JSON text."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message as llama.cpp's chat layer holds it (common_chat_msg)."""

    role: str
    content: str = ""
    content_parts: tuple[ContentPart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_content: str = ""
    tool_name: str = ""
    tool_call_id: str = ""

    def _parts(self) -> list[dict[str, str]]:
        return [{"type": part.type, "text": part.text} for part in self.content_parts]

    def to_json(self) -> dict[str, Any]:
        """The message as llama.cpp gives it to a template (to_json_oaicompat, typed parts kept)."""
        if self.content and self.content_parts:
            raise ChatRequestError("Cannot specify both content and content_parts")
        message: dict[str, Any] = {"role": self.role}
        if self.content:
            message["content"] = self.content
        elif self.content_parts:
            if any(part.type == "media_marker" for part in self.content_parts):
                message["content"] = _join_parts(self._parts())
            else:
                message["content"] = self._parts()
        else:
            message["content"] = ""
        if self.reasoning_content:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_name:
            message["name"] = self.tool_name
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            calls = []
            for call in self.tool_calls:
                item: dict[str, Any] = {
                    "type": "function", "function": {"name": call.name, "arguments": call.arguments},
                }
                if call.id:
                    item["id"] = call.id
                calls.append(item)
            message["tool_calls"] = calls
        return message


@dataclass(frozen=True, slots=True)
class ChatTool:
    """A function tool; `parameters` as the request's JSON value."""

    name: str
    description: str = ""
    parameters: Any = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


def _dump(value: Any) -> str:
    # nlohmann's dump() of a request value: compact, non-ASCII kept
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _message(raw: Any) -> ChatMessage:
    if not isinstance(raw, dict):
        raise ChatRequestError(f"Expected 'message' to be an object, got {_dump(raw)}")
    if "role" not in raw:
        raise ChatRequestError(f"Missing 'role' in message: {_dump(raw)}")
    content, parts, calls = "", [], []
    if "content" in raw:
        value = raw["content"]
        if isinstance(value, str):
            content = value
        elif isinstance(value, list):
            for part in value:
                if not isinstance(part, dict) or "type" not in part:
                    raise ChatRequestError(f"Missing content part type: {_dump(part)}")
                if part["type"] not in ("text", "media_marker"):
                    raise ChatRequestError(f"Unsupported content part type: {_dump(part['type'])}")
                parts.append(ContentPart(part["type"], str(part.get("text", ""))))
        elif value is not None:
            raise ChatRequestError(
                f"Invalid 'content' type: expected string or array, got {_dump(value)} "
                "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)")
    for call in raw.get("tool_calls") or ():
        if not isinstance(call, dict) or "type" not in call:
            raise ChatRequestError(f"Missing tool call type: {_dump(call)}")
        if call["type"] != "function":
            raise ChatRequestError(f"Unsupported tool call type: {_dump(call)}")
        function = call.get("function")
        if not isinstance(function, dict):
            raise ChatRequestError(f"Missing tool call function: {_dump(call)}")
        if "name" not in function:
            raise ChatRequestError(f"Missing tool call name: {_dump(call)}")
        arguments = function.get("arguments")
        calls.append(ToolCall(
            function["name"], arguments if isinstance(arguments, str) else _dump(arguments),
            call.get("id", "")))
    if "content" not in raw and "tool_calls" not in raw:
        raise ChatRequestError(
            "Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/llama.cpp/issues/8367 & "
            "https://github.com/ggml-org/llama.cpp/issues/12279)")
    return ChatMessage(
        raw["role"], content, tuple(parts), tuple(calls), raw.get("reasoning_content") or "",
        raw.get("name") or "", raw.get("tool_call_id") or "")


def parse_messages(messages: Any) -> list[ChatMessage]:
    """OpenAI chat messages as llama.cpp's chat layer reads them.

    Raises:
        ChatRequestError: what llama.cpp refuses, in its words ("Failed to parse messages: ...").
    """
    try:
        if not isinstance(messages, list):
            raise ChatRequestError(f"Expected 'messages' to be an array, got {_dump(messages)}")
        return [_message(message) for message in messages]
    except ChatRequestError as exc:
        raise ChatRequestError(f"Failed to parse messages: {exc}") from None


def parse_tools(tools: Any) -> list[ChatTool]:
    """OpenAI function tools as llama.cpp's chat layer reads them (none for null).

    Raises:
        ChatRequestError: a tool that is not a function tool, or not an array.
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ChatRequestError(f"Failed to parse tools: Expected 'tools' to be an array, got {_dump(tools)}")
    parsed = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise ChatRequestError(f"Failed to parse tools: Unsupported tool type: {_dump(tool)}")
        if "name" not in function:
            raise ChatRequestError(f"Failed to parse tools: missing function name: {_dump(tool)}")
        parsed.append(ChatTool(
            function["name"], function.get("description", ""), function.get("parameters", {})))
    return parsed


def _join_parts(parts: Sequence[Mapping[str, Any]]) -> str:
    # text parts joined by newlines, none around a media marker (llama.cpp's concat_content_parts)
    text, after_marker = "", False
    for part in parts:
        kind = part.get("type", "")
        if kind == "text":
            newline = not after_marker and bool(text)
            after_marker = False
        elif kind == "media_marker":
            newline, after_marker = False, True
        else:
            continue
        text += ("\n" if newline else "") + str(part.get("text", ""))
    return text


def _normalize_content(messages: list[dict[str, Any]], caps: TemplateCaps) -> list[dict[str, Any]]:
    only_string = caps.supports_string_content and not caps.supports_typed_content
    only_typed = caps.supports_typed_content and not caps.supports_string_content
    if not (only_string or only_typed):
        return messages
    for message in messages:
        content = message.get("content")
        if only_typed and isinstance(content, str):
            message["content"] = [{"type": "text", "text": content}]
        elif only_string and isinstance(content, list):
            message["content"] = _join_parts(content)
    return messages


def _fold_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # a template without a system role: the first system message goes before the next message's content
    if not messages or messages[0].get("role") != "system":
        return messages
    if len(messages) > 1:
        first, second = messages[0], messages[1]
        if not isinstance(first.get("content"), str) or not isinstance(second.get("content"), str):
            raise ChatRequestError("a system message folded into the next one must have text content")
        second["content"] = first["content"] + "\n" + second["content"]
    return messages[1:]


def _arguments_as_objects(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        for call in message.get("tool_calls", ()):
            function = call.get("function", {})
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except ValueError as exc:
                    raise ChatRequestError(f"Failed to parse tool call arguments as JSON: {exc}") from None


def format_time(now: float, pattern: str) -> str:
    """`now` (Unix seconds) in local time, as C's strftime writes it (llama.cpp's dates, strftime_now)."""
    return time.strftime(pattern, time.localtime(now))


# The specialised formats whose prompt llama.cpp renders from messages adjusted for the template
# (common/chat parsers): recognised by the same marks in the template's source.
def _is_ministral_3(source: str) -> bool:
    return all(mark in source for mark in ("[SYSTEM_PROMPT]", "[TOOL_CALLS]", "[ARGS]")) \
        and "[CALL_ID]" not in source


def _specialised(source: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if _is_ministral_3(source):
        adjusted = []
        for message in messages:
            if message.get("role") not in ("system", "assistant"):
                adjusted.append(message)
                continue
            blocks: list[Any] = []
            if isinstance(message.get("reasoning_content"), str):
                blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
            content = message.get("content")
            if isinstance(content, str):
                blocks.append({"type": "text", "text": content})
            elif isinstance(content, list):
                blocks.extend(content)
            message = {key: value for key, value in message.items() if key != "reasoning_content"}
            message["content"] = blocks
            adjusted.append(message)
        return adjusted
    if "'<|tool_call>call:'" in source and "{#- OpenAI Chat Completions:" not in source:
        return _gemma4_turns(messages)
    if "<|channel|>" in source or _is_lfm2(source):
        gpt_oss = "<|channel|>" in source
        for message in messages:
            if isinstance(message.get("reasoning_content"), str):
                message["thinking"] = message["reasoning_content"]
                if gpt_oss and message.get("tool_calls"):
                    del message["content"]
    return messages


def _gemma4_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Gemma 4's older templates read tool results from the assistant turn that called the tools: an
    # assistant turn with calls, the tool messages after it and a final assistant answer become one turn
    # with `tool_responses` (each result parsed as JSON where it is JSON, named by its call)
    turns: list[dict[str, Any]] = []
    at = 0
    while at < len(messages):
        message = messages[at]
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            turns.append(message)
            at += 1
            continue
        calls = list(message["tool_calls"])
        reasoning = message.get("reasoning_content")
        responses: list[dict[str, Any]] = []
        at += 1
        while at < len(messages) and messages[at].get("role") == "tool":
            result = messages[at]
            response = result.get("content")
            if isinstance(response, str):
                with contextlib.suppress(ValueError):
                    response = json.loads(response)
            name = ""
            if len(responses) < len(calls):
                name = calls[len(responses)].get("function", {}).get("name", "")
            responses.append({"name": name or result.get("tool_call_id", ""), "response": response})
            at += 1
        content = None
        final = messages[at] if at < len(messages) else {}
        if final.get("role") == "assistant" and not final.get("tool_calls"):
            text = final.get("content")
            if text:
                content = text
                at += 1
        turn: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        if content is not None:
            turn["content"] = content
        if isinstance(reasoning, str):
            turn["reasoning_content"] = reasoning
        turns.append(turn)
    return turns


def _is_lfm2(source: str) -> bool:
    if "<|channel|>" in source or _is_ministral_3(source):
        return False
    return ("<|tool_list_start|>" in source and "<|tool_list_end|>" in source) or \
        ("List of tools: [" in source and "<|tool_list_start|>" not in source)


C_SPACE = " \t\n\v\f\r"  # isspace() in the C locale, as llama.cpp's trim_whitespace reads it


def _trimmed(message: ChatMessage) -> ChatMessage:
    parts = tuple(ContentPart(p.type, p.text.strip(C_SPACE) if p.type == "text" else p.text)
                  for p in message.content_parts)
    return ChatMessage(message.role, message.content.strip(C_SPACE), parts, message.tool_calls,
                       message.reasoning_content.strip(C_SPACE), message.tool_name, message.tool_call_id)


def template_context(
    source: str,
    messages: Sequence[ChatMessage],
    *,
    caps: TemplateCaps,
    tools: Sequence[ChatTool] = (),
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    enable_thinking: bool = True,
    now: float,
    template_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The variables llama.cpp renders the template `source` with (see the module's contract).

    Does not render: hand the result to a renderer of llama.cpp's Jinja dialect.

    Raises:
        ChatRequestError: tool-call arguments that are not JSON, for a template that reads them as objects.
    """
    if "You have access to the following functions in JSONSchema format" in source:
        messages = [_trimmed(message) for message in messages]  # StepFun (llama.cpp issue 24181)
    rendered = _normalize_content([message.to_json() for message in messages], caps)
    if "<|channel|>" not in source:
        for message in rendered:
            if message.get("role") == "developer":
                message["role"] = "system"
    if not caps.supports_system_role:
        rendered = _fold_system(rendered)
    if caps.supports_tool_calls:
        for message in rendered:
            if "tool_calls" in message and "content" not in message:
                message["content"] = ""
    if caps.supports_object_arguments:
        _arguments_as_objects(rendered)
    context: dict[str, Any] = {
        "messages": _specialised(source, rendered), "bos_token": bos_token, "eos_token": eos_token,
        "enable_thinking": enable_thinking,
    }
    if tools:
        context["tools"] = [tool.to_json() for tool in tools]
    context["datetime"] = format_time(now, "%b %d %Y")
    context["date_string"] = format_time(now, "%d %b %Y")
    context.update(template_kwargs or {})
    if add_generation_prompt:
        context["add_generation_prompt"] = True
    # the reasoning settings a caller gives as template arguments, under every name templates read them by
    # (set before the variables in llama.cpp, so a variable of the same name the caller gives wins)
    given = template_kwargs or {}
    preserve = context.get("preserve_reasoning")
    if isinstance(preserve, bool):
        flags = {"preserve_thinking": preserve, "clear_thinking": not preserve,
                 "truncate_history_thinking": not preserve, "drop_thinking": not preserve}
        context.update({name: value for name, value in flags.items() if name not in given})
    effort = context.get("reasoning_effort")
    if isinstance(effort, str) and effort and "reasoning_strength" not in given:
        context["reasoning_strength"] = effort
    return context
