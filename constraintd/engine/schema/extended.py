# The extended dialect: what the converter enforces beyond llama.cpp when asked for `dialect="extended"`.
#
# Contract:
# - `DIALECTS` names the dialects; "llama.cpp" (the default) is llama.cpp's converter byte for byte and
#   nothing here touches it. "extended" writes, for the keywords below, a grammar that takes exactly the
#   documents the schema allows (up to JSON whitespace, and refusing some spellings of a valid value, as
#   the default does: `1.0` for an integer, escapes), and the report names only what it still does not
#   enforce. Objects take their properties in any order (schema/property_order.py), and are open to other
#   keys unless `additionalProperties` says otherwise, as JSON Schema's are; an object whose properties
#   cannot be taken in any order is named by the report.
# - `FORMATS`: the `format`s written as exact grammars, each to a named specification (`FORMAT_SPECS`):
#     date       RFC 3339 full-date, months' lengths and leap years (Feb 29 in leap years only); years 0001
#                to 9999 (0000, which the ABNF allows, is refused: the proleptic calendars of validators
#                start at year 1);
#     time       RFC 3339 full-time: an offset is required, any number of fraction digits, `Z` in either
#                case; a leap second (60) only at 23:59:60 UTC (Z, +00:00, -00:00): a leap second written
#                in another offset is refused although the JSON Schema test suite takes it;
#     date-time  RFC 3339 date-time: full-date, `T` in either case, full-time;
#     ipv4       RFC 2673's dotted-decimal: four decimal octets 0-255 without leading zeros;
#     ipv6       RFC 4291's text forms (section 2.2), as RFC 3986's IPv6address ABNF writes them: eight
#                groups of 1-4 hexadecimal digits, one `::` for a run of zero groups, an IPv4 tail; no zone;
#     uri        RFC 3986's URI ABNF (a scheme, so no relative reference; ASCII only, as URIs are);
#     uuid       RFC 4122's 8-4-4-4-12 hexadecimal digits, either case (llama.cpp's own rule);
#     email      RFC 5321's Mailbox ABNF (section 4.1.2): a dot-string or quoted local part (its quote and
#                backslash in their JSON escapes), a domain of letter-digit-hyphen labels, or an address
#                literal of IPv4 or IPv6 (`IPv6:` in any case); the general address literal (a tag
#                registered with IANA: none but IPv6 is) is refused. Section 4.5.3's size limits are not
#                part of the ABNF and are not checked.
#   Every other format JSON Schema defines (hostname, uri-reference, iri, ...) stays reported.
# - `integer_bounds(schema)`: the integer range the schema's minimum / maximum / exclusive bounds set (the
#   tightest of them, draft 4's boolean exclusives read too), exactly, or None for a side without one.
#   `integer_range_rule(low, high)` is a GBNF expression taking exactly the integers of [low, high] in JSON's
#   spelling (no leading zeros, no "-0"). An open side stops at `OPEN_DIGITS` digits (llama.cpp's integers
#   take at most 16), or at the bound's own number of digits when that is more. Bounds past `MAX_DIGITS`
#   digits are left to llama.cpp's rule (and reported).
# - `exact_pattern(pattern)`: a `pattern` as ECMA-262 reads it, matched against the string's value, unanchored
#   unless anchored (schema/ecma_patterns.py says what it reads); None where it does not read the pattern.
# - `number_rule(schema)`: bounds on a number (not an integer), exactly, as decimals, for the numbers written
#   without an exponent (number_ranges.py), or None.
# - A format JSON Schema does not define is an annotation (2020-12 makes an unknown format one): not
#   reported. A name `required` lists that the properties do not declare is a required property of the
#   other keys' schema (of any value where llama.cpp closes the object), unless `additionalProperties` is
#   false (`undeclared_required`).
# - minLength / maxLength on a plain string count characters: a character outside the BMP is taken raw
#   only (llama.cpp's rule counts each of its two escapes).
# - `other_keys_rule(names, add_rule, written)`: the keys beside an object's declared properties, exactly
#   the JSON strings that are none of the names (see the section below).
# - `x-value` (in `RULES`): any JSON value, as llama.cpp's `value` but numbers of any number of digits (its
#   `integral-part` and `decimal-part` write a rule per digit), over llama.cpp's `ANY_VALUE_PRIMITIVES`.
# - Rules are written for the parser's cost (it reads a grammar in time linear in its elements, and each
#   group, `*`, `+` or `?` is one rule more): repetitions as right recursion, an empty alternative shared in
#   a named rule where many places would each write one, the same language as the plainer spelling.
# - `PRIMITIVES`: llama.cpp's rules the dialect writes in its own spelling, the same languages in fewer
#   rules (`number`, `integer` and their parts sharing one repetition of digits, `boolean`).
# Invariants: every rule name written here starts with `x-`. `RESERVED_NAMES` reserves those of `RULES`,
# which refer to each other by name, so a property's rule can never take one of them; the rules
# `other_keys_rule` adds (`x-key-not-...`, `x-key-more-not-...`, `x-key-at-...`) are referred to by the
# names `add_rule` gives them.
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Final

