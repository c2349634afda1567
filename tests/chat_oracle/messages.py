"""The project's message parser (constraintd.engine.chat.parsing.message_parser) beside llama.cpp's
common_chat_parse, on texts written in each template's own tool-call format.

For every auto-parser template and a few requests (tools with tool_choice auto, required, parallel calls on;
no tools; a response schema), texts are made from the template's analysis, as a model would write them: plain
content, a call, content then a call, two calls, a thinking block first (where the template has thinking
tags), the JSON spaced differently, and an unfinished text (the content or a call cut short); in a tag format
with JSON arguments also a call cut in its name, its markers or the second call, an unknown tool, arguments
that are no object, and space around the section's calls, the arguments and the call's end; in a tag
format with tagged arguments string and JSON values (empty, escaped, spaced, no JSON), the text cut in each
of a call's parts, calls apart or after ", ", arguments out of order, left out or unknown, each after a
thinking block too; for the response schema, the value plain, spaced, fenced, after a thinking block, cut
short, and texts that are no such answer. Each text is read twice, whole and partial (is_partial, as
llama-server reads a stream's text so far). The harness's "parse" mode answers llama.cpp's message for each
(the same chat params, the parser llama-server loads); the project's comes from `parse_message` on its own
chat params, in the same mode. Compared: content, reasoning content, tool calls (name, arguments, id), or
both sides refusing the text. A case the project does not parse (`NotPorted`) is counted apart.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from constraintd.engine.chat.analysis.template_analysis import ToolFormat, ToolMode
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.params.json_tool_grammar import call_id_before_arguments
from constraintd.engine.chat.parsing.message_parser import MessageParseError, parse_message
from constraintd.engine.chat.templates.prompt import template_source
from constraintd.engine.chat.templates.template_inputs import parse_messages, parse_tools
from sampler_worker.prompt import chat_grammar_of, chat_prompt_of, template_caps
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, EOS_TOKEN, MESSAGE_SETS, SEARCH_TOOL, WEATHER_TOOL

# A response schema (OpenAI's response_format json_schema)
CITY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}
# (name, tools, tool_choice, parallel_tool_calls, response schema)
Request = tuple[str, list[dict[str, Any]] | None, str, bool, dict[str, Any] | None]
REQUESTS: tuple[Request, ...] = (
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


def _tag_call(tools: ToolFormat, name: str, arguments: Any, *, spaced: bool, gap: str = "",
              before_end: str = "") -> str:
    # a tag format with JSON arguments: the call's markers, the name between its prefix and suffix, `gap`, the
    # JSON, the function's close (after a newline where the JSON is spaced), `before_end`, the call's end
    args = json.dumps(arguments, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
    close = ("\n" if spaced else "") + tools.function_close if tools.function_close else ""
    opened = f"{tools.per_call_start}{tools.name_prefix}{name}{tools.name_suffix}"
    return f"{opened}{gap}{args}{close}{before_end}{tools.per_call_end}"


def _tag_calls(tools: ToolFormat, calls: list[str], *, around: str = "") -> str:
    return tools.section_start + around + "\n".join(calls) + around + tools.section_end


def _tagged_call(tools: ToolFormat, name: str, arguments: list[tuple[str, str]], *, end: bool = True) -> str:
    # a tag format with tagged arguments: the call's markers, the name between its prefix and suffix, the
    # separator, each argument's name and value (`arguments`: the values as written) between their markers,
    # the function's close and the call's end (unless `end` is off: a text cut there)
    written = "".join(f"{tools.arg_name_prefix}{key}{tools.arg_name_suffix}{tools.arg_value_prefix}{value}"
                      f"{tools.arg_value_suffix}" for key, value in arguments)
    opened = f"{tools.per_call_start}{tools.name_prefix}{name}{tools.name_suffix}{tools.args_separator}"
    return opened + written + (f"{tools.function_close}{tools.per_call_end}" if end else "")


def _tagged_calls(tools: ToolFormat, calls: list[str], *, between: str = "\n") -> str:
    return tools.section_start + between.join(calls) + tools.section_end


def _tagged_texts(tools: ToolFormat) -> dict[str, str]:
    # calls as a model writes them in a tag format with tagged arguments: string and JSON values, content
    # before, cut at each of the call's parts, spaced differently, and texts llama.cpp does not match
    weather = _tagged_call(tools, "get_weather", [("city", "Paris")])
    search = _tagged_call(tools, "search", [("query", "café « crème »"), ("filters", '{"max": 3}')])

    def one(name: str, arguments: list[tuple[str, str]]) -> str:
        return _tagged_calls(tools, [_tagged_call(tools, name, arguments)])

    made = {"call": _tagged_calls(tools, [weather])}
    made["content and call"] = "Let me look.\n" + made["call"]
    made["two calls"] = _tagged_calls(tools, [weather, search])
    made["two calls, no space"] = _tagged_calls(tools, [weather, search], between="")
    made["two calls, comma"] = _tagged_calls(tools, [weather, search], between=", ")
    made["cut call"] = made["call"][: len(made["call"]) * 2 // 3]
    made["cut name"] = tools.section_start + tools.per_call_start + tools.name_prefix + "get_wea"
    made["cut marker"] = tools.section_start + tools.per_call_start[:-1]
    made["cut after the name"] = tools.section_start + _tagged_call(tools, "get_weather", [], end=False)
    made["cut argument name"] = made["cut after the name"] + tools.arg_name_prefix + "ci"
    made["cut string value"] = made["call"].split("Par")[0] + "Par"
    made["cut value suffix"] = made["call"].split("Paris")[0] + "Paris" + tools.arg_value_suffix[:3]
    made["cut before the close"] = tools.section_start + _tagged_call(tools, "get_weather",
                                                                      [("city", "Paris")], end=False)
    made["cut JSON value"] = made["two calls"].split('"max": ')[0] + '"max": 3'
    made["cut JSON string"] = made["two calls"].split('"max": ')[0] + '"site": "ex\\'
    made["cut second call"] = made["two calls"][: len(made["two calls"]) - len(tools.section_end) - 12]
    made["empty value"] = one("get_weather", [("city", "")])
    made["escaped value"] = one("get_weather", [("city", 'He said "hi" \\ {x}\n\tthere')])
    made["spaced value"] = one("get_weather", [("city", "\n Paris \n")])
    made["spaced JSON value"] = one("search", [("query", "x"), ("filters", ' {"max": 3}\n')])
    made["JSON value, raw newline"] = one("search", [
        ("query", "x"), ("filters", '{"site": "a\nb", "max": [1, 2.5e3, true, null]}')])
    made["no JSON value"] = one("search", [("query", "x"), ("filters", "cheap")])
    made["arguments out of order"] = one("search", [("filters", '{"max": 3}'), ("query", "x")])
    made["optional argument left out"] = one("search", [("query", "x")])
    made["unknown tool"] = one("get_time", [])
    made["unknown argument"] = one("get_weather", [("town", "Paris")])
    made["space before the end"] = made["call"].replace(tools.function_close + tools.per_call_end,
                                                        " \n" + tools.function_close + tools.per_call_end)
    made["text after the call"] = made["call"] + "\nDone."
    return made


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
    elif tools.mode is ToolMode.TAG_WITH_JSON:
        weather = _tag_call(tools, "get_weather", WEATHER_ARGS, spaced=True)
        search = _tag_call(tools, "search", SEARCH_ARGS, spaced=False)
        made["call"] = _tag_calls(tools, [weather])
        made["content and call"] = "Let me look.\n" + made["call"]
        made["two calls"] = _tag_calls(tools, [weather, search])
        made["spaced section"] = _tag_calls(tools, [weather, search], around="\n ")
        made["cut call"] = made["call"][: len(made["call"]) * 2 // 3]
        # the text ending inside the second call's name, its arguments, or the first call's markers
        named = tools.section_start + weather + "\n" + tools.per_call_start + tools.name_prefix
        made["cut name"] = named + "sea"
        made["cut second call"] = made["two calls"][: len(made["two calls"]) - len(tools.section_end) - 12]
        made["cut marker"] = tools.section_start + tools.per_call_start[:-1]
        made["unknown tool"] = _tag_calls(tools, [_tag_call(tools, "get_time", {}, spaced=False)])
        # arguments that are JSON but no object, whole and cut short
        no_object = _tag_call(tools, "get_weather", "Paris", spaced=False)
        made["arguments no object"] = _tag_calls(tools, [no_object])
        made["cut arguments no object"] = made["arguments no object"].split('"Par')[0] + '"Par'
        made["unclosed arguments no object"] = made["arguments no object"].split('"Paris"')[0] + '"Paris"'
        # space between the name and the arguments, and between the arguments and the call's end
        spaced = _tag_call(tools, "get_weather", WEATHER_ARGS, spaced=True, gap="\n ")
        made["spaced call"] = _tag_calls(tools, [spaced])
        ended = _tag_call(tools, "get_weather", WEATHER_ARGS, spaced=True, before_end=" \n")
        made["space before the end"] = _tag_calls(tools, [ended])
        if call_id_before_arguments(tools):
            # a call id between the name and the arguments (`name[CALL_ID]id[ARGS]{...}`), given, left out
            # (its suffix alone), spaced, and the text ending inside it or right after it
            opened = f"{tools.per_call_start}{tools.name_prefix}get_weather{tools.name_suffix}"
            prefix, suffix, args = tools.call_id_prefix, tools.call_id_suffix, json.dumps(WEATHER_ARGS)
            with_id = f"{opened}{prefix}a1B2c3D4e{suffix}{args}{tools.per_call_end}"
            made["call with id"] = _tag_calls(tools, [with_id])
            made["call id left out"] = _tag_calls(tools, [f"{opened}{suffix}{args}"])
            made["spaced call id"] = _tag_calls(tools, [f"{opened}{prefix} a1B2 \n{suffix} {args}"])
            made["cut call id"] = tools.section_start + f"{opened}{prefix}a1B2"
            made["cut after call id"] = tools.section_start + f"{opened}{prefix}a1B2{suffix}"
            second = with_id.replace("a1B2c3D4e", "f5G6h7I8j")
            made["two calls with ids"] = _tag_calls(tools, [with_id, second])
    elif tools.mode is ToolMode.TAG_WITH_TAGGED:
        made.update(_tagged_texts(tools))
    reasoning = analysis.reasoning
    if reasoning.end:
        thought = f"{reasoning.start}I should check.{reasoning.end}"
        made["thinking"] = thought + "It is mild."
        if "call" in made:
            made["thinking and call"] = thought + made["call"]
        if tools.mode is ToolMode.TAG_WITH_TAGGED:
            # every call text after a thinking block too: where the generation prompt opens the block, the
            # calls are read after it only
            for name in _tagged_texts(tools):
                if name != "call":
                    made[f"thinking, {name}"] = thought + made[name]
        if tools.mode is ToolMode.TAG_WITH_JSON:
            # where the generation prompt opens the thinking block, the calls are read after it only
            for name in ("content and call", "two calls", "cut call", "cut name", "cut second call",
                         "unknown tool", "arguments no object", "unclosed arguments no object", "spaced call",
                         "space before the end", "spaced section", "call with id", "cut call id"):
                if name in made:
                    made[f"thinking, {name}"] = thought + made[name]
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


@dataclass(frozen=True, slots=True)
class ParseRequest:
    """One template and request, with the project's chat params for it: a text parsed both ways."""

    source: str
    name: str
    tool_list: list[dict[str, Any]] | None
    choice: str
    parallel: bool
    schema: dict[str, Any] | None
    now: int
    grammar: ChatGrammar
    generation_prompt: str

    @classmethod
    def make(cls, source: str, name: str, tool_list: list[dict[str, Any]] | None, choice: str, parallel: bool,
             schema: dict[str, Any] | None, *, now: int) -> ParseRequest:
        """The request's chat params, as a client of the service gets them.

        Raises:
            NotPorted: the project does not make this request's chat params.
        """
        messages = parse_messages(MESSAGE_SETS["system+user"])
        tools = parse_tools(tool_list)
        prompt = chat_prompt_of(source, messages, tools=tools, bos_text=BOS_TOKEN, eos_text=EOS_TOKEN,
                                now=now)
        grammar = chat_grammar_of(source, messages, tools=tools, tool_choice=choice, bos_text=BOS_TOKEN,
                                  eos_text=EOS_TOKEN, now=now, parallel_tool_calls=parallel,
                                  generation_prompt=prompt.generation_prompt, json_schema=schema)
        return cls(source, name, tool_list, choice, parallel, schema, now, grammar, prompt.generation_prompt)

    def compare(self, binary: Path, text: str, *, partial: bool) -> tuple[dict[str, Any] | None,
                                                                           dict[str, Any], str | None]:
        """(ours, llama.cpp's, the NotPorted message or None) for `text`, whole or partial."""
        request: dict[str, Any] = {
            "mode": "parse", "template": self.source, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
            "messages": MESSAGE_SETS["system+user"], "tool_choice": self.choice,
            "parallel_tool_calls": self.parallel, "now": self.now, "text": text, "reasoning_format": "auto",
            "is_partial": partial,
        }
        if self.tool_list is not None:
            request["tools"] = self.tool_list
        if self.schema is not None:
            request["json_schema"] = self.schema
        llama = _llama(run_harness(binary, request))
        try:
            message = parse_message(
                text, self.grammar, generation_prompt=self.generation_prompt,
                tools=[tool.to_json() for tool in parse_tools(self.tool_list)], tool_choice=self.choice,
                parallel_tool_calls=self.parallel, supports_tool_calls=_caps(self.source),
                has_response_format=self.schema is not None, partial=partial)
        except MessageParseError:
            return {"error": "parse"}, llama, None
        except NotPorted as exc:
            return None, llama, str(exc)
        return ({"content": message.content, "reasoning_content": message.reasoning_content,
                 "tool_calls": [[c.name, c.arguments, c.id] for c in message.tool_calls]}, llama, None)


