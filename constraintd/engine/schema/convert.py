# JSON schema to GBNF, identical to llama.cpp's `json_schema_to_grammar` (common/json-schema-to-grammar.cpp
# of the pinned llama.cpp): the schema tree of schema/nodes.py walked by `common_chat_schema_converter`.
#
# Contract:
# - For every schema text llama.cpp converts, `convert_json_schema` returns the same grammar, byte for
#   byte once encoded as UTF-8 (rule names, de-duplication, rule order, whitespace rule), and the warnings
#   llama.cpp prints (an untranslatable `pattern` becomes any string, with a warning).
# - Beside them, the report (schema/report.py): every keyword the grammar does not enforce, with its JSON
#   pointer and why. It never changes the grammar. With `strict=True` a schema whose report is not empty is
#   refused, naming its first keyword.
# - Where llama.cpp throws, we raise SchemaError whose `reason` is the message of the exception llama.cpp's
#   `json_schema_to_grammar` throws, and whose `pointer` is the JSON pointer of the offending node.
# - Where llama.cpp never answers or crashes (a `$ref` cycle inside allOf), and where our limits are reached
#   (nesting, time, grammar size: the module constants), we raise SchemaError too. Where llama.cpp would
#   return a grammar that is not valid UTF-8 (a quantifier after a non-ASCII pattern character repeats its
#   last byte), we refuse rather than hand out broken text. Nothing else escapes.
#
# Invariants: rule texts are byte strings held in `str`, one character per byte (latin-1), because llama.cpp
# works on bytes and sorts its rule map by bytes; `to_bytes` converts JSON text in, the end converts back.
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from constraintd.engine.schema import extended, property_order
from constraintd.engine.schema.extended import DEFAULT_DIALECT, EXTENDED, check_dialect
from constraintd.engine.schema.json_text import JsonValue, dump_json, dump_string, parse_json
from constraintd.engine.schema.keywords import Unenforced
from constraintd.engine.schema.nodes import (
    FAILED,
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
    StringFormat,
    StringNode,
    TupleNode,
    WorkLimit,
    schema_from_json,
)
from constraintd.engine.schema.patterns import InvalidPattern, UnsupportedPattern, pattern_to_rule
from constraintd.engine.schema.ranges import INT_MAX, build_min_max_int, build_repetition
from constraintd.engine.schema.report import unenforced_keywords
from constraintd.engine.schema.rules import (
    INVALID_RULE_CHARS,
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    SPACE_RULE,
    STRING_FORMAT_RULES,
    BuiltinRule,
    format_literal,
    from_bytes,
    from_utf8,
    is_utf8,
    not_strings,
    to_bytes,
)
from constraintd.errors import SchemaError

__all__ = [
    "MAX_CONVERSION_SECONDS",
    "MAX_GRAMMAR_CHARS",
    "MAX_SCHEMA_DEPTH",
    "SchemaConversion",
    "Unenforced",
    "convert_json_schema",
    "convert_schema_value",
    "json_schema_to_gbnf",
    "report_lines",
]

MAX_SCHEMA_DEPTH: Final = 128  # schema levels, counted through $ref too (each costs a few Python frames)
MAX_GRAMMAR_CHARS: Final = 8_000_000
MAX_CONVERSION_SECONDS: Final = 10.0

_FORMAT_RULE_NAMES: Final = {
    StringFormat.DATE: "date-string",
    StringFormat.TIME: "time-string",
    StringFormat.DATE_TIME: "date-time-string",
}
_NOT_OBJECTS: Final = ("array", "string", "number", "boolean", "null")

# llama.cpp's rules -> the extended dialect's spelling of them (extended.PRIMITIVES)
_EXTENDED_PRIMITIVES: Final = {PRIMITIVE_RULES[name]: rule for name, rule in extended.PRIMITIVES.items()}
_BAD_UTF8: Final = (
    "the grammar llama.cpp makes of this pattern is not valid UTF-8 (a quantifier after a non-ASCII "
    "character repeats only its last byte)"
)


def _is_rule_name(name: str) -> bool:
    # letters, digits and `-` only (most names are): INVALID_RULE_CHARS would change nothing
    return name.isascii() and name.replace("-", "a").isalnum()


