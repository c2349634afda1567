"""The extended dialect (constraintd/engine/schema/extended.py): each keyword it enforces, checked on raw
bytes against a validator of JSON Schema 2020-12 (`jsonschema` with format assertion), or, where `jsonschema`
has no check of its own (`time`, `date-time` need a package it does not install), against RFC 3339 read
here.
"""

from __future__ import annotations

import calendar
import json
import random
import re
import warnings
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraintd.engine import Grammar, Matcher, Vocab
from constraintd.engine.schema.convert import convert_json_schema, json_schema_to_gbnf
from constraintd.engine.schema.extended import OPEN_DIGITS, integer_range_rule
from constraintd.errors import ConstraintdError, SchemaError
from tests.engine.schema.test_report_property import draw_text, judge
from tests.schema_oracle.strategies import schema_documents

jsonschema = pytest.importorskip("jsonschema")

BYTES: Final = Vocab([b"</s>", *(bytes((b,)) for b in range(1, 256))], eog_ids=[0])
FORMAT_CHECKER: Final = jsonschema.Draft202012Validator.FORMAT_CHECKER


def grammar_of(schema: dict[str, Any], *, strict: bool = True) -> Grammar:
    gbnf = json_schema_to_gbnf(json.dumps(schema), strict=strict, dialect="extended")
    return Grammar.from_gbnf(gbnf, BYTES)


def takes(grammar: Grammar, text: str | bytes) -> bool:
    matcher = Matcher(grammar)
    data = text.encode() if isinstance(text, str) else text
    return matcher.accept_bytes(data) and matcher.is_complete()


def valid(schema: dict[str, Any], document: object) -> bool:
    return bool(jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(document))


# ---------------------------------------------------------------------------------------------- the dialect


def test_the_default_dialect_is_llama_cpps() -> None:
    schema = json.dumps({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                          "n": {"type": "integer", "minimum": 100}}})
    assert convert_json_schema(schema, dialect="llama.cpp") == convert_json_schema(schema)


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(SchemaError, match="unknown schema dialect 'llama'"):
        convert_json_schema('{"type": "integer"}', dialect="llama")


def test_rule_names_of_the_dialect_are_reserved() -> None:
    # a property whose rule would be named as one of the dialect's rules gets another name
    schema = {"type": "object", "properties": {"x-date": {"type": "string", "format": "date"},
                                               "x-year": {"type": "integer", "minimum": 0}},
              "required": ["x-date", "x-year"]}
    grammar = grammar_of(schema)
    assert takes(grammar, '{"x-date":"2024-02-29","x-year":5}')
    assert not takes(grammar, '{"x-date":"2023-02-29","x-year":5}')
    assert not takes(grammar, '{"x-date":"2024-02-29","x-year":-5}')


# ------------------------------------------------------------------------------------------ integer bounds


def integer_rule_grammar(low: int, high: int) -> Grammar:
    return Grammar.from_gbnf(f"root ::= {integer_range_rule(low, high)}\n", BYTES)


def probes(low: int, high: int, rng: random.Random) -> set[int]:
    near = {low - 1, low, low + 1, high - 1, high, high + 1, 0, -1, 1, -low, -high}
    near |= {rng.randint(low - 1000, high + 1000) for _ in range(20)}
    near |= {10**k for k in range(1, len(str(high)) + 1)} | {-(10**k) for k in range(1, len(str(low)) + 1)}
    return near | {value - 1 for value in near}


@settings(max_examples=200, deadline=None)
@given(st.integers(-10**20, 10**20), st.integers(0, 10**20), st.randoms(use_true_random=False))
def test_an_integer_range_takes_exactly_its_integers(low: int, width: int, rng: random.Random) -> None:
    high = low + width if rng.random() < 0.5 else low + width % 1000
    grammar = integer_rule_grammar(low, high)
    for value in probes(low, high, rng):
        assert takes(grammar, str(value)) == (low <= value <= high), (low, high, value)
    for text in ("-0", "00", "01", "-01", "+1", "1.0", "1e2", ""):
        if takes(grammar, text):  # only a JSON integer of the range, spelled as JSON spells it
            assert text == str(json.loads(text)) and low <= json.loads(text) <= high, (low, high, text)


