"""llama.cpp's own chat-parser test cases, read from the pinned source's tests/test-chat.cpp.

The one call form read is test-chat.cpp's peg_tester builder chain on a tester made with a literal template
path, the form of its test_template_output_peg_parsers:

    auto tst = peg_tester("models/templates/X.jinja", ...);
    tst.test(<string literals, adjacent ones joined>).setter(...)...run();

A case is the text given to `.test(...)` on the template its tester was made with, with the request the
setters give: reasoning_format, enable_thinking, tools (named common_chat_tool definitions, or a named vector
of them), tool_choice, parallel_tool_calls, json_schema (a literal, or a named `const char *` literal),
messages (named common_chat_msg values, read from their definitions in the file: a brace initialiser of
string fields, `= simple_assist_msg(...)` of string literals, or a declaration followed by `name.field =
"..."` assignments; a name defined again in another block is the last definition before the call),
add_generation_prompt and continue_final_message. The `expect*` setters are left out: the oracle compares the
two implementations, not llama.cpp's expectations. The rest of the request is the builder's default (one user
message "Hey there!", add_generation_prompt on, reasoning_format none, thinking on, tool_choice auto, no
parallel calls, nothing continued, no bos or eos text).

Skipped, and counted by reason in `skipped_calls()`: a text that is not only string literals
(`get_time_call + ...`: 11), a tester whose template is a variable (`peg_tester(path, ...)`: 19), tools that
are not named definitions (2), messages that are not named definitions (none on the pinned source), and the
setters the project's parser does not take or this reader does not render, counted by the first one met
(none on the pinned source). `is_partial(true)` reads the text as a stream's text so far, both sides.
test-chat-peg-parser.cpp and test-chat-auto-parser.cpp are not read: their cases pair a parser built in C++,
or a template's analysis, with a text, not a template and a request with a text.

On the pinned source this reads 393 cases on 53 templates, 72 of them with their messages (69 continuing the
final message, 3 with a tool's call and its result in the conversation) and 6 read as a stream's text so far
(is_partial) (file name without .jinja, cases):
Apertus-8B-Instruct 2, Apriel-1.6-15b-Thinker-fixed 4, ByteDance-Seed-OSS 8, Cohere2MoE 10,
CohereForAI-c4ai-command-r-plus-tool_use 3, CohereForAI-c4ai-command-r7b-12-2024-tool_use 8, GLM-4.6 1,
GLM-4.7-Flash 8, GigaChat3-10B-A1.8B 4, GigaChat3.1-10B-A1.8B 4, Kimi-K2-Instruct 2, Kimi-K2-Thinking 14,
Kimi-K3 9, LFM2.5-8B-A1B 7, MiniMax-M2 6, MiniMax-M3 21, Mistral-Small-3.2-24B-Instruct-2506 4,
NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 10, NVIDIA-Nemotron-Nano-v2 3,
NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use 3, Qwen-QwQ-32B 4, Qwen3-Coder 23, Qwen3.5-4B 25, Reka-Edge 21,
Spark2.5 6, StepFun3.5-Flash 13, deepseek-ai-DeepSeek-R1-Distill-Llama-8B 4,
deepseek-ai-DeepSeek-R1-Distill-Qwen-32B 5, deepseek-ai-DeepSeek-V3.1 7, deepseek-ai-DeepSeek-V3.2 15,
deepseek-ai-DeepSeek-V4 10, deepseek-ai-DeepSeek-V4-Flash-0731 1, fireworks-ai-llama-3-firefunction-v2 3,
google-gemma-2-2b-it 4, google-gemma-4-31B-it 28, ibm-granite-granite-3.3-2B-Instruct 4,
ibm-granite-granite-4.0 3, ibm-granite-granite-4.1 2, inclusionai-ling-3.0-flash 14, llama-cpp-deepseek-r1 5,
meetkai-functionary-medium-v3.1 3, meetkai-functionary-medium-v3.2 3, meta-llama-Llama-3.1-8B-Instruct 4,
meta-llama-Llama-3.2-3B-Instruct 2, meta-llama-Llama-3.3-70B-Instruct 2,
mistralai-Ministral-3-14B-Reasoning-2512 10, mistralai-Mistral-Nemo-Instruct-2407 3, moonshotai-Kimi-K2 4,
muse-glimmer 3, openai-gpt-oss-120b 17, openbmb-MiniCPM5-1B 8, unsloth-Apriel-1.5 3,
unsloth-mistral-Devstral-Small-2507 3
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from constraintd.engine.chat.templates.template_inputs import ChatMessage, ToolCall
from tests import reference

_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<raw>(?:u8)?R"(?P<delim>[^(\s]*)\((?P<body>.*?)\)(?P=delim)")
  | (?P<string>(?:u8)?"(?:\\.|[^"\\\n])*")
  | (?P<char>'(?:\\.|[^'\\])+')
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<number>\d[\w.]*)
  | (?P<punct>::|->|.)
""", re.VERBOSE | re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0", "?": "?", "/": "/"}
_REASONING = {"COMMON_REASONING_FORMAT_NONE": "none", "COMMON_REASONING_FORMAT_AUTO": "auto",
              "COMMON_REASONING_FORMAT_DEEPSEEK": "deepseek",
              "COMMON_REASONING_FORMAT_DEEPSEEK_LEGACY": "deepseek-legacy"}