class _Converter:
    """common_chat_schema_converter, with dotall off (the JSON-schema path); with `dialect` "extended",
    the string formats and integer bounds of schema/extended.py written exactly."""

    def __init__(self, document: SchemaDocument, limit: WorkLimit, max_chars: int,
                 dialect: str = DEFAULT_DIALECT) -> None:
        self.document = document
        self.extended = dialect == EXTENDED
        self.reserved = RESERVED_NAMES | extended.RESERVED_NAMES if self.extended else RESERVED_NAMES
        # the schema object each node was built from (what the extended dialect reads), by kind and pointer
        self.schemas: dict[tuple[type, str], Mapping[str, JsonValue]] = {
            (type(source.node), source.pointer): source.schema for source in document.sources
        }
        self.limit = limit
        self.max_chars = max_chars
        self.chars = len("space") + len(SPACE_RULE)
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.refs_being_resolved: set[str] = set()
        self.errors: list[tuple[str, str]] = []  # (message, pointer)
        self.warnings: list[str] = []
        self.unsupported_patterns: dict[str, str] = {}  # node pointer -> the warning
        self.journal: list[str] | None = None  # rule names added while a pattern is being translated
        self.bad_utf8_pointer: str | None = None
        # the extended dialect's rule of other keys by the names they are not (None: none written), and the
        # rules those write (shared by every object)
        self.other_key_rules: dict[tuple[str, ...], str | None] = {}
        self.key_rules = extended.KeyRules()
        self.readings = extended.Readings()  # shared with the report (it asks the same of patterns)

    def _name_for(self, name: str, rule_of: Callable[[str], str]) -> str:
        # the first of name, name0, name1, ... (made a rule name) not held by another rule than the one
        # it would name, `rule_of(it)`
        esc_name = name if _is_rule_name(name) else INVALID_RULE_CHARS.sub("-", name)
        key = esc_name
        i = 0
        while key in self.rules and self.rules[key] != rule_of(key):
            key = f"{esc_name}{i}"
            i += 1
        return key

    def _insert(self, key: str, rule: str) -> None:
        self.chars += len(key) + len(rule)
        if self.chars > self.max_chars:
            raise SchemaError(f"the grammar grows past {self.max_chars} characters")
        self.rules[key] = rule
        if self.journal is not None:
            self.journal.append(key)

    def add_rule(self, name: str, rule: str) -> str:
        held = self.rules.get(name)
        if held == rule:  # held already under this name (a rule's name needs no escape)
            return name
        if held is None and _is_rule_name(name):  # a free name: its own (what `_name_for` would give)
            self._insert(name, rule)
            return name
        key = self._name_for(name, lambda _: rule)
        if key not in self.rules:
            self._insert(key, rule)
        return key

    def add_recursive(self, name: str, rule_of: Callable[[str], str]) -> str:
        """A rule that refers to itself: `rule_of(the name it gets)`, named as `add_rule` names (the first
        of name, name0, name1, ... not taken by another rule)."""
        key = self._name_for(name, rule_of)
        if key not in self.rules:  # else it holds this rule already (`_name_for`)
            self._insert(key, rule_of(key))
        return key

    def add_primitive(self, name: str, rule: BuiltinRule) -> str:
        if self.extended:  # the same language in the dialect's spelling, with what it needs
            rule = _EXTENDED_PRIMITIVES.get(rule, rule)
        result = self.add_rule(name, rule.content)
        for dep in rule.deps:
            if self.extended and dep in extended.RULES:
                self.add_extended(dep)
                continue
            dep_rule = PRIMITIVE_RULES.get(dep) or STRING_FORMAT_RULES.get(dep)
            if dep_rule is None:
                self.errors.append((f"Rule {dep} not known", "#"))
            elif dep not in self.rules:
                self.add_primitive(dep, dep_rule)
        return result

    def schema_of(self, node: SchemaNode) -> Mapping[str, JsonValue]:
        return self.schemas.get((type(node), node.pointer), {})

    def add_extended(self, name: str) -> str:
        """A rule of the extended dialect (schema/extended.py) and the rules it needs, once each."""
        if name in self.rules:  # with the rules it needs: a name of RULES is reserved, and added once
            return name
        rule = extended.RULES[name]
        added = self.add_rule(name, rule.content)  # first: rules may refer to each other (x-value)
        for dep in rule.deps:
            if dep not in self.rules:
                if dep in extended.RULES:
                    self.add_extended(dep)
                else:  # one of llama.cpp's rules, as the dialect writes it
                    self.add_primitive(dep, PRIMITIVE_RULES[dep])
        return added

    def any_value(self) -> str:
        """The rule of any JSON value: llama.cpp's `value`, or the extended dialect's `x-value` (the same
        values, numbers of any number of digits: a smaller grammar)."""
        if not self.extended:
            return self.add_primitive("value", PRIMITIVE_RULES["value"])
        if "x-value" in self.rules:  # added before, with the primitives it needs
            return "x-value"
        for kind in extended.ANY_VALUE_PRIMITIVES:
            self.add_primitive(kind, PRIMITIVE_RULES[kind])
        return self.add_extended("x-value")

    def visit_primitive(self, rule_name: str, kind: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else kind, PRIMITIVE_RULES[kind])

    @staticmethod
    def constant_rule(value: JsonValue) -> str:
        return format_literal(to_bytes(dump_json(value)))

    def visit_pattern(self, node: StringNode, name: str) -> str:
        if self.extended:
            # with its lengths where it can, else alone (the lengths are then reported)
            max_length = None if node.max_length < 0 else node.max_length
            rule = self.readings.noted(
                node.pattern, extended.exact_pattern(node.pattern, self.add_rule, name,
                                                     min_length=node.min_length, max_length=max_length),
                min_length=node.min_length, max_length=max_length)
            if rule is None:
                rule = self.readings.noted(node.pattern, extended.exact_pattern(node.pattern, self.add_rule,
                                                                                name))
            if rule is not None:
                self.add_extended("x-any-char")
                return self.add_rule(name, rule)
        # _visit_pattern: an untranslatable pattern leaves no rule behind and becomes any string
        self.journal = []
        try:
            result = pattern_to_rule(to_bytes(node.pattern), name, self.add_rule)
            added = [self.rules[key] for key in self.journal]
        except (UnsupportedPattern, InvalidPattern) as err:
            for key in self.journal:  # llama.cpp restores its rule map as it was before the pattern
                self.chars -= len(key) + len(self.rules.pop(key))
            self.journal = None
            if isinstance(err, InvalidPattern):
                self.errors.append((f"Invalid pattern {node.pattern}: {from_bytes(str(err))}", node.pointer))
                return ""
            reason = from_bytes(str(err))
            warning = f"pattern {node.pattern} is not supported ({reason}), accepting any string"
            self.warnings.append(warning)
            self.unsupported_patterns.setdefault(node.pointer, warning)
            return self.add_rule(name, self.add_primitive("string", PRIMITIVE_RULES["string"]))
        finally:
            self.journal = None
        if self.bad_utf8_pointer is None and not all(map(is_utf8, added)):
            self.bad_utf8_pointer = node.pointer
        return result

    def resolve_ref(self, node: RefNode) -> str:
        fragment = node.ref[node.ref.find("#") + 1 :]
        ref_name = "ref" + INVALID_RULE_CHARS.sub("-", to_bytes(fragment))
        if ref_name not in self.rules and node.ref not in self.refs_being_resolved:
            target = self.document.refs.get(node.ref)
            if target is None:
                self.errors.append((f"Unresolved $ref {node.ref}", node.pointer))
                return ""
            self.refs_being_resolved.add(node.ref)
            ref_name = self.visit(target, ref_name)
            self.refs_being_resolved.discard(node.ref)
        return ref_name

    def object_rule(self, properties: Sequence[tuple[str, SchemaNode]], required: set[str], name: str,
                    additional: SchemaNode | None, forbidden: Sequence[str] = (),
                    counts: tuple[int | None, int | None] = (None, None)) -> str:
        """_build_object_rule; `properties` names are byte strings. The extended dialect takes the
        properties in any order where it can (schema/property_order.py), and a property named `*` as any
        other (llama.cpp's reading of it stays, and the report)."""
        if self.extended and all(prop_name != "*" for prop_name, _ in properties):
            return self.unordered_object_rule(properties, required, name, additional, forbidden=forbidden,
                                              counts=counts)
        prefix = name + "-" if name else ""
        required_props: list[str] = []
        optional_props: list[str] = []
        kv_rule_names: dict[str, str] = {}
        for prop_name, prop_schema in properties:
            prop_rule_name = self.visit(prop_schema, prefix + prop_name)
            key_literal = format_literal(dump_string(prop_name))
            kv_rule_names[prop_name] = self.add_rule(
                f"{prefix}{prop_name}-kv", f'{key_literal} space ":" space {prop_rule_name}'
            )
            (required_props if prop_name in required else optional_props).append(prop_name)
        if additional is not None:
            sub_name = prefix + "additional"
            value_rule = (self.visit(additional, sub_name + "-value") if not isinstance(additional, AnyNode)
                          else self.any_value())
            names = [prop_name for prop_name, _ in properties]
            key_rule = self.other_keys(names, sub_name + "-k")
            kv_rule_names["*"] = self.add_rule(sub_name + "-kv", f'{key_rule} ":" space {value_rule}')
            optional_props.append("*")
        if not required_props and not optional_props:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv_rule_names[prop] for prop in required_props)
        if optional_props:
            rule += " (" + (' "," space ( ' if required_props else "")
            rule += " | ".join(self.optional_chains(optional_props, kv_rule_names, prefix))
            rule += (" )" if required_props else "") + " )?"
        return rule + ' space "}"'

    def unordered_object_rule(self, properties: Sequence[tuple[str, SchemaNode]], required: set[str],
                              name: str, additional: SchemaNode | None, key_rule: str | None = None,
                              other_pair: str | None = None, *, forbidden: Sequence[str] = (),
                              counts: tuple[int | None, int | None] = (None, None)) -> str:
        # the pairs' rules are named as llama.cpp names them; their order is property_order's
        prefix = name + "-" if name else ""
        kvs: list[str] = []
        # a name declared twice (by two allOf parts) is one property, of the last schema (as llama.cpp's)
        for prop_name, prop_schema in dict(properties).items():
            prop_rule_name = self.visit(prop_schema, prefix + prop_name)
            key_literal = format_literal(dump_string(prop_name))
            kv = f'{key_literal} space ":" space {prop_rule_name}'
            kvs.append(self.add_rule(f"{prefix}{prop_name}-kv", kv))
        other = None
        if additional is not None:
            sub_name = prefix + "additional"
            value_rule = (self.visit(additional, sub_name + "-value") if not isinstance(additional, AnyNode)
                          else self.any_value())
            if key_rule is None:
                # other keys are none of the declared names, nor a forbidden one (byte strings too)
                key_rule = self.other_keys([*dict(properties), *forbidden], sub_name + "-k")
            other = self.add_rule(sub_name + "-kv", f'{key_rule} ":" space {value_rule}')
            if other_pair is not None:  # a second kind of other key
                other = self.add_rule(sub_name + "-pairs", f"{other} | {other_pair}")
        elif other_pair is not None:  # the other keys' pairs, written by the caller
            other = other_pair
        flags = [prop_name in required for prop_name in dict(properties)]
        # minProperties / maxProperties where the rule holds them (else the report names them)
        low_held, high_held = property_order.counts_held(len(kvs), sum(flags), other is not None, *counts)
        low, high = counts
        return property_order.object_rule(kvs, flags, other, self.add_rule, name,
                                          add_recursive=self.add_recursive,
                                          min_pairs=low if low is not None and low_held else 0,
                                          max_pairs=high if high_held else None)

    def other_keys(self, names: list[str], name: str) -> str:
        """The rule of the keys beside the declared properties' `names` (byte strings)."""
        if not names:
            return self.add_primitive("string", PRIMITIVE_RULES["string"])
        if self.extended:
            # the same names (objects of the same declared properties, an object reached through several
            # $refs, allOf merges) share one expression and its rules
            key = tuple(names)
            if key not in self.other_key_rules:
                self.add_extended("x-key-end")
                rule = extended.other_keys_rule([from_utf8(name) for name in names], self.add_rule,
                                                self.key_rules)
                # the expression itself (two symbols), written where the pair is: a rule of it would be one
                # rule and one reference more
                self.other_key_rules[key] = rule
            shared = self.other_key_rules[key]
            if shared is not None:
                return shared
        char_rule = self.add_primitive("char", PRIMITIVE_RULES["char"])
        return self.add_rule(name, not_strings(names, char_rule))

    def optional_chains(self, keys: list[str], kv_rule_names: dict[str, str], prefix: str) -> list[str]:
        # llama.cpp's get_recursive_refs, unrolled: for each start i, the first key then a rule "<k>-rest"
        # holding the optional rest. Its later calls repeat the first one's add_rule calls (same names, same
        # texts), which change nothing, so each rest rule is added once, innermost first, as there.
        def comma_ref(key: str) -> str:
            return f'( "," space {kv_rule_names[key]} )' + ("*" if key == "*" else "?")

        rest_names: dict[int, str] = {}
        for j in range(len(keys) - 2, -1, -1):
            content = comma_ref(keys[j + 1]) + (f" {rest_names[j + 1]}" if j + 1 < len(keys) - 1 else "")
            rest_names[j] = self.add_rule(f"{prefix}{keys[j]}-rest", content)
        chains = []
        for i, key in enumerate(keys):
            kv = kv_rule_names[key]
            chain = kv + (f' ( "," space {kv} )*' if key == "*" else "")
            chains.append(chain + (f" {rest_names[i]}" if i < len(keys) - 1 else ""))
        return chains

    def visit_all_of(self, node: AllOfNode, name: str, rule_name: str) -> str:
        required: set[str] = set()
        properties: list[tuple[str, SchemaNode]] = []
        enum_values: dict[str, int] = {}
        open_parts: list[bool] = []  # False for each object part that says what its other keys are

        def add_component(component: SchemaNode, is_required: bool) -> None:
            seen: set[str] = set()
            while isinstance(component, RefNode):
                if component.ref in seen:
                    raise SchemaError(f"{FAILED}$ref cycle through {component.ref} inside allOf "
                                      "(llama.cpp recurses without end)", pointer=node.pointer)
                seen.add(component.ref)
                target = self.document.refs.get(component.ref)
                if target is None:
                    return
                component = target
            if isinstance(component, ObjectNode):
                if not extended.opens_object(self.schema_of(component)):
                    open_parts.append(False)
                for prop in component.properties:
                    properties.append((to_bytes(prop.name), prop.schema))
                    # llama.cpp requires every property of a part; the extended dialect, the part's own
                    if is_required and (prop.required or not self.extended):
                        required.add(to_bytes(prop.name))
            elif isinstance(component, EnumNode):
                for value in component.values:
                    literal = self.constant_rule(value)
                    enum_values[literal] = enum_values.get(literal, 0) + 1

        for child in node.children:
            if isinstance(child, AnyOfNode):
                for alt in child.children:
                    add_component(alt, False)
            else:
                add_component(child, True)
        intersection = [value for value, count in sorted(enum_values.items()) if count == len(node.children)]
        if intersection:
            return self.add_rule(rule_name, self.alternatives(intersection))
        # the extended dialect: other keys are open where no part speaks of them (JSON Schema's default)
        additional = AnyNode(node.pointer) if self.extended and not open_parts else None
        return self.add_rule(rule_name, self.object_rule(properties, required, name, additional))

    def visit(self, node: SchemaNode, name: str) -> str:
        self.limit.enter(node.pointer)
        try:
            rule_name = name + "-" if name in self.reserved else name or "root"
            return _VISITORS[type(node)](self, node, name, rule_name)
        finally:
            self.limit.leave()

    def visit_ref(self, node: RefNode, name: str, rule_name: str) -> str:
        if self.extended and self.schema_of(node).get("type") == "object":
            typed = self.typed_target(node)
            if typed is not None:
                return self.add_rule(rule_name, self.visit(typed, f"{name or 'root'}-object"))
        return self.add_rule(rule_name, self.resolve_ref(node))

    def visit_any_of(self, node: AnyOfNode, name: str, rule_name: str) -> str:
        # the extended dialect: beside `"type": "object"`, a $ref to an object without `type` is an object
        typed = self.extended and self.schema_of(node).get("type") == "object"
        alternatives = []
        for i, alt in enumerate(node.children):
            alt_name = name + ("-" if name else "alternative-") + str(i)
            target = self.typed_target(alt) if typed and isinstance(alt, RefNode) else None
            alternatives.append(self.visit(alt if target is None else target, alt_name))
        return self.add_rule(rule_name, " | ".join(alternatives))

    def typed_target(self, node: RefNode) -> ObjectNode | None:
        """The object-only reading of the $ref's target where it is an object without `type`."""
        seen: set[str] = set()
        target: SchemaNode | None = node
        while isinstance(target, RefNode) and target.ref not in seen:
            seen.add(target.ref)
            target = self.document.refs.get(target.ref)
        return replace(target, untyped=False) if isinstance(target, ObjectNode) and target.untyped else None

    def visit_object(self, node: ObjectNode, name: str, rule_name: str) -> str:
        if node.untyped and self.extended:
            # a schema without `type` speaks of objects only: every other value is valid too
            objects = self.visit_object(replace(node, untyped=False), name, f"{name or 'root'}-object")
            others = [self.add_primitive(kind, PRIMITIVE_RULES[kind]) for kind in _NOT_OBJECTS]
            return self.add_rule(rule_name, " | ".join([objects, *others]))
        # the extended dialect: a required name the properties do not declare is a required property, of
        # the other keys' schema (any value where llama.cpp closes the object). Not in an allOf's merge,
        # which reads its parts' properties alone (the report says so).
        extras = extended.undeclared_required(self.schema_of(node), node) if self.extended else []
        counts = extended.property_counts(self.schema_of(node)) if self.extended else (None, None)
        if (not node.properties and not extras and isinstance(node.additional, AnyNode) and not node.patterns
                and not node.forbidden and counts == (None, None)):
            return self.add_rule(rule_name, self.add_primitive("object", PRIMITIVE_RULES["object"]))
        # an object of a oneOf's alternative holds none of its forbidden names (schema/alternatives.py)
        forbidden = [to_bytes(prop_name) for prop_name in node.forbidden]
        properties = [(to_bytes(prop.name), prop.schema) for prop in node.properties
                      if prop.name not in node.forbidden]
        required = {to_bytes(prop.name) for prop in node.properties if prop.required}
        for extra in extras:
            properties.append((to_bytes(extra), node.additional or AnyNode(node.pointer)))
            required.add(to_bytes(extra))
        additional = node.additional
        if self.extended:
            schema = self.schema_of(node)
            if extended.opens_object(schema):
                additional = AnyNode(node.pointer)  # JSON Schema's objects are open; llama.cpp closes them
            names = [from_utf8(prop_name) for prop_name, _ in properties]
            keys, split = self.readings.object_keys(schema, node, names, extras)
            if split is not None:
                return self.add_rule(rule_name,
                                     self.split_object_rule(split, properties, required, name, counts))
            if keys is not None:
                # the other keys are the pattern's (every undeclared name where it matches every key)
                key_name = (name + "-" if name else "") + "pattern-key"
                key_rule = (None if keys.every
                            else extended.exact_pattern(keys.pattern, self.add_rule, key_name))
                if key_rule is not None:
                    self.add_extended("x-any-char")
                other_pair = None
                if keys.complement is not None:
                    # the keys the pattern does not match, of additionalProperties' schema
                    self.add_extended("x-any-char")
                    prefix = name + "-" if name else ""
                    value_rule = (self.visit(additional, prefix + "other-value")
                                  if additional is not None and not isinstance(additional, AnyNode)
                                  else self.any_value())
                    other_pair = self.add_rule(prefix + "other-kv",
                                               f'{keys.complement} ":" space {value_rule}')
                return self.add_rule(rule_name, self.unordered_object_rule(properties, required, name,
                                                                           keys.schema, key_rule, other_pair,
                                                                           counts=counts))
        return self.add_rule(rule_name, self.object_rule(properties, required, name, additional, forbidden,
                                                         counts))

    def split_object_rule(self, split: extended.PatternSplit, properties: list[tuple[str, SchemaNode]],
                          required: set[str], name: str, counts: tuple[int | None, int | None]) -> str:
        # the extended dialect's patternProperties, the keys split by the patterns they match
        # (schema/key_automata.py): one pair rule per label, the undeclared required names of the pattern's
        # schema where one matches them
        prefix = name + "-" if name else ""
        properties = [(prop_name, split.extras.get(from_utf8(prop_name), schema))
                      for prop_name, schema in properties]
        pairs = []
        for i, (label, value) in enumerate(sorted(split.values.items(), key=lambda item: sorted(item[0]))):
            key_rule = split.automaton.key_rules(label, self.add_rule,
                                                 lambda names: not any(map(self.rules.__contains__, names)),
                                                 INVALID_RULE_CHARS.sub("-", f"{prefix}key-{i}"))
            value_rule = (self.visit(value, f"{prefix}pattern-value-{i}") if not isinstance(value, AnyNode)
                          else self.any_value())
            pairs.append(self.add_rule(f"{prefix}pattern-kv-{i}", f'{key_rule} ":" space {value_rule}'))
        other = self.add_rule(f"{prefix}pattern-kv", " | ".join(pairs)) if pairs else None
        return self.unordered_object_rule(properties, required, name, None, other_pair=other, counts=counts)

    def visit_tuple(self, node: TupleNode, name: str, rule_name: str) -> str:
        sub_name = name + "-" if name else ""
        items = [self.visit(item, f"{sub_name}tuple-{i}") for i, item in enumerate(node.items)]
        return self.add_rule(rule_name, '"[" space ' + ' "," space '.join(items) + ' space "]"')

    def visit_array(self, node: ArrayNode, name: str, rule_name: str) -> str:
        if isinstance(node.items, AnyNode) and node.min_items == 0 and node.max_items < 0:
            return self.visit_primitive(rule_name, "array")
        item_rule_name = self.visit(node.items, (name + "-" if name else "") + "item")
        if self.extended and node.max_items < 0 and node.min_items <= 1:
            # llama.cpp's `(item ("," space item)*)?` as right recursion: the rule of the items after the
            # first is one rule where the groups, the loop and the option are four
            more = self.add_recursive(f"{rule_name}-x-more", lambda me: f'| "," space {item_rule_name} {me}')
            items = f'"[" space {item_rule_name} {more} space "]"'
            return self.add_rule(rule_name, items if node.min_items else f'"[" space space "]" | {items}')
        max_items = INT_MAX if node.max_items < 0 else node.max_items
        repetition = build_repetition(item_rule_name, node.min_items, max_items, '"," space')
        return self.add_rule(rule_name, f'"[" space {repetition} space "]"')

    def visit_string(self, node: StringNode, name: str, rule_name: str) -> str:
        if node.pattern:
            return self.visit_pattern(node, rule_name)
        if self.extended:
            format_name = self.schema_of(node).get("format")
            if isinstance(format_name, str) and format_name in extended.FORMATS:
                return self.add_rule(rule_name, self.add_extended(extended.format_rule_name(format_name)))
        if node.format is StringFormat.UUID:
            return self.visit_primitive(rule_name, "uuid")
        if node.format is not StringFormat.NONE:
            prim_name = _FORMAT_RULE_NAMES[node.format]
            return self.add_rule(rule_name, self.add_primitive(prim_name, STRING_FORMAT_RULES[prim_name]))
        if node.min_length > 0 or node.max_length >= 0:
            # the extended dialect counts characters, not escapes: no surrogate pair spelled as two escapes
            char_rule = (self.add_extended("x-counted-char") if self.extended
                         else self.add_primitive("char", PRIMITIVE_RULES["char"]))
            max_len = INT_MAX if node.max_length < 0 else node.max_length
            repetition = build_repetition(char_rule, node.min_length, max_len)
            return self.add_rule(rule_name, f'"\\"" {repetition} "\\""')
        return self.visit_primitive(rule_name, "string")

    def visit_integer(self, node: IntegerNode, name: str, rule_name: str) -> str:
        if self.extended:
            bounds = extended.exact_range(*extended.integer_bounds(self.schema_of(node)))
            if bounds is not None:
                return self.add_rule(rule_name, extended.integer_range_rule(*bounds))
        if node.minimum == INT64_MIN and node.maximum == INT64_MAX:
            return self.visit_primitive(rule_name, "integer")
        try:
            return self.add_rule(rule_name, f"({build_min_max_int(node.minimum, node.maximum)})")
        except SchemaError as err:
            raise SchemaError(err.reason, pointer=node.pointer) from None

    def visit_number(self, node: NumberNode, name: str, rule_name: str) -> str:
        if self.extended:
            rule = extended.number_rule(self.schema_of(node))
            if rule is not None:
                return self.add_rule(rule_name, rule)
        return self.visit_primitive(rule_name, "number")

    def alternatives(self, texts: Sequence[str]) -> str:
        """A rule's body of these alternatives: llama.cpp writes them in a group, one rule more to the parser,
        which the extended dialect leaves out."""
        body = " | ".join(texts)
        return body if self.extended else f"({body})"

    def format_grammar(self) -> str:
        return "".join(f"{key} ::= {self.rules[key]}\n" for key in sorted(self.rules))


