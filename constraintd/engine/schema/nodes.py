# The schema tree llama.cpp's converter walks: a port of common/json-schema.cpp (common_chat_schema_*).
#
# Contract: `schema_from_json(value)` builds, from a parsed JSON schema, the same tree llama.cpp's
# `common_chat_schema_from_json` builds, and refuses the same schemas with the same message
# ("JSON schema conversion failed:\nJSON schema error at <path>: <what>", where <path> is llama.cpp's
# own, e.g. `#/properties/a` or `#/type/1`). The SchemaError's pointer is the RFC 6901 pointer of the
# offending schema object in the document (a `$ref` target's pointer is the `$ref` text itself).
#
# Invariants:
# - Nodes are immutable. A `$ref` node names its target by the `$ref` text; the targets live in
#   `SchemaDocument.refs`, each built once, so a cycle through `$ref` is a cycle of names, not of objects.
# - Keyword precedence is llama.cpp's: `$ref` beats everything, then oneOf/anyOf, a `type` list (one
#   alternative per entry, the rest of the schema copied), const, enum, then `type` or, without one, the
#   structural keywords. Numbers are narrowed as C++ narrows them (`to_int32`, `to_int64`, and a double
#   outside int64 turning into INT64_MIN, what x86-64's conversion yields).
# - Work is bounded by a `WorkLimit`: nesting (through `$ref` too) and time; exceeding it is a SchemaError.
# - Every schema object built is kept with its node, in document order (`SchemaDocument.sources`): the
#   report of schema/report.py reads which keywords each node's kind left out. Building is otherwise as
#   llama.cpp builds.
from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from constraintd.engine.schema.all_of import merged_all_of
from constraintd.engine.schema.alternatives import (
    Merged,
    dependent_objects,
    merged_alternatives,
    not_all_present,
)
from constraintd.engine.schema.json_text import JsonValue, is_integer, to_int32, to_int64
from constraintd.engine.schema.listed_values import allowed_values
from constraintd.errors import SchemaError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "AllOfNode",
    "AnyNode",
    "AnyOfNode",
    "ArrayNode",
    "BooleanNode",
    "ConstNode",
    "EnumNode",
    "IntegerNode",
    "NullNode",
    "NumberNode",
    "ObjectNode",
    "Property",
    "RefNode",
    "SchemaDocument",
    "SchemaNode",
    "SchemaSource",
    "StringFormat",
    "StringNode",
    "TupleNode",
    "WorkLimit",
    "schema_from_json",
]

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
FAILED: Final = "JSON schema conversion failed:\n"


class StringFormat(enum.Enum):
    NONE = "none"
    UUID = "uuid"  # uuid, uuid1 .. uuid5
    DATE = "date"
    TIME = "time"
    DATE_TIME = "date-time"


@dataclass(frozen=True, slots=True)
class AnyNode:
    pointer: str


@dataclass(frozen=True, slots=True)
class RefNode:
    pointer: str
    ref: str  # "#/...", a key of SchemaDocument.refs


@dataclass(frozen=True, slots=True)
class AnyOfNode:  # oneOf / anyOf, or a "type" list
    pointer: str
    children: tuple[SchemaNode, ...]
    # the extended dialect's: the keywords beside it merged into each alternative (schema/alternatives.py),
    # and which alternative each child comes from (one may split into several); empty where not merged
    origins: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AllOfNode:
    pointer: str
    children: tuple[SchemaNode, ...]


@dataclass(frozen=True, slots=True)
class ConstNode:
    pointer: str
    value: JsonValue


@dataclass(frozen=True, slots=True)
class EnumNode:
    pointer: str
    values: tuple[JsonValue, ...]


@dataclass(frozen=True, slots=True)
class NullNode:
    pointer: str


@dataclass(frozen=True, slots=True)
class BooleanNode:
    pointer: str


@dataclass(frozen=True, slots=True)
class NumberNode:
    pointer: str


@dataclass(frozen=True, slots=True)
class IntegerNode:  # inclusive bounds; INT64_MIN / INT64_MAX mean unbounded
    pointer: str
    minimum: int = INT64_MIN
    maximum: int = INT64_MAX