from constraintd.engine.schema.ecma_patterns import (
    ANY_JSON_CHAR,
    AddRule,
    Unsupported,
    complement_rule,
    pattern_rule,
)
from constraintd.engine.schema.json_text import JsonValue
from constraintd.engine.schema.key_automata import KeyAutomaton
from constraintd.engine.schema.keywords import Enforcement, keyword_of
from constraintd.engine.schema.nodes import AnyNode, ObjectNode, SchemaNode
from constraintd.engine.schema.number_ranges import Bound, integer_range_rule, number_range_rule
from constraintd.engine.schema.rules import BuiltinRule
from constraintd.errors import SchemaError

__all__ = [
    "ANY_VALUE_PRIMITIVES",
    "DEFAULT_DIALECT",
    "DEFINED_FORMATS",
    "DIALECTS",
    "EXTENDED",
    "FORMATS",
    "FORMAT_SPECS",
    "MAX_DIGITS",
    "OPEN_DIGITS",
    "PRIMITIVES",
    "RESERVED_NAMES",
    "RULES",
    "KeyRules",
    "PatternKeys",
    "PatternSplit",
    "Readings",
    "check_dialect",
    "exact_pattern",
    "exact_range",
    "format_rule_name",
    "integer_bounds",
    "integer_range_rule",
    "number_rule",
    "opens_object",
    "other_keys_held",
    "other_keys_rule",
    "pattern_keys",
    "pattern_split",
    "property_counts",
    "undeclared_required",
]

DEFAULT_DIALECT: Final = "llama.cpp"
EXTENDED: Final = "extended"
DIALECTS: Final = (DEFAULT_DIALECT, EXTENDED)
OPEN_DIGITS: Final = 16
MAX_DIGITS: Final = 40

_MULTIPLE_OF_4: Final = '"0" [48] | [2468] [048] | [13579] [26]'  # 04 .. 96, two digits
_DAY_28: Final = '"0" [1-9] | "1" [0-9] | "2" [0-8]'

# rule name -> rule; the names a format needs are its rule's dependencies
_FORMAT_RULES: Final[Mapping[str, BuiltinRule]] = {
    "x-year": BuiltinRule('[0-9]{3} [1-9] | [0-9]{2} [1-9] "0" | [0-9] [1-9] "00" | [1-9] "000"'),
    "x-leap-year": BuiltinRule(f'[0-9] [0-9] ({_MULTIPLE_OF_4}) | ({_MULTIPLE_OF_4}) "00"'),
    "x-date": BuiltinRule(
        f'x-year "-" ( ( "0" [13578] | "1" [02] ) "-" ( {_DAY_28} | "29" | "3" [01] )'
        f' | ( "0" [469] | "11" ) "-" ( {_DAY_28} | "29" | "30" ) | "02-" ( {_DAY_28} ) )'
        ' | x-leap-year "-02-29"',
        ("x-year", "x-leap-year"),
    ),
    "x-time-fraction": BuiltinRule('"." [0-9]+'),
    "x-time": BuiltinRule(
        '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] x-time-fraction? '
        '( [Zz] | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )'
        ' | "23:59:60" x-time-fraction? ( [Zz] | [+-] "00:00" )',
        ("x-time-fraction",),
    ),
    "x-date-time": BuiltinRule("x-date [Tt] x-time", ("x-date", "x-time")),
    "x-ipv4-octet": BuiltinRule('"25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]'),
    "x-ipv4": BuiltinRule('x-ipv4-octet "." x-ipv4-octet "." x-ipv4-octet "." x-ipv4-octet',
                          ("x-ipv4-octet",)),
    "x-h16": BuiltinRule("[0-9a-fA-F]{1,4}"),
    "x-ls32": BuiltinRule('x-h16 ":" x-h16 | x-ipv4', ("x-h16", "x-ipv4")),
    # RFC 3986's IPv6address, alternative for alternative
    "x-ipv6": BuiltinRule(
        '( x-h16 ":" ){6} x-ls32 | "::" ( x-h16 ":" ){5} x-ls32 | x-h16? "::" ( x-h16 ":" ){4} x-ls32'
        ' | ( ( x-h16 ":" )? x-h16 )? "::" ( x-h16 ":" ){3} x-ls32'
        ' | ( ( x-h16 ":" ){0,2} x-h16 )? "::" ( x-h16 ":" ){2} x-ls32'
        ' | ( ( x-h16 ":" ){0,3} x-h16 )? "::" x-h16 ":" x-ls32'
        ' | ( ( x-h16 ":" ){0,4} x-h16 )? "::" x-ls32'
        ' | ( ( x-h16 ":" ){0,5} x-h16 )? "::" x-h16'
        ' | ( ( x-h16 ":" ){0,6} x-h16 )? "::"',
        ("x-h16", "x-ls32"),
    ),
    # RFC 3986's URI, rule for rule (host: IPv4address is within reg-name, so it is left out)
    "x-uri": BuiltinRule(
        'x-uri-scheme ":" ( "//" x-uri-authority ( "/" x-uri-pchar* )*'
        ' | "/" ( x-uri-pchar+ ( "/" x-uri-pchar* )* )? | x-uri-pchar+ ( "/" x-uri-pchar* )* )?'
        ' ( "?" x-uri-query )? ( "#" x-uri-query )?',
        ("x-uri-scheme", "x-uri-authority", "x-uri-pchar", "x-uri-query"),
    ),
    "x-uri-scheme": BuiltinRule("[a-zA-Z] [a-zA-Z0-9+.-]*"),
    "x-uri-authority": BuiltinRule(
        '( ( x-uri-unreserved | x-uri-pct | [:] )* "@" )? ( "[" ( x-ipv6 | "v" [0-9a-fA-F]+ "." '
        '( x-uri-unreserved | [:] )+ ) "]" | ( x-uri-unreserved | x-uri-pct )* ) ( ":" [0-9]* )?',
        ("x-uri-unreserved", "x-uri-pct", "x-ipv6"),
    ),
    # unreserved and sub-delims together (every place that takes one takes the other)
    "x-uri-unreserved": BuiltinRule("[a-zA-Z0-9._~!$&'()*+,;=-]"),
    "x-uri-pct": BuiltinRule('"%" [0-9a-fA-F] [0-9a-fA-F]'),
    "x-uri-pchar": BuiltinRule("x-uri-unreserved | x-uri-pct | [:@]", ("x-uri-unreserved", "x-uri-pct")),
    "x-uri-query": BuiltinRule('( x-uri-pchar | [/?] )*', ("x-uri-pchar",)),
    # RFC 5321's Mailbox (section 4.1.2), each character in its JSON spelling (a quoted local part's quote
    # and backslash escaped); address literals of IPv4 and IPv6 only (the one registered tag)
    "x-email": BuiltinRule(
        'x-email-local "@" ( x-email-domain | "[" ( x-ipv4 | [iI] [pP] [vV] "6:" x-ipv6 ) "]" )',
        ("x-email-local", "x-email-domain", "x-ipv4", "x-ipv6"),
    ),
    "x-email-local": BuiltinRule(
        "x-email-atom ( \".\" x-email-atom )* | \"\\\\\\\"\" ( [ !#-[\\]-~] "
        "| \"\\\\\\\\\" ( [ !#-[\\]-~] | \"\\\\\\\"\" | \"\\\\\\\\\" ) )* \"\\\\\\\"\"",
        ("x-email-atom",),
    ),
    "x-email-atom": BuiltinRule("[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+"),
    "x-email-domain": BuiltinRule('x-email-label ( "." x-email-label )*', ("x-email-label",)),
    "x-email-label": BuiltinRule("[a-zA-Z0-9] ( [a-zA-Z0-9-]* [a-zA-Z0-9] )?"),
    "x-uuid": BuiltinRule('[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
                          "[0-9a-fA-F]{12}"),
}