def stream_cuts(text: str, count: int, rng: random.Random) -> list[str]:
    """`count` prefixes of `text` at cut points drawn with `rng` (each a distinct length, shortest first), as
    a stream reads its text so far."""
    lengths = sorted(rng.sample(range(1, len(text)), min(count, len(text) - 1)))
    return [text[:length] for length in lengths]


def compare_streams(binary: Path, path: Path, requests: Sequence[Request],
                    texts_of: Callable[[ParseRequest], dict[str, str]], *, now: int,
                    cuts: int) -> list[MessageComparison]:
    """The longest text of each request on one template, read partial at `cuts` prefixes drawn at random
    (seeded by the template and request), as llama-server reads a stream's text so far."""
    source = path.read_text()
    found = []
    for name, tool_list, choice, parallel, schema in requests:
        try:
            request = ParseRequest.make(source, name, tool_list, choice, parallel, schema, now=now)
        except NotPorted as exc:
            found.append(MessageComparison(path.stem, name, "*", None, {}, str(exc)))
            continue
        text_name, text = max(texts_of(request).items(), key=lambda item: len(item[1]))
        for cut in stream_cuts(text, cuts, random.Random(f"{path.stem}/{name}")):
            ours, llama, not_ported = request.compare(binary, cut, partial=True)
            found.append(MessageComparison(path.stem, name, f"{text_name} to {len(cut)} of {len(text)}", ours,
                                           llama, not_ported))
    return found


def message_texts(request: ParseRequest) -> dict[str, str]:
    """The texts written in an auto-parser template's format for the request (or its schema's answers)."""
    return texts(request.grammar) if request.schema is None else answers(request.grammar)


def compare_messages(binary: Path, path: Path, *, now: int) -> list[MessageComparison]:
    """Every request and text on one template file, each read whole and partial."""
    source = path.read_text()
    found = []
    for name, tool_list, choice, parallel, schema in REQUESTS:
        try:
            request = ParseRequest.make(source, name, tool_list, choice, parallel, schema, now=now)
        except NotPorted as exc:  # the request's chat params: the tag formats' tool grammars
            found.append(MessageComparison(path.stem, name, "*", None, {}, str(exc)))
            continue
        for text_name, text in message_texts(request).items():
            for partial in (False, True):
                ours, llama, not_ported = request.compare(binary, text, partial=partial)
                found.append(MessageComparison(path.stem, name, text_name + (" (partial)" if partial else ""),
                                               ours, llama, not_ported))
    return found


def _caps(source: str) -> bool:
    return template_caps(template_source(source)).supports_tool_calls
