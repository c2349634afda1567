"""Continuing the final message (constraintd/engine/chat/templates/continuation.py): the chat's split, and the
prompt and generation prompt beside llama.cpp's on every template of the reference.

The oracle test sends each template a user message and a partial assistant turn to continue (its reasoning
and content, its reasoning alone, its content alone, its content as text parts; after a tool's call and
result), with continue_final_message true, "reasoning_content" and "content", to the harness ("apply" mode:
common_chat_templates_apply) and to the project's path (continued_chat, chat_prompt_of, chat_grammar_of,
continued_prompt), and compares the prompt and the generation prompt byte for byte, or both sides refusing.
Ling 3's parser, the one that reads the continuation, is compared through its grammar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from constraintd.chat_templates import chat_grammar_of, chat_prompt_of
from constraintd.engine.chat.analysis.reasoning import ReasoningAnalysis, ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import TemplateAnalysis
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.templates.continuation import (
    Continuation,
    ContinuedChat,
    continued_chat,
    continued_prompt,
    parse_continuation,
    parser_input,
)
from constraintd.engine.chat.templates.prompt import ChatPrompt, template_source
from constraintd.engine.chat.templates.template_inputs import (
    ChatMessage,
    ChatRequestError,
    ContentPart,
    ToolCall,
    parse_messages,
    parse_tools,
)
from sampler_worker.prompt import TemplateError
from tests.chat_oracle.build import run_harness
from tests.chat_oracle.cases import BOS_TOKEN, EOS_TOKEN, WEATHER_TOOL, template_paths
from tests.conftest import OracleReport

USER = ChatMessage("user", "Hey there!")
BOTH = ChatMessage("assistant", "Hello, ", reasoning_content="I'm thinking")
THOUGHT = ChatMessage("assistant", reasoning_content="I'm")
PARTS = ChatMessage("assistant", content_parts=(ContentPart("text", "Hello,"), ContentPart("text", "world")))


@pytest.mark.parametrize(("value", "expected"), [
    (True, Continuation.AUTO), ("reasoning_content", Continuation.REASONING),
    ("content", Continuation.CONTENT), (False, Continuation.NONE), (None, Continuation.NONE),
    ("auto", Continuation.NONE), (1, Continuation.NONE),
], ids=["true", "reasoning_content", "content", "false", "null", "other word", "number"])
def test_the_request_value_is_read_as_llama_cpp_reads_it(value: Any, expected: Continuation) -> None:
    assert parse_continuation(value) is expected


def test_nothing_continued_keeps_the_chat() -> None:
    chat = continued_chat([USER, BOTH], Continuation.NONE, add_generation_prompt=True)
    assert chat == ContinuedChat((USER, BOTH), True)


@pytest.mark.parametrize(("message", "asked", "continued"), [
    (BOTH, Continuation.AUTO, Continuation.CONTENT),
    (THOUGHT, Continuation.AUTO, Continuation.REASONING),
    (PARTS, Continuation.AUTO, Continuation.CONTENT),
    (ChatMessage("assistant", content_parts=(ContentPart("text", ""),), reasoning_content="r"),
     Continuation.AUTO, Continuation.CONTENT),
    (BOTH, Continuation.REASONING, Continuation.REASONING),
    (THOUGHT, Continuation.CONTENT, Continuation.CONTENT),
], ids=["auto, content", "auto, reasoning only", "auto, parts", "auto, reasoning and parts", "reasoning",
        "content"])
def test_the_last_message_is_split_off_and_auto_resolved(message: ChatMessage, asked: Continuation,
                                                         continued: Continuation) -> None:
    chat = continued_chat([USER, message], asked, add_generation_prompt=True)
    assert chat == ContinuedChat((USER,), False, message, continued)


def test_an_empty_message_is_dropped_but_not_continued() -> None:
    # has_continuation: nothing to continue, though the message is not rendered and no generation prompt added
    empty = ChatMessage("assistant")
    assert continued_chat([USER, empty], Continuation.CONTENT) == ContinuedChat((USER,), False)
    assert continued_chat([], Continuation.AUTO) == ContinuedChat((), False)


def _auto(start: str, end: str) -> ChatGrammar:
    analysis = TemplateAnalysis(reasoning=ReasoningAnalysis(ReasoningMode.TAG_BASED, start, end))
    return ChatGrammar(analysis=analysis)


@pytest.mark.parametrize(("generation_prompt", "grammar", "message", "continuation", "expected"), [
    ("<a>\n<think>\n", _auto("<think>\n", "</think>"), BOTH, Continuation.CONTENT,
     "<a>\n<think>\nI'm thinking</think>Hello, "),
    ("<a>\n<think>\n", _auto("<think>\n", "</think>"), THOUGHT, Continuation.REASONING, "<a>\n<think>\nI'm"),
    ("<a>\n", _auto("<think>", "</think>"), BOTH, Continuation.REASONING, "<a>\n<think>I'm thinking"),
    ("<a>\n", ChatGrammar(), BOTH, Continuation.CONTENT, "<a>\nHello, "),
    ("<a>\n", ChatGrammar(), BOTH, Continuation.REASONING, "<a>\n"),
    ("<a>\n", ChatGrammar(), PARTS, Continuation.CONTENT, "<a>\nHello,\n\nworld"),
], ids=["content after the thought", "the thought", "a start tag the prompt does not hold", "no thought",
        "no thought, reasoning", "text parts"])
def test_the_auto_parsers_generation_prompt_is_continued(generation_prompt: str, grammar: ChatGrammar,
                                                          message: ChatMessage, continuation: Continuation,
                                                          expected: str) -> None:
    made = continued_prompt("", ChatPrompt("P" + generation_prompt, generation_prompt),
                            ContinuedChat((USER,), False, message, continuation), grammar)
    assert made == ChatPrompt("P" + generation_prompt + expected, expected)


def test_nothing_continued_keeps_the_prompt() -> None:
    prompt = ChatPrompt("P<a>", "<a>")
    assert continued_prompt("", prompt, ContinuedChat((USER,), False), _auto("<think>", "</think>")) is prompt


@pytest.mark.parametrize(("rendered", "continued", "expected"), [
    ("<a>\n", "<a>\nHello, ", ("<a>\n", "Hello, ")),
    ("<a>\n<think>\n", "<a>\n<think>I'm", ("<a>\n<think>I'm", "")),
], ids=["extended", "rebuilt"])
def test_the_parser_reads_the_continued_prompt(rendered: str, continued: str,
                                               expected: tuple[str, str]) -> None:
    assert parser_input(ChatPrompt("", rendered), ChatPrompt("", continued)) == expected


# The oracle: every template, each conversation's last message continued each way (after a tool's result,
# the prompt may not end a turn: Gemma 4's model turn goes on)
CALL = ChatMessage("assistant", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', "call00001"),))
RESULT = ChatMessage("tool", '{"temperature": 18}', tool_call_id="call00001")
CONVERSATIONS = {"reasoning and content": [USER, BOTH], "reasoning": [USER, THOUGHT],
                 "content": [USER, ChatMessage("assistant", "Hello")], "parts": [USER, PARTS],
                 "after a tool result": [USER, CALL, RESULT, BOTH]}
REQUESTS: dict[str, Any] = {"auto": True, "reasoning_content": "reasoning_content", "content": "content"}
TEMPLATES = template_paths()


def _llama(binary: Path, source: str, messages: list[ChatMessage], request: Any,
           tools: list[dict[str, Any]] | None = None, tool_choice: str = "auto") -> dict[str, Any]:
    answer = run_harness(binary, {
        "mode": "apply", "template": source, "bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN,
        "messages": [message.to_json() for message in messages], "continue_final_message": request,
        "reasoning_format": "auto", "tools": tools, "tool_choice": tool_choice})
    if "error" in answer:
        return {"error": answer["stage"]}
    made = {"prompt": answer["prompt"], "generation_prompt": answer["generation_prompt"]}
    return made | ({"grammar": answer["grammar"], "lazy": answer["grammar_lazy"]} if tools else {})


def _ours(source: str, messages: list[ChatMessage], request: Any,
          tools: list[dict[str, Any]] | None = None, tool_choice: str = "auto") -> dict[str, Any]:
    # both sides read the clock (llama.cpp's strftime_now does not take the request's time)
    chat = continued_chat(parse_messages([message.to_json() for message in messages]),
                          parse_continuation(request))
    try:
        prompt = chat_prompt_of(source, chat.messages, tools=parse_tools(tools), bos_text=BOS_TOKEN,
                                eos_text=EOS_TOKEN, add_generation_prompt=chat.add_generation_prompt)
        grammar = chat_grammar_of(source, chat.messages, tools=parse_tools(tools), tool_choice=tool_choice,
                                  bos_text=BOS_TOKEN, eos_text=EOS_TOKEN,
                                  generation_prompt=prompt.generation_prompt, continuation=chat.continuation)
    except (TemplateError, ChatRequestError):
        return {"error": "apply"}
    except NotPorted as exc:
        return {"not ported": str(exc)}
    made = continued_prompt(template_source(source), prompt, chat, grammar)
    ours = {"prompt": made.prompt, "generation_prompt": made.generation_prompt}
    return ours | ({"grammar": grammar.grammar, "lazy": grammar.grammar_lazy} if tools else {})


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_continued_prompts_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    source = path.read_text()
    differing = []
    for name, messages in CONVERSATIONS.items():
        for request_name, request in REQUESTS.items():
            ours, llama = _ours(source, messages, request), _llama(chat_oracle, source, messages, request)
            if ours != llama:
                differing.append(f"{name}, {request_name}: ours {ours!r}, llama.cpp {llama!r}")
    total = len(CONVERSATIONS) * len(REQUESTS)
    oracle_report.add("chat prompt: continued final message", path.stem, identical=total - len(differing),
                      total=total)
    assert not differing, "\n".join(differing)


@pytest.mark.oracle
@pytest.mark.parametrize("request_value", list(REQUESTS.values()), ids=list(REQUESTS))
def test_a_continued_ling3_thought_is_open_unless_the_content_is_continued(request_value: Any,
                                                                            chat_oracle: Path) -> None:
    # the one hand-written format whose parser reads the continuation: here its grammar, the whole turn's
    # where a tool call is required
    path = next(path for path in TEMPLATES if path.stem == "inclusionai-ling-3.0-flash")
    source = path.read_text()
    messages = CONVERSATIONS["reasoning and content"]
    ours = _ours(source, messages, request_value, [WEATHER_TOOL], "required")
    assert ours == _llama(chat_oracle, source, messages, request_value, [WEATHER_TOOL], "required")
    assert ours["grammar"]
    assert not ours["lazy"]
