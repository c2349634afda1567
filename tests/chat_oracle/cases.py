"""The chat requests the oracle is run on: every template of the reference crossed with a few conversations.

Templates are the source distribution's `models/templates/*.jinja` (llama.cpp's own test templates, taken
from the models' tokenizer configs). The conversations are OpenAI chat messages, as llama-server gets them:
- `system+user`: a system prompt and one user message;
- `conversation`: the same, an assistant answer and a second user message;
- `tool_result`: a user message, an assistant turn that calls a tool (content null) and the tool's result;
  only ever sent with tools. The call id is nine alphanumerics, as Mistral's templates require.
Each is rendered with and without a tool definition (`get_weather`), and with `add_generation_prompt`.
Then the cases of llama.cpp's message rewrites and variables, one each:
- `parts`: the user's content as two text parts; `developer`: a developer message first; `user`: one user
  message alone;
- `reasoning`: an earlier assistant answer with its reasoning_content, with thinking on and off;
- `answered`: a conversation that ends with the assistant's answer, without add_generation_prompt;
- `parallel_calls`: two calls in one assistant turn (one with its arguments as a JSON object), two results,
  with two tools (the second with non-ASCII text and a nested schema);
- `unicode`: non-ASCII, quotes and markup in the user's text, with the second tool;
- `reasoning +kwargs`: the reasoning conversation with chat_template_kwargs preserve_reasoning and
  reasoning_effort (which llama.cpp also sets under the other names templates read).
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

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Cherche sur le web — « vite ».",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "object", "properties": {
                    "site": {"type": "string"}, "max": {"type": "integer", "minimum": 1}}},
            },
            "required": ["query"],
        },
    },
}
PARTS = {"role": "user", "content": [{"type": "text", "text": "What is"},
                                     {"type": "text", "text": "the capital of France?"}]}
REASONED = {"role": "assistant", "content": "Paris.", "reasoning_content": "The user asks about France."}
DEVELOPER = {"role": "developer", "content": "Answer in one word."}
PARALLEL_CALLS = {
    "role": "assistant",
    "content": "Let me check both.",
    "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call00002", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Berlin"}}},
    ],
}
RESULTS = [
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temperature": 18}'},
    {"role": "tool", "tool_call_id": "call00002", "content": "sunny, 21 °C"},
]
UNICODE = {"role": "user", "content": 'Ça va ? 日本語 😀 "quoted" <b>bold</b> \\ back'}

MESSAGE_SETS: dict[str, list[dict[str, Any]]] = {
    "system+user": [SYSTEM, USER],
    "conversation": [SYSTEM, USER, ASSISTANT, USER_AGAIN],
    "tool_result": [SYSTEM, USER_WEATHER, TOOL_CALL, TOOL_RESULT],
    "parts": [SYSTEM, PARTS],
    "developer": [DEVELOPER, USER],
    "user": [USER],
    "reasoning": [SYSTEM, USER, REASONED, USER_AGAIN],
    "answered": [SYSTEM, USER, ASSISTANT],
    "parallel_calls": [SYSTEM, USER_WEATHER, PARALLEL_CALLS, *RESULTS,
                       {"role": "assistant", "content": "18 and 21."}, USER_AGAIN],
    "unicode": [SYSTEM, UNICODE],
}
# The tools a message set is sent with, when its case has tools (the weather tool unless said here).
TOOL_SETS: dict[str, list[dict[str, Any]]] = {
    "parallel_calls": [WEATHER_TOOL, SEARCH_TOOL],
    "unicode": [SEARCH_TOOL],
}


@dataclass(frozen=True, slots=True)
class ChatCase:
    """One request: a message set, with or without its tools, thinking on or off, with or without the
    generation prompt."""

    messages: str  # a key of MESSAGE_SETS
    tools: bool
    thinking: bool = True
    generation_prompt: bool = True
    template_kwargs: tuple[tuple[str, Any], ...] = ()  # chat_template_kwargs

    @property
    def name(self) -> str:
        return (f"{self.messages}{' +tools' if self.tools else ''}{' -thinking' if not self.thinking else ''}"
                f"{' -generation_prompt' if not self.generation_prompt else ''}"
                f"{' +kwargs' if self.template_kwargs else ''}")

    @property
    def tool_list(self) -> list[dict[str, Any]] | None:
        """The tools sent, or None."""
        return TOOL_SETS.get(self.messages, [WEATHER_TOOL]) if self.tools else None

    def request(self, template: str, **extra: Any) -> dict[str, Any]:
        """The oracle request (tests/chat_oracle/harness.cpp) for this case on one template source."""
        request: dict[str, Any] = {
            "template": template, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
            "messages": MESSAGE_SETS[self.messages], "add_generation_prompt": self.generation_prompt,
            "enable_thinking": self.thinking,
        }
        if self.tools:
            request["tools"] = self.tool_list
        if self.template_kwargs:
            request["chat_template_kwargs"] = dict(self.template_kwargs)
        request.update(extra)
        return request


CASES = (
    ChatCase("system+user", tools=False),
    ChatCase("conversation", tools=False),
    ChatCase("system+user", tools=True),
    ChatCase("conversation", tools=True),
    ChatCase("tool_result", tools=True),
    ChatCase("parts", tools=False),
    ChatCase("developer", tools=False),
    ChatCase("user", tools=False),
    ChatCase("reasoning", tools=False),
    ChatCase("reasoning", tools=False, thinking=False),
    ChatCase("answered", tools=False, generation_prompt=False),
    ChatCase("parallel_calls", tools=True),
    ChatCase("unicode", tools=True),
    ChatCase("reasoning", tools=False,
             template_kwargs=(("preserve_reasoning", True), ("reasoning_effort", "low"))),
)


def template_paths() -> list[Path]:
    """Every template under the reference's models/templates/, by name."""
    folder = reference.require(reference.llama_cpp_dir() / "models" / "templates")
    return sorted(folder.glob("*.jinja"))