# format -> the specification its grammar is exact to
FORMAT_SPECS: Final[Mapping[str, str]] = {
    "date": "RFC 3339 full-date",
    "time": "RFC 3339 full-time",
    "date-time": "RFC 3339 date-time",
    "ipv4": "RFC 2673 dotted-decimal",
    "ipv6": "RFC 4291 section 2.2 (RFC 3986's IPv6address)",
    "uri": "RFC 3986 URI",
    "uuid": "RFC 4122",
    "email": "RFC 5321 Mailbox (section 4.1.2; address literals of IPv4 and IPv6)",
}
FORMATS: Final = frozenset(FORMAT_SPECS)
# the formats JSON Schema 2020-12 defines; any other is an annotation ("An implementation MUST NOT fail
# validation or cease processing due to an unknown format attribute", 2020-12 validation, 7.2.3)
DEFINED_FORMATS: Final = frozenset({
    "date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer",
    "relative-json-pointer", "regex",
})
# an escape in a key, as alternates without groups (a group is one rule more to the parser, and a rule without
# any is read at once): `[\\] (["\\bfnrt] | "u00" ([01] [0-9a-fA-F] | "22" | "5" [cC] | "7" [fF]))`
_KEY_ESCAPE: Final = (
    '[\\\\] ["\\\\bfnrt] | "\\\\u00" [01] [0-9a-fA-F] | "\\\\u0022" | "\\\\u005" [cC] | "\\\\u007" [fF]'
)
# a key's characters past a place of the names, each rule ending with the key's closing quote, so none of
# them may be empty (a rule that may be empty costs the grammar's parser more: whatever follows a reference
# to it is looked at too, and an empty trie place makes every place above it empty): x-key-more one or more
# characters, x-key-tail any number, x-key-end none or from an escape on (the ending and the escape every
# x-key-not-... rule would write). The loops are right recursion: `*` would add two rules more.
_KEY_RULES: Final[Mapping[str, BuiltinRule]] = {
    "x-key-escape": BuiltinRule(_KEY_ESCAPE),
    "x-key-more": BuiltinRule('[^"\\\\\\x7F\\x00-\\x1F] x-key-tail | x-key-escape x-key-tail',
                              ("x-key-tail", "x-key-escape")),
    "x-key-tail": BuiltinRule('"\\"" | x-key-more', ("x-key-more",)),
    "x-key-end": BuiltinRule('"\\"" | x-key-escape x-key-tail', ("x-key-escape", "x-key-tail")),
}
# each format's JSON string: its rule between quotes
RULES: Final[Mapping[str, BuiltinRule]] = {
    **_FORMAT_RULES,
    **{f"x-{name}-string": BuiltinRule(f'"\\"" x-{name} "\\""', (f"x-{name}",)) for name in FORMATS},
    **_KEY_RULES,
    "x-any-char": BuiltinRule(ANY_JSON_CHAR),
    # the members and elements after the first of llama.cpp's `object` and `array` (PRIMITIVES)
    "x-members": BuiltinRule('| "," space string ":" space value x-members', ("string", "value")),
    "x-elements": BuiltinRule('| "," space value x-elements', ("value",)),
    # any JSON value, as llama.cpp's `value` but for numbers' digits, any number of them (its rules
    # `integral-part` and `decimal-part` write up to 16 as a rule per digit); with ANY_VALUE_PRIMITIVES. Its
    # object, array and number are written in it, not referred to (a rule each less): llama.cpp's object
    # and array with x-value, their repetitions as right recursion (a `*` or `?` is one rule more to the
    # parser, a group one more again), and -? (0 | [1-9] [0-9]*) (. [0-9]+)? ([eE] [-+]? [0-9]+)?, a rule
    # per part
    "x-value": BuiltinRule('"{" space x-object-pairs space "}" | "[" space x-array-items space "]" | string'
                           ' | x-number-abs | "-" x-number-abs | boolean | null',
                           ("x-object-pairs", "x-array-items", "x-number-abs")),
    "x-object-pairs": BuiltinRule('| string ":" space x-value x-object-more', ("x-value", "x-object-more")),
    "x-object-more": BuiltinRule('| "," space string ":" space x-value x-object-more', ("x-value",)),
    "x-array-items": BuiltinRule("| x-value x-array-more", ("x-value", "x-array-more")),
    "x-array-more": BuiltinRule('| "," space x-value x-array-more', ("x-value",)),
    "x-number-abs": BuiltinRule("[0] x-number-frac | [1-9] x-digits x-number-frac",
                                ("x-digits", "x-number-frac")),
    "x-number-frac": BuiltinRule('x-number-exp | "." [0-9] x-digits x-number-exp',
                                 ("x-digits", "x-number-exp")),
    "x-number-exp": BuiltinRule("| [eE] [0-9] x-digits | [eE] [-+] [0-9] x-digits", ("x-digits",)),
    "x-digits": BuiltinRule("| [0-9] x-digits"),
    # the rest of llama.cpp's `number` after its integral part, and its digits after the first (PRIMITIVES)
    "x-bounded-frac": BuiltinRule('x-bounded-exp | "." decimal-part x-bounded-exp',
                                  ("decimal-part", "x-bounded-exp")),
    "x-bounded-exp": BuiltinRule('| [eE] integral-part | [eE] [-+] integral-part', ("integral-part",)),
    "x-digits-15": BuiltinRule("[0-9]{0,15}"),
    # one character of a string whose length counts: a character outside the BMP only raw (as two `\u`
    # escapes it would be one character counted twice)
    "x-counted-char": BuiltinRule(
        '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" ([0-9a-cA-CeEfF] [0-9a-fA-F]{3}'
        ' | [dD] [0-7] [0-9a-fA-F]{2}))'
    ),
}
RESERVED_NAMES: Final = frozenset(RULES)
# llama.cpp's rules (schema/rules.py's PRIMITIVE_RULES) as the dialect writes them: the same languages in
# fewer rules (a group, `?` or `*` is one rule more to the grammar's parser, a repetition `{0,15}` fifteen):
# the integral and decimal parts share their repetition of digits; a dependency is one of these (or of
# llama.cpp's rules) or of `RULES`
PRIMITIVES: Final[Mapping[str, BuiltinRule]] = {
    "boolean": BuiltinRule('"true" | "false"'),
    "decimal-part": BuiltinRule("[0-9] x-digits-15", ("x-digits-15",)),
    "integral-part": BuiltinRule("[0] | [1-9] x-digits-15", ("x-digits-15",)),
    "number": BuiltinRule('integral-part x-bounded-frac | "-" integral-part x-bounded-frac',
                          ("integral-part", "x-bounded-frac")),
    "integer": BuiltinRule('integral-part | "-" integral-part', ("integral-part",)),
    # any object and any array of llama.cpp's values, their members after the first as right recursion:
    # llama.cpp's groups, loop and option are four rules more to the parser
    "object": BuiltinRule('"{" space space "}" | "{" space string ":" space value x-members space "}"',
                          ("string", "value", "x-members")),
    "array": BuiltinRule('"[" space space "]" | "[" space value x-elements space "]"',
                         ("value", "x-elements")),
}
# llama.cpp's rules `x-value` refers to (schema/rules.py's PRIMITIVE_RULES)
ANY_VALUE_PRIMITIVES: Final = ("string", "boolean", "null")


