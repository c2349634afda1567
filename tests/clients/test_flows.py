"""The client's protocol logic (clients/flows.py), driven by a scripted transport: retries, rebuilding lost
sessions by replay, and what each reply does to the client's record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clients import flows
from clients.flows import Call, Flow, Pause, Policy, SessionRecord, VocabHandle
from constraintd.errors import ConstraintdError, InputError, NotFoundError, PositionError, UnavailableError
from constraintd.service.status import status_for
from constraintd.v1 import constraintd_pb2 as pb

POLICY = Policy(timeout=1.0, setup_timeout=5.0, attempts=3, backoff=0.1, max_backoff=0.15, rebuilds=2)
REGISTRATION = pb.RegisterVocabRequest(gguf_path="/m.gguf")
VOCAB = VocabHandle("v1", 20, "v1", REGISTRATION)

Answer = Callable[[Any], Any]  # a request -> its reply, or raises


def run(flow: Flow[Any], script: list[tuple[str, Answer]]) -> tuple[Any, list[Any]]:
    """Drives a flow: each call must be the next method in `script`, answered by its function.
    Returns the flow's result and every action it took."""
    actions: list[Any] = []
    try:
        action = next(flow)
        while True:
            actions.append(action)
            if isinstance(action, Pause):
                action = flow.send(None)
                continue
            method, answer = script.pop(0)
            assert action.method == method, f"expected {method}, the flow called {action.method}"
            try:
                reply = answer(action.request)
            except ConstraintdError as error:
                action = flow.throw(error)
            else:
                action = flow.send(reply)
    except StopIteration as stop:
        assert not script, f"calls never made: {[m for m, _ in script]}"
        return stop.value, actions


def fail(error: ConstraintdError) -> Answer:
    def answer(request: Any) -> Any:
        raise error

    return answer


def record_with(history: list[int], session_id: str = "s1") -> SessionRecord:
    record = SessionRecord(VOCAB, pb.CreateSessionRequest(vocab_id="v1", gbnf=pb.Gbnf(text="root ::= x")))
    record.id = session_id
    record.history = list(history)
    return record


def accepted(complete: bool = False, position: int = 0) -> Answer:
    return lambda request: pb.AcceptResponse(
        accepted=True, state=pb.SessionState(complete=complete, position=position)
    )


def created(session_id: str) -> Answer:
    return lambda request: pb.CreateSessionResponse(session_id=session_id, state=pb.SessionState(position=1))


def test_an_accept_carries_the_position_and_appends_the_token() -> None:
    record = record_with([5])
    seen: list[pb.AcceptRequest] = []

    def answer(request: pb.AcceptRequest) -> pb.AcceptResponse:
        seen.append(request)
        return pb.AcceptResponse(accepted=True, state=pb.SessionState(complete=True, position=2))

    result, _ = run(flows.accept(POLICY, record, 7, mask_on_reject=True), [("Accept", answer)])
    assert result == (True, None)
    assert seen[0] == pb.AcceptRequest(session_id="s1", token=7, mask_on_reject=True, position=1)
    assert record.history == [5, 7] and record.complete


def test_a_rejection_changes_nothing_and_brings_the_mask() -> None:
    record = record_with([5])
    mask = pb.Mask(words=(6).to_bytes(4, "little"), vocab_size=3, allowed=2)
    reply = pb.AcceptResponse(accepted=False, state=pb.SessionState(position=1), mask=mask)
    (taken, words), _ = run(
        flows.accept(POLICY, record, 7, mask_on_reject=True), [("Accept", lambda r: reply)]
    )
    assert not taken and words is not None and words.tolist() == [6]
    assert record.history == [5]


def test_unavailable_is_retried_with_growing_pauses_then_given_up() -> None:
    record = record_with([])
    down = fail(UnavailableError("down"))
    result, actions = run(
        flows.accept(POLICY, record, 1, mask_on_reject=False),
        [("Accept", down), ("Accept", down), ("Accept", accepted())],
    )
    assert result == (True, None)
    assert [a.seconds for a in actions if isinstance(a, Pause)] == [0.1, 0.15]
    with pytest.raises(UnavailableError):
        run(flows.accept(POLICY, record, 1, mask_on_reject=False), [("Accept", down)] * 3)


