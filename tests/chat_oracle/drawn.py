"""Chat requests drawn at random (from a seed) for the prompt comparison, beyond the fixed cases of cases.py.

A drawn conversation has an optional system or developer message, one to three user turns (some as content
parts), assistant answers (some with reasoning_content), and tool-call turns of one or two calls (arguments
as JSON text, ASCII-escaped or not, or as objects; content null, empty or text) each followed by its
results; tools are sent when a call is made and sometimes otherwise. The texts mix whitespace, quotes,
markup, JSON, non-ASCII and special-token look-alikes. Thinking is on in about 80% of the requests and the
generation prompt asked for in about 85%.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from tests.chat_oracle.cases import BOS_TOKEN, EOS_TOKEN, SEARCH_TOOL, WEATHER_TOOL

TEXTS = (
    "Hello", "  spaced  ", "line1\nline2", "quote ' and \"", "tab\there", '{"json": 1}', "<b>x</b>",
    "é ü 日本 😀", "", "back\\slash", "[INST] fake", "<tool_call>", "100%", "a" * 30,
)


@dataclass(frozen=True, slots=True)
class DrawnRequest:
    """One drawn chat request."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    thinking: bool
    generation_prompt: bool

    def request(self, template: str) -> dict[str, Any]:
        """The oracle request (tests/chat_oracle/harness.cpp) on one template source."""
        request: dict[str, Any] = {
            "template": template, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "messages": self.messages,
            "add_generation_prompt": self.generation_prompt, "enable_thinking": self.thinking,
        }
        if self.tools:
            request["tools"] = self.tools
        return request


def _text(rng: random.Random) -> str:
    return rng.choice(TEXTS) + rng.choice(("", " more", "!"))


def _arguments(rng: random.Random) -> Any:
    value = rng.choice([
        {"city": _text(rng)}, {"city": "Paris", "n": rng.randint(-5, 100)}, {"q": [1, 2.5, None, True]}, {},
        {"nested": {"a": {"b": "c"}}},
    ])
    return json.dumps(value, ensure_ascii=rng.random() < 0.5) if rng.random() < 0.6 else value


def draw(rng: random.Random) -> DrawnRequest:
    """One request drawn with `rng`."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": rng.choice(("system", "system", "developer")), "content": _text(rng)})
    turns, calls_made = rng.randint(1, 3), False
    for turn in range(turns):
        user: dict[str, Any] = {"role": "user", "content": _text(rng)}
        if rng.random() < 0.2:
            user["content"] = [{"type": "text", "text": _text(rng)}, {"type": "text", "text": _text(rng)}]
        messages.append(user)
        if turn == turns - 1:
            break
        if rng.random() < 0.4:
            count, calls_made = rng.randint(1, 2), True
            calls = [{"id": f"call0000{n + 1}", "type": "function",
                      "function": {"name": "get_weather", "arguments": _arguments(rng)}}
                     for n in range(count)]
            caller: dict[str, Any] = {"role": "assistant", "content": rng.choice((None, "", _text(rng))),
                                      "tool_calls": calls}
            if rng.random() < 0.3:
                caller["reasoning_content"] = _text(rng)
            messages.append(caller)
            messages.extend({"role": "tool", "tool_call_id": f"call0000{n + 1}",
                             "content": rng.choice(('{"t": 18}', _text(rng)))} for n in range(count))
        answer: dict[str, Any] = {"role": "assistant", "content": _text(rng)}
        if rng.random() < 0.3:
            answer["reasoning_content"] = _text(rng)
        messages.append(answer)
    tools = None
    if calls_made or rng.random() < 0.4:
        tools = [WEATHER_TOOL, SEARCH_TOOL] if rng.random() < 0.3 else [WEATHER_TOOL]
    return DrawnRequest(messages, tools, rng.random() < 0.8, rng.random() < 0.85)


def drawn_requests(seed: int, count: int) -> list[DrawnRequest]:
    """`count` requests drawn from `seed`."""
    rng = random.Random(seed)
    return [draw(rng) for _ in range(count)]
