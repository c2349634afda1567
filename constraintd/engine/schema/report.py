# The report of a conversion: every keyword of the schema that the grammar does not enforce, with its JSON
# pointer and why.
#
# Contract:
# - `unenforced_keywords(document, unsupported_patterns)` reads the schema objects the builder built
#   (`SchemaDocument.sources`, in document order) and, for each, the kind of node it became: a keyword
#   that node's grammar does not hold is named, unless it is an annotation (keywords.py) or vacuous
#   (it speaks only of types the node's grammar cannot produce, or its value leaves nothing to check).
# - Sound before precise: when a keyword may leave a document through that the schema forbids, it is
#   named. A few are named where a closer reading would clear them (a sibling of `enum` is not evaluated
#   against the values; `propertyNames` is named even where every property is declared).
# - It reads, never changes: the grammar is llama.cpp's whatever the report says.
# - Items come in document order, one per (pointer, keyword), first reason kept; `allOf` parts the
#   converter drops are named by the part's pointer with the keyword `allOf`.
# - With the extended dialect (schema/extended.py), the formats and integer bounds its grammars hold are
#   not named; every other finding is the default dialect's.
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Final

from constraintd.engine.schema import extended, listed_values, property_order
from constraintd.engine.schema.json_text import JsonValue, dump_json, is_integer
from constraintd.engine.schema.keywords import Enforcement, Unenforced, keyword_of
from constraintd.engine.schema.nodes import (
    INT64_MAX,
    INT64_MIN,
    AllOfNode,
    AnyNode,
    AnyOfNode,
    ArrayNode,
    BooleanNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    NullNode,
    NumberNode,
    ObjectNode,
    RefNode,
    SchemaDocument,
    SchemaNode,
    SchemaSource,
    StringFormat,
    StringNode,
    TupleNode,
    escape_pointer_token,
)
from constraintd.engine.schema.raw_text import matches_unescaped
from constraintd.engine.schema.tree_reader import (
    EVERY_TYPE,
    TreeReader,
    canonical,
    json_type,
    meets,
    within,
)

__all__ = ["unenforced_keywords"]

_Schema = Mapping[str, JsonValue]
# (keyword, reason) pairs a node kind leaves unenforced in its schema object, "" for the table's reason
_Findings = Iterator[tuple[str, str]]

_STAR: Final = ("llama.cpp reads a property named * as the place of the other keys: the grammar takes it "
                "repeated, and beside additionalProperties with their schema")
_CROSSED: Final = "the counts admit nothing, and llama.cpp's grammar for them may take something"
_MAX_PAIRWISE: Final = 64  # alternatives of a oneOf compared pair by pair, at most
_INT32: Final = 2**31


def _count_narrowed(schema: _Schema, key: str) -> bool:
    value = schema.get(key)
    return is_integer(value) and not 0 <= value < _INT32  # type: ignore[operator]


