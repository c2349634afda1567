# The extended dialect's object rules: an object's properties in any order where the grammar stays small,
# else in the schema's order.
#
# Contract:
# - `object_rule(kvs, required, other, add_rule, name)` writes the rule of a JSON object whose declared
#   properties are `kvs` (each the rule of one `"name": value` pair, in schema order), `required` flags
#   which must be there, and `other` is the rule of one other key and its value (None: no other key).
#   Each declared property appears at most once, every required one appears, and other keys may come
#   between any two of them, any number of times.
# - Up to `ANY_ORDER_MAX` declared properties, any order is taken, exactly: the grammar has one rule per
#   set of properties not yet written (2^n rules, n alternatives each), so no property repeats and none
#   required is missing; exponential, hence the bound. Past it, exactly too where that grammar is no
#   larger than the one below (all of them required, or 3 of 4: `_exact`).
# - Else any order is still taken where at most `REQUIRED_MAX` are required: one rule per set of
#   required properties not yet written (2^required), and a property may repeat. Each of a repeated key's
#   values is then its property's, so whichever value a reader keeps (JSON Schema leaves an object with a
#   repeated name undefined; Python keeps the last) the document is valid.
# - Else the properties are taken in the order of the schema only (`in_any_order` says which; the report
#   names the object, so strict refuses it).
# - Other keys are never declared names (the caller's key rule excludes them), so the key decides which
#   alternative a pair is: the grammar is unambiguous but for the place of other keys (and, past the exact
#   bound, of optional pairs).
# - Counts (minProperties / maxProperties): `counts_held` says which the rule holds, given as `min_pairs` /
#   `max_pairs`: at least one pair (a minimum of 1), and, for an object of other keys only (a map: no
#   declared property), bounds up to MAX_PAIRS, as a counted repetition of pairs. A repeated name counts
#   once per pair (JSON Schema leaves an object with a repeated name undefined).
# - Other pairs before a declared one are one rule with the comma (`x-sep`: `( "," space other )* "," space`;
#   before the first pair of an object with a required property, `x-before`: `( other "," space )*`); past
#   the exact bound, a set's rule takes the comma and a free pair or one of the set (`x-props-...`), and
#   loops are right recursion: a `*` and its group are two rules more to the grammar's parser; an object of
#   one alternative is written without a group.
# Invariants: rule names come from `add_rule`, which shares a rule only with an identical one, and
#   `add_recursive`, which names a rule that refers to itself the same way, so the names written here can
#   never capture another rule.
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "ANY_ORDER_MAX", "MAX_PAIRS", "REQUIRED_MAX", "AddRecursive", "counts_held", "in_any_order",
    "object_rule",
]

ANY_ORDER_MAX: Final = 3  # exact: 2^3 rules of at most 3 alternatives
# past it, a few rules per set of required properties not yet written (2^10 sets at most)
REQUIRED_MAX: Final = 10
MAX_PAIRS: Final = 256  # a map's counted pairs, at most

AddRule = Callable[[str, str], str]
# adds a rule that refers to itself: (name, the rule's text given the name it gets) -> that name
AddRecursive = Callable[[str, Callable[[str], str]], str]


def _loop(add_recursive: AddRecursive, name: str, pair: str) -> str:
    # ( "," space pair )*, as right recursion: `*` and its group would be two rules more to the parser
    return add_recursive(name, lambda me: f'| "," space {pair} {me}')


def _sep(add_recursive: AddRecursive, name: str, pair: str) -> str:
    # ( "," space pair )* "," space: what comes before a declared pair, one rule where each alternative
    # wrote the loop and the comma
    return add_recursive(name, lambda me: f'"," space | "," space {pair} {me}')


def in_any_order(required: Sequence[bool]) -> bool:
    """Whether an object of these declared properties (flags: required) is taken in any order (else in the
    schema's)."""
    return len(required) <= ANY_ORDER_MAX or sum(required) <= REQUIRED_MAX


def _exact(required: Sequence[bool]) -> bool:
    # whether the properties are taken in any order exactly: up to ANY_ORDER_MAX of them, or where that
    # grammar is no larger than the one tracking the required ones alone (counted in alternatives: n 2^(n-1)
    # for n properties; for r required, r 2^(r-1), a loop of free pairs per set and two alternatives per
    # free pairs' rule): where all of them are required, or 3 of 4
    count, tracked = len(required), sum(required)
    return count <= ANY_ORDER_MAX or (
        tracked <= REQUIRED_MAX
        and count << (count - 1) <= (tracked << max(tracked - 1, 0)) + 3 * (1 << tracked) - 2)