_CHOICE = {"COMMON_CHAT_TOOL_CHOICE_AUTO": "auto", "COMMON_CHAT_TOOL_CHOICE_REQUIRED": "required",
           "COMMON_CHAT_TOOL_CHOICE_NONE": "none"}
_BOOL = {"true": True, "false": False}
# common_chat_continuation, as llama-server's continue_final_message names it (common_chat_continuation_parse)
_CONTINUATION = {"COMMON_CHAT_CONTINUATION_NONE": "none", "COMMON_CHAT_CONTINUATION_AUTO": "auto",
                 "COMMON_CHAT_CONTINUATION_REASONING": "reasoning_content",
                 "COMMON_CHAT_CONTINUATION_CONTENT": "content"}
# common_chat_msg's fields in declaration order (a brace initialiser gives them so), and the parameters of
# test-chat.cpp's simple_assist_msg(content, reasoning_content, tool_name, arguments, id)
_MESSAGE_FIELDS = ("role", "content", "content_parts", "tool_calls", "reasoning_content", "tool_name",
                   "tool_call_id")
_SIMPLE_ASSIST = ("content", "reasoning_content", "tool_name", "arguments", "id")


@dataclass(frozen=True, slots=True)
class CppCase:
    """One `.test(...)...run()` of llama.cpp's tests/test-chat.cpp: a template, a text and its request."""

    template: str  # the file name under models/templates/
    line: int  # where the `.test(` is in test-chat.cpp
    text: str  # the generated text, as llama.cpp's tests/test-chat.cpp writes it at `line`
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str = "auto"
    parallel_tool_calls: bool = False
    reasoning_format: str = "none"
    enable_thinking: bool = True
    json_schema: Any = None
    messages: tuple[ChatMessage, ...] = ()  # none given: the builder's default, one user message
    add_generation_prompt: bool = True
    continue_final_message: str = "none"  # or "auto", "reasoning_content", "content": the last message's
    partial: bool = False  # is_partial: the text read as a stream's text so far

    @property
    def name(self) -> str:
        return f"test-chat.cpp:{self.line}"


class _Skip(Exception):
    """A call this reader does not take (see the module's docstring)."""


def _tokens(source: str) -> list[tuple[str, str, int]]:
    found = []
    line = 1
    for match in _TOKEN.finditer(source):
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            if match.group("raw") is not None:
                found.append(("string", match.group("body"), line))
            elif kind == "string":
                text = _unescape(match.group()[match.group().index('"') + 1:-1])
                found.append(("string", text, line) if text is not None else ("bytes", "", line))
            else:
                found.append((kind, match.group(), line))
        line += match.group().count("\n")
    return found


def _unescape(body: str) -> str | None:
    # C++ escapes, to the bytes they stand for; None where those bytes are no UTF-8 text
    out = bytearray()
    for match in re.finditer(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{1,2}|.)|[^\\]+", body, re.DOTALL):
        escape = match.group(1)
        if escape is None:
            out += match.group().encode()
        elif escape[0] == "u":
            out += chr(int(escape[1:], 16)).encode()
        elif escape[0] == "x":
            out.append(int(escape[1:], 16))
        else:
            out += _ESCAPES[escape].encode()
    try:
        return out.decode()
    except UnicodeDecodeError:
        return None


def _strings(tokens: list[tuple[str, str, int]]) -> str:
    if not tokens or any(kind != "string" for kind, _, _ in tokens):
        raise _Skip("a text that is not string literals")
    return "".join(value for _, value, _ in tokens)


def _group(tokens: list[tuple[str, str, int]], at: int) -> int:
    # the index after the bracket that closes the one at `at`
    depth = 0
    for index in range(at, len(tokens)):
        value = tokens[index][1] if tokens[index][0] == "punct" else ""
        depth += value in "({[" and value != ""
        depth -= value in ")}]" and value != ""
        if depth == 0:
            return index + 1
    raise ValueError("unbalanced brackets in test-chat.cpp")


