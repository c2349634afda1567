# A chat template's capabilities, found as llama.cpp's chat layer finds them (common/jinja/caps.cpp): the
# template is run on a few probe conversations, and what it did with each input value says what it can
# take (a system message whose content it never read: no system role; tool-call arguments it read as an
# object's member: object arguments; ...).
#
# Contract:
# - `detect_caps(render)` runs the probes of caps.cpp in its order, each through `render(context)`, which
#   renders the template with that context and answers (ok, output); a probe that fails is read as
#   llama.cpp reads it (the check it belongs to decides what failing means).
# - The probes' values are tracked: every string, list and mapping of the context is a `TrackedStr`,
#   `TrackedList` or `TrackedDict` carrying its `UseStats` (used, and the operations applied to it, named
#   as llama.cpp names them: "array_access", "object_access", a filter's or test's name as
#   "selectattr" / "test_is_string"). The renderer reports what the template does by calling `touch`:
#   a value read as a member or item (with the container's access kind), a value printed, tested or
#   filtered (a filter's own iteration over its input is not an access), and `tojson` / `string` touch
#   the whole value. A tracked value also touches itself when it is compared, joined, tested for truth or
#   iterated, which is how a loop variable or a plain name is seen used (llama.cpp marks a value used when
#   a name that holds it is evaluated).
# - Where this differs from llama.cpp: a name evaluated and never operated on is not seen (a `{% set %}`
#   of a value that is never read again); llama.cpp's marks on the key of an access are not kept (no check
#   reads them).
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from constraintd.engine.chat.templates.template_inputs import TemplateCaps

__all__ = [
    "TrackedDict",
    "TrackedList",
    "TrackedStr",
    "UseStats",
    "detect_caps",
    "quietly",
    "touch",
    "tracked",
]


@dataclass(slots=True)
class UseStats:
    """What a template did with one input value."""

    used: bool = False
    ops: set[str] = field(default_factory=set)


class TrackedStr(str):
    """A string of a probe: an ordinary string that records its use."""

    stats: UseStats

    def __new__(cls, text: str) -> TrackedStr:
        self = super().__new__(cls, text)
        self.stats = UseStats()
        return self

    def __str__(self) -> str:
        self.stats.used = True
        return str.__str__(self)

    def __eq__(self, other: object) -> bool:
        self.stats.used = True
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        self.stats.used = True
        return str.__ne__(self, other)

    __hash__ = str.__hash__

    def __bool__(self) -> bool:
        self.stats.used = True
        return len(self) > 0

    def __add__(self, other: str) -> str:
        self.stats.used = True
        return str.__add__(self, other)

    def __radd__(self, other: str) -> str:
        self.stats.used = True
        return other + str.__str__(self)

    def __iter__(self) -> Iterator[str]:
        touch(self, "array_access")
        return str.__iter__(self)


class TrackedList(list[Any]):
    """A list of a probe that records its use."""

    stats: UseStats

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.stats = UseStats()

    def __iter__(self) -> Iterator[Any]:
        touch(self, "array_access")
        return super().__iter__()

    def __bool__(self) -> bool:
        self.stats.used = True
        return len(self) > 0


class TrackedDict(dict[str, Any]):
    """A mapping of a probe that records its use."""

    stats: UseStats

    def __init__(self, items: Mapping[str, Any]) -> None:
        super().__init__(items)
        self.stats = UseStats()

    def __iter__(self) -> Iterator[str]:
        touch(self, "object_access")
        return super().__iter__()

    def __bool__(self) -> bool:
        self.stats.used = True
        return len(self) > 0


Tracked = TrackedStr | TrackedList | TrackedDict


def tracked(value: Any) -> Any:
    """`value` (JSON data) with every string, list and mapping in it tracked."""
    if isinstance(value, str):
        return TrackedStr(value)
    if isinstance(value, list):
        return TrackedList([tracked(item) for item in value])
    if isinstance(value, dict):
        return TrackedDict({key: tracked(item) for key, item in value.items()})
    return value


def touch(value: Any, op: str | None = None, *, deep: bool = False) -> None:
    """Record that the template used `value` (and applied `op` to it); nothing for an untracked value.
    `deep`: every value inside it too (what `tojson` and `string` read), through untracked lists too."""
    if isinstance(value, (TrackedStr, TrackedList, TrackedDict)):
        value.stats.used = True
        if op is not None:
            value.stats.ops.add(op)
    if deep and isinstance(value, list):
        for item in list.__iter__(value):
            touch(item, deep=True)
    elif deep and isinstance(value, dict):
        for item in dict.values(value):
            touch(item, deep=True)


@contextlib.contextmanager
def quietly(value: Any) -> Iterator[None]:
    """Within: the operations applied to `value` are not recorded (a filter iterating its own input)."""
    stats = value.stats if isinstance(value, (TrackedStr, TrackedList, TrackedDict)) else None
    before = set(stats.ops) if stats is not None else set()
    try:
        yield
    finally:
        if stats is not None:
            stats.ops.intersection_update(before)