@dataclass(frozen=True, slots=True)
class StringNode:
    pointer: str
    pattern: str = ""  # "" when absent
    format: StringFormat = StringFormat.NONE
    min_length: int = 0
    max_length: int = -1  # -1 for unbounded


@dataclass(frozen=True, slots=True)
class ArrayNode:
    pointer: str
    items: SchemaNode  # an AnyNode when "items" is absent
    min_items: int = 0
    max_items: int = -1  # -1 for unbounded


@dataclass(frozen=True, slots=True)
class TupleNode:
    pointer: str
    items: tuple[SchemaNode, ...]


@dataclass(frozen=True, slots=True)
class Property:
    name: str
    schema: SchemaNode
    required: bool


@dataclass(frozen=True, slots=True)
class ObjectNode:
    pointer: str
    properties: tuple[Property, ...]  # in schema order
    additional: SchemaNode | None  # None when additional properties are not allowed
    # patternProperties' schemas (pattern, node), built for the extended dialect only (llama.cpp skips them)
    patterns: tuple[tuple[str, SchemaNode], ...] = ()
    # the extended dialect's reading of a schema without `type` (`{"properties": ...}`): its keywords speak
    # of objects only, so every value that is no object is valid too (llama.cpp reads it as an object)
    untyped: bool = False
    # names the object must not hold (the extended dialect's oneOf alternatives, schema/alternatives.py)
    forbidden: tuple[str, ...] = ()


SchemaNode: TypeAlias = (
    AnyNode | RefNode | AnyOfNode | AllOfNode | ConstNode | EnumNode | NullNode | BooleanNode | NumberNode
    | IntegerNode | StringNode | ArrayNode | TupleNode | ObjectNode
)


@dataclass(frozen=True, slots=True)
class SchemaSource:
    """A schema object of the document and the node built from it (what the report of schema/report.py
    reads: which keywords the node's kind enforces and which it leaves out).

    Attributes:
        pointer: the node's pointer.
        schema: the schema object as the builder read it (a `type` list's alternative: with one type).
        node: the node built from it.
        type_list: the whole `type` list when this is one of its alternatives, else None.
    """

    pointer: str
    schema: Mapping[str, JsonValue]
    node: SchemaNode
    type_list: tuple[JsonValue, ...] | None = None


@dataclass(frozen=True, slots=True)
class SchemaDocument:
    """The tree, the `$ref` targets by their text, and every schema object built, in document order."""

    root: SchemaNode
    refs: Mapping[str, SchemaNode]
    sources: tuple[SchemaSource, ...] = ()


@dataclass(slots=True)
class WorkLimit:
    """How deep the conversion may recurse and until when it may run (time.monotonic())."""

    max_depth: int
    deadline: float
    depth: int = field(default=0)

    def enter(self, pointer: str) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise SchemaError(f"the schema nests deeper than {self.max_depth} levels", pointer=pointer)
        if time.monotonic() > self.deadline:
            raise SchemaError("the conversion ran past its time limit", pointer=pointer)

    def leave(self) -> None:
        self.depth -= 1


