"""The vocabulary store: what it loads equals what is built (the vocabulary, its tables, the masks a
matcher computes from them), a GGUF is found by its metadata wherever it lies, and a stale or damaged
file is passed over and rebuilt, never read as if it were right."""

from __future__ import annotations

import dataclasses
import shutil
import struct
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from constraintd.engine.grammar.compiled import Grammar
from constraintd.engine.matcher import Matcher
from constraintd.engine.vocab import decoded as decoded_vocab_module
from constraintd.engine.vocab.decoded import ColumnTable, DecodedVocab
from constraintd.engine.vocab.vocab import TokenizerRules, Vocab
from constraintd.errors import VocabError
from constraintd.service import vocab_store
from constraintd.service.vocab_store import OpenedVocab, VocabStore
from tests import reference

# Pieces the decoder treats differently: end of generation, empty, NUL-led, a NUL inside, invalid and
# partial UTF-8, continuation bytes only, a long one, the store's first separator; texts with a lone
# surrogate (an undecodable byte escaped), an empty one, the first code points.
PIECES = [b"</s>", b"", b"\x00x", b"a\x00b", b"ab", "中".encode(), b"\xe4", b"\xb8\xad", b"\xad!", b"\x80",
          b"\xff", "日本語のテキスト".encode() * 3, b" {", b"}", b"\xff\xfe\x00\x00\x00\x00\x00"]  # fmt: skip
TEXTS = ["</s>", "", "\x00x", "a\x00b", "ab", "中", "\udce4", "\udcb8\udcad", "\udcad!", "\udc80", "\udcff",
         "日本語のテキスト" * 3, "▁{", "}", "\x01\x02\x03"]  # fmt: skip


def list_vocab(*, with_texts: bool) -> Vocab:
    if not with_texts:
        return Vocab(PIECES, [0])
    attrs = [8] + [4] * (len(PIECES) - 1)
    return Vocab(PIECES, [0], token_texts=TEXTS, token_attrs=attrs, tokenizer=TokenizerRules("llama", True))


def assert_same_tables(loaded: DecodedVocab, built: DecodedVocab) -> None:
    assert loaded is not built
    assert loaded.kinds.tolist() == built.kinds.tolist()
    a, b = loaded.fresh_table(), built.fresh_table()
    for field in dataclasses.fields(ColumnTable):
        if not field.init:  # derived on first use (row_groups), not stored
            continue
        left, right = getattr(a, field.name), getattr(b, field.name)
        if field.name == "columns":
            assert [c.tolist() for c in left] == [c.tolist() for c in right]
        elif field.name == "count_from":
            assert left == right
        else:
            assert left.dtype == right.dtype and left.tolist() == right.tolist(), field.name
            assert not left.flags.writeable


@pytest.mark.parametrize("with_texts", [True, False], ids=["texts-attrs-rules", "pieces-only"])
def test_a_loaded_vocabulary_and_its_tables_equal_the_built_ones(
    tmp_path: Path, with_texts: bool
) -> None:
    vocab = list_vocab(with_texts=with_texts)
    assert vocab_store._piece_separator(PIECES) == b"\xff\xfe\x00\x01\x00\x00\x00"  # the first occurs
    store = VocabStore([tmp_path])
    saved = store.save(vocab)
    assert saved.name == f"vocab-{vocab.content_hash}.npz"
    built = vocab.decoded()

    loaded = store.load(vocab.content_hash)
    assert loaded is not None and loaded is not vocab
    assert (loaded.pieces, loaded.eog_ids, loaded.token_texts, loaded.token_attrs, loaded.tokenizer) == (
        vocab.pieces, vocab.eog_ids, vocab.token_texts, vocab.token_attrs, vocab.tokenizer
    )  # fmt: skip
    assert loaded.content_hash == vocab.content_hash
    assert loaded.token_for_text("ab") == vocab.token_for_text("ab")
    assert_same_tables(loaded.decoded(), built)


def test_loading_hands_the_tables_to_every_grammar_on_the_vocabulary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab = list_vocab(with_texts=True)
    store = VocabStore([tmp_path])
    store.save(vocab)
    expected = DecodedVocab(vocab).fresh_table().ids.tolist()

    def no_building(**_: object) -> ColumnTable:
        raise AssertionError("a table was built, not loaded")

    monkeypatch.setattr(decoded_vocab_module, "_column_table", no_building)
    loaded = store.load(vocab.content_hash)
    assert loaded is not None
    grammar = Grammar.from_gbnf('root ::= "ab" | [^a]+', loaded)  # the loaded vocabulary holds the tables
    assert grammar._decoded is loaded.decoded()
    assert grammar._decoded.fresh_table().ids.tolist() == expected
    assert Matcher(grammar).allows(vocab.pieces.index(b"ab"))


def test_an_unknown_or_malformed_hash_loads_nothing(tmp_path: Path) -> None:
    store = VocabStore([tmp_path / "missing"])
    assert store.load("0" * 64) is None
    assert store.load("../../etc/passwd") is None


