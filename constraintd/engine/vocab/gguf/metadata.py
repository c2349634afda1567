# The metadata (key-value) section of a GGUF file, read with the standard library and numpy.
#
# Contract: `read_gguf_metadata(path)` returns every key of the file with its GGUF type and value, and
# refuses (VocabError) what llama.cpp's gguf reader refuses before it gets to the tensors: a file that is
# not GGUF, an unsupported version (1, or newer than 3), an unknown value type, a duplicate key, data
# running past the end of the file. Tensor data is never read; the file is memory-mapped, so a
# multi-gigabyte model costs only the pages of its header.
#
# Values: scalars as Python int/float/bool, strings as bytes (GGUF does not promise UTF-8, and llama.cpp
# works on the bytes), numeric arrays as read-only numpy arrays, string arrays as lists of bytes.
# `gguf_metadata_size(path)` is where the metadata ends: the bytes before it name the vocabulary whatever
# the file is called (service/vocab_store.py finds a prepared vocabulary by their hash).
#
# This is our own reader rather than the `gguf` package's because the engine imports only the standard
# library and numpy; the format is small and stable (the GGUF specification in ggml's docs).
from __future__ import annotations

import enum
import mmap
import os
import struct
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from constraintd.errors import VocabError

__all__ = ["GgufType", "GgufValue", "gguf_metadata_size", "read_gguf_metadata"]

GGUF_MAGIC = b"GGUF"

T = TypeVar("T")


class GgufType(enum.IntEnum):
    """GGUF's value types (`gguf_type`)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size types: their little-endian numpy dtype.
_DTYPES: dict[GgufType, str] = {
    GgufType.UINT8: "<u1",
    GgufType.INT8: "<i1",
    GgufType.UINT16: "<u2",
    GgufType.INT16: "<i2",
    GgufType.UINT32: "<u4",
    GgufType.INT32: "<i4",
    GgufType.FLOAT32: "<f4",
    GgufType.BOOL: "<u1",
    GgufType.UINT64: "<u8",
    GgufType.INT64: "<i8",
    GgufType.FLOAT64: "<f8",
}


@dataclass(frozen=True, slots=True)
class GgufValue:
    """One metadata value.

    Attributes:
        type: the value's GGUF type (ARRAY for arrays).
        value: see the module comment for the Python form of each type; None for a string array that
            was skipped.
        item_type: the element type of an array; None for a scalar.
        count: the number of elements of an array; 0 for a scalar.
    """

    type: GgufType
    value: object
    item_type: GgufType | None = None
    count: int = 0


class _Cursor:
    """Reads little-endian values from a buffer, refusing to run past its end."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, size: int) -> int:
        start = self.pos
        if size < 0 or start + size > len(self.buf):
            raise VocabError(f"GGUF metadata runs past the end of the file (at byte {start})")
        self.pos = start + size
        return start

    def u32(self) -> int:
        value: int = struct.unpack_from("<I", self.buf, self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack_from("<Q", self.buf, self.take(8))[0]
        return value

    def string(self) -> bytes:
        size = self.u64()
        start = self.take(size)
        return self.buf[start : start + size]

    def type(self) -> GgufType:
        code = self.u32()
        try:
            return GgufType(code)
        except ValueError:
            raise VocabError(f"unknown GGUF value type {code} at byte {self.pos - 4}") from None

    def strings(self, count: int, *, keep: bool) -> list[bytes] | None:
        # One pass over (u64 length, bytes) pairs; each length says where the next one is, so this
        # cannot be vectorised. A skipped array is only walked (a 500k-entry merge list costs ~0.3 s).
        buf, pos, end = self.buf, self.pos, len(self.buf)
        unpack = struct.Struct("<Q").unpack_from
        out: list[bytes] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                break
            size = unpack(buf, pos)[0]
            pos += 8
            if pos + size > end:
                break
            if keep:
                append(buf[pos : pos + size])
            pos += size
        else:
            self.pos = pos
            return out if keep else None
        raise VocabError(f"GGUF string array runs past the end of the file (at byte {pos})")

    def value(self, kind: GgufType, *, keep_strings: bool) -> GgufValue:
        if kind is GgufType.STRING:
            return GgufValue(kind, self.string())
        if kind is GgufType.ARRAY:
            item = self.type()
            count = self.u64()
            if item is GgufType.STRING:
                return GgufValue(kind, self.strings(count, keep=keep_strings), item, count)
            if item is GgufType.ARRAY:
                raise VocabError("nested GGUF arrays are not supported")
            dtype = np.dtype(_DTYPES[item])
            start = self.take(count * dtype.itemsize)
            array = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).copy()
            array.flags.writeable = False
            return GgufValue(kind, array, item, count)
        dtype = np.dtype(_DTYPES[kind])
        scalar = np.frombuffer(self.buf, dtype=dtype, count=1, offset=self.take(dtype.itemsize))[0]
        return GgufValue(kind, bool(scalar) if kind is GgufType.BOOL else scalar.item())