def counts_held(declared: int, required: int, other: bool, low: int | None, high: int | None,
                ) -> tuple[bool, bool]:
    """Whether `object_rule` holds minProperties `low` and maxProperties `high` (None: absent) of an object of
    `declared` properties (`required` of them required) and other keys (`other`)."""
    # a map's counts are a repetition the grammar's parser writes out: bounded by MAX_PAIRS
    counted = declared == 0 and other and (low or 0) <= MAX_PAIRS and (high is None or high <= MAX_PAIRS)
    low_held = low is None or low <= required or (low == 1 and (declared > 0 or other)) or counted
    high_held = high is None or counted or (not other and high >= declared)
    return low_held, high_held


def _counted(other: str, low: int, high: int | None) -> str:
    # a map's pairs, low to high of them
    if high == 0:
        return '"{" space "}"'
    least = max(low - 1, 0)
    times = ("*" if least == 0 else f"{{{least},}}") if high is None else f"{{{least},{high - 1}}}"
    body = f'{other} ( "," space {other} ){times}'
    return '"{" space ' + (f"( {body} )?" if low == 0 else body) + ' space "}"'


def object_rule(kvs: Sequence[str], required: Sequence[bool], other: str | None, add_rule: AddRule,
                name: str, *, add_recursive: AddRecursive, min_pairs: int = 0, max_pairs: int | None = None,
                ) -> str:
    """The rule text of the object (from `"{"` to `"}"`); rules it needs are added with `add_rule` (those
    that refer to themselves with `add_recursive`), named after `name`. `min_pairs` / `max_pairs`: the
    counts `counts_held` says it holds (others are ignored)."""
    if not kvs and other and (min_pairs > 0 or max_pairs is not None):
        return _counted(other, min_pairs, max_pairs)
    prefix = f"{name}-" if name else ""
    lead = ""  # what comes before the first alternative's pair
    if not _exact(required) and in_any_order(required):
        first = _required_tracked(kvs, required, other, add_rule, add_recursive, prefix)
    else:
        # other pairs, any number of them (`others`), and any number of them then the comma before a
        # declared pair (`sep`, written where a state's rule refers to it): one rule each
        others = _loop(add_recursive, f"{prefix}x-others", other) if other else ""
        written: list[str] = []

        def sep() -> str:
            if not written:
                written.append(_sep(add_recursive, f"{prefix}x-sep", other) if other else '"," space')
            return written[0]

        if _exact(required):
            if other and any(required):
                # a declared pair comes: the other pairs before it, each with its comma, in one rule
                lead = add_recursive(f"{prefix}x-before", lambda me: f'| {other} "," space {me}') + " "
            first = _any_order(kvs, required, other, others, sep, add_rule, prefix, lead=bool(lead))
        else:
            first = _schema_order(kvs, required, other, others, sep(), add_rule, prefix)
    if not first:
        return '"{" space "}"'
    if len(first) == 1 and (any(required) or min_pairs > 0):
        return f'"{{" space {lead}{first[0]} space "}}"'  # one alternative: no group (a rule less)
    # the alternatives (or none) as a rule of their own: a group would be one rule, and its option another
    empty = "" if any(required) or min_pairs > 0 else "| "
    return f'"{{" space {lead}{add_rule(f"{prefix}x-pairs", empty + " | ".join(first))} space "}}"'