@pytest.mark.parametrize(("schema", "low", "high"), [
    ({"minimum": 100}, 100, None),
    ({"minimum": 1000, "maximum": 1000}, 1000, 1000),
    ({"maximum": -1}, None, -1),
    ({"maximum": -20}, None, -20),
    ({"exclusiveMinimum": 7}, 8, None),
    ({"exclusiveMaximum": 0}, None, -1),
    ({"minimum": 2.5, "maximum": 9.5}, 3, 9),
    ({"exclusiveMinimum": 2.5, "exclusiveMaximum": 9.0}, 3, 8),
    ({"minimum": 5, "exclusiveMinimum": 10}, 11, None),  # the tighter of the two holds
    ({"maximum": 5, "exclusiveMaximum": 10}, None, 5),
    ({"minimum": -5, "maximum": 5}, -5, 5),
    ({"minimum": 10**18, "maximum": 10**19}, 10**18, 10**19),  # past int64: llama.cpp's range wraps
    ({"minimum": -(10**17)}, -(10**17), None),
], ids=lambda value: json.dumps(value) if isinstance(value, dict) else None)
def test_integer_bounds_hold_exactly(schema: dict[str, Any], low: int | None, high: int | None) -> None:
    schema = {"type": "integer", **schema}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert conversion.unenforced == ()
    grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
    rng = random.Random(7)
    bound_low = low if low is not None else -(10**OPEN_DIGITS) + 1
    bound_high = high if high is not None else 10**OPEN_DIGITS - 1
    for value in probes(bound_low, bound_high, rng) | {10, 99, 101, 9, -1, -2, -21, -19}:
        expected = valid(schema, value) and len(str(abs(value))) <= max(OPEN_DIGITS, len(str(abs(low or 0))),
                                                                          len(str(abs(high or 0))))
        assert takes(grammar, str(value)) == expected, value


def test_draft_4_exclusive_flags_are_read() -> None:
    schema = {"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 9,
              "exclusiveMaximum": True}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert conversion.unenforced == ()
    grammar = Grammar.from_gbnf(conversion.grammar, BYTES)
    assert [value for value in range(0, 12) if takes(grammar, str(value))] == list(range(4, 9))


@pytest.mark.parametrize("schema", [
    {"type": "integer", "minimum": 10, "maximum": 5},  # admits nothing: llama.cpp's grammar and its report
    {"type": "integer", "minimum": 1e60},  # past the dialect's digits
    {"type": "integer", "minimum": 0, "multipleOf": 3},
], ids=["crossed", "huge", "multipleOf"])
def test_what_the_dialect_leaves_to_llama_cpp_stays_reported(schema: dict[str, Any]) -> None:
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced
    with pytest.raises(SchemaError, match="strict: the grammar would not enforce"):
        convert_json_schema(json.dumps(schema), dialect="extended", strict=True)


def test_the_report_example_minimum_100_refuses_10() -> None:
    schema = json.dumps({"type": "integer", "minimum": 100})
    assert takes(Grammar.from_gbnf(convert_json_schema(schema).grammar, BYTES), "10")  # llama.cpp's
    grammar = grammar_of({"type": "integer", "minimum": 100})
    assert not takes(grammar, "10")
    assert takes(grammar, "100")
    assert takes(grammar, "1000")


# ------------------------------------------------------------------------------------------------- formats

_TIME: Final = re.compile(
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.\d+)?(?:[Zz]|(?P<sign>[+-])(?P<oh>\d\d):(?P<om>\d\d))"
)


def rfc3339_time(text: str) -> bool:
    """RFC 3339 full-time; a leap second only where it is 23:59:60 in UTC (the JSON Schema test suite's
    reading), and, as the dialect says, written with a zero offset."""
    match = _TIME.fullmatch(text)
    if match is None:
        return False
    hour, minute, second = int(match["h"]), int(match["m"]), int(match["s"])
    if hour > 23 or minute > 59 or second > 60:
        return False
    if match["sign"] and (int(match["oh"]) > 23 or int(match["om"]) > 59):
        return False
    if second == 60:
        return (hour, minute) == (23, 59) and (not match["sign"] or match["oh"] + match["om"] == "0000")
    return True


def rfc3339_date(text: str) -> bool:
    match = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)", text)
    if match is None:
        return False
    year, month, day = map(int, match.groups())
    return year >= 1 and 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]


