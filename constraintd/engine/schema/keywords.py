# The keywords of JSON Schema and what llama.cpp's converter makes of each: the table the report of
# schema/report.py reads.
#
# Contract:
# - `KEYWORDS` holds every keyword of the seven vocabularies of JSON Schema 2020-12 (core, applicator,
#   unevaluated, validation, format-annotation, content, meta-data) and the older drafts' keywords that real
#   schemas still carry (`definitions`, `dependencies`, `additionalItems`, `$recursiveRef`, ...). A keyword
#   outside it is unknown: 2020-12 makes an unknown keyword an annotation, and so does the report.
# - Each entry says what the grammar does with the keyword:
#     ENFORCED    the converter reads it wherever the schema's kind reads it (`type`, `properties`,
#                 `required`, `minItems`, ...): reported only where the kind it converts to ignores it
#                 (beside a `$ref`, on a number, ...);
#     PARTIAL     enforced for some values or beside some keywords only (`minimum` on integers, within
#                 ranges llama.cpp writes right; `format` time / uuid; a `pattern` llama.cpp translates
#                 that cannot take a quote; `oneOf` whose alternatives cannot overlap): the report names
#                 every other use;
#     NEVER       no grammar text comes of it (`not`, `if`, `uniqueItems`, `multipleOf`, ...): every use
#                 that can matter is reported;
#     ANNOTATION  restricts no value (titles, descriptions, identifiers, `$defs` as a container, the content
#                 vocabulary, which 2020-12 makes annotations): never reported, never refused by strict.
# - `applies_to` is the set of JSON types the keyword says anything about ("integer" is within "number"):
#   a keyword beside a grammar that can only produce other types is vacuous (`minLength` on an integer) and
#   is not reported.
#
# Where the grammar refuses documents the schema allows (llama.cpp writes an object's properties in one
# order, required first; closes objects without `additionalProperties`; takes integers of at most 16
# digits; reads a translated `pattern` or a const against the JSON text, so an escape such as `\u0061` is
# not the letter it stands for), the report says nothing: it is about what the grammar lets through.
# The extended dialect's report names one such refusal: an object whose properties it cannot take in any
# order (property_order.py) is named under `properties` (or its allOf), so that strict refuses it.
# One approximation lets through what it should not and is not reported: `minLength` / `maxLength` count
# the JSON text's characters, an escape as one, so a character outside the BMP written as two `\u`
# escapes counts twice (the extended dialect's grammar takes such a character raw only).
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANY_TYPE",
    "EXTENDED_KEYWORDS",
    "KEYWORDS",
    "Enforcement",
    "Keyword",
    "Unenforced",
    "keyword_of",
]


class Enforcement(enum.Enum):
    ENFORCED = "enforced"
    PARTIAL = "partial"
    NEVER = "never"
    ANNOTATION = "annotation"


ANY_TYPE: Final = frozenset({"null", "boolean", "object", "array", "string", "number"})
_NUMBER: Final = frozenset({"number"})
_STRING: Final = frozenset({"string"})
_ARRAY: Final = frozenset({"array"})
_OBJECT: Final = frozenset({"object"})


@dataclass(frozen=True, slots=True)
class Keyword:
    """One keyword: its vocabulary, what the converter does with it, the types it speaks of, and why it is
    reported where it is (the reason of a report item when no context says more)."""

    vocabulary: str
    enforcement: Enforcement
    applies_to: frozenset[str] = ANY_TYPE
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Unenforced:
    """One keyword the grammar does not enforce.

    Attributes:
        pointer: the JSON pointer of the keyword (`#/properties/age/minimum`), or of the subschema an
            applicator drops (`#/allOf/1`).
        keyword: the keyword.
        reason: why it is not enforced; llama.cpp's own warning where it gives one.
    """

    pointer: str
    keyword: str
    reason: str

    def __str__(self) -> str:
        return f"{self.pointer}: {self.keyword}: {self.reason}"


def _k(vocabulary: str, enforcement: Enforcement, applies_to: frozenset[str] = ANY_TYPE,
       reason: str = "") -> Keyword:
    return Keyword(vocabulary, enforcement, applies_to, reason)


_E, _P, _N, _A = Enforcement.ENFORCED, Enforcement.PARTIAL, Enforcement.NEVER, Enforcement.ANNOTATION
_BOUND = "bounds are enforced on integers only, within 64 bits"