def walk_masks(grammar: Grammar, steps: int) -> list[list[int]]:
    # A deterministic walk: at step i take the i-th allowed token (cycling), record every mask.
    matcher = Matcher(grammar)
    masks: list[list[int]] = []
    for step in range(steps):
        words = matcher.mask()
        masks.append(words.tolist())
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[: grammar.n_vocab])
        plain = [t for t in allowed.tolist() if not grammar.vocab.is_eog(t)]
        if not plain:
            break
        assert matcher.accept(plain[(step * 7919) % len(plain)])
    return masks


def masks_from_store_and_from_file(gguf: Path, tmp_path: Path, grammar_text: str, steps: int) -> None:
    store = VocabStore([tmp_path / "store"])
    first = store.open_gguf(gguf)
    assert first.loaded_from is None and first.saved_to is not None and first.notes == ()

    opened = store.open_gguf(gguf)
    assert opened.loaded_from == first.saved_to and opened.saved_to is None
    from_store = Grammar.from_gbnf(grammar_text, opened.vocab)
    from_file = Grammar.from_gbnf(grammar_text, Vocab.from_gguf(gguf))
    assert from_store._decoded is not from_file._decoded
    assert_same_tables(from_store._decoded, from_file._decoded)
    stored_masks = walk_masks(from_store, steps)
    assert len(stored_masks) > 1
    assert stored_masks == walk_masks(from_file, steps)


def test_masks_from_stored_tables_equal_masks_from_built_ones(
    tmp_path: Path, llama_cpp_dir: Path
) -> None:
    # llama.cpp's own JSON grammar, on its 32k SentencePiece vocabulary: 40 masks along one walk.
    grammar = (llama_cpp_dir / "grammars" / "json.gbnf").read_text(encoding="utf-8")
    masks_from_store_and_from_file(reference.vocab_path("llama-spm"), tmp_path, grammar, 40)


@pytest.mark.slow
def test_masks_from_stored_gemma_tables_equal_masks_from_built_ones(
    tmp_path: Path, llama_cpp_dir: Path, gemma_path: Path
) -> None:
    # Gemma 3's 262k vocabulary, the one the image is prepared for: 15 masks along one walk.
    grammar = (llama_cpp_dir / "grammars" / "json.gbnf").read_text(encoding="utf-8")
    masks_from_store_and_from_file(gemma_path, tmp_path, grammar, 15)


# A GGUF found by its metadata.