def rfc3339_date_time(text: str) -> bool:
    return len(text) > 11 and text[10] in "Tt" and rfc3339_date(text[:10]) and rfc3339_time(text[11:])


@pytest.mark.parametrize("year", ["0000", "0001", "0004", "0100", "0400", "1900", "2000", "2023", "2024",
                                  "9999"])
def test_every_date_of_a_year(year: str) -> None:
    grammar = grammar_of({"type": "string", "format": "date"})
    for month in range(0, 14):
        for day in range(0, 33):
            text = f"{year}-{month:02}-{day:02}"
            expected = valid({"format": "date"}, text)
            assert expected == rfc3339_date(text)
            assert takes(grammar, json.dumps(text)) == expected, text


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}\Z") | st.text("0123456789-", max_size=12))
def test_random_dates(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "date"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "date"}, text), text


TIMES: Final = [
    "08:30:06Z", "08:30:06z", "08:30:06.1+01:00", "08:30:06.123456789-23:59", "23:59:60Z", "23:59:60.5+00:00",
    "23:59:60-00:00", "00:00:00+00:00",
    # invalid
    "08:30:06", "24:00:00Z", "08:60:06Z", "08:30:61Z", "08:30:60Z", "23:58:60Z", "22:59:60Z",
    "08:30:06+24:00", "08:30:06+01:60", "08:30:06.Z", "8:30:06Z", "08:30:06 Z", "08:30:06+0100",
    "08:30:06+01", "T08:30:06Z",
    "08:30:06ZZ",
]


@pytest.mark.parametrize("text", TIMES)
def test_time(text: str) -> None:
    assert takes(grammar_of({"type": "string", "format": "time"}), json.dumps(text)) == rfc3339_time(text)


@pytest.mark.parametrize("text", [
    "1963-06-19T08:30:06.283185Z", "1963-06-19t08:30:06z", "2024-02-29T23:59:60Z",
    "1998-12-31T23:59:60+00:00",
    "2023-02-29T08:30:06Z", "1963-06-19 08:30:06Z", "1963-06-19T08:30:06", "0000-01-01T00:00:00Z",
    "1963-06-1908:30:06Z", "1963-13-19T08:30:06Z", "1963-04-31T08:30:06Z",
])
def test_date_time(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "date-time"})
    assert takes(grammar, json.dumps(text)) == rfc3339_date_time(text)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,3})?"
                     r"([Zz]|[+-][0-9]{2}:[0-9]{2})?\Z"))
def test_random_date_times(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "date-time"})
    assert takes(grammar, json.dumps(text)) == rfc3339_date_time(text), text


@pytest.mark.parametrize("text", [
    "0.0.0.0", "255.255.255.255", "192.168.1.10", "256.1.1.1", "01.1.1.1", "1.1.1", "1.1.1.1.1", "1..1.1",
    "1.1.1.1 ", "249.250.199.100", "300.0.0.0", "-1.0.0.0", "1.2.3.04",
])
def test_ipv4(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "ipv4"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "ipv4"}, text)


@settings(max_examples=300, deadline=None)
@given(st.from_regex(r"\A[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\Z")
       | st.text("0123456789.", max_size=16))
def test_random_ipv4(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "ipv4"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "ipv4"}, text), text


IPV6: Final = [
    "::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1::8", "1:2::7:8",
    "::ffff:192.168.0.1", "1:2:3:4:5:6:1.2.3.4", "fe80::1:2", "ABCD:ef01::", "1::2:3:4:5:6:7",
    # invalid
    "1:2:3:4:5:6:7:8:9", "1::2::3", ":1:2", "1:2:", "12345::", "g::", "1:2:3:4:5:6:7", "::1.2.3", "1.2.3.4",
    "::ffff:192.168.0.01", "fe80::1%eth0", "1:2:3:4:5:6:7:1.2.3.4", "", ":", ":::",
]


@pytest.mark.parametrize("text", IPV6)
def test_ipv6(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "ipv6"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "ipv6"}, text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["1", "ab", "ffff", "0", "12345", ":", "::", ".", "1.2.3.4", "255"]),
                max_size=12).map("".join))
def test_random_ipv6(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "ipv6"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "ipv6"}, text), text


@pytest.mark.parametrize("text", [
    "123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
    "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
    "g23e4567-e89b-12d3-a456-426614174000",
])
def test_uuid(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "uuid"})
    assert takes(grammar, json.dumps(text)) == valid({"format": "uuid"}, text)