# Small templates, each on one point of llama.cpp's Jinja dialect (its common/jinja), rendered with one user
# message by the project's renderer and by llama.cpp's own.
JINJA_CASES = (
    "{{ 'a' ~ none ~ 'b' }}",
    "{{ none }}|{{ undefined_x }}|{{ true }}|{{ 1.0 }}|{{ 1.5e3 }}|{{ 10 / 4 }}|{{ 7 // 2 }}|{{ 7 % 3 }}",
    "{{ [1, 'a', none]|string }}",
    "{{ {'a': [1, 2]}|tojson }}",
    "{{ true|string }}{{ 3|string }}{{ 2.5|string }}",
    "{{ 'abc'|upper }}{{ ' x '|trim }}{{ 'a,b'.split(',')|join('-') }}",
    "{{ messages|length }}{{ messages[0]['role']|title }}",
    "{% for m in messages %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
    "{{ [3, 1, 2]|sort|join(',') }}{{ [1, 2]|reverse|list|join(',') }}{{ [1,2,3]|first }}{{ [1,2,3]|last }}",
    "{{ 'x' if none is none else 'y' }}{{ undefined_x is defined }}{{ undefined_x|default('d') }}",
    "{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}",
    "{{ 'Hello %s'|format('x') }}{{ 'a' * 3 }}{{ 'abc'[1:] }}{{ 'abc'[-1] }}",
    "{{ {'b': 1, 'a': 2}|dictsort|tojson }}{{ {'b': 1, 'a': 2}.items()|list|tojson }}",
    "{{ 'a' in 'abc' }}{{ 1 in [1, 2] }}{{ 'k' in {'k': 1} }}",
    "{{ [1, 2] + [3] }}{{ (1, 2) }}",
    "{{ 'x'|tojson }}{{ 5|tojson }}{{ none|tojson }}{{ 1.0|tojson }}",
    "{{ messages[0].content.startswith('h') }}{{ 'a b'.replace(' ', '_') }}{{ 'AbC'.lower() }}",
    "{{ {'a': 1}|tojson(indent=2) }}",
    "{{ [1]|tojson(separators=(',', ':')) }}",
    "{{ 'x'|length }}{{ {'a': 1}|length }}",
    "{%- macro f(x, y='d') -%}[{{ x }}{{ y }}]{%- endmacro -%}{{ f(1) }}{{ f(2, y='e') }}",
    "{{ raise_exception('boom') if false else 'ok' }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
    "{{ messages|map(attribute='role')|join(',') }}",
    "{{ 'abc'|capitalize }}{{ '  a  '|lstrip if false else 'z' }}",
    "{{ [1, none, 2]|select|list|tojson }}{{ [1, 2, 3]|reject('odd')|list|tojson }}",
    "{{ 3 > 2 and 'x' or 'y' }}",
    "{{ {'a': 1}['a'] }}{{ {'a': 1}.get('b', 'z') }}{{ {'a': 1}.keys()|list|tojson }}",
    "{{ 1 == 1.0 }}{{ 'a' != 'b' }}",
    "{%- for k, v in {'b': 1, 'a': 2}.items() -%}{{ k }}={{ v }};{%- endfor -%}",
    "{{ (messages|last).role }}",
    "{{ 'a\nb'|indent(2) }}",
    "{{ '{}-{}'|format(3, 'x') }}{{ '%d'|format(3) }}",
    "{{ [1, 2, 3][1:]|tojson }}",
    "{{ 'x' ~ 1 ~ true ~ 1.5 ~ [1, 'b'] }}",
    "{{ none|string }}{{ ''|default('e', true) }}",
    "{{ range(3)|list|tojson }}{{ [1,2,3]|sum }}{{ [3,1]|min }}{{ [3,1]|max }}",
    "{{ 'é'|tojson(ensure_ascii=true) }}",
    "{{ ['b','a']|unique|list|tojson }}",
    "{{ 10|int + '3'|int }}{{ '2.5'|float }}",
)


