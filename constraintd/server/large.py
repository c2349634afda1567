# Requests too large to parse on the event loop.
#
# Protobuf parses a message in one C call that holds the GIL: a RegisterVocab of 2M pieces (19 MB) held
# every other session's Accept for 100-280 ms. A request of more than PARSE_ON_LOOP bytes is handed to its
# method unparsed (`Large`), and parsed in a worker thread in slices: the records of its fields are found
# by walking the wire format in Python (bytecode, so the GIL changes hands every switch interval) and
# merged into the message about SLICE_BYTES at a time, each merge a short hold of the GIL.
# PARSE_ON_LOOP bounds the one parse the event loop still makes: protobuf's slowest rate measured is packed
# one-byte numbers (an Allows of a small vocabulary's ids), 3.3 ns a byte, so 256 KiB is under a
# millisecond; at 1 MiB, an Allows of a million such ids held the loop 3.5 ms (10-17 ms under load).
#
# Invariants:
# - The slices make the message one parse makes: parsing concatenated encodings is merging them in order
#   (protobuf's rule), and a merge appends a repeated field and merges a submessage. A record of a message
#   field larger than a slice is itself taken in slices, each wrapped in its field's tag; a packed
#   repeated number is cut between its values, each part wrapped the same way. A string or bytes record
#   is never cut (a 16 MiB piece is one merge: a copy, a few milliseconds).
# - What does not walk as a message (a truncated varint, a record past the end, a group or an unknown wire
#   type) raises DecodeError, as the one-call parse would; what walks but does not parse raises it from
#   the merge.
# - The walk reads the clock every DEADLINE_RECORDS records and stops at `deadline` (DeadlineError).
# - A caller may bound the records of given fields (`most`): past the bound the walk stops with a
#   LimitError, so a request of ten million pieces costs a million records' walk, not ten. The values of a
#   packed repeated number count one each (a value ends at each byte under 0x80), before any is decoded:
#   30M token ids in one packed record (30 MB) took 470 MiB to decode into a message, then were refused.
# - A request sent in parts (RegisterVocabParts) is parsed as their concatenation, which is the parts
#   merged in order: each part is walked as a message of its own, and `most` counts across all of them.
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from constraintd.errors import DeadlineError
from constraintd.service.wire import length_delimited

__all__ = ["PARSE_ON_LOOP", "SLICE_BYTES", "Large", "parse_in_slices"]

PARSE_ON_LOOP = 1 << 18
SLICE_BYTES = 1 << 18
DEADLINE_RECORDS = 4096

_VARINT_TYPES = frozenset(
    (
        FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_ENUM,
    )
)
_FIXED_WIDTH = {
    FieldDescriptor.TYPE_FIXED32: 4, FieldDescriptor.TYPE_SFIXED32: 4, FieldDescriptor.TYPE_FLOAT: 4,
    FieldDescriptor.TYPE_FIXED64: 8, FieldDescriptor.TYPE_SFIXED64: 8, FieldDescriptor.TYPE_DOUBLE: 8,
}

# what takes the encodings in order (a message's MergeFromString, which reads any buffer)
Emit = Callable[[Any], object]


class Large:
    """A request too large to parse on the event loop (or sent in parts): its bytes and its type, parsed
    by `parse`."""

    __slots__ = ("data", "message_type")

    def __init__(self, data: bytes | Sequence[bytes], message_type: type[Message]) -> None:
        self.data = data
        self.message_type = message_type

    def parse(self, deadline: float | None = None, most: Most | None = None) -> Message:
        """The message (see `parse_in_slices`)."""
        return parse_in_slices(self.message_type, self.data, deadline=deadline, most=most)


# a field's full name (as "constraintd.v1.PieceList.pieces") -> the most records of it a request may hold,
# and the error to raise past that
Most = dict[str, tuple[int, Callable[[], Exception]]]