def exact_pattern(pattern: str, add_rule: AddRule | None = None, name: str = "pattern", *,
                  min_length: int = 0, max_length: int | None = None) -> str | None:
    """The dialect's rule for a JSON string `pattern` matches (schema/ecma_patterns.py), of min_length to
    max_length characters, None where it has none (llama.cpp's translation then holds, and the report)."""
    try:
        return pattern_rule(pattern, "x-any-char", add_rule, name, min_length=min_length,
                            max_length=max_length)
    except Unsupported:
        return None


def opens_object(schema: Mapping[str, JsonValue]) -> bool:
    """Whether the dialect opens the object to other keys of any value where llama.cpp closes it: the schema
    says nothing of them (neither additionalProperties nor unevaluatedProperties)."""
    return "additionalProperties" not in schema and "unevaluatedProperties" not in schema


def undeclared_required(schema: Mapping[str, JsonValue], node: ObjectNode) -> list[str]:
    """The names `required` lists that the object's properties do not declare, in its order, once each;
    none where `additionalProperties` is false (no object is valid: that stays reported)."""
    listed = schema.get("required")
    if not isinstance(listed, list) or schema.get("additionalProperties") is False:
        return []
    if "unevaluatedProperties" in schema and "additionalProperties" not in schema:
        return []  # other keys of unevaluatedProperties' schema, which the dialect does not write
    declared = {prop.name for prop in node.properties}
    # "" and "*" are left out: llama.cpp's rule naming breaks on them (the report names them)
    return list(dict.fromkeys(name for name in listed
                              if isinstance(name, str) and name not in declared and name not in ("", "*")))


