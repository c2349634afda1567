"""Allows' owed checks (constraintd/service/operations.py, `OwedChecks`): a call of many tokens checks each
distinct token once and answers exactly what checking every token in order answers."""

from __future__ import annotations

import random
import time

import pytest

from constraintd.engine.matcher import Matcher
from constraintd.errors import DeadlineError, TokenError
from constraintd.service.constraints import Constraint, ConstraintKind
from constraintd.service.limits import Limits
from constraintd.service.operations import DISTINCT_CHECKS_FROM, OwedChecks
from constraintd.service.registry import Registry
from constraintd.v1 import constraintd_pb2 as pb

BYTES = [b"</s>", *(bytes((b,)) for b in range(1, 256))]


@pytest.fixture
def matcher() -> Matcher:
    registry = Registry(Limits())
    vocab = registry.register_pieces(BYTES, [0])
    compiled = registry.compile(Constraint(ConstraintKind.JSON_OBJECT, ""), vocab)
    matcher = Matcher(compiled.grammar, max_stacks=Limits().max_stacks)
    assert matcher.accept_bytes(b'{"a": [1, "x')  # inside a string inside an array: some bytes end it
    return matcher


def checked(matcher: Matcher, tokens: list[int], deadline: float | None = None) -> list[bool]:
    reply = pb.AllowsResponse()
    OwedChecks(reply, matcher.fork(), tokens).pay(deadline)
    return list(reply.allowed)


def test_many_tokens_answer_what_each_checked_in_order_answers(
    matcher: Matcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(7)
    tokens = [rng.randrange(len(BYTES)) for _ in range(4 * DISTINCT_CHECKS_FROM)]
    expected = [matcher.allows(token) for token in tokens]
    assert 0 < sum(expected) < len(expected)
    calls: list[int] = []
    allows = Matcher.allows

    def counted(self: Matcher, token: int) -> bool:
        calls.append(token)
        return allows(self, token)

    monkeypatch.setattr(Matcher, "allows", counted)
    assert checked(matcher, tokens) == expected
    assert len(calls) == len(set(tokens))  # each distinct token once
    calls.clear()
    few = tokens[:DISTINCT_CHECKS_FROM]  # not many: checked one by one, in order
    assert checked(matcher, few) == expected[:DISTINCT_CHECKS_FROM] and calls == few


def test_a_token_outside_the_vocabulary_among_many_is_refused(matcher: Matcher) -> None:
    tokens = [1] * DISTINCT_CHECKS_FROM + [len(BYTES)] + [2] * 10
    with pytest.raises(TokenError):
        checked(matcher, tokens)


def test_many_checks_past_their_deadline_stop(matcher: Matcher) -> None:
    with pytest.raises(DeadlineError):
        checked(matcher, [1] * (2 * DISTINCT_CHECKS_FROM), deadline=time.monotonic() - 1.0)
