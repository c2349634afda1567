# Prepared vocabularies on disk: a `Vocab` and its decoded tables, saved once and loaded by any process.
#
# Contract:
# - A store is a list of directories: look-ups try them in order, a save goes to the first one that
#   takes it. A directory that cannot be written (a cache baked into a read-only image) is only read.
# - One file per vocabulary, `vocab-<content hash>.npz` (numpy's uncompressed zip of arrays): the pieces,
#   end-of-generation ids, token texts and attributes, tokenizer rules and content hash of the `Vocab`, and
#   of its `DecodedVocab` the kinds and the fresh column table. Loading hands those tables to
#   the loaded `Vocab` (`Vocab.decoded(prebuilt=...)`), so no grammar on that vocabulary builds them again.
# - A GGUF file is found by its metadata, never by its name: `gguf-<size>-<sha256>.link` says that a file
#   whose first <size> bytes (header and metadata, `gguf_metadata_size`) have that SHA-256 holds the
#   vocabulary with a given content hash. The vocabulary is a function of those bytes alone, so the model
#   baked in at build time and the same model mounted elsewhere at run time are one entry, and a look-up
#   hashes a few megabytes instead of reading the GGUF.
# - Never a wrong answer. Each file records the format version and a fingerprint of the code that built
#   it (the source of the modules that define pieces, kinds and tables): a file from other code is stale
#   and rebuilt, never read as if it were current. numpy checks each member's CRC-32 as it reads it, the
#   arrays' types and shapes are checked, and the loaded vocabulary's content hash must be the one the
#   file is named by: a damaged file is passed over with a note, and the vocabulary is read from its GGUF.
# - Writes are atomic (a temporary file in the same directory, then a rename), so processes may share a
#   directory; two that save the same vocabulary write the same arrays, and either rename wins. No fsync:
#   a file a crash leaves short or empty fails the checks above and is rebuilt.
# - Members are read into memory rather than mapped: numpy cannot map the members of a zip, and reading
#   is what lets the CRC-32 turn a damaged file into an error (a 262k-token vocabulary: about 30 MB).
from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt

from constraintd.engine.grammar import utf8
from constraintd.engine.vocab import decoded as decoded_vocab_module
from constraintd.engine.vocab import token_lookup
from constraintd.engine.vocab import vocab as vocab_module
from constraintd.engine.vocab.decoded import ColumnTable, DecodedVocab
from constraintd.engine.vocab.gguf import metadata as gguf_file
from constraintd.engine.vocab.gguf import pieces as gguf_pieces
from constraintd.engine.vocab.gguf import reader as gguf_vocab
from constraintd.engine.vocab.gguf.metadata import gguf_metadata_size
from constraintd.engine.vocab.vocab import TokenizerRules, Vocab
from constraintd.errors import VocabError

__all__ = ["FORMAT_VERSION", "OpenedVocab", "VocabStore"]

FORMAT_VERSION: Final = 1
_LINK_HEAD: Final = "constraintd vocabulary link"
_FILE_MODE: Final = 0o644  # readable by the server's user whoever built the cache
_READ_CHUNK: Final = 1 << 20

Arrays = dict[str, npt.NDArray[Any]]


@dataclass(frozen=True, slots=True)
class OpenedVocab:
    """A vocabulary opened through the store.

    Attributes:
        vocab: the vocabulary, holding its decoded tables (loaded or built).
        loaded_from: the store file it was loaded from; None when it was read from the GGUF file.
        saved_to: the store file it was saved to now; None when loaded, or when no directory took it.
        notes: why a store file was passed over or not written (stale, damaged, read-only), for the log.
    """

    vocab: Vocab
    loaded_from: Path | None
    saved_to: Path | None
    notes: tuple[str, ...] = ()


class _Unusable(Exception):
    """A store file that must not be used; `stale` when it is merely from other code or format."""

    def __init__(self, reason: str, *, stale: bool = False) -> None:
        super().__init__(reason)
        self.stale = stale