def read_gguf_metadata(
    path: str | os.PathLike[str], *, string_arrays: Container[str] | None = None
) -> Mapping[str, GgufValue]:
    """Every metadata key of a GGUF file, in file order.

    Args:
        path: the GGUF file.
        string_arrays: the keys whose string arrays to return; the others come back with value None
            (their count is still given). None: return them all.

    Raises:
        VocabError: the file cannot be opened, is not GGUF, or its metadata is malformed.
    """
    return _read(path, lambda name, buf: _parse(name, buf, string_arrays)[0])


def gguf_metadata_size(path: str | os.PathLike[str]) -> int:
    """The size in bytes of a GGUF file's header and metadata section, the part its vocabulary is read from.

    The metadata is a function of these first bytes alone: two files whose first `size` bytes are equal
    hold the same vocabulary, wherever they lie and whatever tensors follow. Walks the metadata without
    keeping it (a 262k-token vocabulary: about 0.2 s).

    Raises:
        VocabError: as `read_gguf_metadata`.
    """
    return _read(path, lambda name, buf: _parse(name, buf, ())[1])


def _read(path: str | os.PathLike[str], parse: Callable[[str, mmap.mmap], T]) -> T:
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < 24:
                head = file.read()
                raise VocabError(_not_gguf(name, head))
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return parse(name, buf)
    except OSError as exc:
        raise VocabError(f"cannot read {name}: {exc.strerror or exc}") from exc


def _not_gguf(name: str, head: bytes) -> str:
    return f"{name} is not a GGUF file (it starts with {head[:4]!r}, not {GGUF_MAGIC!r})"


def _parse(
    name: str, buf: mmap.mmap, string_arrays: Container[str] | None
) -> tuple[dict[str, GgufValue], int]:
    # The metadata, and the offset where it ends.
    if buf[:4] != GGUF_MAGIC:
        raise VocabError(_not_gguf(name, buf[:4]))
    cursor = _Cursor(buf)
    cursor.take(4)
    version = cursor.u32()
    if version == 1:
        raise VocabError(f"{name}: GGUF version 1 is no longer supported (llama.cpp reads 2 and 3)")
    if version > 3:
        # A big-endian file shows its version byte-swapped here; llama.cpp refuses both.
        raise VocabError(f"{name}: GGUF version {version} is not supported (llama.cpp reads 2 and 3)")
    cursor.u64()  # tensor count: the tensors are not read
    n_kv = cursor.u64()
    metadata: dict[str, GgufValue] = {}
    for _ in range(n_kv):
        key = cursor.string().decode("utf-8", "surrogateescape")
        if key in metadata:
            raise VocabError(f"{name}: duplicate GGUF key {key!r}")
        keep = string_arrays is None or key in string_arrays
        metadata[key] = cursor.value(cursor.type(), keep_strings=keep)
    return metadata, cursor.pos