def _split_args(tokens: list[tuple[str, str, int]]) -> list[list[tuple[str, str, int]]]:
    parts: list[list[tuple[str, str, int]]] = [[]]
    index = 0
    while index < len(tokens):
        kind, value, _ = tokens[index]
        if kind == "punct" and value in "({[":
            end = _group(tokens, index)
            parts[-1].extend(tokens[index:end])
            index = end
            continue
        if kind == "punct" and value == ",":
            parts.append([])
        else:
            parts[-1].append(tokens[index])
        index += 1
    return [part for part in parts if part]


@dataclass(slots=True)
class _Definitions:
    tools: dict[str, dict[str, Any]]
    tool_lists: dict[str, list[str]]
    strings: dict[str, str]
    # a common_chat_msg variable's fields, by name, each definition with the token index it starts at (a
    # name defined again in another block: the use takes the last definition before it)
    messages: dict[str, list[tuple[int, dict[str, Any]]]]


def _brace_message(parts: list[list[tuple[str, str, int]]]) -> dict[str, Any]:
    # common_chat_msg{ role, content, content_parts, tool_calls, reasoning_content, tool_name, tool_call_id }
    fields: dict[str, Any] = {}
    for name, part in zip(_MESSAGE_FIELDS, parts, strict=False):
        if name in ("content_parts", "tool_calls"):
            if [value for _, value, _ in part] != ["{", "}"]:
                raise _Skip(f"a message's {name}")
        else:
            fields[name] = _strings(part)
    return fields


def _simple_assist(parts: list[list[tuple[str, str, int]]]) -> dict[str, Any]:
    # test-chat.cpp's simple_assist_msg: an assistant message, with one tool call where a name or id is given
    given = dict(zip(_SIMPLE_ASSIST, (_strings(part) for part in parts), strict=False))
    fields: dict[str, Any] = {"role": "assistant", "content": given.get("content", ""),
                              "reasoning_content": given.get("reasoning_content", "")}
    if given.get("tool_name") or given.get("id"):
        fields["tool_calls"] = (ToolCall(given.get("tool_name", ""), given.get("arguments", ""),
                                         given.get("id", "")),)
    return fields


def _message_definition(tokens: list[tuple[str, str, int]], index: int, known: _Definitions) -> None:
    # `common_chat_msg name{...}`, `common_chat_msg name = simple_assist_msg(...)`, or `common_chat_msg name;`
    # followed by `name.field = "...";` assignments
    name, opening = tokens[index + 1][1], tokens[index + 2][1]
    try:
        if opening == "{":
            fields = _brace_message(_split_args(tokens[index + 3:_group(tokens, index + 2) - 1]))
        elif opening == "=" and tokens[index + 3][1] == "simple_assist_msg" and tokens[index + 4][1] == "(":
            fields = _simple_assist(_split_args(tokens[index + 5:_group(tokens, index + 4) - 1]))
        elif opening == ";":
            fields = {}
            at = index + 3
            while (tokens[at][1] == name and tokens[at + 1][1] == "." and tokens[at + 3][1] == "="
                   and tokens[at + 2][1] in _MESSAGE_FIELDS):
                end = next(i for i in range(at + 4, len(tokens)) if tokens[i][1] == ";")
                fields[tokens[at + 2][1]] = _strings(tokens[at + 4:end])
                at = end + 1
        else:
            return
    except _Skip:
        return
    known.messages.setdefault(name, []).append((index, fields))


def _definitions(tokens: list[tuple[str, str, int]]) -> _Definitions:
    found = _Definitions({}, {}, {}, {})
    for index, (kind, value, _) in enumerate(tokens):
        if kind != "ident" or index + 2 >= len(tokens):
            continue
        if value == "common_chat_msg" and tokens[index + 1][0] == "ident":
            _message_definition(tokens, index, found)
        name_kind, name, _ = tokens[index + 1]
        opening = tokens[index + 2][1]
        if value == "common_chat_tool" and name_kind == "ident" and opening == "{":
            parts = _split_args(tokens[index + 3:_group(tokens, index + 2) - 1])
            try:
                tool_name, description, parameters = (_strings(part) for part in parts)
            except (_Skip, ValueError):
                continue
            found.tools[name] = {"type": "function", "function": {
                "name": tool_name, "description": description, "parameters": json.loads(parameters)}}
        if value == "char" and tokens[index + 1][1] == "*" and tokens[index + 3][1] == "=":
            end = next(i for i in range(index + 4, len(tokens)) if tokens[i][1] == ";")
            try:
                found.strings[tokens[index + 2][1]] = _strings(tokens[index + 4:end])
            except _Skip:
                continue
        if value == "common_chat_tool" and tokens[index + 1][1] == ">" and tokens[index + 3][1] == "{":
            parts = _split_args(tokens[index + 4:_group(tokens, index + 3) - 1])
            if all(len(part) == 1 and part[0][0] == "ident" for part in parts):
                found.tool_lists[tokens[index + 2][1]] = [part[0][1] for part in parts]
    return found