# node kind -> visitor (the node argument is of the key's type)
_Visitor = Callable[[_Converter, Any, str, str], str]
_VISITORS: Final[dict[type, _Visitor]] = {
    RefNode: _Converter.visit_ref,
    AnyOfNode: _Converter.visit_any_of,
    AllOfNode: _Converter.visit_all_of,
    ConstNode: lambda c, node, name, rule_name: c.add_rule(rule_name, c.constant_rule(node.value)),
    EnumNode: lambda c, node, name, rule_name: c.add_rule(
        rule_name, c.alternatives(list(map(c.constant_rule, node.values)))
    ),
    ObjectNode: _Converter.visit_object,
    TupleNode: _Converter.visit_tuple,
    ArrayNode: _Converter.visit_array,
    StringNode: _Converter.visit_string,
    IntegerNode: _Converter.visit_integer,
    NumberNode: _Converter.visit_number,
    BooleanNode: lambda c, node, name, rule_name: c.visit_primitive(rule_name, "boolean"),
    NullNode: lambda c, node, name, rule_name: c.visit_primitive(rule_name, "null"),
    AnyNode: lambda c, node, name, rule_name: c.add_rule(rule_name, c.any_value()),
}


@dataclass(frozen=True, slots=True)
class SchemaConversion:
    """A converted schema.

    Attributes:
        grammar: the GBNF text (root rule `root`), llama.cpp's.
        warnings: llama.cpp's warnings, in its words, one per issue.
        unenforced: the report: every keyword of the schema the grammar does not enforce, in document
            order (llama.cpp's warnings among them, with their pointers).
    """

    grammar: str
    warnings: tuple[str, ...]
    unenforced: tuple[Unenforced, ...] = ()

    @property
    def report(self) -> tuple[str, ...]:
        """The report as the lines a session carries (see `report_lines`)."""
        return report_lines(self.warnings, self.unenforced)