def _at(context: Mapping[str, Any], *path: str | int) -> UseStats:
    value: Any = context
    for step in path:
        value = dict.__getitem__(value, step) if isinstance(step, str) else list.__getitem__(value, step)
    stats: UseStats = value.stats
    return stats


Render = Callable[[dict[str, Any]], tuple[bool, str]]

STRING_MARKER = "STRING_MARKER"
REASONING_PLACEHOLDER = "<REASONING_CONTENT_PLACEHOLDER>"
USER = {"role": "user", "content": "User message"}
TOOL = {
    "name": "tool", "type": "function",
    "function": {
        "name": "tool1", "description": "Tool description",
        "parameters": {
            "type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
            "required": ["arg"],
        },
    },
}


def _tool_conversation(arguments: Any, calls: int) -> list[dict[str, Any]]:
    return [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call0000{n + 1}", "type": "function",
             "function": {"name": "tool1", "arguments": arguments}}
            for n in range(calls)
        ]},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        USER,
    ]


def _run(render: Render, messages: list[dict[str, Any]], *, tools: list[Any] | None = None,
         extra: Mapping[str, Any] | None = None) -> tuple[bool, str, dict[str, Any]]:
    context: dict[str, Any] = {
        "messages": tracked(messages), "tools": tracked(tools or []), "bos_token": "", "eos_token": "",
        "add_generation_prompt": True,
    }
    context.update(extra or {})
    ok, output = render(context)
    return ok, output, context


def _content(render: Render, caps: dict[str, bool]) -> None:
    ok, output, context = _run(render, [{"role": "user", "content": STRING_MARKER}])
    content = _at(context, "messages", 0, "content")
    as_array = bool(content.ops & {"selectattr", "array_access"})
    if as_array:
        caps["supports_typed_content"] = True
    if not ok or (as_array and STRING_MARKER not in output):
        caps["supports_string_content"] = False
    if "test_is_string" in content.ops:
        ok, _, context = _run(render, [{"role": "user", "content": []}])
        if ok and _at(context, "messages", 0, "content").ops & {"selectattr", "array_access"}:
            caps["supports_typed_content"] = True


def _tools(render: Render, caps: dict[str, bool]) -> None:
    ok, _, context = _run(render, _tool_conversation({"arg": "value"}, 1), tools=[TOOL])
    if ok:
        if not _at(context, "tools", 0, "function", "name").used:
            caps["supports_tools"] = False
        if not _at(context, "messages", 1, "tool_calls").used:
            caps["supports_tool_calls"] = False
        elif _at(context, "messages", 1, "tool_calls", 0, "function", "arguments", "arg").used:
            caps["supports_object_arguments"] = True
    if not caps["supports_object_arguments"]:
        ok, _, context = _run(render, _tool_conversation('{"arg": "value"}', 1), tools=[TOOL])
        if not ok:
            caps["supports_tool_calls"] = caps["supports_tools"] = False
        else:
            if not _at(context, "tools", 0, "function", "name").used:
                caps["supports_tools"] = False
            if not _at(context, "messages", 1, "tool_calls").used:
                caps["supports_tool_calls"] = False
    arguments: Any = {"arg": "value"} if caps["supports_object_arguments"] else '{"arg": "value"}'
    ok, _, context = _run(render, _tool_conversation(arguments, 2), tools=[TOOL])
    if not ok or not _at(context, "messages", 1, "tool_calls", 1, "function").used:
        caps["supports_parallel_tool_calls"] = False


def detect_caps(render: Render) -> TemplateCaps:
    """The template's capabilities as llama.cpp's jinja::caps finds them, by running it through `render`.

    `render(context)` renders the template with `context` (values tracked, see the module's contract) and
    answers whether it rendered and its output; it must not raise for a template that fails.
    """
    caps = {name: getattr(TemplateCaps(), name) for name in TemplateCaps.__dataclass_fields__}
    _content(render, caps)
    _, _, context = _run(render, [{"role": "system", "content": "System message"}, USER])
    if not _at(context, "messages", 0, "content").used:
        caps["supports_system_role"] = False
    _tools(render, caps)
    thinking = {"enable_thinking": True, "preserve_thinking": True, "clear_thinking": False,
                "truncate_history_thinking": False, "drop_thinking": False}
    answered = {"role": "assistant", "content": "Assistant message"}
    _, output, _ = _run(render, [
        USER, {**answered, "reasoning_content": REASONING_PLACEHOLDER},
        USER, {**answered, "reasoning_content": "Reasoning content"}, USER,
    ], extra=thinking)
    caps["supports_preserve_reasoning"] = REASONING_PLACEHOLDER in output
    effort = TrackedStr("low")  # one value under both names, as llama.cpp binds them
    _run(render, [USER], extra={"enable_thinking": True, "reasoning_effort": effort,
                                "reasoning_strength": effort})
    caps["supports_reasoning_effort"] = effort.stats.used
    return TemplateCaps(**caps)