class VocabStore:
    """Directories of prepared vocabularies (see the module comment); safe to share between threads."""

    __slots__ = ("directories",)

    def __init__(self, directories: Sequence[str | os.PathLike[str]]) -> None:
        """A store over `directories`, tried in order; none of them need exist yet."""
        self.directories: tuple[Path, ...] = tuple(Path(d) for d in directories)

    def open_gguf(self, path: str | os.PathLike[str]) -> OpenedVocab:
        """The vocabulary of a GGUF file: loaded from the store, or read from the file and saved.

        A vocabulary read from the file has its fresh column table built before it is saved, so the
        first mask on it does not build it. A directory that cannot be written is noted, not an error.

        Raises:
            VocabError: the file is missing, unreadable or not a GGUF vocabulary (as `Vocab.from_gguf`).
        """
        name = os.fspath(path)
        notes: list[str] = []
        sizes = sorted({size for size, _ in self._links()})
        for size, digest in _prefix_digests(name, sizes).items():
            content_hash = self._follow_link(size, digest, notes)
            found = None if content_hash is None else self._find(content_hash, notes)
            if found is not None:
                return OpenedVocab(found[0], loaded_from=found[1], saved_to=None, notes=tuple(notes))
        size = gguf_metadata_size(name)
        digest = _prefix_digests(name, [size])[size]
        vocab = Vocab.from_gguf(name)
        vocab.decoded().fresh_table()
        if _prefix_digests(name, [size]).get(size) != digest:
            notes.append(f"{name} changed while it was read: not saved")
            return OpenedVocab(vocab, loaded_from=None, saved_to=None, notes=tuple(notes))
        saved = self._save(vocab, link=(size, digest), notes=notes)
        return OpenedVocab(vocab, loaded_from=None, saved_to=saved, notes=tuple(notes))

    def load(self, content_hash: str) -> Vocab | None:
        """The stored vocabulary with this content hash, holding its stored tables; None when
        no directory holds a usable one (missing, stale or damaged files are passed over)."""
        found = self._find(content_hash, []) if _is_hash(content_hash) else None
        return None if found is None else found[0]

    def save(self, vocab: Vocab) -> Path:
        """Saves `vocab` and its decoded tables (building them if needed) in the first directory that
        takes it; returns the file.

        Raises:
            OSError: no directory could be written (the message says why, for each).
        """
        notes: list[str] = []
        saved = self._save(vocab, link=None, notes=notes)
        if saved is None:
            raise OSError(f"no directory of the vocabulary store could be written: {'; '.join(notes)}")
        return saved

    # Look-ups.

    def _links(self) -> set[tuple[int, str]]:
        found: set[tuple[int, str]] = set()
        for directory in self.directories:
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for file_name in names:
                parsed = _parse_link_name(file_name)
                if parsed is not None:
                    found.add(parsed)
        return found

    def _follow_link(self, size: int, digest: str, notes: list[str]) -> str | None:
        for directory in self.directories:
            link = directory / _link_name(size, digest)
            try:
                text = link.read_text(encoding="ascii")
            except FileNotFoundError:
                continue
            except (OSError, UnicodeDecodeError) as exc:
                notes.append(f"{link}: unreadable ({exc})")
                continue
            content_hash = text.split("\n")[3] if text.count("\n") == 4 else ""
            if _is_hash(content_hash) and text == _link_text(content_hash):
                return content_hash
            notes.append(f"{link}: stale or damaged, passed over")
        return None

    def _find(self, content_hash: str, notes: list[str]) -> tuple[Vocab, Path] | None:
        for directory in self.directories:
            path = directory / _vocab_name(content_hash)
            if not path.exists():
                continue
            try:
                vocab, decoded = _read_vocab_file(path, content_hash)
            except _Unusable as exc:
                notes.append(f"{path}: {'stale' if exc.stale else 'damaged'} ({exc}), passed over")
                continue
            vocab.decoded(prebuilt=decoded)
            return vocab, path
        return None

    # Saves.

    def _save(self, vocab: Vocab, *, link: tuple[int, str] | None, notes: list[str]) -> Path | None:
        arrays = _vocab_arrays(vocab, vocab.decoded())
        link_text = _link_text(vocab.content_hash).encode("ascii")
        for directory in self.directories:
            target = directory / _vocab_name(vocab.content_hash)
            try:
                directory.mkdir(parents=True, exist_ok=True)
                _write_atomically(target, lambda file: np.savez(file, allow_pickle=False, **arrays))
                if link is not None:
                    _write_atomically(directory / _link_name(*link), lambda file: file.write(link_text))
            except OSError as exc:
                notes.append(f"{directory}: not written ({exc.strerror or exc})")
                continue
            return target
        return None


def _link_text(content_hash: str) -> str:
    return "\n".join([_LINK_HEAD, str(FORMAT_VERSION), _builder(), content_hash, ""])


def _vocab_name(content_hash: str) -> str:
    return f"vocab-{content_hash}.npz"


def _link_name(size: int, digest: str) -> str:
    return f"gguf-{size}-{digest}.link"


def _parse_link_name(name: str) -> tuple[int, str] | None:
    parts = name.removesuffix(".link").split("-")
    if not name.endswith(".link") or len(parts) != 3 or parts[0] != "gguf" or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[2]


