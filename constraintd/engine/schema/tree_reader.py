# The schema tree read for what its grammars can produce and its schemas can accept: the questions the
# report (schema/report.py) asks of the nodes around a keyword.
#
# Contract: `TreeReader(document)` answers, without changing anything, for any node of the document:
# - `types(node)`: the JSON types the grammar of the node can produce ("integer" apart from "number");
# - `schema_types(node)`: the JSON types its schema may accept (every type where that cannot be told);
# - `values(node)`: the values a const or enum node allows, up to JSON Schema's equality (`canonical`);
# - `parts(node)` / `all_of_values(node)`: an allOf's parts and the values it keeps, as the converter
#   merges them;
# - `disjoint(a, b)`: no value one alternative's grammar takes is valid for the other's schema.
# Invariants: a $ref target is read once per question; a cycle of $refs ends every walk (it adds nothing
# to a union of types), so the reader is linear in the document for each question.
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from constraintd.engine.schema.json_text import JsonValue, canonical, dump_json, json_type
from constraintd.engine.schema.keywords import ANY_TYPE
from constraintd.engine.schema.nodes import (
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
    StringNode,
    TupleNode,
)

__all__ = ["EVERY_TYPE", "TreeReader", "canonical", "json_type", "meets", "overlap", "within"]

_Schema = Mapping[str, JsonValue]

_FIXED_TYPES: Final[Mapping[type, frozenset[str]]] = {
    NullNode: frozenset({"null"}),
    BooleanNode: frozenset({"boolean"}),
    NumberNode: frozenset({"number"}),
    IntegerNode: frozenset({"integer"}),
    StringNode: frozenset({"string"}),
    ArrayNode: frozenset({"array"}),
    TupleNode: frozenset({"array"}),
    ObjectNode: frozenset({"object"}),
    AnyNode: ANY_TYPE | {"integer"},
}
EVERY_TYPE: Final = ANY_TYPE | {"integer"}


def within(types: frozenset[str], allowed: frozenset[str]) -> bool:
    """Every type of `types` is one `allowed` admits ("number" admits integers)."""
    return all(t in allowed or (t == "integer" and "number" in allowed) for t in types)


def meets(types: frozenset[str], applies_to: frozenset[str]) -> bool:
    """A keyword applying to `applies_to` says something about some value of `types`."""
    return any(t in applies_to or (t == "integer" and "number" in applies_to) for t in types)


