"""constraintd.engine.chat.parsing.message_parser: the assistant's message from a whole generated text, or a
stream's text so far, as llama.cpp's chat parser reads it.

The oracle test runs tests/chat_oracle/messages.py's texts on every auto-parser template through
llama.cpp's common_chat_parse (the harness's "parse" mode), whole and partial, and through `parse_message`
with the same mode (and, as a stream reads them, each request's longest text cut at prefixes drawn at random,
partial): content, reasoning
content and tool calls identical, or both sides refusing; requests whose tool grammar or parser is not ported
(the tag formats' grammars llama.cpp's chat params build that are not ported) are counted apart. A response
schema's answers are among the texts.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from constraintd.engine.chat.analysis.reasoning import ReasoningAnalysis, ReasoningMode
from constraintd.engine.chat.analysis.template_analysis import (
    CallIdPosition,
    TemplateAnalysis,
    ToolFormat,
    ToolMode,
)
from constraintd.engine.chat.params.chat_params import ChatGrammar, NotPorted
from constraintd.engine.chat.parsing.message_parser import (
    MessageParseError,
    ParsedMessage,
    ParsedToolCall,
    parse_message,
)
from tests.chat_oracle.cases import template_paths
from tests.chat_oracle.messages import REQUESTS, compare_messages, compare_streams, message_texts
from tests.conftest import OracleReport
from tests.engine.chat.params.test_chat_params import SPECIALISED

TEMPLATES = [path for path in template_paths() if path.stem not in SPECIALISED]

# A template that writes each call as <tool_call>{"name": ..., "arguments": ...}</tool_call> (Qwen 2.5)
HERMES = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.JSON_NATIVE, per_call_start="<tool_call>\n", per_call_end="</tool_call>",
    parameter_order=["name", "arguments"])))
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
PROMPT = "<|im_start|>assistant\n"


def test_a_call_after_content_is_read() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"} }\n</tool_call>'
    message = parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert message.content == "Let me look.\n"
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"city": "Paris"}'),)


def test_text_without_a_call_is_content() -> None:
    message = parse_message("It is mild.", HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert (message.content, message.tool_calls) == ("It is mild.", ())


def test_a_call_cut_short_keeps_what_was_read() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    message = parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"ci'),)


def test_an_unknown_tool_does_not_match() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS)


# A template that writes each call as {"name": arguments} in a list in a section (Apertus)
KEYED = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.JSON_NATIVE, section_start="<|tools_prefix|>", section_end="<|tools_suffix|>",
    fun_name_is_key=True, tools_array_wrapped=True)))


def test_a_call_whose_name_is_its_key_has_its_name_before_the_closing_quote() -> None:
    # the name is a literal between two quote literals, not atomic: read whole, the call is kept
    cut = parse_message('<|tools_prefix|>[{"get_weather', KEYED, generation_prompt=PROMPT, tools=TOOLS)
    assert cut.tool_calls == (ParsedToolCall("get_weather", "{"),)
    short = parse_message('<|tools_prefix|>[{"get_weathe', KEYED, generation_prompt=PROMPT, tools=TOOLS)
    assert short.tool_calls == ()


def test_a_partial_text_that_does_not_match_past_its_start_is_an_empty_message() -> None:
    # common_chat_parse with is_partial: the failed parse ends past the input's start (the generation prompt
    # at least), so llama-server's stream gets an empty message, not an error
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert parse_message(text, HERMES, generation_prompt=PROMPT, tools=TOOLS, partial=True) == ParsedMessage()
    matched = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    assert parse_message(matched, HERMES, generation_prompt=PROMPT, tools=TOOLS, partial=True) == \
        parse_message(matched, HERMES, generation_prompt=PROMPT, tools=TOOLS)


def test_a_required_calls_failure_ends_inside_the_call() -> None:
    # the calls are not optional when tool_choice is required: the failure ends at the unknown name, past the
    # marker, so a partial read is an empty message even with no generation prompt
    text = '<function=get_time>{}</function>'
    assert parse_message(text, FUNCTIONARY, generation_prompt="", tools=TOOLS, tool_choice="required",
                         partial=True) == ParsedMessage()
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, FUNCTIONARY, generation_prompt="", tools=TOOLS, tool_choice="auto", partial=True)


def test_a_partial_answer_is_empty_past_its_value_and_refused_at_its_start() -> None:
    # the answer's value matches and the end does not follow: the failure ends past the value; no value at
    # all (and no generation prompt): the failure ends at the input's start, where llama.cpp throws
    grammar = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis()))
    text = '{"city": "Paris"} and more'
    assert parse_message(text, grammar, generation_prompt="", has_response_format=True,
                         partial=True) == ParsedMessage()
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message("Paris", grammar, generation_prompt="", has_response_format=True, partial=True)


# A thinking template (Qwen 3): a response schema's answer after the thinking block
THINKING = ChatGrammar(analysis=TemplateAnalysis(
    ReasoningAnalysis(ReasoningMode.TAG_BASED, "<think>", "</think>")))


def test_a_response_schemas_answer_is_read_after_the_thinking_block() -> None:
    text = '<think>\nThe city is Paris.\n</think>\n\n```json\n{"city": "Paris"}\n```'
    message = parse_message(text, THINKING, generation_prompt=PROMPT, has_response_format=True)
    assert (message.reasoning_content, message.content) == ("\nThe city is Paris.\n", '{"city": "Paris"}')
    cut = parse_message('<think>x</think>{"city": "Pa', THINKING, generation_prompt=PROMPT,
                        has_response_format=True)
    assert (cut.reasoning_content, cut.content) == ("x", '{"city": "Pa')


def test_a_response_schemas_answer_that_is_no_value_does_not_match() -> None:
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message('<think>x</think>{"city": "Paris"} and more', THINKING, generation_prompt=PROMPT,
                      has_response_format=True)


# A tag format with JSON arguments (Functionary 3.1): <function=name>{...}</function>
FUNCTIONARY = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.TAG_WITH_JSON, per_call_start="<function=", per_call_end="</function>", name_suffix=">")))


def test_a_tag_formats_call_after_content_is_read() -> None:
    text = 'Let me look.\n<function=get_weather>{"city": "Paris"}</function>'
    message = parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert message.content == "Let me look.\n"
    assert message.tool_calls == (ParsedToolCall("get_weather", '{"city": "Paris"}'),)


def test_a_tag_formats_call_is_kept_once_its_open_is_read() -> None:
    cut = parse_message('<function=get_weather>{"ci', FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert cut.tool_calls == (ParsedToolCall("get_weather", '{"ci'),)
    opened = parse_message("<function=get_weather>", FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert opened.tool_calls == (ParsedToolCall("get_weather", "{"),)
    inside = parse_message("<function=get_weather", FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    assert inside.tool_calls == ()


def test_a_tag_formats_second_call_needs_parallel_calls() -> None:
    text = '<function=get_weather>{}</function>\n<function=get_weather>{"city": "Paris"}</function>'
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS)
    message = parse_message(text, FUNCTIONARY, generation_prompt=PROMPT, tools=TOOLS,
                            parallel_tool_calls=True)
    assert message.tool_calls == (ParsedToolCall("get_weather", "{}"),
                                  ParsedToolCall("get_weather", '{"city": "Paris"}'))


# Mistral Small 3.2's calls: [TOOL_CALLS]name[ARGS] then an optional [CALL_ID]id, [ARGS] and the JSON, with
# neither a close nor an end marker (llama.cpp's analysis reads [ARGS] as the name's suffix and the id's)
CALL_IDS = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.TAG_WITH_JSON, per_call_start="[TOOL_CALLS]", name_suffix="[ARGS]",
    call_id_position=CallIdPosition.BETWEEN_FUNC_AND_ARGS, call_id_prefix="[CALL_ID]",
    call_id_suffix="[ARGS]")))


def test_a_call_id_before_the_arguments_is_read_once_it_is_closed() -> None:
    def calls(text: str) -> tuple[ParsedToolCall, ...]:
        return parse_message(text, CALL_IDS, generation_prompt=PROMPT, tools=TOOLS).tool_calls

    call = '[TOOL_CALLS]get_weather[ARGS][CALL_ID]a1B2 \n[ARGS]{"city": "Paris"}'
    assert calls(call) == (ParsedToolCall("get_weather", '{"city": "Paris"}', "a1B2"),)
    assert calls('[TOOL_CALLS]get_weather[ARGS][ARGS]{}') == (ParsedToolCall("get_weather", "{}"),)
    # cut inside the id: the call stands with no id; cut after it: with it
    assert calls("[TOOL_CALLS]get_weather[ARGS][CALL_ID]a1") == (ParsedToolCall("get_weather", "{"),)
    after = calls("[TOOL_CALLS]get_weather[ARGS][CALL_ID]a1[ARGS]")
    assert after == (ParsedToolCall("get_weather", "{", "a1"),)
    # the id's suffix is not optional, and a call ends where its arguments and the space after them do
    assert calls("[TOOL_CALLS]get_weather[ARGS][ARGS]{} \n") == (ParsedToolCall("get_weather", "{}"),)
    with pytest.raises(MessageParseError):
        calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')
    with pytest.raises(MessageParseError):
        calls('[TOOL_CALLS]get_weather[ARGS][ARGS]{} and more')


# The same calls as llama.cpp's analysis reads them without the template's special tokens: the name has no
# suffix, the call id follows it: [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
CALL_IDS_NO_SUFFIX = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
    ToolMode.TAG_WITH_JSON, per_call_start="[TOOL_CALLS]",
    call_id_position=CallIdPosition.BETWEEN_FUNC_AND_ARGS, call_id_prefix="[CALL_ID]",
    call_id_suffix="[ARGS]")))


def test_a_name_without_suffix_keeps_its_call_once_its_call_id_is_read() -> None:
    # atomic(open + call id): nothing of the call stands until [ARGS] closes the id
    def calls(text: str) -> tuple[ParsedToolCall, ...]:
        return parse_message(text, CALL_IDS_NO_SUFFIX, generation_prompt=PROMPT, tools=TOOLS).tool_calls

    assert calls('[TOOL_CALLS]get_weather[CALL_ID]12345[ARGS]{"city": "Paris"}') == (
        ParsedToolCall("get_weather", '{"city": "Paris"}', "12345"),)
    assert calls("[TOOL_CALLS]get_weather[CALL_ID]123") == ()
    assert calls("[TOOL_CALLS]get_weather") == ()
    assert calls("[TOOL_CALLS]get_weather[CALL_ID]123[ARGS]") == (ParsedToolCall("get_weather", "{", "123"),)


def test_a_tag_format_with_argument_markers_is_not_ported() -> None:
    analysis = TemplateAnalysis(ReasoningAnalysis(), tools=ToolFormat(
        ToolMode.TAG_WITH_JSON, per_call_start="<function=", per_call_end="</function>", name_suffix=">",
        args_start="<args>"))
    with pytest.raises(NotPorted, match="argument markers"):
        parse_message("x", ChatGrammar(analysis=analysis), generation_prompt=PROMPT, tools=TOOLS)


# A tag format with tagged arguments (GLM 4.6):
# <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>
TAGGED_FORMAT = ToolFormat(
    ToolMode.TAG_WITH_TAGGED, per_call_start="<tool_call>", per_call_end="</tool_call>", name_suffix="\n",
    arg_name_prefix="<arg_key>", arg_name_suffix="</arg_key>\n", arg_value_prefix="<arg_value>",
    arg_value_suffix="</arg_value>\n")
TAGGED = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=TAGGED_FORMAT))
# a string argument, a required one, and an optional JSON one
SEARCH = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "max": {"type": "integer"}},
    "required": ["query"]}}}]


def _tagged(name: str, *arguments: tuple[str, str]) -> str:
    written = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"
                      for key, value in arguments)
    return f"<tool_call>{name}\n{written}</tool_call>"


def test_tagged_arguments_become_the_json_object_llama_cpp_writes() -> None:
    text = "Let me look.\n" + _tagged("search", ("max", "[3, {\"a\": 1}]"), ("query", "café"))
    with pytest.raises(MessageParseError):  # the required argument comes first
        parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    text = "Let me look.\n" + _tagged("search", ("query", "café"), ("max", "[3, {\"a\": 1}]"))
    message = parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    assert message.content == "Let me look.\n"
    assert message.tool_calls == (ParsedToolCall("search", '{"query":"café","max":[3, {"a": 1}]}'),)


def test_a_tagged_string_value_is_escaped_and_never_trimmed() -> None:
    text = _tagged("search", ("query", '\n "hi" \\ {\t'))
    message = parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    assert message.tool_calls == (ParsedToolCall("search", '{"query":"\\n \\"hi\\" \\\\ {\\t"}'),)
    empty = parse_message(_tagged("search", ("query", "")), TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    assert empty.tool_calls == (ParsedToolCall("search", '{"query":""}'),)


@pytest.mark.parametrize(("value", "arguments"), [
    ('{"site": "a\nb"}', '{"query":"x","max":{"site": "a\nb"}}'),  # a raw newline: llama.cpp's JSON takes it
    (" 3", None), ("3 ", None), ("three", None), ("01", None), ('"\\q"', None),
], ids=["raw newline", "space before", "space after", "no JSON", "leading zero", "bad escape"])
def test_a_tagged_json_value_is_read_as_llama_cpps_peg_json(value: str, arguments: str | None) -> None:
    text = _tagged("search", ("query", "x"), ("max", value))
    if arguments is None:
        with pytest.raises(MessageParseError):
            parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
        return
    message = parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    assert message.tool_calls == (ParsedToolCall("search", arguments),)


@pytest.mark.parametrize(("text", "arguments"), [
    ("<tool_call>sea", None),  # inside the open: no call
    ("<tool_call>search\n", "{"),
    ("<tool_call>search\n<arg_key>que", "{"),  # inside an argument's open: nothing of it
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_val", '{"query":'),
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>caf", '{"query":"caf'),
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>café</arg_", '{"query":"café'),
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n", '{"query":"x"'),
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n<arg_key>max</arg_key>\n"
     "<arg_value>[1, 2", '{"query":"x","max":[1, 2'),
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n<arg_key>max</arg_key>\n"
     '<arg_value>{"a": "b\\', '{"query":"x","max":{"a": "b'),  # a backslash begun is not read
    ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\n</tool_c", '{"query":"x"'),
], ids=["name", "open", "argument name", "value prefix", "string value", "value suffix", "argument",
        "JSON value", "JSON escape", "call's end"])
def test_a_tagged_call_cut_short_keeps_what_the_mapper_read(text: str, arguments: str | None) -> None:
    message = parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    assert message.tool_calls == (() if arguments is None else (ParsedToolCall("search", arguments),))


def test_a_second_tagged_call_needs_parallel_calls() -> None:
    text = _tagged("search", ("query", "a")) + "\n" + _tagged("search", ("query", "b"))
    with pytest.raises(MessageParseError, match="does not match the expected"):
        parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    message = parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH, parallel_tool_calls=True)
    assert message.tool_calls == (ParsedToolCall("search", '{"query":"a"}'),
                                  ParsedToolCall("search", '{"query":"b"}'))


def test_tagged_calls_in_a_section_are_parted_by_a_comma() -> None:
    # MiniMax M2: no call markers, the section holds the calls, more after ", "
    tools = dataclasses.replace(TAGGED_FORMAT, per_call_start="", per_call_end="", section_start="<calls>",
                                section_end="</calls>", function_close="</invoke>")
    grammar = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=tools))
    one = "search\n<arg_key>query</arg_key>\n<arg_value>a</arg_value>\n</invoke>"
    with pytest.raises(MessageParseError):
        parse_message(f"<calls>{one}\n{one}</calls>", grammar, generation_prompt=PROMPT, tools=SEARCH,
                      parallel_tool_calls=True)
    message = parse_message(f"<calls>{one}, {one}</calls>", grammar, generation_prompt=PROMPT, tools=SEARCH,
                            parallel_tool_calls=True)
    assert len(message.tool_calls) == 2


def test_a_name_without_suffix_keeps_its_call_once_an_argument_shows() -> None:
    # GLM 4.7: the name has no suffix; the open is atomic up to a look at the first argument's marker, the
    # whole function where no argument is required
    tools = dataclasses.replace(TAGGED_FORMAT, name_suffix="", arg_name_suffix="</arg_key>",
                                arg_value_suffix="</arg_value>")
    grammar = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=tools))
    for cut, calls in (("<tool_call>search", 0), ("<tool_call>search<arg_k", 0),
                       ("<tool_call>search<arg_key>q", 1)):
        assert len(parse_message(cut, grammar, generation_prompt=PROMPT, tools=SEARCH).tool_calls) == calls
    optional = [{"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}}]
    cut = "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value>"
    assert parse_message(cut, grammar, generation_prompt=PROMPT, tools=optional).tool_calls == ()
    whole = parse_message(cut + "</tool_call>", grammar, generation_prompt=PROMPT, tools=optional)
    assert whole.tool_calls == (ParsedToolCall("search", '{"query":"x"}'),)


def test_space_before_the_calls_end_where_the_template_tolerates_it() -> None:
    text = _tagged("search", ("query", "x")).replace("</tool_call>", " \n</tool_call>")
    with pytest.raises(MessageParseError):
        parse_message(text, TAGGED, generation_prompt=PROMPT, tools=SEARCH)
    tolerant = dataclasses.replace(TAGGED_FORMAT, tolerate_intertag_whitespace=True)
    grammar = ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=tolerant))
    message = parse_message(text, grammar, generation_prompt=PROMPT, tools=SEARCH)
    assert message.tool_calls == (ParsedToolCall("search", '{"query":"x"}'),)


def test_tagged_call_ids_are_not_ported() -> None:
    tools = dataclasses.replace(TAGGED_FORMAT, call_id_position=CallIdPosition.BETWEEN_FUNC_AND_ARGS,
                                call_id_prefix="[ID]", call_id_suffix="[ARGS]")
    with pytest.raises(NotPorted, match="the parser of the tag formats' call ids"):
        parse_message("x", ChatGrammar(analysis=TemplateAnalysis(ReasoningAnalysis(), tools=tools)),
                      generation_prompt=PROMPT, tools=SEARCH)


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_messages_are_llama_cpps(path: Path, chat_oracle: Path, oracle_report: OracleReport) -> None:
    """Every text the project parses gives llama.cpp's message."""
    comparisons = compare_messages(chat_oracle, path, now=int(time.time()))
    parsed = [c for c in comparisons if c.not_ported is None]
    oracle_report.add("chat parser: content, reasoning, tool calls", path.stem,
                      identical=sum(c.identical for c in parsed), total=len(comparisons))
    assert [c.describe() for c in parsed if not c.identical] == []


@pytest.mark.oracle
@pytest.mark.parametrize("path", TEMPLATES, ids=[path.stem for path in TEMPLATES])
def test_a_streams_text_so_far_is_read_as_llama_cpp_reads_it(path: Path, chat_oracle: Path,
                                                             oracle_report: OracleReport) -> None:
    """Each request's longest text cut at 12 prefixes drawn at random, read partial (llama-server's stream):
    llama.cpp's message, or both sides refusing."""
    comparisons = compare_streams(chat_oracle, path, REQUESTS, message_texts, now=int(time.time()), cuts=12)
    parsed = [c for c in comparisons if c.not_ported is None]
    oracle_report.add("chat parser: a stream's text so far", path.stem,
                      identical=sum(c.identical for c in parsed), total=len(comparisons))
    assert [c.describe() for c in parsed if not c.identical] == []