def escape_pointer_token(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _c_stoull(text: str) -> int | None:
    """std::stoull: leading space, a sign, decimal digits; None where it throws (nothing, or > 2**64-1)."""
    rest = text.lstrip(" \t\n\v\f\r")
    sign = -1 if rest.startswith("-") else 1
    rest = rest[1:] if rest[:1] in ("+", "-") else rest
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if digits == 0 or not rest[:digits].isascii():
        return None
    value = int(rest[:digits])
    if value >= 2**64:
        return None
    return (sign * value) % 2**64  # strtoull negates in unsigned arithmetic


class _Builder:
    """common_chat_schema_builder: one pass over the document, each $ref target built once."""

    def __init__(self, root: JsonValue, limit: WorkLimit, *, patterns: bool = False) -> None:
        self.root = root
        self.limit = limit
        self.patterns = patterns
        self.refs: dict[str, SchemaNode | None] = {}
        # (pointer, schema, type list) in the order the objects are entered, the node once built
        self.entered: list[tuple[str, dict[str, JsonValue], tuple[JsonValue, ...] | None]] = []
        self.built: list[SchemaNode | None] = []
        # the extended reading: objects without `type` read as objects only (`_objects_only`)
        self.typed_objects: set[str] = set()
        self.merges = 0  # allOf merges on the path being built (`node`)

    @staticmethod
    def fail(path: str, message: str, pointer: str) -> SchemaError:
        return SchemaError(f"{FAILED}JSON schema error at {path}: {message}", pointer=pointer)

    def count(self, schema: dict[str, JsonValue], key: str, path: str, pointer: str, default: int) -> int:
        if key not in schema:
            return default
        value = schema[key]
        if not is_integer(value) or to_int32(value) < 0:  # type: ignore[arg-type]
            raise self.fail(path, f"{key} must be a non-negative integer", pointer)
        return to_int32(value)  # type: ignore[arg-type]

    def bound(
        self, schema: dict[str, JsonValue], key: str, path: str, pointer: str, *, round_up: bool
    ) -> int:
        value = schema[key]
        if is_integer(value):
            return to_int64(value)  # type: ignore[arg-type]
        if not isinstance(value, float):
            raise self.fail(path, f"{key} must be a number", pointer)
        rounded = math.ceil(value) if round_up else math.floor(value)
        return rounded if INT64_MIN <= rounded <= INT64_MAX else INT64_MIN

    def format(self, schema: dict[str, JsonValue], path: str, pointer: str) -> StringFormat:
        if "format" not in schema:
            return StringFormat.NONE
        value = schema["format"]
        if not isinstance(value, str):
            raise self.fail(path, "format must be a string", pointer)
        if value in ("date", "time", "date-time"):
            return StringFormat(value)
        if value == "uuid" or (len(value) == 5 and value.startswith("uuid") and "1" <= value[4] <= "5"):
            return StringFormat.UUID
        return StringFormat.NONE

    def resolve(self, ref: str, path: str, pointer: str) -> JsonValue:
        target = self.root
        for token in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list):
                index = _c_stoull(token)
                if index is None or index >= len(target):
                    raise self.fail(path, f"cannot resolve $ref {ref}, {token} is out of range", pointer)
                target = target[index]
            else:
                raise self.fail(path, f"cannot resolve $ref {ref}, {token} not found", pointer)
        return target

    def ref(self, value: JsonValue, path: str, pointer: str) -> SchemaNode:
        if not isinstance(value, str):
            raise self.fail(path, "$ref must be a string", pointer)
        if not value.startswith("#/"):
            message = f"unsupported $ref {value}, only references into the same document are supported"
            raise self.fail(path, message, pointer)
        if value not in self.refs:
            self.refs[value] = None  # reserved first, so that a cycle back to this $ref stops here
            self.refs[value] = self.node(self.resolve(value, path, pointer), value, value)
        return RefNode(pointer, value)

    def alternatives(self, alts: JsonValue, path: str, pointer: str) -> tuple[SchemaNode, ...]:
        if not isinstance(alts, list):
            raise self.fail(path, "must be an array of schemas", pointer)
        if not alts:
            raise self.fail(path, "must not be empty", pointer)
        return tuple(self.node(alt, f"{path}/{i}", f"{pointer}/{i}") for i, alt in enumerate(alts))

    def keyword_alternatives(self, kind: Callable[[str, tuple[SchemaNode, ...]], SchemaNode],
                             schema: dict[str, JsonValue], key: str, path: str, pointer: str) -> SchemaNode:
        return kind(pointer, self.alternatives(schema[key], f"{path}/{key}", f"{pointer}/{key}"))

    def merged(self, merged: list[Merged], key: str, path: str, pointer: str) -> SchemaNode:
        # the extended reading of a oneOf / anyOf beside object keywords (schema/alternatives.py): each
        # alternative merged with them, an object of its own (its forbidden names kept on the node)
        children: list[SchemaNode] = []
        for item in merged:
            slot = len(self.built)
            node = self.node(item.schema, f"{path}/{key}/{item.index}", f"{pointer}/{key}/{item.index}")
            if item.forbidden:
                assert isinstance(node, ObjectNode)
                node = replace(node, forbidden=node.forbidden + item.forbidden)
                self.built[slot] = node
            children.append(node)
        return AnyOfNode(pointer, tuple(children), tuple(item.index for item in merged))

    def object(self, schema: dict[str, JsonValue], path: str, pointer: str, *, untyped: bool = False,
               ) -> SchemaNode:
        listed = schema.get("required")
        required = {name for name in listed if isinstance(name, str)} if isinstance(listed, list) else set()
        properties: list[Property] = []
        empty: list[str] = []
        if "properties" in schema:
            declared = schema["properties"]
            if not isinstance(declared, dict):
                raise self.fail(path, "properties must be an object", pointer)
            for name, prop in declared.items():
                if self.patterns and name not in required and _admits_nothing(prop):
                    empty.append(name)  # the extended reading: a property no value is valid for is absent
                    continue
                node = self.node(prop, f"{path}/properties/{name}",
                                 f"{pointer}/properties/{escape_pointer_token(name)}")
                properties.append(Property(name, node, name in required))
        additional: SchemaNode | None = None
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if isinstance(extra, bool):
                additional = AnyNode(f"{pointer}/additionalProperties") if extra else None
            elif isinstance(extra, dict):
                key = "/additionalProperties"
                additional = self.node(extra, path + key, pointer + key)
            else:
                raise self.fail(path, "additionalProperties must be a boolean or a schema", pointer)
        elif "properties" not in schema:
            additional = AnyNode(pointer)  # {"type": "object"} on its own accepts any object
        patterns = self.pattern_nodes(schema, path, pointer) if self.patterns else ()
        return ObjectNode(pointer, tuple(properties), additional, patterns, untyped and self.patterns,
                          tuple(empty))

    def pattern_nodes(self, schema: dict[str, JsonValue], path: str, pointer: str,
                      ) -> tuple[tuple[str, SchemaNode], ...]:
        # every schema of patternProperties, or none: one the builder refuses leaves the builder as it was
        # (the report then names patternProperties, as llama.cpp's reading does)
        declared = schema.get("patternProperties")
        if not isinstance(declared, dict) or not all(isinstance(value, dict) for value in declared.values()):
            return ()
        refs, entered = dict(self.refs), len(self.entered)
        try:
            return tuple((pattern, self.node(value, f"{path}/patternProperties/{pattern}",
                                             f"{pointer}/patternProperties/{escape_pointer_token(pattern)}"))
                         for pattern, value in declared.items())
        except SchemaError:
            self.refs = refs
            del self.entered[entered:], self.built[entered:]
            return ()

    def array(self, schema: dict[str, JsonValue], path: str, pointer: str) -> SchemaNode:
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"  # "items" wins when both are there
            items = schema[key]
            if isinstance(items, list):  # a tuple: minItems / maxItems are not even read
                built = [self.node(item, f"{path}/{key}/{i}", f"{pointer}/{key}/{i}")
                         for i, item in enumerate(items)]
                return TupleNode(pointer, tuple(built))
            item_node = self.node(items, f"{path}/{key}", f"{pointer}/{key}")
        else:
            item_node = AnyNode(pointer)
        return ArrayNode(pointer, item_node, self.count(schema, "minItems", path, pointer, 0),
                         self.count(schema, "maxItems", path, pointer, -1))

    def string(self, schema: dict[str, JsonValue], path: str, pointer: str) -> SchemaNode:
        pattern = ""
        if "pattern" in schema:
            value = schema["pattern"]
            if not isinstance(value, str):
                raise self.fail(path, "pattern must be a string", pointer)
            pattern = value
        return StringNode(pointer, pattern, self.format(schema, path, pointer),
                          self.count(schema, "minLength", path, pointer, 0),
                          self.count(schema, "maxLength", path, pointer, -1))

    def integer(self, schema: dict[str, JsonValue], path: str, pointer: str) -> SchemaNode:
        minimum, maximum = INT64_MIN, INT64_MAX
        if "minimum" in schema:
            minimum = self.bound(schema, "minimum", path, pointer, round_up=True)
        elif "exclusiveMinimum" in schema:
            minimum = to_int64(self.bound(schema, "exclusiveMinimum", path, pointer, round_up=False) + 1)
        if "maximum" in schema:
            maximum = self.bound(schema, "maximum", path, pointer, round_up=False)
        elif "exclusiveMaximum" in schema:
            maximum = to_int64(self.bound(schema, "exclusiveMaximum", path, pointer, round_up=True) - 1)
        return IntegerNode(pointer, minimum, maximum)

    def node(self, schema: JsonValue, path: str, pointer: str,
             type_list: tuple[JsonValue, ...] | None = None) -> SchemaNode:
        merging = False
        if self.patterns and isinstance(schema, dict) and "allOf" in schema and self.merges < _MAX_MERGES:
            # the extended reading: the parts merged into one schema where the merge is exact
            # (schema/all_of.py), read and reported as any other; a merge inlines its parts' $ref targets,
            # so merges within merges stop at a depth (a recursive schema would unfold without end)
            merged = merged_all_of(schema, self.root)
            if merged is not None:
                schema, merging = merged, True
                self.merges += 1
        self.limit.enter(pointer)
        try:
            slot = len(self.built)
            if isinstance(schema, dict):
                self.entered.append((pointer, schema, type_list))
                self.built.append(None)
            node = self.node_of(schema, path, pointer)
            if isinstance(schema, dict):
                self.built[slot] = node
            return node
        finally:
            self.limit.leave()
            self.merges -= merging

    def sources(self) -> tuple[SchemaSource, ...]:
        return tuple(SchemaSource(pointer, schema, node, type_list)
                     for (pointer, schema, type_list), node in zip(self.entered, self.built, strict=True)
                     if node is not None)

    def node_of(self, schema: JsonValue, path: str, pointer: str) -> SchemaNode:
        if not isinstance(schema, dict):
            raise self.fail(path, "schema must be an object", pointer)
        if "$ref" in schema:
            return self.ref(schema["$ref"], path, pointer)
        if self.patterns and "not" in schema:
            # the extended reading of a `not` of required names: the objects missing one of them
            # (schema/alternatives.py)
            absent = not_all_present(schema)
            if absent is not None:
                return self.merged(absent, "not", path, pointer)
        if self.patterns and ("dependencies" in schema or "dependentRequired" in schema):
            # the extended reading of dependent requirements: an object per choice (schema/alternatives.py)
            dependent = dependent_objects(schema)
            if dependent is not None:
                key = "dependencies" if "dependencies" in schema else "dependentRequired"
                return self.merged(dependent, key, path, pointer)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            if self.patterns:
                merged = merged_alternatives(schema, key)
                if merged is not None:
                    return self.merged(merged, key, path, pointer)
                self.typed_objects.update(_objects_only(schema, key, pointer))
            return self.keyword_alternatives(AnyOfNode, schema, key, path, pointer)
        kind = schema.get("type")
        if isinstance(kind, list):
            # {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if not kind:
                raise self.fail(path, "type must not be empty", pointer)
            alternatives = [self.node({**schema, "type": entry}, f"{path}/type/{i}", pointer, tuple(kind))
                            for i, entry in enumerate(kind)]
            return AnyOfNode(pointer, tuple(alternatives))
        if "const" in schema:
            return ConstNode(pointer, schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail(path, "enum must be a non-empty array", pointer)
            if self.patterns:
                # the extended reading: the values the keywords beside them allow (schema/listed_values.py)
                allowed = allowed_values(schema, values)
                if allowed:
                    return EnumNode(pointer, tuple(allowed))
            return EnumNode(pointer, tuple(values))
        if kind is not None and not isinstance(kind, str):
            raise self.fail(path, "type must be a string or an array of strings", pointer)
        has_properties = _has_properties(schema)
        if not kind:  # absent, null or "": the structural keywords decide, in the converter's order
            if has_properties:
                return self.object(schema, path, pointer, untyped=pointer not in self.typed_objects)
            if "allOf" in schema:
                return self.keyword_alternatives(AllOfNode, schema, "allOf", path, pointer)
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, path, pointer)
            if any(key in schema for key in ("pattern", "minLength", "maxLength")) or (
                self.format(schema, path, pointer) is not StringFormat.NONE
            ):
                return self.string(schema, path, pointer)
            return AnyNode(pointer)
        if kind in ("object", "string") and "allOf" in schema and not (kind == "object" and has_properties):
            return self.keyword_alternatives(AllOfNode, schema, "allOf", path, pointer)
        build = _TYPED.get(kind)
        if build is None:
            raise self.fail(path, f"unrecognized type {kind}", pointer)
        return build(self, schema, path, pointer)