# patterns every string matches (ECMA-262 searches unanchored; `.` stops at line terminators, so `^.*$`
# is not one of them)
_EVERY_KEY: Final = frozenset({"", ".*", "^.*", ".*$", "(.*)"})


@dataclass(frozen=True, slots=True)
class PatternKeys:
    """How the dialect writes an object's patternProperties: the other keys are the pattern's (`every`:
    it matches every key, so they are the undeclared names), their values of `schema`; beside them, where
    other keys are allowed, the keys of `complement` (of additionalProperties' schema)."""

    pattern: str
    schema: SchemaNode
    every: bool
    complement: str | None = None  # the rule of the keys it does not match, where other keys are allowed


def _may_match(pattern: str, name: str) -> bool:
    # Python's reading of the pattern, Unicode and ASCII classes both, as an approximation of ECMA-262's
    # (its \d \w are ASCII, its \s Unicode's spaces); a pattern Python does not read may match
    try:
        return any(re.search(pattern, name, flags) is not None for flags in (0, re.ASCII))
    except re.error:
        return True


def pattern_keys(schema: Mapping[str, JsonValue], node: ObjectNode, names: Sequence[str],
                 ) -> PatternKeys | None:
    """The dialect's reading of the object's patternProperties (one pattern; the object's declared `names`
    none it matches), or None where it leaves them to the report: several patterns, a pattern it does not
    read, a declared name the pattern may match (beside a pattern of every key, one whose schema is not
    any value), other keys beside a pattern that does not match every key, but where the pattern is
    `^C*$` / `^C+$` and no name is declared (`complement_rule`)."""
    if len(node.patterns) != 1:
        return None
    pattern, value = node.patterns[0]
    if pattern in _EVERY_KEY:
        # a declared name matches it too, and its value would need both schemas: only where one is any value
        if (names and not isinstance(value, AnyNode)) or not other_keys_held(names):
            return None
        return PatternKeys(pattern, value, True)
    if exact_pattern(pattern) is None or any(_may_match(pattern, name) for name in names):
        return None
    if schema.get("additionalProperties") is False:
        return PatternKeys(pattern, value, False)
    # other keys: the pattern's complement, written for `^C*$` / `^C+$` and no declared name (the
    # complement would take them too)
    complement = None if names else complement_rule(pattern, "x-any-char")
    return None if complement is None else PatternKeys(pattern, value, False, complement)


def property_counts(schema: Mapping[str, JsonValue]) -> tuple[int | None, int | None]:
    """minProperties and maxProperties where they are non-negative integers (else None: not held)."""
    def count(key: str) -> int | None:
        value = schema.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    return count("minProperties"), count("maxProperties")


@dataclass(frozen=True, slots=True)
class PatternSplit:
    """The dialect's reading of patternProperties it does not read as `PatternKeys`: the keys split by the
    patterns they match (schema/key_automata.py), each label's values of `values[label]` (a label absent
    there: no such key is allowed), and the schema of each undeclared required name a pattern matches."""

    automaton: KeyAutomaton
    values: Mapping[frozenset[int], SchemaNode]
    extras: Mapping[str, SchemaNode]