def _tools(args: list[tuple[str, str, int]], known: _Definitions) -> tuple[dict[str, Any], ...]:
    if len(args) == 1 and args[0][1] in known.tool_lists:
        names = known.tool_lists[args[0][1]]
    elif args and args[0][1] == "{":
        parts = _split_args(args[1:-1])
        if not all(len(part) == 1 and part[0][1] in known.tools for part in parts):
            raise _Skip("tools that are not named definitions")
        names = [part[0][1] for part in parts]
    else:
        raise _Skip("tools that are not named definitions")
    return tuple(known.tools[name] for name in names)


def _messages(args: list[tuple[str, str, int]], at: int, known: _Definitions) -> tuple[ChatMessage, ...]:
    # `{ name, ... }` of messages defined before `at`
    if not args or args[0][1] != "{":
        raise _Skip("messages that are not named definitions")
    messages = []
    for part in _split_args(args[1:-1]):
        definitions = known.messages.get(part[0][1], []) if len(part) == 1 else []
        before = [fields for start, fields in definitions if start < at]
        if not before:
            raise _Skip("messages that are not named definitions")
        messages.append(ChatMessage(**before[-1]))
    return tuple(messages)


def _setting(name: str, args: list[tuple[str, str, int]], known: _Definitions,
             at: int) -> tuple[str, Any] | None:
    word = args[0][1] if len(args) == 1 else ""
    if name == "reasoning_format":
        return "reasoning_format", _REASONING[word]
    if name == "tool_choice":
        return "tool_choice", _CHOICE[word]
    if name in ("enable_thinking", "parallel_tool_calls"):
        return name, _BOOL[word]
    if name == "tools":
        return "tools", _tools(args, known)
    if name == "json_schema":
        text = known.strings[word] if word in known.strings else _strings(args)
        return "json_schema", json.loads(text)
    if name == "add_generation_prompt":
        return "add_generation_prompt", _BOOL[word]
    if name == "continue_final_message":
        return "continue_final_message", _CONTINUATION[word]
    if name == "messages":
        return "messages", _messages(args, at, known)
    if name == "is_partial":
        return "partial", _BOOL[word]
    if name.startswith("expect"):
        return None
    raise _Skip(f"{name}(...)")


@cache
def _read() -> tuple[tuple[CppCase, ...], Counter[str]]:
    path = reference.require(reference.llama_cpp_dir() / "tests" / "test-chat.cpp")
    tokens = _tokens(Path(path).read_text())
    known = _definitions(tokens)
    testers: dict[str, str | None] = {}
    found = []
    skipped: Counter[str] = Counter()
    for index, (kind, value, line) in enumerate(tokens):
        if value == "peg_tester" and tokens[index + 1][1] == "(" and tokens[index - 1][1] == "=":
            first = tokens[index + 2]
            template = first[1].rsplit("/", 1)[-1] if first[0] == "string" else None
            testers[tokens[index - 2][1]] = template
        if not (kind == "ident" and value in testers and tokens[index + 1][1] == "."
                and tokens[index + 2][1] == "test" and tokens[index + 3][1] == "("):
            continue
        end = _group(tokens, index + 3)
        settings: dict[str, Any] = {}
        try:
            template = testers[value]
            if template is None:
                raise _Skip("a tester whose template is a variable")
            text = _strings(tokens[index + 4:end - 1])
            while tokens[end][1] == "." and tokens[end + 1][1] != "run":
                name, closing = tokens[end + 1][1], _group(tokens, end + 2)
                setting = _setting(name, tokens[end + 3:closing - 1], known, index)
                if setting is not None:
                    settings[setting[0]] = setting[1]
                end = closing
        except _Skip as exc:
            skipped[str(exc)] += 1
            continue
        found.append(CppCase(template, line, text, **settings))
    return tuple(found), skipped


def cpp_cases() -> tuple[CppCase, ...]:
    """Every case of the read form in the pinned tests/test-chat.cpp, in the file's order."""
    return _read()[0]


def skipped_calls() -> Counter[str]:
    """The `.test(...)` calls not read, counted by reason."""
    return Counter(_read()[1])


def cases_by_template() -> dict[str, list[CppCase]]:
    """The cases read, by template file name."""
    by_template: dict[str, list[CppCase]] = {}
    for case in cpp_cases():
        by_template.setdefault(case.template, []).append(case)
    return by_template