_MAX_MERGES: Final = 8


def _has_properties(schema: Mapping[str, JsonValue]) -> bool:
    return "properties" in schema or (
        "additionalProperties" in schema and schema["additionalProperties"] is not True
    )


def _admits_nothing(schema: JsonValue) -> bool:
    # a const / enum none of whose values the keywords beside them allow (schema/listed_values.py)
    if not isinstance(schema, dict) or any(key in schema for key in ("$ref", "oneOf", "anyOf")):
        return False
    if isinstance(schema.get("type"), list):
        return False
    listed = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(listed, list) and bool(listed) and allowed_values(schema, listed) == []


def _untyped_object(schema: JsonValue) -> bool:
    # what the builder reads as an object though the schema has no `type`
    return (isinstance(schema, dict) and not schema.get("type") and _has_properties(schema)
            and not any(key in schema for key in ("$ref", "oneOf", "anyOf", "const", "enum")))


def _objects_only(schema: Mapping[str, JsonValue], key: str, pointer: str) -> list[str]:
    """The pointers of the alternatives of `schema[key]` that are objects without `type` and still take
    objects only, in the extended reading: beside `"type": "object"`, or in a oneOf where at least two of
    them take every value that is no object (which is then valid for none: it matches two alternatives),
    and every other alternative is an object."""
    alternatives = schema.get(key)
    if not isinstance(alternatives, list):
        return []
    untyped = [i for i, alt in enumerate(alternatives) if _untyped_object(alt)]
    objects = all(i in untyped or (isinstance(alt, dict) and alt.get("type") == "object"
                                   and not any(k in alt for k in ("$ref", "oneOf", "anyOf")))
                  for i, alt in enumerate(alternatives))
    if schema.get("type") == "object" or (key == "oneOf" and len(untyped) >= 2 and objects):
        return [f"{pointer}/{key}/{i}" for i in untyped]
    return []


_TYPED: Final[dict[str, Callable[[_Builder, dict[str, JsonValue], str, str], SchemaNode]]] = {
    "object": _Builder.object,
    "string": _Builder.string,
    "array": _Builder.array,
    "integer": _Builder.integer,
    "number": lambda _builder, _schema, _path, pointer: NumberNode(pointer),
    "boolean": lambda _builder, _schema, _path, pointer: BooleanNode(pointer),
    "null": lambda _builder, _schema, _path, pointer: NullNode(pointer),
}


def schema_from_json(value: JsonValue, limit: WorkLimit, *, patterns: bool = False) -> SchemaDocument:
    """Build the schema tree of a parsed JSON schema, as `common_chat_schema_from_json` does; with
    `patterns`, the extended dialect's reading: the schemas of patternProperties too, and an object without
    `type` marked `untyped`.

    Raises:
        SchemaError: the schema falls outside what llama.cpp converts (its message), or exceeds `limit`.
    """
    builder = _Builder(value, limit, patterns=patterns)
    root = builder.node(value, "#", "#")
    refs = {ref: node for ref, node in builder.refs.items() if node is not None}
    return SchemaDocument(root, refs, builder.sources())