def pattern_split(schema: Mapping[str, JsonValue], node: ObjectNode, names: Sequence[str],
                  extras: Sequence[str]) -> PatternSplit | None:
    """The keys of an object with patternProperties split by the patterns they match, or None where the
    dialect leaves them to the report: a pattern the automaton does not read, a key two patterns of
    different schemas match (neither of them any value), a declared property a pattern of a schema that is
    not any value matches."""
    if not node.patterns:
        return None
    try:
        automaton = KeyAutomaton([pattern for pattern, _ in node.patterns], names)
    except Unsupported:
        return None

    declared = schema.get("patternProperties")
    raw = declared if isinstance(declared, dict) else {}

    def vacuous(i: int) -> bool:
        # a pattern's schema that holds no keyword but annotations: any value
        pattern_schema = raw.get(node.patterns[i][0])
        return isinstance(pattern_schema, dict) and all(
            keyword_of(key).enforcement is Enforcement.ANNOTATION for key in pattern_schema)

    def value(label: frozenset[int]) -> SchemaNode | bool | None:
        # the schema of the label's values, None where no such key is allowed, False where not written
        if not label:
            if schema.get("additionalProperties") is False:
                return None
            return AnyNode(node.pointer) if opens_object(schema) else node.additional
        exact = [node.patterns[i][1] for i in sorted(label) if not vacuous(i)]
        return AnyNode(node.pointer) if not exact else exact[0] if len(exact) == 1 else False

    values: dict[frozenset[int], SchemaNode] = {}
    for label in automaton.labels():
        found = value(label)
        if found is False:
            return None
        if found is not None and not isinstance(found, bool):
            values[label] = found
    matched: dict[str, SchemaNode] = {}
    for name in names:
        label = automaton.label_of(name)
        if not label:
            continue
        found = value(label)
        if found is False or found is None:
            return None
        if not (isinstance(found, AnyNode) and all(map(vacuous, label))) and not isinstance(found, bool):
            if name not in extras:
                return None  # a declared property's schema and the pattern's: both would hold
            matched[name] = found
    return PatternSplit(automaton, values, matched)


class Readings:
    """The dialect's readings of one schema document's patterns and patternProperties, made once for its
    conversion and its report, which ask the same questions: a pattern read again is translated again, and
    an object's patternProperties split again builds its key automaton again (up to about 100 ms). Keeps
    answers for one document only (an object by its pointer)."""

    __slots__ = ("_keys", "_patterns")

    def __init__(self) -> None:
        self._patterns: dict[tuple[str, int, int | None], bool] = {}
        self._keys: dict[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]],
                         tuple[PatternKeys | None, PatternSplit | None]] = {}

    def noted(self, pattern: str, rule: str | None, *, min_length: int = 0,
              max_length: int | None = None) -> str | None:
        """`rule`, `exact_pattern(pattern, ..., min_length=, max_length=)`'s answer, noted for `held`."""
        self._patterns[pattern, min_length, max_length] = rule is not None
        return rule

    def held(self, pattern: str, *, min_length: int = 0, max_length: int | None = None) -> bool:
        """Whether `exact_pattern(pattern, min_length=, max_length=)` writes a rule."""
        key = (pattern, min_length, max_length)
        found = self._patterns.get(key)
        if found is None:
            found = self._patterns[key] = exact_pattern(pattern, min_length=min_length,
                                                        max_length=max_length) is not None
        return found

    def object_keys(self, schema: Mapping[str, JsonValue], node: ObjectNode, names: Sequence[str],
                    extras: Sequence[str]) -> tuple[PatternKeys | None, PatternSplit | None]:
        """`pattern_keys(schema, node, names)`, and where it is None, `pattern_split(schema, node, names,
        extras)`."""
        if not node.patterns:
            return None, None  # neither reads anything then
        key = (node.pointer, tuple(names), tuple(extras), tuple(pattern for pattern, _ in node.patterns))
        found = self._keys.get(key)
        if found is None:
            keys = pattern_keys(schema, node, names)
            found = self._keys[key] = keys, (pattern_split(schema, node, names, extras) if keys is None
                                             else None)
        return found


def format_rule_name(name: str) -> str:
    """The rule (in `RULES`) of a JSON string of format `name` (one of `FORMATS`)."""
    return f"x-{name}-string"


def check_dialect(dialect: str) -> None:
    """Raises SchemaError when `dialect` is not one of `DIALECTS`."""
    if dialect not in DIALECTS:
        raise SchemaError(f"unknown schema dialect {dialect!r}: one of {', '.join(DIALECTS)}")


def _number(value: JsonValue) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _side(schema: Mapping[str, JsonValue], inclusive: str, exclusive: str, below: bool) -> int | None:
    bound: int | None = None
    value = _number(schema.get(inclusive))
    if value is not None:
        bound = math.ceil(value) if below else math.floor(value)
    flag = schema.get(exclusive)
    if isinstance(flag, bool):  # draft 4: the inclusive bound, excluded
        if flag and value is not None:
            bound = math.floor(value) + 1 if below else math.ceil(value) - 1
        return bound
    value = _number(flag)
    if value is not None:
        candidate = math.floor(value) + 1 if below else math.ceil(value) - 1
        if bound is None or (candidate > bound if below else candidate < bound):
            bound = candidate
    return bound


def integer_bounds(schema: Mapping[str, JsonValue]) -> tuple[int | None, int | None]:
    """The inclusive integer range a schema's bounds set (None: no bound on that side)."""
    return (_side(schema, "minimum", "exclusiveMinimum", True),
            _side(schema, "maximum", "exclusiveMaximum", False))