def _divides_one(value: JsonValue) -> bool:
    """Every integer is a multiple of `value` (1, 0.5, 0.25, 0.1, ...), read from the number as written."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return False
    return (1 / Fraction(repr(value))).denominator == 1


def _intended(schema: _Schema, inclusive: str, exclusive: str, below: bool) -> tuple[int | None, str]:
    """The integer bound the schema sets on one side (None: none), and the keyword that sets it."""
    bound: int | None = None
    key = inclusive
    value = schema.get(inclusive)
    if isinstance(value, int | float) and not isinstance(value, bool):
        bound = math.ceil(value) if below else math.floor(value)
    value = schema.get(exclusive)
    if isinstance(value, bool):  # draft 4: the inclusive bound, excluded
        if value and bound is not None:
            strict = schema[inclusive]
            assert isinstance(strict, int | float)
            bound, key = (math.floor(strict) + 1 if below else math.ceil(strict) - 1), exclusive
    elif isinstance(value, int | float):
        candidate = math.floor(value) + 1 if below else math.ceil(value) - 1
        if bound is None or (candidate > bound if below else candidate < bound):
            bound, key = candidate, exclusive
    return bound, key


def _integer_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    # The grammar's range is the builder's (llama.cpp's narrowing: one keyword a side, int64, a double
    # outside it unbounded); the schema's is read exactly. Each side the grammar does not hold is named.
    schema, node = source.schema, source.node
    assert isinstance(node, IntegerNode)
    low, low_key = _intended(schema, "minimum", "exclusiveMinimum", True)
    high, high_key = _intended(schema, "maximum", "exclusiveMaximum", False)
    grammar_low = None if node.minimum == INT64_MIN else node.minimum
    grammar_high = None if node.maximum == INT64_MAX else node.maximum
    if grammar_low is not None and grammar_high is not None and grammar_low > grammar_high:
        yield low_key, "the bounds admit no integer, and the grammar llama.cpp writes for them takes some"
    elif not range_holds(node.minimum, node.maximum):
        key = low_key if grammar_low is not None else high_key
        yield key, ("llama.cpp's grammar of this one-sided range takes integers outside it (or digits JSON "
                    "refuses)")
    else:
        if low is not None and (grammar_low is None or grammar_low < low):
            yield low_key, f"the grammar's lower bound is {_shown(grammar_low)}, not {low}"
        if high is not None and (grammar_high is None or grammar_high > high):
            yield high_key, f"the grammar's upper bound is {_shown(grammar_high)}, not {high}"
    if "multipleOf" in schema and not _divides_one(schema["multipleOf"]):
        yield "multipleOf", ""
    yield from _beside(schema, frozenset({"integer"}), _INTEGER_READS, "")


def range_holds(minimum: int, maximum: int) -> bool:
    """llama.cpp's `build_min_max_int(minimum, maximum)` (ranges.py) takes no text but JSON integers of the
    range (INT64_MIN / INT64_MAX: no bound on that side). It may refuse some of them (its 16 digits, and a
    few more): that is not asked here.

    Two-sided ranges hold. A one-sided one recurses on the digits after the first as a number, which
    forgets their leading zeros: a minimum of 100 reads its tail "00" as 0 and takes 10. A negative maximum
    is a minimum of its magnitude written after "-" inside a number, where a first digit may be 0: -1
    takes -01, -20 takes -012. tests/engine/schema/test_report_ranges.py checks this against the grammar.
    """
    has_min, has_max = minimum != INT64_MIN, maximum != INT64_MAX
    if has_min == has_max:
        return True
    if has_min:
        digits = str(minimum)
        return minimum < 10 or "0" not in digits[1:-1]
    if maximum >= 0:
        return True
    digits = str(-maximum)
    return len(digits) > 1 and digits[0] == "1" and "0" not in digits[1:-1]


def _shown(bound: int | None) -> str:
    return "none" if bound is None else str(bound)


def _extended_integer_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    # The extended dialect writes the schema's own range where it can (schema/extended.py); else llama.cpp's.
    schema = source.schema
    if extended.exact_range(*extended.integer_bounds(schema)) is None:
        yield from _integer_findings(reader, source)
        return
    if "multipleOf" in schema and not _divides_one(schema["multipleOf"]):
        yield "multipleOf", ""
    yield from _beside(schema, frozenset({"integer"}), _INTEGER_READS, "")


def _string_findings(reader: TreeReader, source: SchemaSource, exact_formats: frozenset[str] = frozenset(),
                     readings: extended.Readings | None = None) -> _Findings:
    # readings: the extended dialect's reading of patterns (None: the default dialect's)
    schema, node = source.schema, source.node
    assert isinstance(node, StringNode)
    if node.pattern and readings is not None and readings.held(node.pattern):
        if "format" in schema:
            yield "format", "ignored beside a pattern"
        max_length = None if node.max_length < 0 else node.max_length
        if not readings.held(node.pattern, min_length=node.min_length, max_length=max_length):
            for key in ("minLength", "maxLength"):
                if key in schema:
                    yield key, "ignored beside this pattern"
    elif not node.pattern and schema.get("format") in exact_formats:
        for key in ("minLength", "maxLength"):
            if key in schema:
                yield key, f"ignored beside format {schema['format']}"
    elif node.pattern:
        if matches_unescaped(node.pattern):
            yield "pattern", ("matched against the JSON text, where it takes a quote, backslash or control "
                              "character unescaped: text that is no JSON string of the pattern passes")
        if "format" in schema:
            yield "format", "ignored beside a pattern"
        for key in ("minLength", "maxLength"):
            if key in schema:
                yield key, "ignored beside a pattern"
    elif node.format is not StringFormat.NONE:
        if node.format in (StringFormat.DATE, StringFormat.DATE_TIME):
            yield "format", "a date's day is checked against 31, not its month's length (02-31 passes)"
        for key in ("minLength", "maxLength"):
            if key in schema:
                yield key, f"ignored beside format {schema['format']}"
    elif "format" in schema and (not exact_formats or schema["format"] in extended.DEFINED_FORMATS):
        yield "format", f"format {schema['format']} is not enforced"
    elif 0 <= node.max_length < node.min_length:
        yield "minLength", _CROSSED
    for key in ("minLength", "maxLength"):
        if _count_narrowed(schema, key):
            yield key, "a count beyond 32 bits is narrowed"
    yield from _beside(schema, frozenset({"string"}), _STRING_READS, "")


def _array_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    schema, node = source.schema, source.node
    if "items" in schema and "prefixItems" in schema:
        yield "prefixItems", "ignored beside items (the converter reads items only)"
    if isinstance(node, TupleNode):
        size = len(node.items)
        low, high = schema.get("minItems"), schema.get("maxItems")
        if "minItems" in schema and not (is_integer(low) and low <= size):  # type: ignore[operator]
            yield "minItems", f"not read beside a tuple of {size} items"
        if "maxItems" in schema and not (is_integer(high) and high >= size):  # type: ignore[operator]
            yield "maxItems", f"not read beside a tuple of {size} items"
    else:
        assert isinstance(node, ArrayNode)
        if 0 <= node.max_items < node.min_items:
            yield "minItems", _CROSSED
        for key in ("minItems", "maxItems"):
            if _count_narrowed(schema, key):
                yield key, "a count beyond 32 bits is narrowed"
        # an item schema evaluates every item; a tuple admits no item past its own
        if "unevaluatedItems" in schema and "items" not in schema and "prefixItems" not in schema:
            yield "unevaluatedItems", ""
    at_most_one = len(node.items) <= 1 if isinstance(node, TupleNode) else 0 <= node.max_items <= 1
    if schema.get("uniqueItems", False) is not False and not at_most_one:
        yield "uniqueItems", ""
    if "contains" in schema:
        yield "contains", ""
        for key in ("minContains", "maxContains"):
            if key in schema:
                yield key, ""
    yield from _beside(schema, frozenset({"array"}), _ARRAY_READS, "")


def _object_findings(reader: TreeReader, source: SchemaSource, *, readings: extended.Readings | None = None,
                     merged: frozenset[str] = frozenset()) -> _Findings:
    # readings: the extended dialect's (the other keys exactly, required names added), but for the objects
    # an allOf merges (pointers in `merged`): the merge reads their properties alone
    exact_keys = readings is not None
    schema, node = source.schema, source.node
    assert isinstance(node, ObjectNode)
    declared = {prop.name for prop in node.properties}
    names = [prop.name for prop in node.properties if prop.name not in node.forbidden]
    required = schema.get("required")
    extra_names: list[str] = []
    if exact_keys and node.pointer not in merged:
        extra_names = extended.undeclared_required(schema, node)
        declared |= set(extra_names)
        names += extra_names
    if isinstance(required, list):
        missing = [name for name in required if isinstance(name, str) and name not in declared]
        if missing:
            yield "required", f"not among the properties, so not required: {', '.join(missing)}"
    # the extended dialect opens an object that does not say what its other keys are, as JSON Schema does,
    # and reads some patternProperties (schema/extended.py)
    patterns = None
    split = None
    if readings is not None and node.pointer not in merged:
        patterns, split = readings.object_keys(schema, node, names, extra_names)
    closed = node.additional is None and not (exact_keys and extended.opens_object(schema)) and not patterns
    if split is not None:
        closed = not split.values  # the keys of no label are allowed
    # the extended dialect's rule of the other keys is exact where it can be written (schema/extended.py)
    keys_held = exact_keys and (patterns is not None or split is not None
                                or extended.other_keys_held([*names, *node.forbidden]))
    if exact_keys and node.pointer not in merged:
        flags = [prop.required for prop in node.properties] + [True] * (len(names) - len(node.properties))
        if not property_order.in_any_order(flags):
            yield "properties", _order_reason(len(names))
    if declared and not closed and not keys_held:
        # llama.cpp's rule for the other keys excludes the names as they are written, and reads a key as
        # JSON text: a name spelled with an escape (`\u0061` for `a`) passes as another key
        yield "additionalProperties", ("other keys are matched as JSON text: a property's name spelled with "
                                       "an escape passes as another key")
    # (where no key is allowed, llama.cpp's `{}` takes nothing invalid; the extended dialect's report also
    # names what its grammar refuses that is valid: the keys of the patterns)
    if (schema.get("patternProperties") and patterns is None and split is None
            and (exact_keys or not (closed and not declared))):
        yield "patternProperties", ""
    if "propertyNames" in schema and not (closed and not declared):
        yield "propertyNames", ""
    if "unevaluatedProperties" in schema and not ("additionalProperties" in schema or "properties" in schema):
        yield "unevaluatedProperties", ""
    elif (exact_keys and closed and "additionalProperties" not in schema
          and schema.get("unevaluatedProperties", False) is not False):
        # the extended dialect: where unevaluatedProperties allows other keys, its closed object refuses them
        yield "unevaluatedProperties", "other keys of its schema are refused (the object is closed)"
    required_count = sum(prop.required for prop in node.properties)
    low, high = schema.get("minProperties"), schema.get("maxProperties")
    low_held = is_integer(low) and low <= required_count  # type: ignore[operator]
    high_held = closed and is_integer(high) and high >= len(declared)  # type: ignore[operator]
    if exact_keys and node.pointer not in merged and all(prop.name != "*" for prop in node.properties):
        # the extended dialect's counts (schema/property_order.py)
        counts = extended.property_counts(schema)
        held = property_order.counts_held(len(names), required_count + len(extra_names),
                                          not closed, *counts)
        low_held = low_held or (counts[0] is not None and held[0])
        high_held = high_held or (counts[1] is not None and held[1])
    if "minProperties" in schema and not low_held:
        yield "minProperties", ""
    if "maxProperties" in schema and not high_held:
        yield "maxProperties", ""
    # an object without `type` (the extended dialect's reading) also takes every value that is no object
    yield from _beside(schema, EVERY_TYPE if node.untyped else frozenset({"object"}), _OBJECT_READS, "")


def _order_reason(count: int) -> str:
    return (f"the grammar takes these {count} properties in the schema's order only (too many, and too many "
            "of them required, for a grammar of any order): a valid document in another order is refused")


def _merged_order(reader: TreeReader, node: AllOfNode) -> Iterator[Unenforced]:
    # the extended dialect's merge of an allOf's objects is one object (its names once each)
    if reader.all_of_values(node):
        return
    names: dict[str, bool] = {}  # name -> required
    for _, target, required in reader.parts(node):
        if isinstance(target, ObjectNode):
            for prop in target.properties:
                names[prop.name] = names.get(prop.name, False) or (required and prop.required)
    if not property_order.in_any_order(list(names.values())):
        yield Unenforced(f"{node.pointer}/allOf", "allOf", _order_reason(len(names)))


def _all_of_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    # Only the keywords beside `allOf`: its parts are judged by `_dropped_parts`.
    schema, node = source.schema, source.node
    assert isinstance(node, AllOfNode)
    types = reader.types(node)
    declared = schema.get("type")
    if isinstance(declared, str) and not within(types, frozenset({declared})):
        yield "type", f"the allOf converts to {' or '.join(sorted(types))}, not {declared}"
    yield from _beside(schema, types, _ALL_OF_READS, "ignored beside allOf")


def _dropped_parts(reader: TreeReader, node: AllOfNode) -> Iterator[Unenforced]:
    common = reader.all_of_values(node)
    common_texts = set(map(dump_json, common))
    for child in node.children:
        if isinstance(child, AnyOfNode):
            schema = reader.schemas.get(child.pointer, {})
            key = "oneOf" if "oneOf" in schema else "anyOf" if "anyOf" in schema else "type"
            if len(child.children) > 1:
                yield Unenforced(f"{child.pointer}/{key}", key,
                                 "inside allOf, the alternatives are merged: none of them is required")
    for part, target, required in reader.parts(node):
        if target is None or isinstance(target, AnyNode):
            continue
        if common:
            kept = isinstance(target, EnumNode) and common_texts <= set(map(dump_json, target.values))
            why = "the allOf converts to the values its enums share"
        elif isinstance(target, ObjectNode):
            kept = required or not any(prop.required for prop in target.properties)
            why = "the part's required properties are not required (an alternative inside allOf)"
        else:
            kept = False
            why = "only objects' properties (and enums) of allOf parts are merged"
        if not kept:
            yield Unenforced(part.pointer, "allOf", f"this part is not enforced: {why}")
    if not common:
        yield from _replaced_properties(reader, node)


def _replaced_properties(reader: TreeReader, node: AllOfNode) -> Iterator[Unenforced]:
    # The converter merges the parts' properties into one object whose rule for a name is the last
    # part's: an earlier part's schema for the same name (unless it is the same schema) is dropped.
    last: dict[str, str] = {}
    merged: list[tuple[ObjectNode, str, SchemaNode]] = []
    for _, target, _ in reader.parts(node):
        if isinstance(target, ObjectNode):
            for prop in target.properties:
                text = canonical(dict(reader.schemas.get(prop.schema.pointer, {})))
                merged.append((target, prop.name, prop.schema))
                last[prop.name] = text
    for target, name, schema in merged:
        text = canonical(dict(reader.schemas.get(schema.pointer, {})))
        if text != last[name]:
            pointer = f"{target.pointer}/properties/{escape_pointer_token(name)}"
            yield Unenforced(pointer, "properties", "a later allOf part declares this property too: only the "
                             "last one's schema holds")


def _beside(schema: _Schema, types: frozenset[str], reads: frozenset[str], why: str) -> _Findings:
    """Every keyword of `schema` but the annotations, the ones read, and those vacuous for `types`."""
    for key in schema:
        entry = keyword_of(key)
        if entry.enforcement is Enforcement.ANNOTATION or key in reads:
            continue
        if key == "type":
            declared = schema[key]
            listed = declared if isinstance(declared, list) else [declared]
            if types and within(types, frozenset(t for t in listed if isinstance(t, str))):
                continue
        elif not meets(types, entry.applies_to):
            continue
        needs = _NEEDS.get(key)
        if needs is not None and not any(other in schema for other in needs):
            continue  # the specification ignores it without its partner
        yield key, why


def _ref_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    types = reader.types(source.node) or EVERY_TYPE  # a $ref cycle: say everything
    yield from _beside(source.schema, types, frozenset({"$ref"}), "ignored beside $ref")


def _repeats(listed: Sequence[set[str]]) -> bool:
    """Some value is in two of the sets."""
    return len(set().union(*listed)) < sum(map(len, listed))


def _may_overlap(reader: TreeReader, children: Sequence[SchemaNode], origins: Sequence[int] = ()) -> bool:
    """Whether a value the grammar of one alternative takes may be valid for another's schema too (children
    of the same origin, one alternative split in several, may overlap)."""
    listed = [reader.values(child) for child in children]
    if all(values is not None for values in listed):  # consts and enums
        return _repeats(listed)  # type: ignore[arg-type]
    targets = [reader.target(child) for child in children]
    objects = [target for target in targets if isinstance(target, ObjectNode) and not target.untyped]
    if len(objects) == len(children):  # a tagged union: a required property whose values tell them apart
        for prop in objects[0].properties:
            tags = [_tag(reader, target, prop.name) for target in objects]
            if all(values is not None for values in tags) and not _repeats(tags):  # type: ignore[arg-type]
                return False
    if len(children) > _MAX_PAIRWISE:
        return True  # not told apart pair by pair: the report says so rather than spend the time
    origin = list(origins) or list(range(len(children)))
    return any(not reader.disjoint(a, b) for i, a in enumerate(children) for j, b in enumerate(children)
               if i < j and origin[i] != origin[j])


def _tag(reader: TreeReader, node: ObjectNode, name: str) -> set[str] | None:
    for prop in node.properties:
        if prop.name == name and prop.required:
            return reader.values(prop.schema)
    return None


def _any_of_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    schema, node = source.schema, source.node
    assert isinstance(node, AnyOfNode)
    if "oneOf" not in schema and "anyOf" not in schema:
        return  # a `type` list: its alternatives are judged one by one
    key = "oneOf" if "oneOf" in schema else "anyOf"
    if key == "anyOf" and "oneOf" in schema:
        yield "anyOf", "ignored beside oneOf"
    if key == "oneOf" and _may_overlap(reader, node.children, node.origins):
        yield "oneOf", "converted as anyOf: a value matching more than one alternative is accepted"
    if node.origins:
        return  # the extended dialect merged the keywords beside it into each alternative, judged there
    yield from _beside(schema, reader.types(node), frozenset({key}), f"ignored beside {key}")


def _values_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    schema, node = source.schema, source.node
    values: tuple[JsonValue, ...]
    if isinstance(node, ConstNode):
        key, values = "const", (node.value,)
        if "enum" in schema:
            listed = schema["enum"]
            if not (isinstance(listed, list) and canonical(node.value) in set(map(canonical, listed))):
                yield "enum", "ignored beside const"
    else:
        assert isinstance(node, EnumNode)
        key, values = "enum", node.values
    types = frozenset(map(json_type, values))
    declared = source.type_list if source.type_list is not None else (schema.get("type"),)
    if "type" in schema and not within(types, frozenset(t for t in declared if isinstance(t, str))):
        yield "type", f"not checked against the {key} values"
    reads = frozenset({key, "type", "enum"})
    yield from _beside(schema, types, reads, f"not checked against the {key} values")


def _extended_values_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    # the extended dialect lists the values the keywords beside them allow (schema/listed_values.py)
    schema, node = source.schema, source.node
    values = [node.value] if isinstance(node, ConstNode) else list(node.values) if isinstance(
        node, EnumNode) else []
    listed = [schema["const"]] if "const" in schema else schema.get("enum")
    allowed = listed_values.allowed_values(schema, listed) if isinstance(listed, list) else None
    if not (allowed and list(map(canonical, allowed)) == list(map(canonical, values))):
        yield from _values_findings(reader, source)


def _any_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    yield from _beside(source.schema, EVERY_TYPE, frozenset(), "")


def _number_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    for key in source.schema:
        if key in _BOUNDS:
            yield key, "bounds on a non-integer number are not enforced"
    yield from _beside(source.schema, frozenset({"number"}), frozenset({"type"}), "")


def _extended_number_findings(reader: TreeReader, source: SchemaSource) -> _Findings:
    if extended.number_rule(source.schema) is None:
        yield from _number_findings(reader, source)
    else:
        yield from _beside(source.schema, frozenset({"number"}), frozenset({"type", *_BOUNDS}), "")


def _typed(types: frozenset[str]) -> Callable[[TreeReader, SchemaSource], _Findings]:
    def findings(reader: TreeReader, source: SchemaSource) -> _Findings:
        yield from _beside(source.schema, types, frozenset({"type"}), "")

    return findings


# What each kind reads: the keywords its grammar holds, and those its findings judge use by use (a few
# uses of which are vacuous); `_beside` names every other keyword that can matter.
_INTEGER_READS: Final = frozenset({"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                   "multipleOf"})
_STRING_READS: Final = frozenset({"type", "pattern", "format", "minLength", "maxLength"})
_ARRAY_READS: Final = frozenset({"type", "items", "prefixItems", "minItems", "maxItems", "additionalItems",
                                 "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems"})
_OBJECT_READS: Final = frozenset({"type", "properties", "additionalProperties", "required",
                                  "patternProperties", "propertyNames", "unevaluatedProperties",
                                  "minProperties", "maxProperties"})
_ALL_OF_READS: Final = frozenset({"allOf", "type"})
_BOUNDS: Final = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
# keywords the specification ignores unless one of these siblings is there
_NEEDS: Final[Mapping[str, tuple[str, ...]]] = {
    "if": ("then", "else"),
    "then": ("if",),
    "else": ("if",),
    "minContains": ("contains",),
    "maxContains": ("contains",),
    "additionalItems": ("items",),
}

# what a kind's grammar is, for the reason of a keyword it does not read
_KIND_NAMES: Final[Mapping[type, str]] = {
    RefNode: "its $ref", AnyOfNode: "its alternatives", AllOfNode: "its merged allOf",
    ConstNode: "its const", EnumNode: "its enum", ObjectNode: "an object of its properties",
    ArrayNode: "an array of its items", TupleNode: "a tuple of its items", StringNode: "a string",
    IntegerNode: "an integer", NumberNode: "a number", BooleanNode: "a boolean", NullNode: "null",
    AnyNode: "any value",
}

_KINDS: Final[Mapping[type, Callable[[TreeReader, SchemaSource], _Findings]]] = {
    RefNode: _ref_findings,
    AnyOfNode: _any_of_findings,
    AllOfNode: _all_of_findings,
    ConstNode: _values_findings,
    EnumNode: _values_findings,
    ObjectNode: _object_findings,
    ArrayNode: _array_findings,
    TupleNode: _array_findings,
    StringNode: _string_findings,
    IntegerNode: _integer_findings,
    NumberNode: _number_findings,
    BooleanNode: _typed(frozenset({"boolean"})),
    NullNode: _typed(frozenset({"null"})),
    AnyNode: _any_findings,
}


_EXTENDED_KINDS: Final[Mapping[type, Callable[[TreeReader, SchemaSource], _Findings]]] = {
    **_KINDS,
    IntegerNode: _extended_integer_findings,
    NumberNode: _extended_number_findings,
    ConstNode: _extended_values_findings,
    EnumNode: _extended_values_findings,
}


def unenforced_keywords(document: SchemaDocument, unsupported_patterns: Mapping[str, str], *,
                        dialect: str = extended.DEFAULT_DIALECT,
                        readings: extended.Readings | None = None) -> tuple[Unenforced, ...]:
    """Every keyword of the document's schema objects that the converted grammar does not enforce.

    Args:
        document: the built schema tree, with its sources.
        unsupported_patterns: node pointer -> llama.cpp's warning, for the patterns it could not translate.
        dialect: the dialect the grammar was written in (schema/extended.py).
        readings: the extended dialect's readings of this document's patterns, as its conversion made them
            (read here where absent).
    """
    reader = TreeReader(document)
    kinds = _KINDS
    if dialect == extended.EXTENDED:
        merged = frozenset(target.pointer for source in document.sources if isinstance(source.node, AllOfNode)
                           for _, target, _ in reader.parts(source.node) if isinstance(target, ObjectNode))
        readings = extended.Readings() if readings is None else readings
        kinds = {**_EXTENDED_KINDS,
                 StringNode: functools.partial(_string_findings, exact_formats=extended.FORMATS,
                                               readings=readings),
                 ObjectNode: functools.partial(_object_findings, readings=readings, merged=merged)}
    items: dict[tuple[str, str], Unenforced] = {}

    def add(item: Unenforced) -> None:
        items.setdefault((item.pointer, item.keyword), item)

    for source in document.sources:
        node = source.node
        if isinstance(node, StringNode) and node.pattern and source.pointer in unsupported_patterns:
            add(Unenforced(f"{source.pointer}/pattern", "pattern", unsupported_patterns[source.pointer]))
        for key, why in kinds[type(node)](reader, source):
            kind = _KIND_NAMES[type(node)]
            reason = why or keyword_of(key).reason or f"ignored: the schema converts as {kind}"
            add(Unenforced(f"{source.pointer}/{escape_pointer_token(key)}", key, reason))
        if isinstance(node, AllOfNode):
            for item in _dropped_parts(reader, node):
                add(item)
            if dialect == extended.EXTENDED:
                for item in _merged_order(reader, node):
                    add(item)
        if isinstance(node, ObjectNode) and any(prop.name == "*" for prop in node.properties):
            add(Unenforced(f"{node.pointer}/properties/*", "properties", _STAR))
    for item in _root_named_property(reader, document.root):
        add(item)
    return tuple(items.values())


def _root_named_property(reader: TreeReader, root: SchemaNode) -> Iterator[Unenforced]:
    # llama.cpp names a property's rule after the object's rule and the property's name; the root object's
    # rule name is empty, so a property named "" gets the name `root`: the grammar is that property's value
    if isinstance(root, ObjectNode):
        objects = [root]
    elif isinstance(root, AllOfNode) and not reader.all_of_values(root):
        objects = [target for _, target, _ in reader.parts(root) if isinstance(target, ObjectNode)]
    else:
        return
    for node in objects:
        if any(prop.name == "" for prop in node.properties):
            yield Unenforced(f"{node.pointer}/properties/", "properties", "llama.cpp names this property's "
                             "rule `root`: the whole grammar is the property's value, not the object")

