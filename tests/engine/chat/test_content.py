"""The content rule (constraintd/engine/chat/content.py): what llama-server answers as the content of a
structured answer, complete, open, streamed and cut short.

The expected contents follow llama-server's response-format parser (common/chat-auto-parser-generator.cpp,
`autoparser::build_parser`) over llama.cpp's lenient JSON parser (common/peg-parser.cpp); llama.cpp's own
JSON-parser vectors (tests/peg-parser/test-json-parser.cpp) are read from the reference tree.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constraintd.engine.chat.content import (
    AnswerState,
    ContentStream,
    JsonAnswer,
    json_content,
    json_message,
    parse_json_answer,
)

OPEN, COMPLETE, INVALID = AnswerState.OPEN, AnswerState.COMPLETE, AnswerState.INVALID

# (id, raw answer, content, state)
ANSWERS = [
    ("empty", "", "", OPEN),
    ("space only", " \n", "", OPEN),
    ("object", '{"a": 1}', '{"a": 1}', COMPLETE),
    ("space around", ' \n {"a": 1} \n\n ', '{"a": 1}', COMPLETE),
    ("string value", '"42"\n', '"42"', COMPLETE),
    ("array", "[1, [2, {}], []]", "[1, [2, {}], []]", COMPLETE),
    ("literals", "[true, false, null]", "[true, false, null]", COMPLETE),
    ("c isspace inside", '{\v"a"\f:\r1\t}', '{\v"a"\f:\r1\t}', COMPLETE),
    ("raw newline in string", '{"a": "x\ny"}', '{"a": "x\ny"}', COMPLETE),
    ("every escape", r'"\" \\ \/ \b \f \n \r \t \u00e9"', r'"\" \\ \/ \b \f \n \r \t \u00e9"', COMPLETE),
    ("fenced", '```json\n{"a": 1}\n```', '{"a": 1}', COMPLETE),
    ("fenced tight", "```json[]```", "[]", COMPLETE),
    ("fenced after space", '\n ```json {"a": 1} ```', '{"a": 1}', COMPLETE),
    # Inside the fence: nothing is content until the value starts.
    ("cut in opening fence", "``", "", OPEN),
    ("cut after opening fence", "```json", "", OPEN),
    ("cut after fence line", "```json\n", "", OPEN),
    ("fenced open value", '```json\n{"a', '{"a', OPEN),
    ("cut in closing fence", '```json\n{"a": 1}\n``', '{"a": 1}', OPEN),
    ("before closing fence", '```json\n{"a": 1}\n', '{"a": 1}', OPEN),
    # An escape cut in half is not content.
    ("cut after backslash", '{"a": "x\\', '{"a": "x', OPEN),
    ("cut after \\u", '{"a": "x\\u', '{"a": "x', OPEN),
    ("cut after \\u00", '{"a": "x\\u00', '{"a": "x', OPEN),
    ("cut after \\u00e", '{"a": "x\\u00e', '{"a": "x', OPEN),
    ("whole \\u escape", '{"a": "x\\u00e9', '{"a": "x\\u00e9', OPEN),
    ("whole simple escape", '{"a": "x\\n', '{"a": "x\\n', OPEN),
    ("cut in key escape", '{"k\\', '{"k', OPEN),
    # A length-limited answer: the open part is the content.
    ("length limit in string", '{"name": "Ali', '{"name": "Ali', OPEN),
    ("length limit after comma", '{"a": 1, ', '{"a": 1, ', OPEN),
    ("length limit after colon", '{"a": ', '{"a": ', OPEN),
    ("length limit in literal", '{"a": tr', '{"a": tr', OPEN),
    ("length limit in array", "[1, 2", "[1, 2", OPEN),
    ("open brace", "{", "{", OPEN),
    # Numbers stay open at the end of the text: more digits may follow.
    ("number at end", "12", "12", OPEN),
    ("number then space", "12 ", "12", COMPLETE),
    ("minus alone", "-", "-", OPEN),
    ("fraction dot at end", "1.", "1.", OPEN),
    ("exponent at end", "1.5e", "1.5e", OPEN),
    ("exponent sign at end", "1.5e+", "1.5e+", OPEN),
    ("zero", "0 ", "0", COMPLETE),
    ("negative exponent", "-0.5E-3 ", "-0.5E-3", COMPLETE),
    # Texts that cannot be such an answer have no content.
    ("text after value", "{} x", "", INVALID),
    ("second value", "{} {}", "", INVALID),
    ("space after closing fence", "```json\n{}\n```\n", "", INVALID),
    ("text after closing fence", "```json\n{}\n```!", "", INVALID),
    ("other fence", "```python\n{}", "", INVALID),
    ("fence without language", "```\n{}\n```", "", INVALID),
    ("unfenced value then fence", "{}\n```", "", INVALID),
    ("prose", "Sure! {}", "", INVALID),
    ("trailing comma", '{"a": 1,}', "", INVALID),
    ("missing comma", "[1 2]", "", INVALID),
    ("leading zero", "01", "", INVALID),
    ("fraction without digit", "1.e5", "", INVALID),
    ("number then dot", "1.5.", "", INVALID),
    ("bad escape", '"\\x"', "", INVALID),
    ("bad unicode escape", '"\\u00g0"', "", INVALID),
    ("literal with tail", "nulx", "", INVALID),
    ("unquoted key", "{a: 1}", "", INVALID),
]


@pytest.mark.parametrize(("raw", "content", "state"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_parse_json_answer(raw: str, content: str, state: AnswerState) -> None:
    assert parse_json_answer(raw) == JsonAnswer(content, state)
    assert json_content(raw) == content


@pytest.mark.parametrize(("raw", "content", "state"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_json_message_is_content_or_raw(raw: str, content: str, state: AnswerState) -> None:
    assert json_message(raw) == (content or raw)


@pytest.mark.parametrize(("raw", "content", "state"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_stream_char_by_char_matches_whole_parse(raw: str, content: str, state: AnswerState) -> None:
    stream = ContentStream()
    growth = "".join(stream.push(char) for char in raw)
    assert stream.text == raw
    assert stream.state is state
    # An invalid answer keeps the last content it streamed, as llama-server keeps its last message.
    assert growth == stream.content
    if state is not INVALID:
        assert stream.content == content


# (id, pieces, growth per piece)
STREAMS = [
    ("escape cut in half", ['{"a": "x', "\\", "u00", "e9", '"}'], ['{"a": "x', "", "", "\\u00e9", '"}']),
    ("simple escape cut", ['"a\\', 'n"'], ['"a', '\\n"']),
    ("inside the fence",
     ["``", "`js", "on", "\n", '{"k"', ": 1}", "\n`", "``"], ["", "", "", "", '{"k"', ": 1}", "", ""]),
    ("length-limited", ['{"name": ', '"Al', "i"], ['{"name": ', '"Al', "i"]),
    ("number then more digits", ["[1", "2", "]"], ["[1", "2", "]"]),
    ("top-level number ends on space", ["4", "2", " "], ["4", "2", ""]),
    ("content stops growing when invalid", ["{}", " x", "}"], ["{}", "", ""]),
    ("trailing space is not content", ['{"a": 1}', "\n\n"], ['{"a": 1}', ""]),
]


@pytest.mark.parametrize(("pieces", "growth"), [c[1:] for c in STREAMS], ids=[c[0] for c in STREAMS])
def test_stream_growth(pieces: list[str], growth: list[str]) -> None:
    stream = ContentStream()
    assert [stream.push(piece) for piece in pieces] == growth


def _reference_vectors(llama_cpp_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """llama.cpp's JSON parser vectors: inputs it parses whole, inputs it needs more of (lenient), and
    inputs that end in a cut escape (whose partial value ends at the backslash)."""
    source = (llama_cpp_dir / "tests" / "peg-parser" / "test-json-parser.cpp").read_text()
    whole: list[str] = []
    needs_more: list[str] = []
    for chunk in source.split("t.test(")[1:]:
        if "p.json()" not in chunk:
            continue
        declared = re.search(r"std::string\s+input\s*=\s*((?:R\"\(.*?\)\"\s*)+);", chunk, re.DOTALL)
        if not declared:
            continue
        text = "".join(re.findall(r'R"\((.*?)\)"', declared.group(1), re.DOTALL))
        if '"result_is_success", true' in chunk:
            whole.append(text)
        elif '"result_is_need_more_input", true' in chunk:
            needs_more.append(text)
    escapes_block = re.search(r"std::vector<std::string>\s+inputs\s*\{(.*?)\};", source, re.DOTALL)
    assert escapes_block and "input.find('\\\\'), result.end" in source
    escapes = re.findall(r'R"\((.*?)\)"', escapes_block.group(1), re.DOTALL)
    return whole, needs_more, escapes


def test_llama_cpp_json_parser_vectors(llama_cpp_dir: Path) -> None:
    whole, needs_more, escapes = _reference_vectors(llama_cpp_dir)
    assert len(whole) >= 3 and len(needs_more) >= 3 and len(escapes) >= 3
    for text in whole:
        assert parse_json_answer(text) == JsonAnswer(text, COMPLETE), text
    for text in needs_more:
        answer = parse_json_answer(text)
        assert answer.state is OPEN and answer.content == text, text
    for text in escapes:
        assert parse_json_answer(text) == JsonAnswer(text[: text.index("\\")], OPEN), text


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8"), max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(
    value=_JSON_VALUES,
    indent=st.sampled_from([None, 0, 2]),
    ensure_ascii=st.booleans(),
    fenced=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
)
def test_content_only_grows(value: object, indent: int | None, ensure_ascii: bool, fenced: bool,
                            cuts: list[int]) -> None:
    """Every prefix's content is a prefix of the whole answer's content, and a stream cut anywhere
    adds up to the value's text."""
    text = json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
    raw = f"```json\n{text}\n```" if fenced else f" {text}\n"
    assert parse_json_answer(raw) == JsonAnswer(text, COMPLETE)
    for cut in range(len(raw) + 1):
        assert text.startswith(json_content(raw[:cut]))
    points = sorted({min(cut, len(raw)) for cut in cuts})
    stream = ContentStream()
    pieces = [raw[start:end] for start, end in zip([0, *points], [*points, len(raw)], strict=True)]
    assert "".join(stream.push(piece) for piece in pieces) == text