@pytest.mark.parametrize("format_name", ["hostname", "iri", "duration", "regex", "uri-reference"])
def test_other_formats_stay_reported(format_name: str) -> None:
    schema = json.dumps({"type": "object", "properties": {"a": {"type": "string", "format": format_name}}})
    conversion = convert_json_schema(schema, dialect="extended")
    found = [(item.pointer, item.keyword) for item in conversion.unenforced]
    assert found == [("#/properties/a/format", "format")]
    with pytest.raises(SchemaError) as refused:
        convert_json_schema(schema, dialect="extended", strict=True)
    assert refused.value.pointer == "#/properties/a/format"


def test_a_length_beside_a_format_stays_reported() -> None:
    schema = json.dumps({"type": "string", "format": "date", "maxLength": 5})
    conversion = convert_json_schema(schema, dialect="extended")
    assert [item.keyword for item in conversion.unenforced] == ["maxLength"]


# -------------------------------------------------------------------------------------- the report's promise


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema_documents(), st.randoms(use_true_random=False))
def test_what_a_fully_enforced_extended_grammar_produces_is_valid(schema: dict[str, Any],
                                                                  rng: random.Random) -> None:
    try:
        grammar = Grammar.from_gbnf(json_schema_to_gbnf(json.dumps(schema), strict=True, dialect="extended"),
                                    BYTES)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    except (SchemaError, ConstraintdError, jsonschema.exceptions.SchemaError):
        return
    for _ in range(5):
        text = draw_text(grammar, rng)
        if text is None:
            continue
        document = json.loads(text)
        verdict = judge(validator, document)
        assert verdict is not False, f"{text!r} is not valid for {json.dumps(schema)[:300]}"


def test_the_extended_table_speaks_of_known_keywords() -> None:
    from constraintd.engine.schema.keywords import EXTENDED_KEYWORDS, KEYWORDS

    assert set(EXTENDED_KEYWORDS) <= set(KEYWORDS)


# ------------------------------------------------------------------------------- the other keys of an object

OPEN: Final = {"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"},
                                                "é-x": {"type": "integer"}},
               "additionalProperties": {"type": "string"}}


def key_text(key: str) -> str:
    # JSON's own spelling of a key, DEL escaped (llama.cpp's strings never take it raw)
    return json.dumps(key, ensure_ascii=False).replace("\x7f", "\\u007f")


@pytest.mark.parametrize(("text", "taken"), [
    ('{"a":1}', True), ('{"b":"x"}', True), ('{"":"x"}', True), ('{"abc":"x"}', True), ('{"é":"x"}', True),
    ('{"a":"x"}', False), ('{"ab":"x"}', False), ('{"é-x":"x"}', False),
    ('{"\\u0061":"x"}', False),  # `a` spelled with an escape: llama.cpp's grammar takes it as another key
    ('{"\\u0061b":"x"}', False), ('{"\\/":"x"}', False),
    ('{"\\"":"x"}', True), ('{"\\u0022":"x"}', True), ('{"\\n":"x"}', True), ('{"a\\u001f":"x"}', True),
    ('{"\\":"x"}', False),  # no JSON: a backslash then the closing quote
    ('{"\n":"x"}', False),  # no JSON: a raw control character
])
def test_other_keys_are_exactly_the_undeclared_names(text: str, taken: bool) -> None:
    grammar = grammar_of(OPEN)
    assert takes(grammar, text) == taken
    if taken:
        assert valid(OPEN, json.loads(text))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["a", "ab", "é-x", "b"]) | st.text(max_size=4))
def test_random_other_keys(key: str) -> None:
    grammar = grammar_of(OPEN)
    document = {key: "v"}
    assert takes(grammar, "{" + key_text(key) + ':"v"}') == valid(OPEN, document), key


# names that share prefixes, end inside one another, and run on alone: every place of the trie the rule
# writes (a pair of places in one group, a place where a name ends and another goes on, a last place)
TRIE_NAMES: Final = ("food_items", "foo", "fo", "target_calories", "tag", "x", "é")
TRIE: Final = {"type": "object", "properties": {name: {"type": "integer"} for name in TRIE_NAMES},
               "additionalProperties": {"type": "string"}}


