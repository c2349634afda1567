"""Records written by hand (service/wire.py) against the messages protobuf builds itself."""

from __future__ import annotations

import time

import numpy as np
import pytest

from constraintd.errors import DeadlineError
from constraintd.service.wire import length_delimited, merge_packed_bools, varint
from constraintd.v1 import constraintd_pb2 as pb


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 16_383, 16_384, 2**32 + 5, 2**63 - 1])
def test_a_varint_is_what_protobuf_writes_for_a_uint64(value: int) -> None:
    # Mask.vocab_size is field 2, a uint32 or uint64: its record is the tag (2 << 3 | 0) then the varint
    if value < 2**32:
        assert pb.Mask(vocab_size=value).SerializeToString() == (b"\x10" + varint(value) if value else b"")
    decoded, shift = 0, 0
    for byte in varint(value):
        decoded |= (byte & 0x7F) << shift
        shift += 7
    assert decoded == value and all(byte & 0x80 for byte in varint(value)[:-1])


def test_a_length_delimited_record_parses_as_its_field() -> None:
    payload = bytes(range(256)) * 3  # a length of two varint bytes
    number = pb.Mask.DESCRIPTOR.fields_by_name["words"].number
    assert pb.Mask.FromString(length_delimited(number, payload)).words == payload


@pytest.mark.parametrize("slice_values", [1, 3, 64, 1 << 16])
def test_packed_bools_merged_in_slices_are_the_field_extended(slice_values: int) -> None:
    rng = np.random.default_rng(5)
    values = rng.random(1000) < 0.3
    reply = pb.AllowsResponse(allowed=[True, False])  # what was there stays, the values come after it
    merge_packed_bools(reply, "allowed", values, slice_values=slice_values)
    expected = pb.AllowsResponse(allowed=[True, False, *values.tolist()])
    assert list(reply.allowed) == list(expected.allowed)
    assert reply.SerializeToString() == expected.SerializeToString()


def test_merging_past_the_deadline_stops() -> None:
    reply = pb.AllowsResponse()
    with pytest.raises(DeadlineError):
        merge_packed_bools(reply, "allowed", np.ones(10, dtype=np.bool_), deadline=time.monotonic() - 1.0)
    assert len(reply.allowed) == 0