class TreeReader:
    """The node tree, read for what its grammar can produce."""

    def __init__(self, document: SchemaDocument) -> None:
        self.refs = document.refs
        # an anyOf's types short of its $refs, by pointer (checked to be that node: `type` lists share one)
        self.local_types: dict[str, tuple[SchemaNode, frozenset[str], frozenset[str]]] = {}
        self.schemas: dict[str, _Schema] = {}
        for source in document.sources:
            self.schemas.setdefault(source.pointer, source.schema)

    def target(self, node: SchemaNode) -> SchemaNode | None:
        seen: set[str] = set()
        while isinstance(node, RefNode):
            if node.ref in seen or node.ref not in self.refs:
                return None
            seen.add(node.ref)
            node = self.refs[node.ref]
        return node

    def types(self, node: SchemaNode) -> frozenset[str]:
        """The JSON types the grammar of `node` can produce."""
        # The types of the node itself, and of every $ref target reachable through alternatives: a union
        # over what is reachable, so a cycle of $refs adds nothing and each target is read once.
        types, pending = self._local(node)
        seen = set(pending)
        while pending:
            ref = pending.pop()
            target = self.refs.get(ref)
            if target is None:
                continue
            more, refs = self._local(target)
            types |= more
            for other in refs - seen:
                seen.add(other)
                pending.add(other)
        return types

    def _local(self, node: SchemaNode) -> tuple[frozenset[str], set[str]]:
        """The types of `node` short of its $refs, and those $refs' texts (targets read once, kept)."""
        if isinstance(node, ObjectNode) and node.untyped:
            return EVERY_TYPE, set()  # the extended dialect's object without `type`: every value
        fixed = _FIXED_TYPES.get(type(node))
        if fixed is not None:
            return fixed, set()
        if isinstance(node, RefNode):
            if self.typed_ref(node):
                return frozenset({"object"}), set()
            return frozenset(), {node.ref}
        if isinstance(node, ConstNode):
            return frozenset({json_type(node.value)}), set()
        if isinstance(node, EnumNode):
            return frozenset(map(json_type, node.values)), set()
        if isinstance(node, AnyOfNode):
            known = self.local_types.get(node.pointer)
            if known is not None and known[0] is node:
                return known[1], set(known[2])
            types: frozenset[str] = frozenset()
            refs: set[str] = set()
            typed = self.schemas.get(node.pointer, {}).get("type") == "object"
            for child in node.children:
                if typed and isinstance(child, RefNode) and self.untyped_target(child):
                    types |= {"object"}  # the extended dialect's object-only reading beside the type
                    continue
                child_types, child_refs = self._local(child)
                types |= child_types
                refs |= child_refs
            self.local_types[node.pointer] = (node, types, frozenset(refs))
            return types, refs
        assert isinstance(node, AllOfNode)
        common = self.all_of_values(node)
        return (frozenset(map(json_type, common)) if common else frozenset({"object"})), set()

    def untyped_target(self, node: RefNode) -> bool:
        """The $ref's target is an object without `type` (the extended dialect's reading)."""
        target = self.target(node)
        return isinstance(target, ObjectNode) and target.untyped

    def typed_ref(self, node: RefNode) -> bool:
        """A $ref beside `"type": "object"` to an object without `type`: the extended dialect writes the
        object alone."""
        return self.schemas.get(node.pointer, {}).get("type") == "object" and self.untyped_target(node)

    def schema_types(self, node: SchemaNode, seen: frozenset[str] = frozenset()) -> frozenset[str]:
        """The JSON types the schema of `node` may validate (not the grammar's: `{"minLength": 3}` validates
        every number); every type when that cannot be told. An anyOf met again through its own alternatives
        adds nothing to what its other alternatives give."""
        target = self.target(node)
        if target is not None and target.pointer in seen:
            return frozenset()
        schema = None if target is None else self.schemas.get(target.pointer)
        if target is None or schema is None:
            return EVERY_TYPE
        declared = schema.get("type")
        if isinstance(declared, str | list) and declared:
            return frozenset(t for t in (declared if isinstance(declared, list) else [declared])
                             if isinstance(t, str))
        if "const" in schema:
            return frozenset({json_type(schema["const"])})
        listed = schema.get("enum")
        if isinstance(listed, list) and listed:
            return frozenset(map(json_type, listed))
        if isinstance(target, AnyOfNode):
            inner = seen | {target.pointer}
            return frozenset().union(*(self.schema_types(child, inner) for child in target.children))
        return EVERY_TYPE

    def values(self, node: SchemaNode) -> set[str] | None:
        """The values a const or enum node allows, as `canonical` texts; None for other kinds."""
        target = self.target(node)
        if isinstance(target, ConstNode):
            return {canonical(target.value)}
        if isinstance(target, EnumNode):
            return set(map(canonical, target.values))
        return None

    def parts(self, node: AllOfNode) -> Iterator[tuple[SchemaNode, SchemaNode | None, bool]]:
        """The allOf's parts as the converter merges them: (part, its $ref target, required), an anyOf's
        alternatives as parts that are not required."""
        for child in node.children:
            if isinstance(child, AnyOfNode):
                for alt in child.children:
                    yield alt, self.target(alt), False
            else:
                yield child, self.target(child), True

    def all_of_values(self, node: AllOfNode) -> list[JsonValue]:
        """The values the converter's allOf keeps: those every part's enum lists as often as there are parts
        (the converter counts an anyOf's alternatives one by one); empty when it merges objects instead."""
        counts: dict[str, int] = {}
        values: dict[str, JsonValue] = {}
        for _, target, _ in self.parts(node):
            if isinstance(target, EnumNode):
                for value in target.values:
                    text = dump_json(value)
                    counts[text] = counts.get(text, 0) + 1
                    values[text] = value
        return [values[text] for text in sorted(counts) if counts[text] == len(node.children)]

    def disjoint(self, a: SchemaNode, b: SchemaNode) -> bool:
        """No value one alternative's grammar takes is valid for the other's schema, either way (judged on
        types, listed values, a required property whose listed values differ, and a required property the
        other object does not allow); False when that cannot be told."""
        if not overlap(self.types(a), self.schema_types(b)) and not overlap(self.types(b),
                                                                                  self.schema_types(a)):
            return True
        values_a, values_b = self.values(a), self.values(b)
        if values_a is not None and values_b is not None:
            return not values_a & values_b
        target_a, target_b = self.target(a), self.target(b)
        if not (isinstance(target_a, ObjectNode) and isinstance(target_b, ObjectNode)):
            return False
        if target_a.untyped or target_b.untyped:
            return False  # both take every value that is no object
        if self.excludes(target_a, target_b) or self.excludes(target_b, target_a):
            return True
        if self.forbids(target_a, target_b) or self.forbids(target_b, target_a):
            return True
        required_b = {prop.name: prop.schema for prop in target_b.properties if prop.required}
        for prop in target_a.properties:
            if prop.required and prop.name in required_b:
                tags_a, tags_b = self.values(prop.schema), self.values(required_b[prop.name])
                if tags_a is not None and tags_b is not None and not tags_a & tags_b:
                    return True
        return False

    def forbids(self, a: ObjectNode, b: ObjectNode) -> bool:
        """Every object `a`'s grammar takes holds a name `b` forbids (the extended dialect's oneOf
        alternatives)."""
        return any(prop.required and prop.name in b.forbidden for prop in a.properties)

    def excludes(self, a: ObjectNode, b: ObjectNode) -> bool:
        """Every object `a`'s grammar takes (it has `a`'s required properties) holds a key `b`'s schema does
        not allow: `b` has additionalProperties false, no patternProperties, and does not declare it."""
        schema = self.schemas.get(b.pointer, {})
        if schema.get("additionalProperties") is not False or schema.get("patternProperties"):
            return False
        allowed = {prop.name for prop in b.properties}
        return any(prop.required and prop.name not in allowed for prop in a.properties)


def overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    return bool(a & b) or ("integer" in a and "number" in b) or ("number" in a and "integer" in b)