def _near_keys(names: tuple[str, ...]) -> set[str]:
    # each name, its prefixes, and the keys one character away from it: a character changed, added or
    # taken out at each place, and an escape put in at each place
    keys = {""}
    for name in names:
        for i in range(len(name) + 1):
            keys |= {name[:i], name[:i] + name[i + 1:], name[:i] + "\n" + name[i:]}
            keys |= {name[:i] + char + name[i + 1:] for char in "aoz_\u00e9"}
            keys |= {name[:i] + char + name[i:] for char in "ao_\u00e9"}
    return keys


def test_other_keys_near_the_names_are_exactly_the_undeclared_ones() -> None:
    # a declared name takes an integer, another key a string: a string under a declared name is refused
    grammar = grammar_of(TRIE)
    for key in sorted(_near_keys(TRIE_NAMES)):
        taken = takes(grammar, "{" + key_text(key) + ':"v"}')
        assert taken == (key not in TRIE_NAMES) == valid(TRIE, {key: "v"}), key
        if key in TRIE_NAMES:
            assert takes(grammar, "{" + key_text(key) + ":1}"), key


def test_a_name_json_must_escape_keeps_llama_cpps_rule() -> None:
    schema = {"type": "object", "properties": {'a"b': {"type": "integer"}}, "additionalProperties": True}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert [item.keyword for item in conversion.unenforced] == ["additionalProperties"]


# ---------------------------------------------------------------------- required names, undefined formats


@pytest.mark.parametrize(("schema", "cases"), [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
     {'{"a":1,"b":"x"}': True, '{"a":1}': False, '{"b":[1]}': False}),
    ({"type": "object", "required": ["b"]}, {'{"b":null}': True, '{"b":1,"c":2}': True, "{}": False}),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"],
      "additionalProperties": {"type": "integer"}},
     {'{"b":1}': True, '{"b":"x"}': False, '{"a":1}': False, '{"b":1,"a":"x"}': True, '{"b":1,"c":2}': True}),
], ids=["closed by llama.cpp", "no properties", "other keys' schema"])
def test_a_required_name_without_a_property_is_required(schema: dict[str, Any],
                                                        cases: dict[str, bool]) -> None:
    grammar = grammar_of(schema)
    for text, expected in cases.items():
        if expected:
            assert valid(schema, json.loads(text))
        assert takes(grammar, text) == expected, text


def test_a_required_name_where_no_other_key_is_allowed_stays_reported() -> None:
    schema = {"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert [item.keyword for item in conversion.unenforced] == ["required"]


@pytest.mark.parametrize("format_name", ["path", "byte", "int32", "uuid7", "topic"])
def test_a_format_json_schema_does_not_define_is_an_annotation(format_name: str) -> None:
    schema = {"type": "string", "format": format_name}
    assert convert_json_schema(json.dumps(schema), dialect="extended").unenforced == ()
    assert valid(schema, "anything at all")


# RFC 3986's URI as a Python regex, written from the ABNF on its own (the reference of the tests below)
_UNRESERVED_SUB: Final = r"[A-Za-z0-9._~!$&'()*+,;=-]"
_PCT: Final = r"%[0-9A-Fa-f]{2}"
_PCHAR: Final = rf"(?:{_UNRESERVED_SUB}|{_PCT}|[:@])"
_H16: Final = r"[0-9A-Fa-f]{1,4}"
_URI: Final = re.compile(
    rf"[A-Za-z][A-Za-z0-9+.-]*:"
    rf"(?://(?:(?:{_UNRESERVED_SUB}|{_PCT}|:)*@)?"
    rf"(?:\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\.(?:{_UNRESERVED_SUB}|:)+)\]|(?:{_UNRESERVED_SUB}|{_PCT})*)"
    rf"(?::[0-9]*)?(?:/{_PCHAR}*)*"
    rf"|/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?|{_PCHAR}+(?:/{_PCHAR}*)*)?"
    rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
)


def rfc3986_uri(text: str) -> bool:
    match = _URI.fullmatch(text)
    if match is None:
        return False
    literal = re.search(r"//[^/?#]*?@?\[([0-9A-Fa-f:.]+)\]", text)  # an IPv6 literal: Python's reading
    if literal and not text.split("//", 1)[1].startswith(("v", "[v")) and "[" in text:
        return valid({"format": "ipv6"}, literal.group(1))
    return True


@pytest.mark.parametrize("text", [
    "http://foo.bar/?baz=qux#quux", "mailto:John.Doe@example.com", "tel:+1-816-555-1212",
    "urn:oasis:names:specification:docbook:dtd:xml:4.1.2", "ldap://[2001:db8::7]/c=GB?objectClass?one",
    "http://www.example.com/foo%20bar?q=a%2Fb", "news:comp.infosystems.www.servers.unix", "a:", "a:b/c//d",
    "http://user:pw@h%41st:8080/p", "foo://[v7.abc:def]/", "http://1.2.3.4/",
    # invalid
    "//foo.bar/?baz=qux#quux", "abc", "bar,baz:foo", "http://[2001:db8::7", "http://example.com/%zz",
    "http://ex ample.com", "http://ä.com", ":// should fail", "\\\\WINDOWS\\fileshare", "http://[1::2::3]/",
    "1http://x", "http://x/a b", 'http://x/"',
])
def test_uri(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "uri"})
    assert takes(grammar, json.dumps(text, ensure_ascii=False)) == rfc3986_uri(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["h", "ttp", ":", "//", "/", "@", "[", "]", "::1", "%2F", "%z", "?", "#",
                                 "a.b", "8080", " ", "v1.x", "!$"]), max_size=10).map("".join))
