"""The GGUF metadata reader: values written by the `gguf` package (ggml's own writer) read back intact,
and malformed files refused with a VocabError that says what is wrong."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from constraintd.engine.vocab.gguf.metadata import GgufType, gguf_metadata_size, read_gguf_metadata
from constraintd.errors import VocabError
from tests import reference


def test_values_written_by_the_gguf_package_read_back(tmp_path: Path) -> None:
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_string("s", "héllo")
    writer.add_uint8("u8", 200)
    writer.add_int8("i8", -100)
    writer.add_uint16("u16", 60000)
    writer.add_int16("i16", -30000)
    writer.add_uint32("u32", 4_000_000_000)
    writer.add_int32("i32", -2_000_000_000)
    writer.add_float32("f32", 1.5)
    writer.add_uint64("u64", 2**63)
    writer.add_int64("i64", -(2**62))
    writer.add_float64("f64", -2.25)
    writer.add_bool("b", True)
    writer.add_array("strings", ["a", "", "ü\n"])
    writer.add_array("ints", [1, -2, 3])
    writer.add_array("floats", [0.5, 2.0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()

    meta = read_gguf_metadata(path)
    scalars = {key: (meta[key].type, meta[key].value) for key in
               ("s", "u8", "i8", "u16", "i16", "u32", "i32", "f32", "u64", "i64", "f64", "b")}  # fmt: skip
    assert scalars == {
        "s": (GgufType.STRING, "héllo".encode()),
        "u8": (GgufType.UINT8, 200),
        "i8": (GgufType.INT8, -100),
        "u16": (GgufType.UINT16, 60000),
        "i16": (GgufType.INT16, -30000),
        "u32": (GgufType.UINT32, 4_000_000_000),
        "i32": (GgufType.INT32, -2_000_000_000),
        "f32": (GgufType.FLOAT32, 1.5),
        "u64": (GgufType.UINT64, 2**63),
        "i64": (GgufType.INT64, -(2**62)),
        "f64": (GgufType.FLOAT64, -2.25),
        "b": (GgufType.BOOL, True),
    }
    assert meta["general.architecture"].value == b"llama"
    strings = meta["strings"]
    assert (strings.type, strings.item_type, strings.count, strings.value) == (
        GgufType.ARRAY, GgufType.STRING, 3, [b"a", b"", "ü\n".encode()]
    )  # fmt: skip
    ints = meta["ints"]
    assert ints.item_type is GgufType.INT32
    assert isinstance(ints.value, np.ndarray) and ints.value.tolist() == [1, -2, 3]
    assert not ints.value.flags.writeable
    assert meta["floats"].item_type is GgufType.FLOAT32
    assert meta["floats"].value.tolist() == [0.5, 2.0]  # type: ignore[attr-defined]


def test_string_arrays_not_asked_for_are_skipped_but_counted() -> None:
    path = reference.vocab_path("gpt-2")
    meta = read_gguf_metadata(path, string_arrays=("tokenizer.ggml.tokens",))
    assert len(meta["tokenizer.ggml.tokens"].value) == meta["tokenizer.ggml.tokens"].count == 50257  # type: ignore[arg-type]
    merges = meta["tokenizer.ggml.merges"]
    assert merges.value is None and merges.count == 50000
    assert meta["tokenizer.ggml.eos_token_id"].value == 50256  # keys after the skipped array are read


def header(version: int = 3, n_kv: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, 0, n_kv)


def kv(key: bytes, kind: int, payload: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", kind) + payload


GOOD_KV = kv(b"k", int(GgufType.UINT32), struct.pack("<I", 7))


def array(item: GgufType, count: int, data: bytes = b"") -> bytes:
    return header() + kv(b"k", int(GgufType.ARRAY), struct.pack("<IQ", int(item), count) + data)


BAD_FILES = [
    (b"", "not a GGUF file"),
    (b"GGML" + bytes(40), "not a GGUF file"),
    (b"\x89PNG\r\n\x1a\n" + bytes(40), "not a GGUF file"),
    (header(version=1) + GOOD_KV, "version 1 is no longer supported"),
    (header(version=4) + GOOD_KV, "version 4 is not supported"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 1) + GOOD_KV, "version 50331648 is not supported"),  # big-endian
    (header(n_kv=2) + GOOD_KV + GOOD_KV, "duplicate GGUF key 'k'"),
    (header() + kv(b"k", 13, b""), "unknown GGUF value type 13"),
    (header() + kv(b"k", int(GgufType.UINT64), b"\0\0"), "runs past the end"),
    (header(n_kv=2) + GOOD_KV, "runs past the end"),
    (header() + kv(b"k", int(GgufType.STRING), struct.pack("<Q", 10) + b"abc"), "runs past the end"),
    (array(GgufType.STRING, 2, struct.pack("<Q", 1)), "string array runs past the end"),
    (array(GgufType.INT32, 2**40), "runs past the end"),
    (array(GgufType.ARRAY, 0), "nested GGUF arrays"),
]  # fmt: skip
BAD_IDS = ["empty", "ggml-magic", "png", "version-1", "version-4", "big-endian", "duplicate-key",
           "unknown-type", "short-scalar", "missing-kv", "short-string", "short-string-array",
           "short-int-array", "nested-array"]  # fmt: skip


@pytest.mark.parametrize(("content", "message"), BAD_FILES, ids=BAD_IDS)
def test_malformed_files_are_refused(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(VocabError, match=message):
        read_gguf_metadata(path)


def test_a_missing_file_is_refused_with_its_name(tmp_path: Path) -> None:
    with pytest.raises(VocabError, match=r"cannot read .*nothing\.gguf"):
        read_gguf_metadata(tmp_path / "nothing.gguf")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VocabError, match="cannot read"):
        read_gguf_metadata(tmp_path)


def test_metadata_size_is_where_the_key_values_end(tmp_path: Path) -> None:
    metadata = header(n_kv=2) + GOOD_KV + kv(b"s", int(GgufType.ARRAY), struct.pack("<IQ", 8, 2)
                                            + struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 0))  # fmt: skip
    path = tmp_path / "model.gguf"
    path.write_bytes(metadata + b"tensor infos and data, never read")
    assert gguf_metadata_size(path) == len(metadata)


@pytest.mark.parametrize(("content", "message"), BAD_FILES[:4], ids=BAD_IDS[:4])
def test_metadata_size_refuses_what_the_reader_refuses(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(VocabError, match=message):
        gguf_metadata_size(path)
