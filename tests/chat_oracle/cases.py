"""The chat requests the oracle is run on: every template of the reference crossed with a few conversations.

Templates are the source distribution's `models/templates/*.jinja` (llama.cpp's own test templates, taken
from the models' tokenizer configs). The conversations are OpenAI chat messages, as llama-server gets them:
- `system+user`: a system prompt and one user message;
- `conversation`: the same, an assistant answer and a second user message;
- `tool_result`: a user message, an assistant turn that calls a tool (content null) and the tool's result;
  only ever sent with tools. The call id is nine alphanumerics, as Mistral's templates require.
Each is rendered with and without a tool definition (`get_weather`), and with `add_generation_prompt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests import reference

# The same token texts on both sides: what they are does not matter to the comparison, only that the
# template sees the same bos_token / eos_token in both renderers.
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT = {"role": "assistant", "content": "The capital of France is Paris."}
USER_AGAIN = {"role": "user", "content": "And of Germany?"}
USER_WEATHER = {"role": "user", "content": "What is the weather in Paris?"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{
        "id": "call00001",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 18}'}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name."}},
            "required": ["city"],
        },
    },
}

MESSAGE_SETS: dict[str, list[dict[str, Any]]] = {
    "system+user": [SYSTEM, USER],
    "conversation": [SYSTEM, USER, ASSISTANT, USER_AGAIN],
    "tool_result": [SYSTEM, USER_WEATHER, TOOL_CALL, TOOL_RESULT],
}


@dataclass(frozen=True, slots=True)
class ChatCase:
    """One request: a message set, with or without the tool."""

    messages: str  # a key of MESSAGE_SETS
    tools: bool

    @property
    def name(self) -> str:
        return f"{self.messages}{' +tools' if self.tools else ''}"

    def request(self, template: str, **extra: Any) -> dict[str, Any]:
        """The oracle request (tests/chat_oracle/harness.cpp) for this case on one template source."""
        request: dict[str, Any] = {
            "template": template, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
            "messages": MESSAGE_SETS[self.messages], "add_generation_prompt": True,
        }
        if self.tools:
            request["tools"] = [WEATHER_TOOL]
        request.update(extra)
        return request


CASES = (
    ChatCase("system+user", tools=False),
    ChatCase("conversation", tools=False),
    ChatCase("system+user", tools=True),
    ChatCase("conversation", tools=True),
    ChatCase("tool_result", tools=True),
)


def template_paths() -> list[Path]:
    """Every template under the reference's models/templates/, by name."""
    folder = reference.require(reference.llama_cpp_dir() / "models" / "templates")
    return sorted(folder.glob("*.jinja"))