def _join(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _any_order(kvs: Sequence[str], required: Sequence[bool], other: str | None, others: str,
               sep: Callable[[], str], add_rule: AddRule, prefix: str, *, lead: bool) -> list[str]:
    # rest[mask]: what may follow a written pair when the properties of `mask` are not written yet ("" for
    # nothing); masks in increasing order, so every smaller set's rule exists first. Rules are flat
    # alternatives (no groups: a group is one more rule to the parser), an empty one first where nothing
    # more is needed. `lead`: the other pairs before the first declared one are the caller's (a declared
    # one is required), so no alternative starts with an other pair.
    count = len(kvs)
    needed = sum(1 << i for i in range(count) if required[i])
    full = (1 << count) - 1
    rest: list[str] = []
    written: list[str] = []  # each pair with what comes before it (made where a set's rule needs them)
    for mask in range(1 << count):
        if mask == full and (not other or lead):
            break  # only an alternative that starts with an other key is followed by every property
        if mask and not written:
            written = [f"{sep()} {kv}" for kv in kvs]
        pairs = []
        for i in range(count):
            if mask >> i & 1:
                after = rest[mask & ~(1 << i)]
                pairs.append(f"{written[i]} {after}" if after else written[i])
        if not pairs:
            rest.append(others)  # all written: other pairs only, or nothing
            continue
        nullable = [] if mask & needed else [others]
        rest.append(add_rule(f"{prefix}x-props-{mask}", " | ".join(nullable + pairs)))
    first = [_join(kvs[i], rest[full & ~(1 << i)]) for i in range(count)]
    if other and not lead:
        first.append(_join(other, rest[full]))
    return first


def _required_tracked(kvs: Sequence[str], required: Sequence[bool], other: str | None, add_rule: AddRule,
                      add_recursive: AddRecursive, prefix: str) -> list[str]:
    # any order, a property may repeat: only the required ones not yet written are tracked. Each value of a
    # repeated key is its property's, so whichever one a reader keeps, the document is valid.
    # free[mask]: the pairs that leave `mask` (the required properties not yet written) as it is: optional
    # properties, other keys, required ones already written; taken any number of times in the set's rule
    # (x-props), or, once all are written, in x-loop
    count = len(kvs)
    needed = [i for i in range(count) if required[i]]
    full = (1 << len(needed)) - 1
    optional_pairs = [kvs[i] for i in range(count) if not required[i]] + ([other] if other else [])
    # one pair is referred to as it is (a rule of one alternative would be a rule more)
    optional = (optional_pairs[0] if len(optional_pairs) == 1 else
                add_rule(f"{prefix}x-optional", " | ".join(optional_pairs)) if optional_pairs else "")
    # free[mask] is free[mask + its lowest written property] or that property: two alternatives, whatever
    # the number of pairs (the two sets of pairs have none in common)
    free = [optional] * (full + 1)
    for mask in range(full - 1, -1, -1):
        bit = (~mask & (mask + 1)).bit_length() - 1
        pairs = ([free[mask | 1 << bit]] if free[mask | 1 << bit] else []) + [kvs[needed[bit]]]
        free[mask] = pairs[0] if len(pairs) == 1 else add_rule(f"{prefix}x-free-{mask}", " | ".join(pairs))
    rest: list[str] = []
    for mask in range(full + 1):
        if mask == full and not free[mask]:
            break  # only a free pair is followed by every required property
        if not mask:
            rest.append(_loop(add_recursive, f"{prefix}x-loop-{mask}", free[mask]) if free[mask] else "")
            continue
        # the comma, then a free pair (and the same set after it) or one of the set: one rule, whose
        # alternatives each write the comma (a rule of the free pairs before the comma would be one more)
        progress = [_join('"," space', kvs[needed[bit]], rest[mask & ~(1 << bit)])
                    for bit in range(len(needed)) if mask >> bit & 1]
        body = " | ".join(progress)
        if free[mask]:
            pair = free[mask]
            rest.append(add_recursive(f"{prefix}x-props-{mask}",
                                      lambda me: f'"," space {pair} {me} | {body}'))  # noqa: B023 (called here)
        else:
            rest.append(add_rule(f"{prefix}x-props-{mask}", body))
    first = [_join(kvs[needed[bit]], rest[full & ~(1 << bit)]) for bit in range(len(needed))]
    if free[full]:
        first.append(_join(free[full], rest[full]))
    return first


def _schema_order(kvs: Sequence[str], required: Sequence[bool], other: str | None, others: str, sep: str,
                  add_rule: AddRule, prefix: str) -> list[str]:
    # after[i]: what may follow a written pair when properties i.. remain; starts[i]: the alternatives of
    # the first pair when properties i.. remain (none is written yet)
    count = len(kvs)
    after = [""] * (count + 1)
    after[count] = others
    for i in range(count - 1, -1, -1):
        written = _join(sep, kvs[i], after[i + 1])
        if required[i]:
            text = written
        elif after[i + 1]:
            text = f"{written} | {after[i + 1]}"
        else:
            text = f"| {written}"
        after[i] = add_rule(f"{prefix}x-props-{i}", text)
    starts: list[str] = [_join(other, after[count])] if other else []
    for i in range(count - 1, -1, -1):
        here = [_join(kvs[i], after[i + 1])] + ([_join(other, after[i])] if other else [])
        if not required[i] and starts:
            here.append(add_rule(f"{prefix}x-first-{i + 1}", " | ".join(starts)))
        starts = here
    return starts