def test_random_uris(text: str) -> None:
    grammar = grammar_of({"type": "string", "format": "uri"})
    assert takes(grammar, json.dumps(text)) == rfc3986_uri(text), text


def test_a_required_name_of_an_all_of_part_is_required_of_the_merge() -> None:
    # the parts merged into one object (schema/all_of.py): "b", declared by neither open part, is a
    # required key of any value
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]},
                        {"type": "object", "properties": {"c": {}}}]}
    conversion = convert_json_schema(json.dumps(schema), dialect="extended")
    assert conversion.unenforced == ()
    grammar = grammar_of(schema)
    assert takes(grammar, '{"a": 1, "b": null}') and takes(grammar, '{"c": [], "b": "x", "a": 2}')
    assert not takes(grammar, '{"a": 1}') and not takes(grammar, '{"a": "1", "b": 2}')


def test_a_length_counts_characters_not_escapes() -> None:
    grammar = grammar_of({"type": "string", "maxLength": 1})
    assert takes(grammar, '"😀"')
    assert not takes(grammar, '"\\ud83d\\ude00"')  # one character as two escapes: a valid spelling refused
    assert takes(grammar, '"\\u00e9"')
    assert takes(grammar, '"\\/"')
    assert not takes(grammar, '"ab"')
    # llama.cpp's grammar counts the two escapes as two characters
    assert Matcher(Grammar.from_gbnf(json_schema_to_gbnf('{"type": "string", "minLength": 2}'), BYTES)
                   ).accept_bytes(b'"\\ud83d\\ude00"')
    assert not takes(grammar_of({"type": "string", "minLength": 2}), '"\\ud83d\\ude00"')


@pytest.mark.parametrize(
    "schema",
    [{"type": "string", "minLength": 3, "maxLength": 3, "pattern": "[a-zA-Z]{3}"},
     {"type": "string", "minLength": 2, "maxLength": 2, "pattern": "([A-Z]{2})"},
     {"type": "string", "maxLength": 3, "pattern": "^ab[cd]"},
     {"type": "string", "maxLength": 2, "pattern": "xx|^yy"}],
    ids=["letters", "group", "anchored-start", "alternatives"],
)
def test_an_unanchored_pattern_as_long_as_the_max_length_is_the_whole_value(schema: dict[str, Any]) -> None:
    # a value of at most maxLength characters holds a match at least that long only as the whole value
    grammar = grammar_of(schema)
    for text in ["", "a", "ab", "abc", "abd", "aBc", "ABC", "AB", "A", "1AB", "abcd", "abde", "abc ",
                 "xx", "xxxx", "xxxxx", "axx", "yy", "yyy", "yyyy", "xyy"]:
        assert takes(grammar, json.dumps(text)) == valid(schema, text), (schema, text)


def test_an_unanchored_pattern_shorter_than_the_max_length_stays_reported() -> None:
    # "xab" is valid: the match need not be the whole value
    with pytest.raises(SchemaError, match="maxLength"):
        convert_json_schema(json.dumps({"type": "string", "maxLength": 3, "pattern": "ab"}), strict=True,
                            dialect="extended")