def report_lines(warnings: tuple[str, ...], unenforced: tuple[Unenforced, ...]) -> tuple[str, ...]:
    """A report as lines: llama.cpp's warnings first, in its words (what a session always carried), then
    each other item as `pointer: keyword: reason`."""
    own = set(warnings)
    return warnings + tuple(str(item) for item in unenforced if item.reason not in own)


def _refuse_unenforced(item: Unenforced) -> SchemaError:
    return SchemaError(f"strict: the grammar would not enforce {item.keyword}: {item.reason}",
                       pointer=item.pointer)


def convert_schema_value(
    schema: JsonValue, *, strict: bool = False, time_limit: float = MAX_CONVERSION_SECONDS,
    dialect: str = DEFAULT_DIALECT,
) -> SchemaConversion:
    """Convert an already parsed schema (a `parse_json` value, so numbers and key order are llama.cpp's).

    Raises:
        SchemaError: llama.cpp refuses the schema (its message), a limit of this module is reached,
            `strict` is set and the grammar would leave a keyword unenforced (the first one, its pointer),
            or `dialect` is not one of `extended.DIALECTS`.
    """
    check_dialect(dialect)
    limit = WorkLimit(max_depth=MAX_SCHEMA_DEPTH, deadline=time.monotonic() + time_limit)
    document = schema_from_json(schema, limit, patterns=dialect == EXTENDED)
    converter = _Converter(document, limit, MAX_GRAMMAR_CHARS, dialect)
    converter.visit(document.root, "")
    if converter.errors:
        message = FAILED + "\n".join(text for text, _ in converter.errors)
        raise SchemaError(message, pointer=converter.errors[0][1])
    try:
        grammar = converter.format_grammar().encode("latin-1").decode("utf-8")
    except UnicodeDecodeError:
        raise SchemaError(f"{FAILED}{_BAD_UTF8}", pointer=converter.bad_utf8_pointer or "#") from None
    unenforced = unenforced_keywords(document, converter.unsupported_patterns, dialect=dialect,
                                     readings=converter.readings)
    if strict and unenforced:
        raise _refuse_unenforced(unenforced[0])
    return SchemaConversion(grammar, tuple(converter.warnings), unenforced)


