# Protobuf's wire format, written by hand where a message built field by field would hold the GIL too long.
#
# A upb message is filled by C calls that each hold the GIL: a repeated field extended with a million
# values is one such call, or a Python list of a million objects made for it. Merging encodings is
# appending (protobuf's rule for a repeated field), so a large repeated field can be made of records
# encoded with numpy and merged a slice at a time, each merge a short hold.
#
# Invariants:
# - `length_delimited(number, payload)` is the record of field `number` with wire type 2 (a string, bytes,
#   a submessage, or a packed repeated number); `varint` is base-128, least significant group first.
# - `merge_packed_bools` leaves `message` as `getattr(message, name).extend(values)` would; it merges at
#   most `slice_values` values at a time and reads the clock between merges.
from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from constraintd.engine.masks.compute import check_deadline

__all__ = ["PACKED_SLICE", "length_delimited", "merge_packed_bools", "varint"]

# Values merged at once: a merge of 64 Ki packed bools is about 0.3 ms (a million of them, 4 ms in one).
PACKED_SLICE: Final = 1 << 16


def varint(value: int) -> bytes:
    """The base-128 encoding of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """The record of field `number` holding `payload` (wire type 2)."""
    return b"".join((varint(number << 3 | 2), varint(len(payload)), payload))


def merge_packed_bools(
    message: Message,
    name: str,
    values: npt.NDArray[np.bool_],
    *,
    deadline: float | None = None,
    slice_values: int = PACKED_SLICE,
) -> None:
    """Appends `values` to the repeated bool field `name` of `message`, `slice_values` at a time.

    Raises:
        DeadlineError: still merging at `deadline` (time.monotonic()); what was merged stays.
    """
    number = message.DESCRIPTOR.fields_by_name[name].number
    flags = np.ascontiguousarray(values, dtype=np.bool_).view(np.uint8)  # a bool's varint is its byte
    for start in range(0, len(flags), slice_values):
        check_deadline(deadline)
        message.MergeFromString(length_delimited(number, flags[start : start + slice_values].tobytes()))