def test_a_lost_session_is_rebuilt_by_replay_and_the_call_made_again() -> None:
    record = record_with([4, 5])
    creates: list[pb.CreateSessionRequest] = []

    def create(request: pb.CreateSessionRequest) -> pb.CreateSessionResponse:
        creates.append(request)
        return pb.CreateSessionResponse(session_id="s2", state=pb.SessionState(position=2), warnings=["w"])

    seen: list[str] = []

    def answer(request: pb.AcceptRequest) -> pb.AcceptResponse:
        seen.append(request.session_id)
        return pb.AcceptResponse(accepted=True, state=pb.SessionState(position=3))

    run(
        flows.accept(POLICY, record, 6, mask_on_reject=False),
        [("Accept", fail(NotFoundError("gone"))), ("CreateSession", create), ("Accept", answer)],
    )
    assert list(creates[0].replay) == [4, 5] and creates[0].gbnf.text == "root ::= x"
    assert not record.request.replay  # the record's own request stays without replay
    assert seen == ["s2"] and record.id == "s2" and record.history == [4, 5, 6] and record.warnings == ("w",)


def test_a_session_out_of_step_is_rebuilt_from_the_clients_tokens() -> None:
    record = record_with([4])
    _, actions = run(
        flows.rollback(POLICY, record, 1),
        [
            ("Rollback", fail(PositionError("differs"))),
            ("CreateSession", created("s2")),
            ("Rollback", lambda r: pb.RollbackResponse(state=pb.SessionState())),
        ],
    )
    assert [a.request.position for a in actions if isinstance(a, Call) and a.method == "Rollback"] == [1, 1]
    assert record.history == [] and record.id == "s2"


def test_a_lost_vocabulary_is_registered_again_before_the_session() -> None:
    record = record_with([1])
    registrations: list[pb.RegisterVocabRequest] = []

    def register(request: pb.RegisterVocabRequest) -> pb.RegisterVocabResponse:
        registrations.append(request)
        return pb.RegisterVocabResponse(vocab_id="v1", size=20, content_hash="v1")

    run(
        flows.mask(POLICY, record),
        [
            ("Mask", fail(NotFoundError("no session"))),
            ("CreateSession", fail(NotFoundError("no vocab"))),
            ("RegisterVocab", register),
            ("CreateSession", created("s3")),
            ("Mask", lambda r: pb.MaskResponse(mask=pb.Mask(words=bytes(4), vocab_size=20))),
        ],
    )
    assert registrations == [REGISTRATION]
    assert record.id == "s3"


def test_a_vocabulary_lost_again_between_its_registration_and_the_session_is_registered_again() -> None:
    # the server restarts after the client registered the vocabulary anew but before CreateSession
    record = record_with([1])

    def register(request: pb.RegisterVocabRequest) -> pb.RegisterVocabResponse:
        return pb.RegisterVocabResponse(vocab_id="v1", size=20, content_hash="v1")

    no_vocab = fail(NotFoundError("no vocab"))
    run(
        flows.create(POLICY, record),
        [
            ("CreateSession", no_vocab),
            ("RegisterVocab", register),
            ("CreateSession", no_vocab),
            ("RegisterVocab", register),
            ("CreateSession", created("s4")),
        ],
    )
    assert record.id == "s4"
    with pytest.raises(NotFoundError):  # up to the policy's rebuilds
        run(flows.create(POLICY, record), [("CreateSession", no_vocab), ("RegisterVocab", register)] * 2
            + [("CreateSession", no_vocab)])


def test_rebuilding_gives_up_after_its_limit() -> None:
    record = record_with([])
    gone = fail(NotFoundError("gone"))
    with pytest.raises(NotFoundError):
        run(
            flows.allows(POLICY, record, [1]),
            [
                ("Allows", gone),
                ("CreateSession", created("a")),
                ("Allows", gone),
                ("CreateSession", created("b")),
                ("Allows", gone),
            ],
        )