_BOUND_KEYS: Final = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _decimal(value: JsonValue) -> Decimal | None:
    number = _number(value)
    if number is None:
        return None
    # a double's shortest decimal: the value as the schema's text wrote it, to a double's precision
    return Decimal(number) if isinstance(number, int) else Decimal(repr(number))


def _number_side(schema: Mapping[str, JsonValue], inclusive: str, exclusive: str, below: bool,
                 ) -> tuple[bool, Bound | None]:
    # (readable, the tightest bound of the side)
    bounds: list[Bound] = []
    value = _decimal(schema.get(inclusive))
    if inclusive in schema and value is None:
        return False, None
    flag = schema.get(exclusive)
    if isinstance(flag, bool):  # draft 4: the inclusive bound, excluded
        if value is not None:
            bounds.append(Bound(value, flag))
    else:
        if value is not None:
            bounds.append(Bound(value))
        strict = _decimal(flag)
        if exclusive in schema and strict is None:
            return False, None
        if strict is not None:
            bounds.append(Bound(strict, True))
    if not bounds:
        return True, None
    # the tightest: the largest lower bound (the strict one on a tie), the smallest upper bound
    if below:
        return True, max(bounds, key=lambda bound: (bound.value, bound.strict))
    return True, max(bounds, key=lambda bound: (-bound.value, bound.strict))


def number_rule(schema: Mapping[str, JsonValue]) -> str | None:
    """The dialect's expression for a number within the schema's bounds (number_ranges.py), or None where
    it leaves them to llama.cpp (no bound, one it cannot read, past MAX_DIGITS digits, or none admits a
    number)."""
    if not any(key in schema for key in _BOUND_KEYS):
        return None
    readable_low, low = _number_side(schema, "minimum", "exclusiveMinimum", True)
    readable_high, high = _number_side(schema, "maximum", "exclusiveMaximum", False)
    if not (readable_low and readable_high) or (low is None and high is None):
        return None
    if any(len(format(abs(bound.value), "f")) > MAX_DIGITS for bound in (low, high) if bound is not None):
        return None
    return number_range_rule(low, high)


def exact_range(low: int | None, high: int | None) -> tuple[int, int] | None:
    """The closed range `integer_range_rule` writes for these bounds, or None when the extended dialect
    leaves them to llama.cpp (no bound, bounds past MAX_DIGITS digits, or crossed bounds)."""
    if low is None and high is None:
        return None
    if any(bound is not None and len(str(abs(bound))) > MAX_DIGITS for bound in (low, high)):
        return None
    if low is not None and high is not None:
        return (low, high) if low <= high else None
    bound = low if low is not None else high
    assert bound is not None
    widest = 10 ** max(OPEN_DIGITS, len(str(abs(bound)))) - 1
    return (bound, widest) if low is not None else (-widest, bound)


# -- the other keys of an object ------------------------------------------------------------------------
# llama.cpp's rule for the keys beside the declared properties reads a key as JSON text: a declared name
# spelled with an escape (`\u0061` for `a`) passes as another key, and a first character outside the names'
# is taken raw, a backslash or a control character too (text that is no JSON string). The dialect's rule
# takes escapes only for the characters that need one (quote, backslash, controls, DEL): a key spelled with
# an escape then holds one of them, so it is no declared name when no declared name does, and a key without
# one is compared as it is written. Where a declared name holds such a character, the dialect keeps
# llama.cpp's rule (and the report). Other spellings of a key (`\u0061`, `\/`) are refused.

_MAX_NAME_CHARS: Final = 256  # the rule nests one group per character
_RUN: Final = 3  # the most places of one character where no name ends written in one rule


# printable ASCII a character class takes as it is written (not `\\`, `]`, `-` or `^`: escaped)
_RAW_IN_CLASS: Final = frozenset(map(chr, range(0x20, 0x7F))) - set("\\]-^[")


def _class_char(char: str) -> str:
    return char if char in _RAW_IN_CLASS else f"\\U{ord(char):08X}"


# a character JSON must escape in a string (DEL too, as llama.cpp's `char` has it)
_NEEDS_ESCAPE: Final = re.compile(r'[\x00-\x1f"\\\x7f]')


def other_keys_held(names: Sequence[str]) -> bool:
    """Whether `other_keys_rule(names)` writes a rule (without writing it)."""
    return not any(len(name) > _MAX_NAME_CHARS or _NEEDS_ESCAPE.search(name) for name in names)


def _literal_char(char: str) -> str:
    # a name's character in a GBNF string literal: as it is, or escaped outside printable ASCII (the
    # grammar's text is held as bytes; a name holds no quote, backslash or control character here)
    return char if " " <= char <= "~" else f"\\U{ord(char):08X}"