def _prefix_digests(name: str, sizes: Iterable[int]) -> dict[int, str]:
    # SHA-256 of the file's first `size` bytes for each size the file has, in one pass.
    wanted = sorted(set(sizes))
    digests: dict[int, str] = {}
    if not wanted:
        return digests
    hasher = hashlib.sha256()
    done = 0
    try:
        with open(name, "rb") as file:
            for size in wanted:
                while done < size:
                    chunk = file.read(min(_READ_CHUNK, size - done))
                    if not chunk:
                        return digests  # shorter than this size (and every larger one)
                    hasher.update(chunk)
                    done += len(chunk)
                digests[size] = hasher.copy().hexdigest()
    except OSError as exc:
        raise VocabError(f"cannot read {name}: {exc.strerror or exc}") from exc
    return digests


def _write_atomically(target: Path, write: Callable[[IO[bytes]], object]) -> None:
    descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:
            write(file)
        os.chmod(temporary, _FILE_MODE)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@functools.cache
def _builder() -> str:
    # The code whose output a file holds: a change to any of it makes every file stale.
    modules = (vocab_module, token_lookup, gguf_file, gguf_vocab, gguf_pieces, utf8, decoded_vocab_module)
    digest = hashlib.sha256(f"format {FORMAT_VERSION}".encode())
    for module in (*modules, sys.modules[__name__]):
        source = Path(module.__file__ or "").read_bytes()
        digest.update(len(source).to_bytes(8, "little") + source)
    return digest.hexdigest()


# The file's arrays.


def _vocab_arrays(vocab: Vocab, decoded: DecodedVocab) -> Arrays:
    table = decoded.fresh_table()
    arrays: Arrays = {
        "format_version": np.array(FORMAT_VERSION, dtype=np.int64),
        "builder": np.array(_builder()),
        "content_hash": np.array(vocab.content_hash),
        "eog_ids": np.array(sorted(vocab.eog_ids), dtype=np.int64),
        "kinds": decoded.kinds,
        "fresh_ids": table.ids,
        "fresh_columns": np.concatenate(table.columns) if table.columns else np.zeros(0, np.int64),
        "fresh_count_from": np.array(table.count_from, dtype=np.int64),
        "fresh_partials": table.partials,
        "fresh_row_of": table.row_of,
        "fresh_first_code_points": table.first_code_points,
        "fresh_first_index": table.first_index,
    }
    piece_separator = _piece_separator(vocab.pieces)
    arrays["piece_bytes"] = np.frombuffer(piece_separator.join(vocab.pieces), np.uint8)
    arrays["piece_separator"] = np.frombuffer(piece_separator, np.uint8)
    texts = vocab.token_texts
    if texts is not None:
        separator = _text_separator(texts)
        arrays["text_bytes"] = np.frombuffer(separator.join(texts).encode("utf-8", "surrogatepass"), np.uint8)
        arrays["text_separator"] = np.frombuffer(separator.encode("utf-8"), np.uint8)
    if vocab.token_attrs is not None:
        arrays["token_attrs"] = np.array(vocab.token_attrs, dtype=np.int64)
    rules = vocab.tokenizer
    if rules is not None:
        arrays["tokenizer_model"] = np.array(rules.model)
        arrays["tokenizer_flags"] = np.array(
            [rules.add_space_prefix, rules.escape_whitespaces], dtype=np.bool_
        )
    return arrays


# Pieces and texts are kept joined by a separator that occurs nowhere else, because splitting one bytes
# object is several times quicker than slicing it once per token. Splitting with a wrong separator cannot go
# unseen: the vocabulary's content hash is checked.


def _piece_separator(pieces: Sequence[bytes]) -> bytes:
    # Byte-level vocabularies hold every byte value, so the separator is a few bytes, checked by splitting.
    for n in itertools.count():
        separator = b"\xff\xfe\x00" + n.to_bytes(4, "little")
        if separator.join(pieces).split(separator) == list(pieces):
            return separator
    raise AssertionError("unreachable")


def _text_separator(texts: Sequence[str]) -> str:
    # A code point no text holds (a vocabulary's texts use few of the million).
    joined = "".join(texts)
    return next(chr(c) for c in range(1, 0xD800) if chr(c) not in joined)


# name -> dtype of every array of a file (all one-dimensional). The optional ones (token texts, attributes,
# tokenizer rules) are absent for None; the strings (format, builder, hash, tokenizer model) are 0-d.
_DTYPES: Mapping[str, str] = {
    "piece_bytes": "|u1",
    "piece_separator": "|u1",
    "eog_ids": "<i8",
    "kinds": "|i1",
    "fresh_ids": "<i8",
    "fresh_columns": "<i8",
    "fresh_count_from": "<i8",
    "fresh_partials": "<i8",
    "fresh_row_of": "<i8",
    "fresh_first_code_points": "<i8",
    "fresh_first_index": "<i8",
    "text_bytes": "|u1",
    "text_separator": "|u1",
    "token_attrs": "<i8",
    "tokenizer_flags": "|b1",
}
_OPTIONAL: Final = frozenset({"text_bytes", "text_separator", "token_attrs", "tokenizer_flags"})