# The chat params matrix (llama.cpp's grammar, lazy flag, triggers, preserved tokens, stops and thinking tags
# for a request): the system+user conversation on every template, with the tools offered or not and each
# tool_choice, thinking on and off, with and without a response schema, reasoning_format auto (llama-server's
# default: reasoning extracted); and the schema with reasoning_format none.
# `named` is OpenAI's {"type": "function", "function": {"name": "get_weather"}}: the pinned chat layer takes
# only the three strings (common_chat_tool_choice_parse_oaicompat throws on anything else), so it is sent as
# the named tool alone with tool_choice required, the reading that makes the model call exactly that tool.
RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number", "minimum": 0}},
    "required": ["answer"],
}
TOOL_CHOICE_CASES = (None, "auto", "required", "none", "named")


@dataclass(frozen=True, slots=True)
class ParamsCase:
    """One chat-params request: tool_choice (None: no tools), thinking, schema, reasoning_format."""

    tool_choice: str | None
    thinking: bool
    schema: bool
    reasoning_format: str = "auto"

    @property
    def name(self) -> str:
        tools = "no tools" if self.tool_choice is None else f"tools {self.tool_choice}"
        return (f"{tools}{' +schema' if self.schema else ''}{' -thinking' if not self.thinking else ''}"
                f"{'' if self.reasoning_format == 'auto' else ' reasoning ' + self.reasoning_format}")

    @property
    def tool_list(self) -> list[dict[str, Any]] | None:
        """The tools sent to llama.cpp, or None."""
        if self.tool_choice is None:
            return None
        return [WEATHER_TOOL] if self.tool_choice == "named" else [WEATHER_TOOL, SEARCH_TOOL]

    @property
    def llama_tool_choice(self) -> str:
        """The tool_choice string llama.cpp gets."""
        return "required" if self.tool_choice == "named" else self.tool_choice or "auto"

    def request(self, template: str, **extra: Any) -> dict[str, Any]:
        """The oracle request (tests/chat_oracle/harness.cpp) for this case on one template source."""
        request: dict[str, Any] = {
            "template": template, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
            "messages": MESSAGE_SETS["system+user"], "enable_thinking": self.thinking,
            "reasoning_format": self.reasoning_format, "tool_choice": self.llama_tool_choice,
        }
        if self.tool_list is not None:
            request["tools"] = self.tool_list
        if self.schema:
            request["json_schema"] = RESPONSE_SCHEMA
        request.update(extra)
        return request


PARAMS_CASES = (
    *(ParamsCase(choice, thinking, schema)
      for schema in (False, True) for choice in TOOL_CHOICE_CASES for thinking in (True, False)),
    ParamsCase(None, True, True, "none"),
    ParamsCase(None, False, True, "none"),
)