KEYWORDS: Final[Mapping[str, Keyword]] = {
    # core
    "$schema": _k("core", _A),
    "$id": _k("core", _A),  # a base URI; `$ref` is resolved in the document alone, as llama.cpp does
    "$ref": _k("core", _E),
    "$anchor": _k("core", _A),
    "$dynamicRef": _k("core", _N, reason="dynamic references are not followed"),
    "$dynamicAnchor": _k("core", _A),
    "$vocabulary": _k("core", _A),
    "$comment": _k("core", _A),
    "$defs": _k("core", _A),  # a container: its schemas count where a $ref uses them
    # applicator
    "prefixItems": _k("applicator", _E, _ARRAY),
    "items": _k("applicator", _E, _ARRAY),
    "contains": _k("applicator", _N, _ARRAY, "contains is not enforced"),
    "additionalProperties": _k("applicator", _E, _OBJECT),
    "properties": _k("applicator", _E, _OBJECT),
    "patternProperties": _k("applicator", _N, _OBJECT, "pattern properties are not enforced"),
    "dependentSchemas": _k("applicator", _N, _OBJECT, "dependent schemas are not enforced"),
    "propertyNames": _k("applicator", _N, _OBJECT, "property names are not checked"),
    "if": _k("applicator", _N, reason="conditional schemas are not enforced"),
    "then": _k("applicator", _N, reason="conditional schemas are not enforced"),
    "else": _k("applicator", _N, reason="conditional schemas are not enforced"),
    "allOf": _k("applicator", _P),
    "anyOf": _k("applicator", _E),
    "oneOf": _k("applicator", _P),
    "not": _k("applicator", _N, reason="negation is not enforced"),
    # unevaluated
    "unevaluatedItems": _k("unevaluated", _N, _ARRAY, "unevaluated items are not enforced"),
    "unevaluatedProperties": _k("unevaluated", _N, _OBJECT, "unevaluated properties are not enforced"),
    # validation
    "type": _k("validation", _E),
    "const": _k("validation", _E),
    "enum": _k("validation", _E),
    "multipleOf": _k("validation", _N, _NUMBER, "multipleOf is not enforced"),
    "maximum": _k("validation", _P, _NUMBER, _BOUND),
    "exclusiveMaximum": _k("validation", _P, _NUMBER, _BOUND),
    "minimum": _k("validation", _P, _NUMBER, _BOUND),
    "exclusiveMinimum": _k("validation", _P, _NUMBER, _BOUND),
    "maxLength": _k("validation", _P, _STRING, "lengths are enforced on plain strings only"),
    "minLength": _k("validation", _P, _STRING, "lengths are enforced on plain strings only"),
    "pattern": _k("validation", _P, _STRING),
    "maxItems": _k("validation", _P, _ARRAY, "counts are enforced on arrays of one item schema only"),
    "minItems": _k("validation", _P, _ARRAY, "counts are enforced on arrays of one item schema only"),
    "uniqueItems": _k("validation", _N, _ARRAY, "unique items are not enforced"),
    "maxContains": _k("validation", _N, _ARRAY, "contains is not enforced"),
    "minContains": _k("validation", _N, _ARRAY, "contains is not enforced"),
    "maxProperties": _k("validation", _N, _OBJECT, "property counts are not enforced"),
    "minProperties": _k("validation", _N, _OBJECT, "property counts are not enforced"),
    "required": _k("validation", _P, _OBJECT, "required properties are enforced among `properties` only"),
    "dependentRequired": _k("validation", _N, _OBJECT, "dependent requirements are not enforced"),
    # format-annotation (format-assertion has the same keyword)
    "format": _k("format-annotation", _P, _STRING),
    # content: annotations in 2020-12 (a validator need not decode the content)
    "contentEncoding": _k("content", _A),
    "contentMediaType": _k("content", _A),
    "contentSchema": _k("content", _A),
    # meta-data
    "title": _k("meta-data", _A),
    "description": _k("meta-data", _A),
    "default": _k("meta-data", _A),
    "deprecated": _k("meta-data", _A),
    "readOnly": _k("meta-data", _A),
    "writeOnly": _k("meta-data", _A),
    "examples": _k("meta-data", _A),
    # older drafts, still common
    "definitions": _k("draft-07", _A),  # a container, as $defs
    "id": _k("draft-04", _A),
    "$recursiveRef": _k("2019-09", _N, reason="recursive references are not followed"),
    "$recursiveAnchor": _k("2019-09", _A),
    "dependencies": _k("draft-07", _N, _OBJECT, "dependencies are not enforced"),
    "additionalItems": _k("draft-07", _N, _ARRAY, "additional items are not enforced"),
}