def parse_in_slices(
    message_type: type[Message],
    data: bytes | Sequence[bytes],
    *,
    slice_bytes: int = SLICE_BYTES,
    deadline: float | None = None,
    most: Most | None = None,
) -> Message:
    """`message_type.FromString(data)`, in merges of about `slice_bytes` each (see the module's comment);
    of parts, `FromString` of their concatenation, each part a message of its own.

    Raises:
        DecodeError: `data` (or a part) is not a message of this type.
        DeadlineError: still walking at `deadline` (time.monotonic()).
        Exception: the error `most` names for a field with more records than it allows, in all the parts.
    """
    message = message_type()
    counts: dict[str, int] = {}
    for part in (data,) if isinstance(data, bytes) else data:
        _Walk(part, slice_bytes, deadline, most or {}, counts).message(
            0, len(part), message_type.DESCRIPTOR, message.MergeFromString
        )
    return message


def _wrapped(emit: Emit, number: int) -> Emit:
    """An emitter that sends each encoding on as the payload of field `number` (a length-delimited record)."""
    return lambda payload: emit(length_delimited(number, payload))


class _Walk:
    __slots__ = ("counts", "data", "deadline", "fields", "most", "records", "slice_bytes", "view")

    def __init__(
        self, data: bytes, slice_bytes: int, deadline: float | None, most: Most, counts: dict[str, int]
    ) -> None:
        self.most = most
        self.counts = counts  # shared by the walks of one request's parts
        self.fields: dict[str, tuple[dict[int, str], set[int], set[int]]] = {}  # by message type: _fields_of
        self.data = data  # read a byte at a time (an int)
        self.view = memoryview(data)  # cut without a copy
        self.slice_bytes = slice_bytes
        self.deadline = deadline
        self.records = 0

    def message(self, pos: int, end: int, descriptor: Any, emit: Emit) -> None:
        """Emits the records of the message encoded in data[pos:end], in slices, in order."""
        try:
            self._message(pos, end, descriptor, emit)
        except IndexError:
            raise DecodeError("a record runs past the end of the request") from None

    def _message(self, pos: int, end: int, descriptor: Any, emit: Emit) -> None:
        data, view, slice_bytes, varint_at = self.data, self.view, self.slice_bytes, self._varint_at
        watched, packed, within = self._fields_of(descriptor)
        pending = pos  # the start of the records not yet emitted
        records = self.records
        while pos < end:
            # the common case inline (a one-byte key, a one-byte length): this loop is the walk's cost
            start = pos
            key = data[pos]
            if key < 0x80:
                pos += 1
            else:
                key, pos = varint_at(pos, end)
            wire = key & 7
            if wire == 2:
                length = data[pos]
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = varint_at(pos, end)
                payload = pos
                pos += length
            elif wire == 0:
                _, pos = varint_at(pos, end)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise DecodeError(f"wire type {wire} at byte {start}")
            if pos > end:
                raise DecodeError(f"the record at byte {start} runs past the end of its message")
            run = 1
            if wire == 2 and key < 0x80 and length < 0x80 and key >> 3 not in within:
                # more short records of the same field (a vocabulary's pieces), as far as this slice
                # goes: two bytes read a record, the walk's common case
                limit = min(end, pending + slice_bytes)
                while pos < limit and data[pos] == key:
                    length = data[pos + 1]
                    if length >= 0x80:
                        break
                    pos += 2 + length
                    run += 1
                if pos > end:
                    raise DecodeError(f"a record runs past the end of its message at byte {start}")
            if (records + run) // DEADLINE_RECORDS != records // DEADLINE_RECORDS:
                self._check_deadline()
            records += run
            if watched and key >> 3 in watched:
                if wire == 2 and key >> 3 in packed:
                    self._count_values(watched[key >> 3], start, pos, run)
                else:
                    self._count(watched[key >> 3], run)
            if wire == 2 and run == 1 and (pos - start > slice_bytes or key >> 3 in within):
                field = descriptor.fields_by_number.get(key >> 3)
                if field is not None:
                    if pending < start:
                        emit(view[pending:start])
                    self.records = records
                    if self._cut(field, payload, pos, emit):
                        records = self.records
                        pending = pos
                        continue
                    pending = start
            if pos - pending >= slice_bytes:
                emit(view[pending:pos])
                pending = pos
        self.records = records
        if pending < end:
            emit(view[pending:end])

    def _fields_of(self, descriptor: Any) -> tuple[dict[int, str], set[int], set[int]]:
        """A message type's fields the walk looks at, by number: those whose records are counted (with
        their full names); those of them whose records are packed numbers, whose values are counted
        instead; and its message fields with counted fields inside, each record of which is walked,
        whatever its size (a part of a request cut small is counted as a large request is)."""
        known = self.fields.get(descriptor.full_name)
        if known is None:
            fields = descriptor.fields
            watched = {field.number: field.full_name for field in fields if field.full_name in self.most}
            packed = {
                field.number
                for field in fields
                if field.number in watched and field.is_repeated and field.type in _VARINT_TYPES
            }
            within = {
                field.number
                for field in fields
                if field.type == FieldDescriptor.TYPE_MESSAGE and self._counts_within(field.message_type)
            }
            known = self.fields[descriptor.full_name] = (watched, packed, within)
        return known

    def _counts_within(self, descriptor: Any, seen: frozenset[str] = frozenset()) -> bool:
        """Whether a message of this type holds a counted field, at any depth."""
        if descriptor.full_name in seen:
            return False
        seen = seen | {descriptor.full_name}
        return any(
            field.full_name in self.most
            or (field.type == FieldDescriptor.TYPE_MESSAGE and self._counts_within(field.message_type, seen))
            for field in descriptor.fields
        )

    def _cut(self, field: Any, pos: int, end: int, emit: Emit) -> bool:
        """Emits a large record of `field` (its payload data[pos:end]) in slices; False when it cannot be
        cut (a string or bytes, or an empty payload: a message's presence) and must go whole."""
        if pos == end:
            return False
        if not field.is_repeated:
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                return False
            # one message's records in slices (of a repeated field, each record is an element of its own)
            self.message(pos, end, field.message_type, _wrapped(emit, field.number))
            return True
        if field.type in _VARINT_TYPES:
            values = np.frombuffer(self.data, dtype=np.uint8, count=end - pos, offset=pos)
            ends = np.flatnonzero(values < 0x80) + 1  # each value ends at a byte without the high bit
        elif field.type in _FIXED_WIDTH:
            ends = np.arange(_FIXED_WIDTH[field.type], end - pos + 1, _FIXED_WIDTH[field.type])
        else:
            return False
        if not len(ends) or ends[-1] != end - pos:
            raise DecodeError(f"packed field {field.name} ends inside a value")
        send = _wrapped(emit, field.number)
        cut = 0
        while cut < end - pos:
            # the last value ending within a slice of the cut (the next one to end, if none does)
            index = int(np.searchsorted(ends, cut + self.slice_bytes, side="right")) - 1
            if ends[index] <= cut:
                index += 1
            after = int(ends[index])
            send(self.view[pos + cut : pos + after])
            cut = after
        return True

    def _count_values(self, name: str, start: int, end: int, records: int) -> None:
        # the values of `records` packed records (data[start:end]): each value's varint ends at a byte under
        # 0x80, and so do each record's key and length. Counted a slice at a time (30 MB at once held the
        # GIL about 40 ms), and stopped as soon as the bound is passed.
        self._count(name, -2 * records)
        for at in range(start, end, self.slice_bytes):
            span = np.frombuffer(self.data, dtype=np.uint8, count=min(self.slice_bytes, end - at), offset=at)
            self._count(name, int(np.count_nonzero(span < 0x80)))

    def _count(self, name: str, records: int) -> None:
        count = self.counts[name] = self.counts.get(name, 0) + records
        most, error = self.most[name]
        if count > most:
            raise error()

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineError("reading the request ran past its time limit")

    def _varint_at(self, pos: int, end: int) -> tuple[int, int]:
        data = self.data
        value = 0
        shift = 0
        while True:
            if pos >= end:
                raise DecodeError(f"a varint runs past the end of its message at byte {pos}")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, pos
            shift += 7
            if shift > 63:
                raise DecodeError(f"a varint longer than 10 bytes at byte {pos}")
