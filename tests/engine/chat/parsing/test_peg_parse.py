"""Tests of constraintd.engine.chat.parsing.peg_parse: a PEG arena run on a text as llama.cpp's
parser_executor runs it, and the hand-written formats' messages it gives through `parse_message`.

The unit tests hold the executor's rules at the end of the text (lenient parsing), lookaheads, atomic and
until. The oracle test parses texts a model of each hand-written format writes (content, thinking then
content, calls alone, after content and two of them, calls cut short at several points, an unknown tool,
malformed text, a response schema's answers) under tool_choice auto, required and none, parallel calls on and
off, through llama.cpp's common_chat_parse (the harness's "parse" mode) and through `parse_message` on the
project's chat params, each text read whole and partial (a stream's text so far): content, reasoning
content and tool calls (name, arguments, id) identical, or both sides refusing. A format whose parse is not
ported refuses with NotPorted and is counted as not identical; a request without a grammar is parsed with its
format's parser, as llama.cpp parses it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from constraintd.engine.chat.formats.qwen3_coder import GENERATION_PREFIX as QWEN_PROMPT
from constraintd.engine.chat.formats.qwen3_coder import qwen3_coder_params
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted, format_grammar
from constraintd.engine.chat.parsing.message_parser import MessageParseError, ParsedMessage, parse_message
from constraintd.engine.chat.parsing.peg_parse import (
    Outcome,
    TaggedNode,
    message,
    normalize_quotes_to_json,
    run,
)
from constraintd.engine.chat.peg_arena import PegArena
from tests.chat_oracle.cases import SEARCH_TOOL, WEATHER_TOOL, template_paths
from tests.chat_oracle.messages import ParseRequest, Request, compare_streams
from tests.conftest import OracleReport
from tests.engine.chat.params.test_chat_params import PORTED_FORMATS, SPECIALISED


def _outcome(arena: PegArena, text: str, *, lenient: bool = True) -> tuple[Outcome, int]:
    result = run(arena, text, lenient=lenient)
    return result.outcome, result.end


def _tagged(arena: PegArena, text: str) -> list[tuple[str, str]]:
    return [(node.tag, node.text) for node in run(arena, text).visit()]


# -- the executor
def test_a_literal_cut_by_the_end_needs_more_input_only_when_lenient() -> None:
    p = PegArena()
    p.root = p.literal("<tool_call>")
    assert _outcome(p, "<tool") == (Outcome.NEED_MORE, 5)
    assert _outcome(p, "<tool", lenient=False) == (Outcome.FAIL, 0)
    assert _outcome(p, "<tool_x") == (Outcome.FAIL, 0)
    assert _outcome(p, "<tool_call>!") == (Outcome.SUCCESS, 11)


def test_until_stops_at_a_delimiter_or_at_its_start_cut_by_the_end() -> None:
    p = PegArena()
    p.root = p.until_one_of(["</think>", "<tool_call>"])
    assert _outcome(p, "abc</think>x") == (Outcome.SUCCESS, 3)
    assert _outcome(p, "abc</thi") == (Outcome.SUCCESS, 3)  # a partial delimiter at the end stops it
    assert _outcome(p, "abc</x") == (Outcome.NEED_MORE, 6)  # no delimiter: the whole text, more may come
    assert _outcome(p, "abc</x", lenient=False) == (Outcome.SUCCESS, 6)


def test_rest_always_needs_more_input() -> None:
    p = PegArena()
    p.root = p.rest()
    assert _outcome(p, "all of it") == (Outcome.NEED_MORE, 9)


def test_a_repetition_tries_nothing_at_the_end_and_needs_more_when_short() -> None:
    p = PegArena()
    p.root = p.repeat(p.literal("ab"), 2, 3)
    assert _outcome(p, "ab") == (Outcome.NEED_MORE, 2)  # one of two, the text ended
    assert _outcome(p, "abx") == (Outcome.FAIL, 2)
    assert _outcome(p, "ababab") == (Outcome.SUCCESS, 6)
    assert _outcome(p, "aba") == (Outcome.NEED_MORE, 3)  # the child itself cut short
    r = PegArena()
    r.root = r.zero_or_more(r.literal("ab"))
    assert _outcome(r, "abab") == (Outcome.SUCCESS, 4)  # not tried again at the end: no need for more
    q = PegArena()
    q.root = q.sequence(q.zero_or_more(q.literal("x")), q.literal("y"))
    assert _outcome(q, "xx") == (Outcome.NEED_MORE, 2)  # the repetition stops at the end: "y" needs more


def test_lookaheads_consume_nothing_and_not_propagates_need_more() -> None:
    p = PegArena()
    p.root = p.sequence(p.peek(p.literal("ab")), p.literal("a"))
    assert _outcome(p, "abc") == (Outcome.SUCCESS, 1)
    assert _outcome(p, "ac") == (Outcome.FAIL, 0)
    q = PegArena()
    q.root = q.sequence(q.negate(q.literal("ab")), q.any())
    assert _outcome(q, "ac") == (Outcome.SUCCESS, 1)
    assert _outcome(q, "ab") == (Outcome.FAIL, 0)
    assert _outcome(q, "a") == (Outcome.NEED_MORE, 0)  # "ab" might still come


def test_an_atomic_parser_cut_short_drops_its_nodes() -> None:
    p = PegArena()
    name = p.tag(p.literal("get_weather"), "tool-name")
    p.root = p.choice(p.atomic(p.tag(p.sequence(p.literal("<f="), name), "tool-open")), p.eps())
    assert _tagged(p, "<f=get_we") == []
    assert _tagged(p, "<f=get_weather") == [("tool-open", "<f=get_weather"), ("tool-name", "get_weather")]
    q = PegArena()
    q.root = q.sequence(q.literal("<f="), q.tag(q.literal("get_weather"), "tool-name"))
    assert _tagged(q, "<f=get_we") == [("tool-name", "get_we")]  # not atomic: kept


def test_a_choice_takes_the_first_that_does_not_fail() -> None:
    p = PegArena()
    p.root = p.choice(p.literal("abc"), p.literal("a"))
    assert _outcome(p, "ab") == (Outcome.NEED_MORE, 2)  # the first needs more: the second is not tried
    assert _outcome(p, "ax") == (Outcome.SUCCESS, 1)


def test_json_values_cut_short_need_more_input() -> None:
    p = PegArena()
    p.root = p.json()
    assert _outcome(p, '{"a": [1, 2.5e3, "x\\"y"], "b": null}') == (Outcome.SUCCESS, 36)
    assert _outcome(p, '{"a": "x\\') == (Outcome.NEED_MORE, 8)  # a string cut in an escape
    assert _outcome(p, '{"a": 1') == (Outcome.NEED_MORE, 7)  # a number cut: what follows is not known
    assert _outcome(p, '{"a": tru') == (Outcome.NEED_MORE, 9)
    assert _outcome(p, '{"a": x}') == (Outcome.FAIL, 0)


def test_end_matches_only_at_the_end_of_the_text() -> None:
    p = PegArena()
    p.root = p.sequence(p.literal("a"), p.end())
    assert _outcome(p, "a") == (Outcome.SUCCESS, 1)
    assert _outcome(p, "ab") == (Outcome.FAIL, 1)
    q = PegArena()
    q.root = q.sequence(q.literal("a"), q.eps())
    assert _outcome(q, "ab") == (Outcome.SUCCESS, 1)  # an epsilon, not end(): the rest is left


def test_a_string_of_another_delimiter_takes_its_escape() -> None:
    p = PegArena()
    p.root = p.sequence(p.literal("'"), p.string_content("'"), p.literal("'"))
    assert _outcome(p, "'it\\'s'x") == (Outcome.SUCCESS, 7)
    assert _outcome(p, "'it\\\"s'") == (Outcome.FAIL, 1)  # \" is no escape of a single-quoted string
    assert _outcome(p, "'it") == (Outcome.NEED_MORE, 3)


def test_chars_counts_and_negated_classes() -> None:
    p = PegArena()
    p.root = p.sequence(p.chars("[^:}]", 1, -1), p.literal(":"))
    assert _outcome(p, "key:") == (Outcome.SUCCESS, 4)
    assert _outcome(p, ":") == (Outcome.FAIL, 0)
    q = PegArena()
    q.root = q.chars("[0-9]", 2, 3)
    assert _outcome(q, "1") == (Outcome.NEED_MORE, 1)
    assert _outcome(q, "1x") == (Outcome.FAIL, 1)
    assert _outcome(q, "1234") == (Outcome.SUCCESS, 3)


def test_the_mapper_writes_tagged_arguments_as_json() -> None:
    nodes = [TaggedNode("tool-open", "<function=f>\n"), TaggedNode("tool-name", "f"),
             TaggedNode("tool-arg-open", ""), TaggedNode("tool-arg-name", "city"),
             TaggedNode("tool-arg-string-value", 'Pa"ris'), TaggedNode("tool-arg-close", ""),
             TaggedNode("tool-arg-open", ""), TaggedNode("tool-arg-name", "n"),
             TaggedNode("tool-arg-value", "{'a': True}"), TaggedNode("tool-close", "")]
    content, reasoning, calls = message(nodes)
    assert (content, reasoning) == ("", "")
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"city":"Pa\\"ris","n":{"a": true}}')]


def test_a_call_cut_in_a_string_value_keeps_the_arguments_read() -> None:
    nodes = [TaggedNode("tool-open", ""), TaggedNode("tool-name", "f"), TaggedNode("tool-arg-name", "city"),
             TaggedNode("tool-arg-string-value", "Par")]
    # named, so listed at once; never closed, so its quote and brace stay open
    assert [(c.name, c.arguments) for c in message(nodes)[2]] == [("f", '{"city":"Par')]


def test_an_empty_string_value_always_opens_a_quote() -> None:
    # llama.cpp's rule, kept as it is: an empty string value writes its quote even after another value's
    def arguments(*values: str) -> str:
        nodes = [TaggedNode("tool-open", ""), TaggedNode("tool-name", "f"), TaggedNode("tool-arg-name", "a")]
        nodes += [TaggedNode("tool-arg-string-value", value) for value in values]
        nodes += [TaggedNode("tool-arg-close", ""), TaggedNode("tool-close", "")]
        return message(nodes)[2][0].arguments
    assert arguments("") == '{"a":""}'
    assert arguments("x", "") == '{"a":"x""}'


def test_python_literals_and_quotes_become_json() -> None:
    written = normalize_quotes_to_json("{'a': 'it\\'s', 'b': None, 'c': Tr}")
    assert written == '{"a": "it\'s", "b": null, "c": tr}'


# -- parse_message on a hand-written format's chat params
def _qwen3_coder_grammar(**request: Any) -> Any:
    return format_grammar(qwen3_coder_params("", tools=[WEATHER_TOOL], **request))


def test_parse_message_runs_the_formats_own_parser() -> None:
    text = "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" \
           "</function>\n</tool_call>"
    message = parse_message(text, _qwen3_coder_grammar(), generation_prompt=QWEN_PROMPT, tools=[WEATHER_TOOL])
    assert message.content == "Let me look.\n"
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city":"Paris"}')]


def test_a_text_the_format_does_not_match_is_refused_with_llama_cpps_words() -> None:
    grammar = _qwen3_coder_grammar(tool_choice="required")
    with pytest.raises(MessageParseError, match="does not match the expected peg-native format"):
        parse_message("<tool_call>\n<oops>", grammar, generation_prompt=QWEN_PROMPT, tools=[WEATHER_TOOL])
    # read as a stream's text so far, the failure past the input's start is an empty message
    partial = parse_message("<tool_call>\n<oops>", grammar, generation_prompt=QWEN_PROMPT,
                            tools=[WEATHER_TOOL], partial=True)
    assert partial == ParsedMessage()


def test_a_format_request_without_a_grammar_is_parsed_with_its_parser() -> None:
    grammar = _qwen3_coder_grammar(tool_choice="none")
    assert grammar.grammar == "" and grammar.arena is not None  # llama.cpp builds the parser all the same
    message = parse_message("Paris.", grammar, generation_prompt=QWEN_PROMPT, tools=[WEATHER_TOOL],
                            tool_choice="none")
    assert (message.content, message.tool_calls) == ("Paris.", ())


def test_an_arena_with_a_tag_without_a_name_is_refused() -> None:
    p = PegArena()
    p.root = p.tag(p.rest())
    grammar = ChatGrammar(arena=p, format_name="qwen3-coder")
    with pytest.raises(NotPorted, match=r"^the parser of the qwen3-coder format$"):
        parse_message("Paris.", grammar, generation_prompt="")


# -- the oracle: texts a model of each hand-written format writes
TEMPLATES = [path for path in template_paths() if SPECIALISED.get(path.stem) in PORTED_FORMATS]
CITY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}
# (name, tools, tool_choice, parallel_tool_calls, response schema)
REQUESTS: tuple[Request, ...] = (
    ("no tools", None, "auto", False, None),
    ("auto", [WEATHER_TOOL, SEARCH_TOOL], "auto", False, None),
    ("required", [WEATHER_TOOL, SEARCH_TOOL], "required", False, None),
    ("auto parallel", [WEATHER_TOOL, SEARCH_TOOL], "auto", True, None),
    ("none", [WEATHER_TOOL, SEARCH_TOOL], "none", False, None),
    ("response schema", None, "auto", False, CITY_SCHEMA),
)


def _qwen3_coder_call(name: str, arguments: list[tuple[str, str]], *, opened: bool = True) -> str:
    args = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments)
    return ("<tool_call>\n" if opened else "") + f"<function={name}>\n{args}</function>\n</tool_call>"


def _cuts(text: str, marks: list[str]) -> dict[str, str]:
    # the text cut just after each mark's first occurrence
    return {f"cut after {mark!r}": text[:text.index(mark) + len(mark)] for mark in marks}


def _qwen3_coder_texts() -> dict[str, str]:
    weather = _qwen3_coder_call("get_weather", [("city", "Paris")])
    search = _qwen3_coder_call("search", [("query", "café « crème »"), ("filters", '{"max": 3}')])
    both = weather + "\n" + search
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": "<think>\nThe user asks about France.\n</think>\n\nParis.",
        "thinking cut": "<think>\nThe user asks",
        "thought, content": "The user asks about France.\n</think>\n\nParis.",  # the prompt opened it
        "thought, call": "I need the weather.\n</think>\n\n" + weather,
        "call": weather,
        "content, call": "Let me look.\n" + weather,
        "thinking, call": "<think>\nI need the weather.\n</think>\n\n" + weather,
        "two calls": both,
        "call without its opening tag": _qwen3_coder_call("get_weather", [("city", "Paris")], opened=False),
        "arguments out of order": _qwen3_coder_call("search", [("filters", '{"max": 3}'), ("query", "x")]),
        "optional argument left out": _qwen3_coder_call("search", [("query", "x")]),
        "empty string argument": _qwen3_coder_call("get_weather", [("city", "")]),
        "multi-line string argument": _qwen3_coder_call("search", [("query", "a\n  b \"c\"")]),
        "unknown tool": _qwen3_coder_call("lookup", [("q", "x")]),
        "unknown argument": _qwen3_coder_call("get_weather", [("town", "Paris")]),
        "argument not JSON": _qwen3_coder_call("search", [("query", "x"), ("filters", "max 3")]),
        "malformed call": "<tool_call>\n<function=get_weather>\n<city>Paris</city>\n</function>\n"
                          "</tool_call>",
        "content after the call": weather + "\nDone.",
        "content with a stray tag": "Use <tool_call> to call.",
    }
    texts.update(_cuts(both, ["<tool_c", "<function=get_w", "<function=get_weather>\n", "<param",
                              "<parameter=city>\nPa", "Paris\n</param", "</parameter>\n", "</function>\n",
                              "</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\n",
                              "<parameter=filters>\n{\"max\": 3",
                              "<parameter=filters>\n{\"max\": 3}\n</para"]))
    return texts


def _ministral3_texts() -> dict[str, str]:
    weather = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    search = '[TOOL_CALLS]search[ARGS]{"query": "café « crème »", "filters": {"max": 3}}'
    both = weather + search
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": "[THINK]The user asks about France.[/THINK]Paris.",
        "thinking cut": "[THINK]The user asks",
        "call": weather,
        "content, call": "Let me look.\n" + weather,
        "thinking, call": "[THINK]I need the weather.[/THINK]" + weather,
        "two calls": both,
        "two calls apart": weather + "\n" + search,
        "call spaced": '[TOOL_CALLS]get_weather[ARGS] {"city": "Paris"} ',
        "unknown tool": '[TOOL_CALLS]lookup[ARGS]{"q": "x"}',
        "arguments not an object": '[TOOL_CALLS]get_weather[ARGS]"Paris"',
        "malformed call": '[TOOL_CALLS]get_weather{"city": "Paris"}',
        "content after the call": weather + "\nDone.",
        "content with a stray tag": "Use [TOOL_CALLS] to call.",
    }
    texts.update(_cuts(both, ["[TOOL_", "[TOOL_CALLS]get_w", "[TOOL_CALLS]get_weather[AR", "[ARGS]",
                              '[ARGS]{"ci', '"Par', '"Paris"', '"Paris"}[TOOL_CALLS]sea',
                              '"filters": {"max": 3']))
    return texts


def _kimi_k2_call(name: str, index: int, arguments: str) -> str:
    opened = f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
    return opened + arguments + "<|tool_call_end|>"


def _kimi_k2_texts() -> dict[str, str]:
    weather = _kimi_k2_call("get_weather", 0, '{"city": "Paris"}')
    search = _kimi_k2_call("search", 1, '{"query": "café « crème »", "filters": {"max": 3}}')
    section = "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"
    both = section.format(weather + search)
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": "<think>The user asks about France.</think>Paris.",
        "thinking cut": "<think>The user asks",
        "call": section.format(weather),
        "content, call": "Let me look.\n" + section.format(weather),
        "thinking, call": "<think>I need the weather.</think>" + section.format(weather),
        "call inside the thinking": "<think>I need the weather." + section.format(weather),
        "two calls": both,
        "call without its section": weather,
        "call without its end": section.format(weather.removesuffix("<|tool_call_end|>")),
        "unknown tool": section.format(_kimi_k2_call("lookup", 0, '{"q": "x"}')),
        "arguments not an object": section.format(_kimi_k2_call("get_weather", 0, '"Paris"')),
        "malformed call": section.format("<|tool_call_begin|>get_weather:0{}<|tool_call_end|>"),
        "content after the call": section.format(weather) + "\nDone.",
    }
    texts.update(_cuts(both, [
        "<|tool_calls_sec", "<|tool_call_begin|>functions.get_w", "functions.get_weather:",
        "get_weather:0<|tool_call_argument", '<|tool_call_argument_begin|>{"ci', '"Par', '"Paris"}',
        '"Paris"}<|tool_call_end|>', "functions.search:1", '"filters": {"max": 3']))
    return texts


def _deepseek_call(name: str, arguments: list[tuple[str, str, bool]]) -> str:
    dsml = "｜DSML｜"
    args = "".join(f'<{dsml}parameter name="{key}" string="{"true" if string else "false"}">{value}'
                   f"</{dsml}parameter>\n" for key, value, string in arguments)
    return f'<{dsml}invoke name="{name}">\n{args}</{dsml}invoke>'


def _deepseek_texts(source: str) -> dict[str, str]:
    block = "function_calls" if "function_calls" in source else "tool_calls"
    opened, closed = f"<｜DSML｜{block}>\n", f"\n</｜DSML｜{block}>"
    weather = _deepseek_call("get_weather", [("city", "Paris", True)])
    search = _deepseek_call("search", [("query", "café « crème »", True), ("filters", '{"max": 3}', False)])
    both = opened + weather + "\n" + search + closed
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": "<think>The user asks about France.</think>Paris.",
        "thought, content": "The user asks about France.</think>Paris.",
        "thinking cut": "<think>The user asks",
        "call": opened + weather + closed,
        "content, call": "Let me look.\n\n" + opened + weather + closed,
        "thinking, call": "<think>I need the weather.</think>" + opened + weather + closed,
        "call inside the thinking": "<think>I need the weather.\n\n" + opened + weather + closed,
        "two calls": both,
        "optional argument left out": opened + _deepseek_call("search", [("query", "x", True)]) + closed,
        "empty string argument": opened + _deepseek_call("get_weather", [("city", "", True)]) + closed,
        "unknown tool": opened + _deepseek_call("lookup", [("q", "x", True)]) + closed,
        "argument not JSON": opened + _deepseek_call(
            "search", [("query", "x", True), ("filters", "max", False)]) + closed,
        "malformed call": opened + "<｜DSML｜invoke>get_weather</｜DSML｜invoke>" + closed,
        "content after the call": opened + weather + closed + "\nDone.",
    }
    texts.update(_cuts(both, [f"<｜DSML｜{block[:4]}", '<｜DSML｜invoke name="get_w', 'get_weather">\n',
                              '<｜DSML｜parameter name="ci', 'string="true">Pa', "Paris</｜DSML｜para",
                              "</｜DSML｜invoke>", '<｜DSML｜invoke name="search">\n', '{"max": 3']))
    return texts


def _kimi_k3_call(name: str, index: int, arguments: list[tuple[str, str, str]]) -> str:
    args = "".join(f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'
                   for key, value, kind in arguments)
    return f'<|open|>call tool="{name}" index="{index}"<|sep|>{args}<|close|>call<|sep|>'


def _kimi_k3_texts() -> dict[str, str]:
    weather = _kimi_k3_call("get_weather", 0, [("city", "Paris", "string")])
    search = _kimi_k3_call("search", 1, [
        ("query", "café « crème »", "string"), ("filters", '{"max": 3}', "object")])
    # the generation prompt opens the think section: a call comes after the thought's close
    section = ("Checking.<|close|>think<|sep|><|open|>tools<|sep|>{}<|close|>tools<|sep|>"
               "<|close|>message<|sep|>")
    both = section.format(weather + search)
    think = "<|open|>think<|sep|>{}<|close|>think<|sep|>"
    response = "<|open|>response<|sep|>{}<|close|>response<|sep|>"
    texts = {
        "content": response.format("Paris is the capital of France.") + "<|close|>message<|sep|>",
        "bare content": "Paris is the capital of France.",
        "thinking, content": think.format("The user asks about France.") + response.format("Paris.")
        + "<|close|>message<|sep|>",
        "thinking cut": "<|open|>think<|sep|>The user asks",
        "call": section.format(weather),
        "call without a thought": section.format(weather).removeprefix("Checking.<|close|>think<|sep|>"),
        "content, call": response.format("Let me look.") + section.format(weather),
        "thinking, call": think.format("I need the weather.") + section.format(weather),
        "two calls": both,
        "empty string argument": section.format(_kimi_k3_call("get_weather", 0, [("city", "", "string")])),
        "unknown tool": section.format(_kimi_k3_call("lookup", 0, [("q", "x", "string")])),
        "unknown argument": section.format(_kimi_k3_call("get_weather", 0, [("town", "x", "string")])),
        "malformed call": section.format("<|open|>call get_weather<|close|>call<|sep|>"),
        "content after the call": section.format(weather) + "Done.",
    }
    texts.update(_cuts(both, ["<|open|>to", '<|open|>call tool="get_w', 'tool="get_weather" ind',
                              '<|open|>argument key="ci', 'type="string"<|sep|>Pa', "Paris<|close|>arg",
                              "<|close|>call<|sep|>", 'tool="search" index="1"<|sep|>', '{"max": 3',
                              "<|close|>tools<|sep|>"]))
    return texts


def _gemma4_texts() -> dict[str, str]:
    mark = '<|"|>'
    weather = f"<|tool_call>call:get_weather{{city:{mark}Paris{mark}}}<tool_call|>"
    search = (f"<|tool_call>call:search{{query:{mark}café « crème »{mark},filters:{{max:3}}}}<tool_call|>")
    both = weather + search
    think = "<|channel>thought\n{}<channel|>"
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": think.format("The user asks about France.") + "Paris.",
        "thinking cut": "<|channel>thought\nThe user asks",
        "empty channel, thinking": "<|channel><|channel>thought\nHm.<channel|>Paris.",
        "call": weather,
        "content, call": "Let me look.\n" + weather,
        "thinking, call": think.format("I need the weather.") + weather,
        "two calls": both,
        "values of every kind": f"<|tool_call>call:search{{query:{mark}a \"b\"{mark},filters:{{max:-1.5e2,"
                                f"list:[1,{mark}x{mark},true,null],empty:{{}}}}}}<tool_call|>",
        "unknown tool": f"<|tool_call>call:lookup{{q:{mark}x{mark}}}<tool_call|>",
        "arguments not a dict": "<|tool_call>call:get_weather(Paris)<tool_call|>",
        "malformed call": "<|tool_call>get_weather{}<tool_call|>",
        "content after the call": weather + "Done.",
    }
    texts.update(_cuts(both, [
        "<|tool_c", "call:get_w", "call:get_weather{", "{ci", "city:<|", f"city:{mark}Pa", f"Paris{mark}",
        f"Paris{mark}}}", "<tool_call|>", "query:", "filters:{max:3", "filters:{max:3}"]))
    return texts


def _lfm2_texts() -> dict[str, str]:
    weather = "get_weather(city=\"Paris\")"
    search = "search(query='café « crème »', filters={'max': 3})"
    call = "<|tool_call_start|>[{}]<|tool_call_end|>"
    both = call.format(weather + ", " + search)
    texts = {
        "content": "Paris is the capital of France.",
        "thinking, content": "<think>The user asks about France.</think>Paris.",
        "thinking cut": "<think>The user asks",
        "call": call.format(weather),
        "content, call": "Let me look.\n" + call.format(weather),
        "thinking, call": "<think>I need the weather.</think>" + call.format(weather),
        "two calls": both,
        "JSON and Python literals": call.format('search(query="a \\"b\\"", filters={"max": 3, "on": True, '
                                                '"off": false, "none": None, "list": [1, \'x\']})'),
        "unknown tool": call.format("lookup(q='x')"),
        "unknown argument": call.format("get_weather(town='x')"),
        "string argument not quoted": call.format("get_weather(city=Paris)"),
        "malformed call": call.format("get_weather{'city': 'Paris'}"),
        "content after the call": call.format(weather) + "Done.",
    }
    texts.update(_cuts(both, ["<|tool_call_st", "[get_w", "get_weather(", "(ci", 'city="Pa', '"Paris"',
                              '"Paris")', ", sea", "query='caf", "{'max': 3", "{'max': 3})"]))
    return texts


def _texts(calls: dict[str, str], both: str, marks: list[str], **more: str) -> dict[str, str]:
    # the texts of a format from its calls: content, content then a call, two calls, cuts of the two calls
    texts = {"content": "Paris is the capital of France.", "content, call": "Let me look.\n" + calls["call"],
             **calls, **more}
    texts.update(_cuts(both, marks))
    return texts


def _gigachat_texts() -> dict[str, str]:
    call = ('<|message_sep|>\n\nfunction call<|role_sep|>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}')
    return _texts({"call": call, "call alone": call.removeprefix("<|message_sep|>\n\n"),
                   "unknown tool": call.replace("get_weather", "lookup"),
                   "malformed call": "<|message_sep|>\n\nfunction call<|role_sep|>\nget_weather(Paris)"},
                  call, ["<|message_sep|>\n\nfunc", "<|role_sep|>\n", '"name": "get_w', '"arguments": {"ci',
                         '"Paris"'])


def _functionary_texts() -> dict[str, str]:
    weather, search = 'get_weather\n{"city": "Paris"}', 'search\n{"query": "café", "filters": {"max": 3}}'
    both = weather + ">>>" + search
    return _texts({"call": weather, "two calls": both, "two calls apart": weather + "\n>>>" + search,
                   "content then a call": "all\nLet me look.>>>" + weather,
                   "content to all": "all\nParis.", "unknown tool": 'lookup\n{"q": "x"}',
                   "malformed call": "get_weather(Paris)"},
                  both, ["get_w", "get_weather\n", '{"ci', '"Paris"}', ">>>sea", '"max": 3'])


def _minicpm5_texts() -> dict[str, str]:
    weather = '<function name="get_weather"><param name="city">Paris</param></function>'
    search = ('<function name="search"><param name="query">café</param>'
              '<param name="filters">{"max": 3}</param></function>')
    both = "Hm.\n</think>\n" + weather + "\n" + search  # the prompt opens the thought
    return _texts({"call": "Hm.</think>" + weather, "two calls": both, "call in the thought": weather,
                   "thinking, content": "The user asks.</think>Paris.",
                   "unknown tool": weather.replace("get_weather", "lookup"),
                   "malformed call": "<function=get_weather>Paris</function>"},
                  both, ['<function name="get_w', 'get_weather">', '<param name="ci', 'city">Pa',
                         "Paris</param>",
                         "</function>", '{"max": 3'])


def _ling3_texts() -> dict[str, str]:
    weather = "<tool_call>get_weather<arg_key>city</arg_key>\n<arg_value>Paris</arg_value></tool_call>"
    search = ('<tool_call>search<arg_key>query</arg_key>\n<arg_value>café</arg_value>'
              '<arg_key>filters</arg_key>'
              '\n<arg_value>{"max": 3}</arg_value></tool_call>')
    both = weather + search
    return _texts({"call": weather, "two calls": both, "thinking, call": "<think>Hm.</think>" + weather,
                   "thinking, content": "<think>The user asks.</think>Paris.",
                   "unknown tool": weather.replace("get_weather", "lookup"),
                   "malformed call": "<tool_call>get_weather(Paris)</tool_call>"},
                  both, ["<tool_call>get_w", "<arg_key>ci", "<arg_value>Pa", "Paris</arg_value>",
                         "</tool_call>",
                         '{"max": 3'])


def _cohere2_texts() -> dict[str, str]:
    weather = '{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}'
    search = ('{"tool_call_id": "1", "tool_name": "search", '
              '"parameters": {"query": "café", "filters": {"max": 3}}}')
    action = "<|START_ACTION|>[{}]<|END_ACTION|>"
    both = action.format(weather + ", " + search)
    return _texts({"call": action.format(weather), "two calls": both,
                   "thinking, call": "<|START_THINKING|>Hm.<|END_THINKING|>" + action.format(weather),
                   "text": "<|START_TEXT|>Paris.<|END_TEXT|>",
                   "thinking, text": "<|START_THINKING|>Hm.<|END_THINKING|><|START_TEXT|>Paris.<|END_TEXT|>",
                   "unknown tool": action.format(weather.replace("get_weather", "lookup")),
                   "malformed call": "<|START_ACTION|>get_weather(Paris)<|END_ACTION|>"},
                  both, ["<|START_AC", '"tool_call_id": "0', '"tool_name": "get_w', '"parameters": {"ci',
                         '"Paris"}',
                         '"Paris"}}', '"max": 3'])


def _gpt_oss_texts() -> dict[str, str]:
    weather = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json' \
              '<|message|>' \
              '{"city": "Paris"}<|call|>'
    search = ('<|start|>assistant to=functions.search<|channel|>commentary json<|message|>'
              '{"query": "café"}<|call|>')
    both = weather.removeprefix("<|start|>assistant") + search  # the prompt ends in <|start|>assistant
    analysis = "<|channel|>analysis<|message|>The user asks.<|end|>"
    return _texts({"call": weather.removeprefix("<|start|>assistant"), "two calls": both,
                   "thinking, call": analysis + weather,
                   "final": "<|channel|>final<|message|>Paris.",
                   "thinking, final": analysis + "<|start|>assistant<|channel|>final<|message|>Paris.",
                   "unknown tool": weather.replace("get_weather", "lookup"),
                   "malformed call": "<|start|>assistant<|channel|>commentary get_weather(Paris)<|call|>"},
                  both, ["<|chan", "to=functions.get_w", "<|constrain|>js",
                         '<|message|>{"ci',
                         '"Paris"}', "<|call|>", "to=functions.search<|channel|>"])


def _muse_glimmer_texts() -> dict[str, str]:
    def call(name: str, arguments: list[tuple[str, str]]) -> str:
        args = "".join(f'<atem:parameter name="{key}">{value}</atem:parameter>' for key, value in arguments)
        return f'<atem:invoke name="{name}">{args}</atem:invoke>'
    block = "<|start|>assistant to={}<|message|><atem:function_calls>{}</atem:function_calls><|eom|>"
    weather = block.format("get_weather", call("get_weather", [("city", "Paris")]))
    search = block.format("search", call("search", [("query", "café"), ("filters", '{"max": 3}')]))
    both = weather.removeprefix("<|start|>assistant") + search  # the prompt ends in <|start|>assistant
    thought = " to=self<|message|>Hm.<|eom|>"
    return _texts({"call": weather.removeprefix("<|start|>assistant"), "two calls": both,
                   "thinking, call": thought + weather,
                   "answer": " to=user<|message|>Paris.<|eot|>",
                   "thinking, answer": thought + "<|start|>assistant to=user<|message|>Paris.<|eot|>",
                   "unknown tool": weather.replace("get_weather", "lookup"),
                   "malformed call": "<|start|>assistant to=get_weather<|message|>get_weather(Paris)<|eom|>"},
                  both, [" to=get_w", "<atem:function_c", '<atem:invoke name="get_w',
                         '<atem:parameter name="ci', 'city">Pa', "Paris</atem:parameter>", "</atem:invoke>",
                         '{"max": 3'])


def _minimax_m3_texts() -> dict[str, str]:
    ns = "]<]minimax[>["

    def call(name: str, arguments: str) -> str:
        return f'{ns}<invoke name="{name}">{arguments}{ns}</invoke>'

    block = ns + "<tool_call>{}" + ns + "</tool_call>"
    weather = call("get_weather", f"{ns}<city>Paris{ns}</city>")
    search = call("search", f"{ns}<query>café{ns}</query>{ns}<filters>{ns}<max>3{ns}</max>{ns}</filters>")
    both = "Hm.</mm:think>" + block.format(weather + search)
    return _texts({"call": "Hm.</mm:think>" + block.format(weather), "two calls": both,
                   "call in the thought": block.format(weather), "thinking, content": "Hm.</mm:think>Paris.",
                   "unknown tool": block.format(call("lookup", f"{ns}<q>x{ns}</q>")),
                   "malformed call": block.format("get_weather(Paris)")},
                  both, [f"{ns}<tool_c", '<invoke name="get_w', 'get_weather">', f"{ns}<ci", "<city>Pa",
                         f"Paris{ns}</ci", f"{ns}</invoke>", f"{ns}<max>3", f"{ns}</filters>"])


def _answers() -> dict[str, str]:
    return {
        "answer": '{"city": "Paris"}',
        "answer spaced": ' { "city" : "Paris" } ',
        "thinking, answer": '<think>\nJSON then.\n</think>\n\n{"city": "Paris"}',
        "answer cut": '{"city": "Pa',
        "answer cut in a key": '{"ci',
        "answer and more": '{"city": "Paris"} trailing',
        "no answer": "Paris",
        "fenced answer": '```json\n{"city": "Paris"}\n```',
    }


def _generic_texts() -> dict[str, str]:
    # a format whose parse is not ported yet: its requests are refused whatever the text
    return {"content": "Paris is the capital of France.", "malformed": "<|unknown|>"}


# the refusals left, by template, each exact and named: none
REFUSALS: dict[str, set[str]] = {}

FORMAT_TEXTS: dict[str, Callable[[str], dict[str, str]]] = {
    "qwen3-coder": lambda _: _qwen3_coder_texts(), "ministral-3": lambda _: _ministral3_texts(),
    "kimi-k2": lambda _: _kimi_k2_texts(), "deepseek-v3.2": _deepseek_texts,
    "kimi-k3": lambda _: _kimi_k3_texts(), "gemma4": lambda _: _gemma4_texts(),
    "lfm2": lambda _: _lfm2_texts(), "lfm2.5": lambda _: _lfm2_texts(),
    "gigachat-v3": lambda _: _gigachat_texts(), "functionary-v3.2": lambda _: _functionary_texts(),
    "minicpm5": lambda _: _minicpm5_texts(), "ling-3": lambda _: _ling3_texts(),
    "cohere2-moe": lambda _: _cohere2_texts(), "gpt-oss": lambda _: _gpt_oss_texts(),
    "muse-glimmer": lambda _: _muse_glimmer_texts(), "minimax-m3": lambda _: _minimax_m3_texts(),
}


def compare(binary: Path, path: Path, *, now: int) -> list[tuple[str, str, Any, Any, str | None]]:
    """(request, text name, ours, llama.cpp's, NotPorted message) for every request and text, each read
    whole and partial."""
    source = path.read_text()
    format_name = SPECIALISED[path.stem]
    found: list[tuple[str, str, Any, Any, str | None]] = []
    for name, tool_list, choice, parallel, schema in REQUESTS:
        try:
            request = ParseRequest.make(source, name, tool_list, choice, parallel, schema, now=now)
        except NotPorted as exc:
            found.append((name, "*", None, {}, str(exc)))
            continue
        texts = (_answers() if schema is not None else
                 FORMAT_TEXTS.get(format_name, lambda _: _generic_texts())(source))
        for text_name, text in texts.items():
            for partial in (False, True):
                ours, llama, not_ported = request.compare(binary, text, partial=partial)
                found.append((name, text_name + (" (partial)" if partial else ""), ours, llama, not_ported))
    return found


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_format_messages_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every text a hand-written format's parse gives is llama.cpp's message; the rest is refused."""
    comparisons = compare(chat_oracle, path, now=int(time.time()))
    parsed = [c for c in comparisons if c[4] is None]
    oracle_report.add("chat parser of a hand-written format", path.stem,
                      identical=sum(ours == llama for _, _, ours, llama, _ in parsed), total=len(comparisons))
    different = [f"{request}, {text}: ours {ours!r}, llama.cpp {llama!r}"
                 for request, text, ours, llama, _ in parsed if ours != llama]
    assert not different, "\n".join(different[:10])
    refused = {c[4] for c in comparisons if c[4] is not None}
    if SPECIALISED[path.stem] not in FORMAT_TEXTS:
        assert refused <= {f"the parser of the {format_of_name(path)} format"}
    else:
        # a request without a grammar is parsed like any other (llama.cpp builds its parser all the same)
        assert refused == REFUSALS.get(path.stem, set())


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_a_streams_text_so_far_is_read_as_llama_cpp_reads_it(path: Path, chat_oracle: Path,
                                                             oracle_report: OracleReport) -> None:
    """Each request's longest text cut at 12 prefixes drawn at random, read partial (llama-server's stream):
    llama.cpp's message, or both sides refusing."""
    format_name = SPECIALISED[path.stem]

    def texts(request: ParseRequest) -> dict[str, str]:
        if request.schema is not None:
            return _answers()
        return FORMAT_TEXTS.get(format_name, lambda _: _generic_texts())(request.source)

    comparisons = compare_streams(chat_oracle, path, REQUESTS, texts, now=int(time.time()), cuts=12)
    parsed = [c for c in comparisons if c.not_ported is None]
    oracle_report.add("chat parser of a hand-written format: a stream's text so far", path.stem,
                      identical=sum(c.identical for c in parsed), total=len(comparisons))
    assert [c.describe() for c in parsed if not c.identical] == []


def format_of_name(path: Path) -> str:
    name = SPECIALISED[path.stem]
    return "lfm2" if name == "lfm2.5" else name