# What the extended dialect (schema/extended.py) enforces beyond the table above, keyword by keyword; a
# keyword not named here is enforced and reported as in the default dialect.
_INTEGER_BOUND: Final = (
    "exactly, one- or two-sided, the tightest of minimum and exclusiveMinimum (maximum and exclusiveMaximum) "
    "and draft 4's boolean exclusives, bounds of up to 40 digits: on integers, any integer of the range (an "
    "open side takes at most 16 digits, or the bound's); on numbers, compared as decimals, the numbers "
    "written without an exponent (an open side's integer part as integers'); crossed bounds stay reported"
)
_LENGTH: Final = (
    "on a plain string: characters counted, a character outside the BMP taken raw only (not as two escapes "
    "counted twice); beside a pattern the dialect reads: held where every value of the pattern has such a "
    "length, or where the pattern is anchored and its one variable part is a repeated character class among "
    "fixed-length parts (the count is fitted), where an unanchored pattern's every match is at least "
    "maxLength long (read anchored: such a value is its match), else reported; beside a format, reported"
)
EXTENDED_KEYWORDS: Final[Mapping[str, str]] = {
    "format": ("date, time, date-time (RFC 3339: month lengths, leap years, offsets; a leap second at "
               "23:59:60 UTC only; years from 0001), ipv4 (dotted decimal, no leading zeros), ipv6 (RFC 4291 "
               "text forms, no zone), uri (RFC 3986), uuid, email (RFC 5321 Mailbox; address literals of "
               "IPv4 and IPv6 only): exact grammars; a format 2020-12 does not define is an annotation; "
               "every other format (hostname, uri-reference, ...), and a length "
               "beside a format, stays reported"),
    "additionalProperties": ("absent (and unevaluatedProperties too), other keys are allowed (JSON "
                             "Schema's default; llama.cpp closes the object); the keys beside the declared "
                             "properties are exactly the JSON strings that are none of their names (a name "
                             "spelled with an escape no longer passes, nor a key that is no JSON string); "
                             "other keys take an escape only for the characters JSON must escape; where a "
                             "declared name holds one, it stays reported"),
    "properties": ("in any order, other keys anywhere between them: up to 3 properties exactly (none "
                   "repeated), and past 3 where all are required (up to 10) or 3 of 4; else, where at most "
                   "10 are required, a property may repeat (each value checked, so the document is valid "
                   "whichever one a reader keeps); past that, the schema's order only, reported (strict "
                   "refuses it)"),
    "unevaluatedProperties": ("false beside properties: the object closed, exactly; a schema there (whose "
                              "keys the closed object refuses) stays reported, and a required name the "
                              "properties do not declare with it"),
    "patternProperties": ("one pattern, read as `pattern` is, where no declared name may match it: beside "
                          "additionalProperties false, the other keys are exactly the pattern's, of its "
                          "schema; beside other keys allowed and no declared name, a pattern `^C*$` / `^C+$` "
                          "(C one class) splits the keys into its own and their complement (of "
                          "additionalProperties' schema); a pattern of every key (`.*`, `^.*`, `.*$`, ``) "
                          "gives its schema to every undeclared key, beside declared names only where its "
                          "schema is any value; otherwise (several patterns, another pattern beside other "
                          "keys) the keys split by the patterns they match (a deterministic automaton of the "
                          "patterns, up to 400 states, schema/key_automata.py), each set's values of its "
                          "pattern's schema, the rest of additionalProperties'; an undeclared required name "
                          "a pattern matches of its schema; reported where a key two patterns match needs "
                          "both schemas (neither any value), where a declared name's pattern schema is not "
                          "any value, or a pattern the automaton does not read"),
    "allOf": ("the parts (and the keywords beside them, nested allOf and $ref parts) merged into one "
              "schema where the merge is exact (schema/all_of.py), then read as any schema: where a part "
              "lists values (const, enum), those of them valid against the whole schema, checked value by "
              "value (schema/value_checks.py: not, anyOf, oneOf, if, properties, counts, bounds ...; a "
              "pattern or format on the way leaves it unmerged); else type intersected, bounds, lengths and "
              "counts the tightest, required and dependentRequired united, integer multipleOf by their "
              "least common multiple, several `not` as one, objects' properties the allOf of what each part "
              "says of the name (its schema or its additionalProperties), items and propertyNames as allOf; "
              "unmerged where two parts speak of patternProperties, anyOf, oneOf, if, contains, prefixItems "
              "or dependentSchemas, of different patterns or formats, or of unevaluated keywords (merges "
              "within merges stop 8 deep); there, objects merged as the default does, but a part's optional "
              "properties stay optional and the merge is open to other keys where no part has "
              "additionalProperties, and the rest reported"),
    "oneOf": ("beside `type` object (or `properties` and no `type`) and object keywords, each alternative "
              "of required names, properties and annotations merged with them where the merge is exact "
              "(schema/alternatives.py); alternatives told apart by a required property's listed values, "
              "or one excluded from another by requiring one of its required names absent (an alternative "
              "split in up to 32 objects); else, as in the default, where alternatives may overlap, "
              "reported"),
    "anyOf": ("beside `type` object and object keywords, each alternative of required names, properties and "
              "annotations merged with them where the merge is exact (schema/alternatives.py); beside "
              "`required` alone, its names added to each alternative's; else as in the default (the "
              "keywords beside it reported)"),
    "minProperties": ("held where at most the required count, as 1 beside declared properties or other "
                      "keys (no empty object), and up to 256 for an object of other keys only (a map: "
                      "counted pairs, a repeated name counted once per pair, where JSON Schema leaves it "
                      "undefined); else reported"),
    "maxProperties": ("held beside a closed object of as many properties or fewer, and up to 256 for an "
                      "object of other keys only (a map, as minProperties); else reported"),
    "enum": ("beside type, a const, length, count and bound keywords (schema/listed_values.py): the values "
             "they allow, checked value by value, are the grammar's; an optional property none of whose "
             "values is allowed is absent; beside any other keyword, as in the default"),
    "const": "as enum",
    "dependentRequired": ("beside object keywords (no patternProperties, no applicator): an object per "
                          "choice of each dependent name absent or present with its names, up to 32, in an "
                          "anyOf (schema/alternatives.py); else reported"),
    "dependencies": "of names only: as dependentRequired; a dependent schema stays reported",
    "not": ("of required names alone (`{\"required\": [a, b]}`, or an allOf of such parts) beside object "
            "keywords: the objects missing one of the names, one object per name the schema does not require "
            "itself, each with that name forbidden (schema/alternatives.py); a value that is no object is "
            "refused, as such a `not` refuses it; in an allOf part beside listed values, checked value by "
            "value (see allOf); every other `not` stays reported"),
    "pattern": ("matched against the string's value as ECMA-262 reads it (unanchored unless anchored; `.`, "
                "`\\d \\w \\s` and their negations, classes, groups, alternatives, counted repetition, "
                "escapes), each character in its JSON spelling (a quote, backslash or control character "
                "escaped); lookarounds, backreferences, word boundaries, `\\p{...}` and anchors inside stay "
                "reported"),
    "type": ("absent beside object keywords (`properties`, `additionalProperties`): objects as those say, "
             "and every value that is no object (llama.cpp takes objects only), but in a oneOf of two or "
             "more such alternatives and objects (where no other value is valid: it matches two), and beside "
             "`\"type\": \"object\"` on the oneOf/anyOf or a `$ref` to such an object, objects only"),
    "minLength": _LENGTH,
    "maxLength": _LENGTH,
    "required": ("a name the properties do not declare is a required property of the other keys' schema (any "
                 "value where llama.cpp closes the object); beside additionalProperties false, reported"),
    "minimum": _INTEGER_BOUND,
    "maximum": _INTEGER_BOUND,
    "exclusiveMinimum": _INTEGER_BOUND,
    "exclusiveMaximum": _INTEGER_BOUND,
}

_UNKNOWN: Final = Keyword("unknown", Enforcement.ANNOTATION)


def keyword_of(name: str) -> Keyword:
    """The table's entry for `name`; an unknown keyword is an annotation (2020-12, section 6.5)."""
    return KEYWORDS.get(name, _UNKNOWN)