def _is_hash(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _string(npz: Mapping[str, npt.NDArray[Any]], name: str) -> str:
    value = npz[name]
    if value.dtype.kind != "U" or value.ndim != 0:
        raise ValueError(f"{name!r} is not a string")
    return str(value)


def _read_vocab_file(path: Path, content_hash: str) -> tuple[Vocab, DecodedVocab]:
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as npz:  # the file is ours to close
            if not isinstance(npz, np.lib.npyio.NpzFile):
                raise _Unusable("not an archive of arrays")
            version = npz["format_version"]
            if version.dtype != np.int64 or version.ndim != 0:
                raise ValueError("'format_version' is not an integer")
            if int(version) != FORMAT_VERSION:
                raise _Unusable(f"format {int(version)}, this code reads {FORMAT_VERSION}", stale=True)
            if _string(npz, "builder") != _builder():
                raise _Unusable("written by other code", stale=True)
            if _string(npz, "content_hash") != content_hash:
                raise _Unusable("holds another vocabulary")
            rules = _string(npz, "tokenizer_model") if "tokenizer_model" in npz.files else None
            arrays = {name: npz[name] for name in npz.files if name in _DTYPES}
    except _Unusable:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise _Unusable(f"{type(exc).__name__}: {exc}") from None
    for name, dtype in _DTYPES.items():
        array = arrays.get(name)
        if array is None and name in _OPTIONAL:
            continue
        if array is None or array.dtype.str != dtype or array.ndim != 1:
            raise _Unusable(f"array {name!r} missing or malformed")
        array.flags.writeable = False
    try:
        vocab = _vocab_from_arrays(arrays, rules)
        table = _table_from_arrays(arrays, len(vocab))
    except (ValueError, KeyError, UnicodeDecodeError, VocabError) as exc:
        raise _Unusable(f"{type(exc).__name__}: {exc}") from None
    if vocab.content_hash != content_hash:
        raise _Unusable("its vocabulary's content hash differs from its name")
    kinds = arrays["kinds"]
    if kinds.size != len(vocab) or not np.all((kinds >= 0) & (kinds <= 2)):
        raise _Unusable("its kinds do not fit the vocabulary")
    return vocab, DecodedVocab(vocab, kinds=kinds, fresh_table=table)


def _vocab_from_arrays(arrays: Arrays, model: str | None) -> Vocab:
    pieces = arrays["piece_bytes"].tobytes().split(arrays["piece_separator"].tobytes())
    texts = None
    if "text_bytes" in arrays:
        text = arrays["text_bytes"].tobytes().decode("utf-8", "surrogatepass")
        texts = text.split(arrays["text_separator"].tobytes().decode("utf-8"))
    attrs = arrays["token_attrs"].tolist() if "token_attrs" in arrays else None
    rules = None
    if model is not None:
        add_space_prefix, escape_whitespaces = arrays["tokenizer_flags"].tolist()
        rules = TokenizerRules(model, add_space_prefix, escape_whitespaces)
    return Vocab(pieces, arrays["eog_ids"].tolist(), token_texts=texts, token_attrs=attrs, tokenizer=rules)


def _table_from_arrays(arrays: Arrays, n_tokens: int) -> ColumnTable:
    ids = arrays["fresh_ids"]
    count_from = tuple(arrays["fresh_count_from"].tolist())
    flat = arrays["fresh_columns"]
    rows = ids.size
    first = count_from[0] if count_from else 0  # rows with a code point (a lone partial byte has none)
    if (
        sum(count_from) != flat.size
        or first > rows
        or any(a < b for a, b in itertools.pairwise(count_from))
        or arrays["fresh_partials"].size != rows
        or arrays["fresh_first_index"].size != first
        or arrays["fresh_row_of"].size != n_tokens
    ):
        raise ValueError("the fresh table's arrays do not fit together")
    bounds = np.cumsum(count_from[:-1]).tolist() if count_from else []
    return ColumnTable(
        ids=ids,
        columns=tuple(np.split(flat, bounds)) if count_from else (),
        count_from=count_from,
        partials=arrays["fresh_partials"],
        row_of=arrays["fresh_row_of"],
        first_code_points=arrays["fresh_first_code_points"],
        first_index=arrays["fresh_first_index"],
    )