def test_other_errors_reach_the_caller_at_once() -> None:
    with pytest.raises(InputError, match="bad token"):
        run(
            flows.accept(POLICY, record_with([]), 99, mask_on_reject=False),
            [("Accept", fail(InputError("bad token")))],
        )


def test_a_closed_session_is_never_rebuilt() -> None:
    record = record_with([])
    run(flows.close(POLICY, record), [("Close", fail(NotFoundError("gone")))])  # closed already: fine
    assert record.closed
    run(flows.close(POLICY, record), [])  # closing twice makes no call
    with pytest.raises(NotFoundError):
        run(flows.mask(POLICY, record), [("Mask", fail(NotFoundError("gone")))])


def test_fork_copies_the_record() -> None:
    record = record_with([1, 2])
    child, _ = run(
        flows.fork(POLICY, record),
        [("Fork", lambda r: pb.ForkResponse(session_id="s9", state=pb.SessionState(complete=True)))],
    )
    assert child.id == "s9" and child.history == [1, 2] and child.complete
    child.history.append(3)
    assert record.history == [1, 2]


def test_rolling_back_more_than_was_accepted_is_refused_locally() -> None:
    with pytest.raises(ValueError, match="cannot roll back 3 tokens of 2"):
        run(flows.rollback(POLICY, record_with([1, 2]), 3), [])


def test_a_step_batch_applies_each_result_and_redoes_lost_sessions_alone() -> None:
    first, second, third = record_with([1], "a"), record_with([], "b"), record_with([2], "c")
    mask = pb.Mask(words=(5).to_bytes(4, "little"), vocab_size=3, allowed=2)

    def step(request: pb.StepRequest) -> pb.StepResponse:
        batch = request.accepts
        assert list(batch.session_ids) == ["a", "b"] and list(batch.tokens) == [7, 8]
        assert list(batch.positions) == [1, 0] and batch.mask_on_reject
        assert [op.WhichOneof("op") for op in request.ops] == ["mask"]
        return pb.StepResponse(
            results=[pb.StepResult(mask=pb.MaskResponse(mask=mask, state=pb.SessionState(position=1)))],
            accepts=pb.AcceptBatchResponse(
                accepted=[True, False],
                complete=[True, False],
                errors=[pb.ItemError(index=1, error=status_for(NotFoundError("gone")))],
            ),
        )

    outcomes, _ = run(
        flows.step(POLICY, [(first, 7), (second, 8), (third, None)], mask_on_reject=True),
        [("Step", step), ("CreateSession", created("b2")), ("Accept", accepted(position=1))],
    )
    assert [(o.accepted, o.complete) for o in outcomes] == [(True, True), (True, False), (None, False)]
    assert outcomes[2].mask is not None and outcomes[2].mask.tolist() == [5]
    assert first.history == [1, 7] and second.history == [8] and second.id == "b2" and third.history == [2]


def test_a_step_batch_answers_a_rejection_with_its_mask() -> None:
    record = record_with([1], "a")
    mask = pb.Mask(words=(6).to_bytes(4, "little"), vocab_size=3, allowed=2)
    reply = pb.StepResponse(
        accepts=pb.AcceptBatchResponse(
            accepted=[False], complete=[False], masks=[pb.ItemMask(index=0, mask=mask)]
        )
    )
    outcomes, _ = run(flows.step(POLICY, [(record, 9)], mask_on_reject=True), [("Step", lambda r: reply)])
    assert outcomes[0].accepted is False and outcomes[0].mask is not None
    assert outcomes[0].mask.tolist() == [6] and record.history == [1]


def test_a_step_reply_missing_items_is_unavailable() -> None:
    record = record_with([], "a")
    short = pb.StepResponse(accepts=pb.AcceptBatchResponse())  # a reply that answers no item
    with pytest.raises(UnavailableError, match="does not answer every item"):
        run(flows.step(POLICY, [(record, 9)], mask_on_reject=False), [("Step", lambda r: short)])
