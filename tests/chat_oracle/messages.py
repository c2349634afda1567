"""The project's message parser (constraintd.engine.chat.message_parser) beside llama.cpp's common_chat_parse,
on texts written in each template's own tool-call format.

For every auto-parser template and a few requests (tools with tool_choice auto, required, parallel calls on;
no tools; a response schema), texts are made from the template's analysis, as a model would write them: plain
content, a call, content then a call, two calls, a thinking block first (where the template has thinking
tags), the JSON spaced differently, and an unfinished text (the content or a call cut short); for the
response schema, the value plain, spaced, fenced, after a thinking block, cut short, and texts that are no
such answer. The harness's "parse" mode answers llama.cpp's message for each (the same chat params, the
parser llama-server loads); the project's comes from `parse_message` on its own chat params. Compared:
content, reasoning content, tool calls (name, arguments, id), or both sides refusing the text. A case the
project does not parse (`NotPorted`) is counted apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constraintd.engine.chat.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.message_parser import MessageParseError, parse_message
from constraintd.engine.chat.prompt import template_source
from constraintd.engine.chat.template_analysis import ToolFormat, ToolMode
from constraintd.engine.chat.template_inputs import parse_messages, parse_tools
from sampler_worker.prompt import chat_grammar_of, chat_prompt_of, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, EOS_TOKEN, MESSAGE_SETS, SEARCH_TOOL, WEATHER_TOOL

# A response schema (OpenAI's response_format json_schema)
CITY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}
# (name, tools, tool_choice, parallel_tool_calls, response schema)
REQUESTS: tuple[tuple[str, list[dict[str, Any]] | None, str, bool, dict[str, Any] | None], ...] = (
    ("no tools", None, "auto", False, None),
    ("auto", [WEATHER_TOOL, SEARCH_TOOL], "auto", False, None),
    ("required", [WEATHER_TOOL, SEARCH_TOOL], "required", False, None),
    ("auto parallel", [WEATHER_TOOL, SEARCH_TOOL], "auto", True, None),
    ("response schema", None, "auto", False, CITY_SCHEMA),
)
WEATHER_ARGS = {"city": "Paris"}
SEARCH_ARGS = {"query": "café « crème »", "filters": {"max": 3}}


def _call(tools: ToolFormat, name: str, arguments: dict[str, Any], *, spaced: bool) -> str:
    args = json.dumps(arguments, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
    sep = ", " if spaced else ","
    colon = ": " if spaced else ":"
    if tools.fun_name_is_key:
        inner = args if not tools.args_field else f'{{"{tools.args_field}"{colon}{args}}}'
        return f'{{"{name}"{colon}{inner}}}'
    fields = {tools.name_field or "name": f'"{name}"', tools.args_field or "arguments": args}
    if tools.id_field:
        fields[tools.id_field] = '"call00001"'
    order = tools.parameter_order
    keys = sorted(fields, key=lambda key: order.index(key) if key in order else len(order))
    return "{" + sep.join(f'"{key}"{colon}{fields[key]}' for key in keys) + "}"


def _calls(tools: ToolFormat, calls: list[str]) -> str:
    if not tools.section_start and tools.per_call_start:
        body = [tools.per_call_start + c + tools.per_call_end for c in calls]
        return "\n".join(body)
    joined = ", ".join(calls)
    if tools.tools_array_wrapped:
        joined = f"[{joined}]"
    return tools.section_start + joined + tools.section_end


def answers(grammar: ChatGrammar) -> dict[str, str]:
    """The texts tried on a template with a response schema: by name."""
    analysis = grammar.analysis
    assert analysis is not None
    value = '{"city": "Paris"}'
    made = {"value": value, "spaced value": f"\n {value}\n", "fenced value": f"```json\n{value}\n```",
            "cut value": value[:8], "cut fence": f"```json\n{value}\n`",
            "text after the value": value + " ok", "content": "The weather in Paris is mild.", "empty": ""}
    reasoning = analysis.reasoning
    if reasoning.end:
        thought = f"{reasoning.start}I should answer.{reasoning.end}"
        made["thinking"] = thought + value
        made["thinking, spaced"] = f"{thought}\n\n{value}"
        made["cut thinking"] = thought[: len(reasoning.start) + 5]
        # where the generation prompt opened the block already
        made["thinking, opened by the prompt"] = f"I should answer.{reasoning.end}{value}"
    return made


def texts(grammar: ChatGrammar) -> dict[str, str]:
    """The texts tried on a template: by name."""
    analysis = grammar.analysis
    assert analysis is not None
    made = {"content": "The weather in Paris is mild.", "empty": ""}
    tools = analysis.tools
    if tools.mode is ToolMode.JSON_NATIVE:
        weather = _call(tools, "get_weather", WEATHER_ARGS, spaced=True)
        search = _call(tools, "search", SEARCH_ARGS, spaced=False)
        made["call"] = _calls(tools, [weather])
        made["content and call"] = "Let me look.\n" + made["call"]
        made["two calls"] = _calls(tools, [weather, search])
        made["cut call"] = made["call"][: len(made["call"]) * 2 // 3]
    reasoning = analysis.reasoning
    if reasoning.end:
        thought = f"{reasoning.start}I should check.{reasoning.end}"
        made["thinking"] = thought + "It is mild."
        if "call" in made:
            made["thinking and call"] = thought + made["call"]
    return made


@dataclass(frozen=True, slots=True)
class MessageComparison:
    template: str
    request: str
    text: str
    ours: dict[str, Any] | None
    llama: dict[str, Any]
    not_ported: str | None

    @property
    def identical(self) -> bool:
        return self.ours is not None and self.ours == self.llama

    def describe(self) -> str:
        return f"{self.request}, {self.text}: ours {self.ours!r}, llama.cpp {self.llama!r}"


def _llama(answer: dict[str, Any]) -> dict[str, Any]:
    if "error" in answer:
        return {"error": answer["stage"]}
    return {"content": answer["content"], "reasoning_content": answer["reasoning_content"],
            "tool_calls": [[c["name"], c["arguments"], c["id"]] for c in answer["tool_calls"]]}


def compare_messages(binary: Path, path: Path, *, now: int) -> list[MessageComparison]:
    """Every request and text on one template file."""
    source = path.read_text()
    messages = parse_messages(MESSAGE_SETS["system+user"])
    found = []
    for name, tool_list, choice, parallel, schema in REQUESTS:
        tools = parse_tools(tool_list)
        try:
            prompt = chat_prompt_of(source, messages, tools=tools, bos_text=BOS_TOKEN, eos_text=EOS_TOKEN,
                                    now=now)
            grammar = chat_grammar_of(source, messages, tools=tools, tool_choice=choice, bos_text=BOS_TOKEN,
                                      eos_text=EOS_TOKEN, now=now, parallel_tool_calls=parallel,
                                      generation_prompt=prompt.generation_prompt, json_schema=schema)
        except NotPorted as exc:  # the request's chat params: the tag formats' tool grammars
            found.append(MessageComparison(path.stem, name, "*", None, {}, str(exc)))
            continue
        for text_name, text in (texts(grammar) if schema is None else answers(grammar)).items():
            request: dict[str, Any] = {
                "mode": "parse", "template": source, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
                "messages": MESSAGE_SETS["system+user"], "tool_choice": choice,
                "parallel_tool_calls": parallel,
                "now": now, "text": text, "reasoning_format": "auto",
            }
            if tool_list is not None:
                request["tools"] = tool_list
            if schema is not None:
                request["json_schema"] = schema
            llama = _llama(run_harness(binary, request))
            ours: dict[str, Any] | None
            not_ported = None
            try:
                message = parse_message(
                    text, grammar, generation_prompt=prompt.generation_prompt,
                    tools=[tool.to_json() for tool in tools], tool_choice=choice,
                    parallel_tool_calls=parallel,
                    supports_tool_calls=_caps(source), has_response_format=schema is not None)
                ours = {"content": message.content, "reasoning_content": message.reasoning_content,
                        "tool_calls": [[c.name, c.arguments, c.id] for c in message.tool_calls]}
            except MessageParseError:
                ours = {"error": "parse"}
            except NotPorted as exc:
                ours, not_ported = None, str(exc)
            found.append(MessageComparison(path.stem, name, text_name, ours, llama, not_ported))
    return found


def _caps(source: str) -> bool:
    return template_caps(template_source(source)).supports_tool_calls
