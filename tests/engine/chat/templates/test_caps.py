"""constraintd.engine.chat.templates.caps: a template's capabilities from what it does with probe
conversations.

Here the template is a Python function reading the tracked context as a template would (the renderer's
part, touch, done by hand); sampler_worker's test_prompt.py runs real templates, and test_chat_oracle.py
compares with llama.cpp's own detection on every template of the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from constraintd.engine.chat.templates.caps import (
    TrackedDict,
    TrackedStr,
    detect_caps,
    quietly,
    touch,
    tracked,
)
from constraintd.engine.chat.templates.template_inputs import TemplateCaps


def _read(container: Any, key: Any) -> Any:
    value = container[key]
    touch(value)
    touch(container, "array_access" if isinstance(key, int) else "object_access")
    return value


def _template(body: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], tuple[bool, str]]:
    def render(context: dict[str, Any]) -> tuple[bool, str]:
        try:
            return True, body(context)
        except (KeyError, IndexError, TypeError, ValueError):
            return False, ""

    return render


def test_a_template_that_prints_contents_has_the_defaults() -> None:
    def body(context: dict[str, Any]) -> str:
        return "".join(str(_read(m, "content")) for m in context["messages"])

    assert detect_caps(_template(body)) == TemplateCaps(
        supports_tools=False, supports_tool_calls=False, supports_parallel_tool_calls=False)


def test_no_system_role_where_a_system_message_is_never_read() -> None:
    def body(context: dict[str, Any]) -> str:
        messages = context["messages"]
        if _read(_read(messages, 0), "role") == "system":
            raise ValueError("no system role")
        return "".join(str(_read(m, "content")) for m in messages)

    assert not detect_caps(_template(body)).supports_system_role


def test_object_arguments_and_tools() -> None:
    def body(context: dict[str, Any]) -> str:
        out = [str(_read(_read(tool, "function"), "name")) for tool in context["tools"]]
        for message in context["messages"]:
            out.append(str(_read(message, "content")))
            for call in message.get("tool_calls", []):
                arguments = _read(_read(call, "function"), "arguments")
                out.extend(str(_read(arguments, key)) for key in arguments)
        return "".join(out)

    caps = detect_caps(_template(body))
    assert caps.supports_object_arguments and caps.supports_tools and caps.supports_tool_calls
    assert caps.supports_parallel_tool_calls


def test_typed_content_where_content_is_read_as_parts() -> None:
    def body(context: dict[str, Any]) -> str:
        content = _read(_read(context["messages"], 0), "content")
        if isinstance(content, str):
            touch(content, "test_is_string")
            return str(content)
        return "".join(str(_read(part, "text")) for part in content)

    caps = detect_caps(_template(body))
    assert caps.supports_typed_content and caps.supports_string_content


def test_tracking() -> None:
    value = tracked({"a": ["x", {"b": "y"}]})
    assert isinstance(value, TrackedDict) and value == {"a": ["x", {"b": "y"}]}
    touch(value, "tojson", deep=True)
    assert value["a"][1]["b"].stats.used and "tojson" in value.stats.ops
    text = TrackedStr("abc")
    with quietly(text):
        list(text)
    assert text.stats.ops == set()
    list(text)
    assert text.stats.ops == {"array_access"} and text.stats.used