def convert_json_schema(
    schema_text: str, *, strict: bool = False, time_limit: float = MAX_CONVERSION_SECONDS,
    dialect: str = DEFAULT_DIALECT,
) -> SchemaConversion:
    """Convert a JSON schema text to GBNF exactly as llama.cpp's `json_schema_to_grammar` does, with the
    report of what the grammar leaves unenforced.

    The text is read as llama.cpp reads it (nlohmann ordered_json; see schema/json_text.py). `strict` does
    not change any grammar: it refuses the schemas whose report is not empty. `dialect="extended"` opts in
    to grammars that enforce more than llama.cpp's (schema/extended.py: string formats, integer bounds);
    its report names only what those grammars still leave unenforced.

    Raises:
        SchemaError: the text is not JSON, llama.cpp refuses the schema (`reason` is its message, `pointer`
            the node), the conversion exceeds this module's depth, size or time limits, or `strict` is set
            and a keyword would not be enforced (`pointer` is the first such keyword's), or `dialect` is
            unknown.
    """
    return convert_schema_value(parse_json(schema_text), strict=strict, time_limit=time_limit,
                                dialect=dialect)


def json_schema_to_gbnf(schema_text: str, *, strict: bool = False, dialect: str = DEFAULT_DIALECT) -> str:
    """The GBNF grammar of a JSON schema text (see `convert_json_schema`; the report is dropped).

    Raises:
        SchemaError: as `convert_json_schema`.
    """
    return convert_json_schema(schema_text, strict=strict, dialect=dialect).grammar
