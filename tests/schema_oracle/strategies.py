"""Hypothesis strategies for the schema oracle tests: schemas that reach every path of llama.cpp's converter.

The generated schemas are deliberately rough: besides well-formed ones they carry wrong types for keywords,
empty or missing `$ref` targets, reserved and colliding property names, non-ASCII text, huge and fractional
bounds, so that refusals and llama.cpp's odd corners (rule renaming, char arithmetic) are compared too.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# names chosen to collide with llama.cpp's reserved rule names and with each other once escaped
NAMES = (
    "a", "b", "a-b", "a b", "", "root", "string", "char", "value", "*", "é", "x\"y", "k]", "date-time", "0",
)
DEF_NAMES = ("node", "item", "a.b", "a-b", "é")
TYPES = ("string", "integer", "number", "boolean", "null", "object", "array")
FORMATS = ("date", "time", "date-time", "uuid", "uuid4", "uuid7", "email", "")
PATTERN_PIECES = (
    "a", "b", "é", "0", "-", ".", "|", "(", ")", "(?:", "(?=", "[a-z]", "[^\"]", "[\\d]", "[\\-x]", "*", "+",
    "?", "{2}", "{1,3}", "{,2}", "{2,}", "{x}", "{1,2,3}", "\\.", "\\d", "\\w", "\\x41", "\\u00e9", "\\\"",
    "\"", "\\", "^", "$", "]", "}", "[", "{",
)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**65), 2**65),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def patterns(draw: st.DrawFn) -> str:
    """Anchored (mostly) regex-like strings made of the pieces llama.cpp's translator treats specially."""
    body = "".join(draw(st.lists(st.sampled_from(PATTERN_PIECES), max_size=8)))
    anchored = draw(st.sampled_from(("both", "both", "both", "start", "none")))
    return {"both": f"^{body}$", "start": f"^{body}", "none": body}[anchored]


bounds = st.one_of(
    st.integers(-(10**6), 10**6), st.integers(-(2**64), 2**64),
    st.sampled_from([0, 1, 9, 10, 99, 100, -1, -9, -10, 2**63 - 1, -(2**63), 2**63, 2**64 - 1]),
    st.floats(-1e6, 1e6), st.sampled_from([0.5, -0.5, 1e300, -1e300, 9.3e18]), st.just("3"),
)
counts = st.one_of(st.integers(0, 4), st.sampled_from([-1, 2**31 - 1, 2**31, 2**32, 1.0, "2"]))


def _keywords(draw: st.DrawFn, choices: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=3))
    return {key: draw(choices[key]) for key in chosen}


@st.composite
def leaf_schemas(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(("string", "integer", "const", "enum", "plain", "ref", "untyped", "odd")))
    if kind == "string":
        return {"type": "string", **_keywords(draw, {
            "pattern": patterns(), "format": st.sampled_from(FORMATS), "minLength": counts,
            "maxLength": counts,
        })}
    if kind == "integer":
        return {"type": "integer", **_keywords(draw, {
            "minimum": bounds, "maximum": bounds, "exclusiveMinimum": bounds, "exclusiveMaximum": bounds,
        })}
    if kind == "const":
        return {"const": draw(json_values)}
    if kind == "enum":
        return {"enum": draw(st.lists(json_values, max_size=4))}
    if kind == "ref":
        refs = [f"#/$defs/{name}" for name in DEF_NAMES] + ["#/x", "other.json"]
        return {"$ref": draw(st.sampled_from(refs))}
    if kind == "untyped":
        return _keywords(draw, {
            "pattern": patterns(), "minLength": counts, "format": st.sampled_from(FORMATS), "minimum": bounds,
        })
    if kind == "odd":
        return draw(st.sampled_from([{"type": 5}, {"type": []}, {"type": "kaboom"}, {"type": None},
                                     {"enum": []}, {"enum": 3}, {"format": 3}, {"pattern": 3}, {"type": ""}]))
    return {"type": draw(st.sampled_from(TYPES))}


def _extend(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    properties = st.dictionaries(st.sampled_from(NAMES), inner, max_size=4)

    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {}
        if draw(st.booleans()):
            schema["type"] = "object"
        props = draw(properties)
        keep_empty: bool = draw(st.booleans())
        if props or keep_empty:
            schema["properties"] = props
        if draw(st.booleans()):
            schema["required"] = draw(st.lists(st.sampled_from(NAMES), max_size=4))
        extra = draw(st.sampled_from(("absent", "true", "false", "schema", "odd")))
        if extra != "absent":
            schema["additionalProperties"] = {"true": True, "false": False, "odd": 1}.get(extra) \
                if extra != "schema" else draw(inner)
        return schema

    @st.composite
    def arrays(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array"} if draw(st.booleans()) else {}
        key = draw(st.sampled_from(("items", "prefixItems", "none")))
        if key != "none":
            schema[key] = draw(st.lists(inner, max_size=3)) if draw(st.booleans()) else draw(inner)
        schema.update(_keywords(draw, {"minItems": counts, "maxItems": counts}))
        return schema

    @st.composite
    def combined(draw: st.DrawFn) -> dict[str, Any]:
        key = draw(st.sampled_from(("anyOf", "oneOf", "allOf", "type-list")))
        if key == "type-list":
            schema = draw(inner)
            schema["type"] = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3))
            return schema
        schema = {key: draw(st.lists(inner, max_size=3))}
        if key == "allOf" and draw(st.booleans()):
            schema["type"] = draw(st.sampled_from(("object", "string")))
        return schema

    return st.one_of(objects(), arrays(), combined())


schema_trees = st.recursive(leaf_schemas(), _extend, max_leaves=10)


@st.composite
def schema_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A root schema, with `$defs` for the `$ref`s inside it (some left missing on purpose)."""
    root = draw(schema_trees)
    if draw(st.booleans()):
        root = {**root, "$defs": draw(st.dictionaries(st.sampled_from(DEF_NAMES), schema_trees, max_size=3))}
    return root