@pytest.fixture
def spm_copy(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "model.gguf"
    path.parent.mkdir()
    shutil.copyfile(reference.vocab_path("llama-spm"), path)
    return path


def test_a_gguf_is_found_by_its_metadata_wherever_it_lies(tmp_path: Path, spm_copy: Path) -> None:
    store = VocabStore([tmp_path / "store"])
    saved = store.open_gguf(spm_copy).saved_to
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes(spm_copy.read_bytes() + b"other tensor data")
    opened = store.open_gguf(elsewhere)
    assert opened.loaded_from == saved


def test_a_gguf_with_other_metadata_is_read_from_its_file(tmp_path: Path, spm_copy: Path) -> None:
    store = VocabStore([tmp_path / "store"])
    saved = store.open_gguf(spm_copy).saved_to
    other = tmp_path / "other.gguf"
    other.write_bytes(spm_copy.read_bytes().replace(b"llama-spm", b"llama-spM", 1))  # general.name
    opened = store.open_gguf(other)  # other metadata, the same vocabulary: read, then linked to its file
    assert opened.loaded_from is None and opened.saved_to == saved
    assert len(list(tmp_path.glob("store/gguf-*.link"))) == 2
    assert store.open_gguf(other).loaded_from == saved


def test_a_missing_or_foreign_file_is_refused_as_from_gguf_refuses_it(tmp_path: Path, spm_copy: Path) -> None:
    store = VocabStore([tmp_path / "store"])
    store.open_gguf(spm_copy)  # a link exists, so the look-up reads the file first
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf" * 100)
    for path, message in ((tmp_path / "missing.gguf", "cannot read"), (junk, "not a GGUF file")):
        with pytest.raises(VocabError, match=message):
            store.open_gguf(path)


# Directories: read-only ones, several, shared.


def test_a_directory_that_cannot_be_written_is_noted_not_fatal(tmp_path: Path, spm_copy: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    opened = VocabStore([blocker / "store"]).open_gguf(spm_copy)
    assert opened.saved_to is None and opened.loaded_from is None
    assert len(opened.vocab) == 32000
    assert "not written" in opened.notes[0]
    with pytest.raises(OSError, match="could be written"):
        VocabStore([blocker / "store"]).save(opened.vocab)


def test_look_ups_try_every_directory_and_saves_go_to_the_first_that_takes_them(
    tmp_path: Path, spm_copy: Path
) -> None:
    baked, blocker, writable = tmp_path / "baked", tmp_path / "a-file", tmp_path / "writable"
    blocker.write_bytes(b"")
    VocabStore([baked]).open_gguf(spm_copy)
    layered = VocabStore([blocker / "store", baked, writable])
    assert layered.open_gguf(spm_copy).loaded_from is not None
    other = VocabStore([blocker / "store", writable]).save(list_vocab(with_texts=False))
    assert other.parent == writable


def test_processes_saving_the_same_vocabulary_at_once_leave_one_good_file(tmp_path: Path) -> None:
    vocab = list_vocab(with_texts=True)
    vocab.decoded().fresh_table()
    stores = [VocabStore([tmp_path]) for _ in range(4)]
    threads = [threading.Thread(target=store.save, args=(vocab,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.name for p in tmp_path.iterdir()] == [f"vocab-{vocab.content_hash}.npz"]  # no temporary left
    assert stores[0].load(vocab.content_hash) is not None


# Stale and damaged files.


def saved_file(tmp_path: Path, spm_copy: Path) -> tuple[VocabStore, Path]:
    store = VocabStore([tmp_path / "store"])
    saved = store.open_gguf(spm_copy).saved_to
    assert saved is not None
    return store, saved


def member_data_offset(path: Path, member: str) -> int:
    # Where a member's bytes start in the zip: after its local header (30 bytes, the name, the extra field).
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    with open(path, "rb") as file:
        file.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", file.read(4))
    return int(info.header_offset + 30 + name_length + extra_length)


def flip_byte(path: Path, member: str, past: int) -> None:
    data = bytearray(path.read_bytes())
    data[member_data_offset(path, member) + past] ^= 0x01
    path.write_bytes(bytes(data))


def rebuilt_and_then_loaded(store: VocabStore, gguf: Path, saved: Path, note: str) -> OpenedVocab:
    rebuilt = store.open_gguf(gguf)
    assert rebuilt.loaded_from is None and rebuilt.saved_to == saved
    assert any(note in n for n in rebuilt.notes), rebuilt.notes
    again = store.open_gguf(gguf)
    assert again.loaded_from == saved and again.notes == ()
    return again


DAMAGES: dict[str, Callable[[Path], object]] = {
    "table-byte": lambda p: flip_byte(p, "fresh_columns.npy", 200),  # past the 128-byte array header
    "piece-byte": lambda p: flip_byte(p, "piece_bytes.npy", 1000),
    "array-header": lambda p: flip_byte(p, "fresh_row_of.npy", 20),
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "not-a-zip": lambda p: p.write_bytes(b"\x93NUMPY" + bytes(200)),
}


@pytest.mark.parametrize("damage", list(DAMAGES), ids=list(DAMAGES))
def test_a_damaged_file_is_passed_over_and_rebuilt(
    tmp_path: Path, spm_copy: Path, damage: str
) -> None:
    store, saved = saved_file(tmp_path, spm_copy)
    DAMAGES[damage](saved)
    assert store.load(Vocab.from_gguf(spm_copy).content_hash) is None
    again = rebuilt_and_then_loaded(store, spm_copy, saved, "damaged")
    assert_same_tables(again.vocab.decoded(), DecodedVocab(Vocab.from_gguf(spm_copy)))


def test_a_file_holding_another_vocabulary_is_passed_over(
    tmp_path: Path, spm_copy: Path
) -> None:
    store, saved = saved_file(tmp_path, spm_copy)
    store.save(list_vocab(with_texts=True)).replace(saved)
    rebuilt_and_then_loaded(store, spm_copy, saved, "holds another vocabulary")


@pytest.mark.parametrize(
    ("patch", "note"),
    [("FORMAT_VERSION", "format 0, this code reads 1"), ("_builder", "written by other code")],
    ids=["format-version", "other-code"],
)
def test_a_stale_file_is_rebuilt_not_read(
    tmp_path: Path,
    spm_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    patch: str,
    note: str,
) -> None:
    store, saved = saved_file(tmp_path, spm_copy)
    vocab = Vocab.from_gguf(spm_copy)
    with monkeypatch.context() as patched:  # the file rewritten by other code; the link stays current
        if patch == "FORMAT_VERSION":
            patched.setattr(vocab_store, "FORMAT_VERSION", 0)
        else:
            patched.setattr(vocab_store, "_builder", lambda: "other code")
        assert store.save(vocab) == saved
    assert store.load(vocab.content_hash) is None
    rebuilt_and_then_loaded(store, spm_copy, saved, note)


def test_a_damaged_link_is_passed_over(tmp_path: Path, spm_copy: Path) -> None:
    store, saved = saved_file(tmp_path, spm_copy)
    (link,) = saved.parent.glob("gguf-*.link")
    link.write_text(link.read_text().replace(saved.name[6:-4], "../" * 20 + "x" * 4), encoding="ascii")
    rebuilt_and_then_loaded(store, spm_copy, saved, "stale or damaged")