class KeyRules:
    """The rules `other_keys_rule` wrote for one grammar, kept between its calls (each is written once):
    the rules of a key leaving the names, by (characters, a name ends there); the rules of the names'
    places, by their text; and those of the places that only one name goes on from, by its rest."""

    __slots__ = ("chains", "leaves", "places")

    def __init__(self) -> None:
        self.leaves: dict[tuple[str, bool], str] = {}
        self.places: dict[str, str] = {}
        self.chains: dict[str, str] = {}


def other_keys_rule(names: Sequence[str], add_rule: AddRule, written: KeyRules | None = None) -> str | None:
    """A GBNF expression for a JSON string (with its quotes) that is none of `names` (text), or None when a
    name holds a character JSON must escape, or is too long for the rule's nesting. The rules it needs
    beside the `x-key-*` ones of `RULES` are added with `add_rule`: one per set of characters a place of the
    names may hold (`x-key-not-...`: a key leaving the names there, or ending there; `x-key-more-not-...`
    where a name ends there, so the key may not), shared by every place and every object of the grammar
    with the same set, and one per place of the names (`x-key-at-...`), shared by every place of the grammar
    that takes the same rest of a key. `written` keeps them between calls with the same `add_rule` (one
    grammar). The closing quote is written by the rules a key ends in (none of the expression's rules may
    be empty)."""
    if not other_keys_held(names):
        return None
    kept = KeyRules() if written is None else written
    leaves, places, chains = kept.leaves, kept.places, kept.chains

    def leave(chars: str, end: bool) -> str:
        # the rest of a key that leaves the names at a place of these characters: a character none of them
        # (or an escape) and any tail; where no name ends at the place, the key may end there too
        found = leaves.get((chars, end))
        if found is None:
            if len(chars) == 1:  # most places
                listed, hexes = _class_char(chars), f"{ord(chars):x}"
            else:
                listed = "".join(map(_class_char, chars))
                hexes = "-".join(f"{ord(char):x}" for char in chars)
            found = leaves[chars, end] = add_rule(
                ("x-key-more-not-" if end else "x-key-not-") + hexes,
                f'[^"\\\\\\x7F\\x00-\\x1F{listed}] x-key-tail | '
                + ("x-key-escape x-key-tail" if end else "x-key-end"))
        return found

    def place(rule: str) -> str:
        found = places.get(rule)
        if found is None:
            found = places[rule] = add_rule(f"x-key-at-{len(places)}", rule)
        return found

    # One rule per place of the names, named so that the places of the grammar that take the same rest of
    # a key (names with the same ending, objects with names in common) share it: its characters, each
    # followed by the places after it, or a key that leaves the names there. Up to `_RUN - 1` places of one
    # character where no name ends are written in the rule of the place before them (a rule less each),
    # counted from the end of a run of such places, so that the places of the same ending are the same
    # wherever the run starts. A place is the names that go through it (sorted, distinct) and how many
    # characters of them it follows.
    def chunk(chars: str, after: str) -> list[str]:
        # the alternatives of these characters (a place's, then those of the places written in its rule)
        # followed by `after`, or by a key leaving the names at one of those written in its rule
        if chars.isascii() and chars.isprintable():  # each character as it is (most names)
            return [f'"{chars}" {after}'] + [f'"{chars[:i]}" {leave(chars[i], False)}'
                                             for i in range(len(chars) - 1, 0, -1)]
        literals = [_literal_char(char) for char in chars]
        return [f'"{"".join(literals)}" {after}'] + [f'"{"".join(literals[:i])}" {leave(chars[i], False)}'
                                                     for i in range(len(chars) - 1, 0, -1)]

    def chain(rest: str) -> str:
        # the place only one name goes on from, `rest` more characters (at least one); no name ends there
        found = chains.get(rest)
        if found is None:
            size = (len(rest) - 1) % _RUN + 1
            after = chain(rest[size:]) if len(rest) > size else "x-key-more"
            found = chains[rest] = place(" | ".join([*chunk(rest[:size], after), leave(rest[0], False)]))
        return found

    def run(group: Sequence[str], depth: int) -> int:
        # how many places of one character where no name ends start `depth` characters into these names
        # (sorted, distinct: where the first and the last agree, all do, and a name ending first comes first)
        first, last = group[0], group[-1]
        end = min(len(first), len(last))
        at = depth
        while at < end and first[at] == last[at]:
            at += 1
        return at - depth

    def rest(group: Sequence[str], depth: int) -> str:
        # the place of these names (sorted, distinct) `depth` characters into them
        if len(group) == 1:
            name = group[0]
            return chain(name[depth:]) if len(name) > depth else "x-key-more"
        end = len(group[0]) == depth
        alternatives: list[str] = []
        chars: list[str] = []
        start = 1 if end else 0
        while start < len(group):
            char = group[start][depth]
            stop = start + 1
            while stop < len(group) and group[stop][depth] == char:
                stop += 1
            chars.append(char)
            child = group[start:stop]
            size = run(child, depth + 1) % _RUN + 1  # this place's character and those written with it
            alternatives += chunk(child[0][depth : depth + size], rest(child, depth + size))
            start = stop
        alternatives.append(leave("".join(chars), end))
        return place(" | ".join(alternatives))

    return f'"\\"" {rest(sorted(set(names)), 0) if names else "x-key-tail"}'
