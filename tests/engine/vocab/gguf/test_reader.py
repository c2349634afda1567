"""Vocab.from_gguf against llama.cpp loading the same file: every piece, eog flag and token attribute,
and token_for_text against llama.cpp's tokenizer, for every vocabulary GGUF shipped with llama.cpp,
for Gemma 3 270M, and for small vocabularies written here to reach the rules those files do not.
Plus the refusals: files llama.cpp refuses are refused, with a message that says why.

Sizes: all tokens of every vocabulary for pieces, eog flags and attributes (about 2.9 million tokens);
token_for_text on every special token and on up to 400 evenly spaced normal tokens per vocabulary.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import llama_cpp as ll
import pytest

from constraintd.engine.vocab.gguf.metadata import read_gguf_metadata
from constraintd.engine.vocab.vocab import TokenAttr, Vocab
from constraintd.errors import VocabError
from tests import reference
from tests.conftest import OracleReport
from tests.oracle import LlamaVocab

GEMMA = "gemma-3-270m"
SUBJECTS = [*reference.vocab_names(), GEMMA]
NORMAL_SAMPLE = 400
SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)


@dataclass
class Loaded:
    """One vocabulary as we read it and as llama.cpp loads it (None when llama.cpp refuses it)."""

    name: str
    ours: Vocab
    llama: LlamaVocab


@pytest.fixture(scope="module", params=SUBJECTS, ids=SUBJECTS)
def loaded(request: pytest.FixtureRequest) -> Iterator[Loaded]:
    name: str = request.param
    path: Path = request.getfixturevalue("gemma_path") if name == GEMMA else reference.vocab_path(name)
    try:
        llama = LlamaVocab(path)
    except RuntimeError:
        with pytest.raises(VocabError):
            Vocab.from_gguf(path)
        pytest.skip(f"llama.cpp refuses {name}, and so do we")
    try:
        yield Loaded(name, Vocab.from_gguf(path), llama)
    finally:
        llama.close()


def llama_attrs(llama: LlamaVocab) -> list[int]:
    return [ll.llama_vocab_get_attr(llama.vocab, t) for t in range(llama.n_vocab)]


def llama_text(llama: LlamaVocab, token: int) -> bytes:
    text: bytes = ll.llama_vocab_get_text(llama.vocab, token)
    return text


def llama_single_token(llama: LlamaVocab, text: str) -> int | None:
    tokens = llama.tokenize(text.encode("utf-8", "surrogateescape"), add_special=False, parse_special=True)
    return tokens[0] if len(tokens) == 1 else None


@pytest.mark.oracle
def test_every_piece_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    theirs = loaded.llama.pieces()
    ours = loaded.ours.pieces
    assert len(ours) == len(theirs)
    different = [t for t in range(len(theirs)) if ours[t] != theirs[t]]
    oracle_report.add("pieces", loaded.name, identical=len(theirs) - len(different), total=len(theirs))
    assert not different, [(t, ours[t], theirs[t]) for t in different[:10]]


@pytest.mark.oracle
def test_every_eog_flag_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    n = loaded.llama.n_vocab
    theirs = [loaded.llama.is_eog(t) for t in range(n)]
    ours = [loaded.ours.is_eog(t) for t in range(n)]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    oracle_report.add("eog flags", loaded.name, identical=same, total=n)
    assert loaded.ours.eog_ids == frozenset(t for t in range(n) if theirs[t])


@pytest.mark.oracle
def test_every_token_text_and_attribute_is_llama_cpps(loaded: Loaded, oracle_report: OracleReport) -> None:
    theirs = llama_attrs(loaded.llama)
    ours = loaded.ours.token_attrs
    texts = loaded.ours.token_texts
    assert ours is not None and texts is not None
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    oracle_report.add("token attributes", loaded.name, identical=same, total=len(theirs))
    assert list(ours) == theirs
    # texts: ctypes stops at NUL, so compare what precedes the first NUL
    sample = range(0, len(texts), max(1, len(texts) // 2000))
    assert [texts[t].encode("utf-8", "surrogateescape").split(b"\0")[0] for t in sample] == [
        llama_text(loaded.llama, t) for t in sample
    ]


@pytest.mark.oracle
def test_token_for_text_finds_every_special_token_as_llama_cpp(
    loaded: Loaded, oracle_report: OracleReport
) -> None:
    texts, attrs = loaded.ours.token_texts, loaded.ours.token_attrs
    assert texts is not None and attrs is not None
    specials = [t for t in range(len(texts)) if attrs[t] & SPECIAL]
    results = [
        (t, loaded.ours.token_for_text(texts[t]), llama_single_token(loaded.llama, texts[t]))
        for t in specials
    ]
    different = [r for r in results if r[1] != r[2]]
    oracle_report.add(
        "token_for_text special", loaded.name, identical=len(results) - len(different), total=len(results)
    )
    assert not different, [(texts[t], ours, theirs) for t, ours, theirs in different[:10]]


@pytest.mark.oracle
def test_token_for_text_on_normal_tokens(loaded: Loaded, oracle_report: OracleReport) -> None:
    # A sample of normal tokens, each written as its piece: what a grammar author would put in a
    # terminal. The plain-text lookup does not run the tokenizer (see Vocab.token_for_text): it may name
    # a token where llama.cpp makes several (counted in the report), but where llama.cpp makes exactly
    # one token it must name that one.
    attrs = loaded.ours.token_attrs
    assert attrs is not None
    normal = [t for t in range(len(attrs)) if attrs[t] & int(TokenAttr.NORMAL) and not attrs[t] & SPECIAL]
    sample = normal[:: max(1, len(normal) // NORMAL_SAMPLE)]
    texts = []
    for token in sample:
        try:
            texts.append(loaded.ours.piece(token).decode("utf-8"))
        except UnicodeDecodeError:
            continue  # a grammar's text is UTF-8; a partial character is no terminal
    results = [
        (text, loaded.ours.token_for_text(text), llama_single_token(loaded.llama, text)) for text in texts
    ]
    same = sum(ours == theirs for _, ours, theirs in results)
    oracle_report.add("token_for_text normal", loaded.name, identical=same, total=len(results))
    missed = [r for r in results if r[2] is not None and r[1] != r[2]]
    assert not missed, missed[:10]
    assert results


# Vocabularies written here, each exercising the load-time rules and piece decodings that the shipped
# files do not (byte-level characters outside GPT-2's image, invalid UTF-8, strtol on odd byte tokens,
# RWKV escapes, PLaMo-2, the EOG exceptions, gpt-oss's channel tokens, ...). They carry the hyper-
# parameters of the shipped gpt-2 file, so llama.cpp loads them as vocabularies of that architecture.
NORMAL, UNKNOWN, CONTROL, USER, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # tokenizer.ggml.token_type values
V = gguf.GGUFValueType


@dataclass(frozen=True)
class Crafted:
    model: str | None
    tokens: tuple[tuple[bytes | str, int], ...] | None  # (text, token type)
    keys: tuple[tuple[str, object, gguf.GGUFValueType], ...] = ()  # more keys: name, value, GGUF type
    name: str = ""  # general.name


MERGES = ("tokenizer.ggml.merges", ["a b"], V.ARRAY)
BPE_TOKENS = (
    ("<|endoftext|>", CONTROL), ("a", NORMAL), ("Ġb", NORMAL), ("Ċ", NORMAL), ("é", NORMAL),
    ("x y", NORMAL), ("€", NORMAL), ("▁x", NORMAL), (b"\xff\xfe", NORMAL), (b"\xc3", NORMAL),
    (b"\xed\xa0\x80", NORMAL), (b"\xc1\x81", NORMAL), ("<0x41>", BYTE), ("<0xG1>", BYTE), ("<0x 9>", BYTE),
    ("<0x-1>", BYTE), ("<0x", BYTE), ("<|im_end|>", NORMAL), ("<tool>", USER), ("<unk>", UNKNOWN),
    ("gone", UNUSED), ("undefined", 0), ("weird", 99), ("<|return|>", CONTROL), ("<|call|>", CONTROL),
    ("<|end|>", CONTROL), ("<|channel|>", NORMAL), ("<|unused_5|>", CONTROL), ("", NORMAL),
    ("</s>", CONTROL), ("<|tool_response>", CONTROL), ("<|fim_pad|>", NORMAL), ("<|eom_id|>", NORMAL),
    ("Ġ<ab>", NORMAL), ("<|file_sep|>", USER), (b"\xf7\xbf\xbf\xbf", CONTROL),
)  # fmt: skip
SPM_TOKENS = (
    ("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("▁hello", NORMAL), ("<0x0A>", BYTE),
    ("<0x0a>", BYTE), ("<0xZZ>", BYTE), ("▁▁", NORMAL), ("▁<ctl>", CONTROL), ("<end_of_turn>", NORMAL),
    ("ab", UNUSED), ("<0x", BYTE), ("▁<PRE>", NORMAL), ("x▁y", USER), (b"\xe2\x96", NORMAL),
)  # fmt: skip
RWKV_TOKENS = tuple(
    (text, NORMAL)
    for text in ("\\n", "a", "\\x41", "\\t", "\\\\", "\\q", "\\xzz", "\\x4", "end\\", "\\r\\n", "\\xFF", "é")
)
PLAMO2_TOKENS = (
    ("<|plamo:unk|>", CONTROL), *((f"<0x{b:02X}>", BYTE) for b in range(256)), ("hello", NORMAL),
    ("▁x", NORMAL), ("<|plamo:eos|>", CONTROL), ("</s>", CONTROL), ("<0xZZ>", BYTE), ("<0x4>", BYTE),
)  # fmt: skip

CRAFTED_LOADED = {
    "bpe-edge-cases": Crafted("gpt2", BPE_TOKENS, (MERGES, ("tokenizer.ggml.pre", "gpt-2", V.STRING))),
    "bpe-eot-named": Crafted("gpt2", BPE_TOKENS, (MERGES, ("tokenizer.ggml.eot_token_id", 2, V.UINT32))),
    "bpe-escaping": Crafted("gemma4", BPE_TOKENS, (MERGES,)),
    "spm-edge-cases": Crafted("llama", SPM_TOKENS),
    "spm-no-types": Crafted("llama", tuple((text, -1) for text, _ in SPM_TOKENS)),
    "spm-out-of-range-ids": Crafted(
        "llama", SPM_TOKENS, (("tokenizer.ggml.eos_token_id", 999, V.UINT32),
                              ("tokenizer.ggml.padding_token_id", 9, V.UINT32))
    ),
    "wpm-edge-cases": Crafted("bert", tuple(t for t in SPM_TOKENS if t[1] != BYTE)),
    "rwkv-escapes": Crafted("rwkv", RWKV_TOKENS),
    "plamo2": Crafted("plamo2", PLAMO2_TOKENS),
    "phi3-rstrip": Crafted(
        "llama", (*SPM_TOKENS, ("<|endoftext|>", CONTROL), ("<|user|>", USER)), name="Phi3-crafted"
    ),
}  # fmt: skip

CRAFTED_REFUSED = {
    "no-tokenizer-model": (Crafted(None, SPM_TOKENS), "holds no tokenizer"),
    "unknown-model": (Crafted("sentencepiece", SPM_TOKENS), "unknown tokenizer model 'sentencepiece'"),
    "no-tokens": (Crafted("llama", None), "cannot find the tokenizer vocabulary"),
    "bpe-without-merges": (Crafted("gpt2", BPE_TOKENS), "cannot find tokenizer merges"),
    "id-of-wrong-type": (
        Crafted("llama", SPM_TOKENS, (("tokenizer.ggml.eos_token_id", 2, V.INT32),)),
        "eos_token_id has type INT32, expected UINT32",
    ),
    "scores-too-short": (
        Crafted("llama", SPM_TOKENS, (("tokenizer.ggml.scores", [0.0], V.ARRAY),)),
        "scores has 1 entries",
    ),
    "types-of-wrong-type": (
        Crafted("llama", SPM_TOKENS, (("tokenizer.ggml.token_type", [0.5] * 20, V.ARRAY),)),
        "invalid GGUF type for tokenizer.ggml.token_type",
    ),
    "byte-token-too-short": (Crafted("llama", (*SPM_TOKENS, ("<0", BYTE))), "too short to hold a byte"),
    "code-point-past-unicode": (
        Crafted("gpt2", ((b"\xf7\xbf\xbf\xbf", NORMAL), ("Ċ", NORMAL)), (MERGES,)),
        "invalid code point",
    ),
    "plamo2-missing-byte": (Crafted("plamo2", PLAMO2_TOKENS[:100]), "without a byte token for <0x63>"),
    "phi3-without-endoftext": (Crafted("llama", SPM_TOKENS, name="phi3"), "expects a '<|endoftext|>' token"),
    "charsmap-too-small": (
        Crafted("t5", SPM_TOKENS, (("tokenizer.ggml.precompiled_charsmap", b"\x01\x02", V.ARRAY),)),
        "precompiled_charsmap too small",
    ),
}  # fmt: skip


def write_crafted(path: Path, crafted: Crafted) -> Path:
    writer = gguf.GGUFWriter(path, "gpt2")
    if crafted.name:
        writer.add_name(crafted.name)
    for key, found in read_gguf_metadata(reference.vocab_path("gpt-2")).items():
        if key.startswith("gpt2."):  # the architecture's hyperparameters, which llama.cpp requires
            writer.add_key_value(key, found.value, gguf.GGUFValueType(int(found.type)))
    if crafted.model is not None:
        writer.add_tokenizer_model(crafted.model)
    if crafted.tokens is not None:
        writer.add_array("tokenizer.ggml.tokens", [text for text, _ in crafted.tokens])
        if all(kind >= 0 for _, kind in crafted.tokens) and not any(
            key == "tokenizer.ggml.token_type" for key, _, _ in crafted.keys
        ):
            writer.add_array("tokenizer.ggml.token_type", [kind for _, kind in crafted.tokens])
    for key, extra, kind in crafted.keys:
        if isinstance(extra, bytes):  # an array of UINT8
            writer.add_key_value(key, list(extra), V.ARRAY, V.UINT8)
        elif kind is V.ARRAY:
            writer.add_array(key, extra)  # type: ignore[arg-type]
        else:
            writer.add_key_value(key, extra, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


@pytest.mark.oracle
@pytest.mark.parametrize("name", list(CRAFTED_LOADED), ids=list(CRAFTED_LOADED))
def test_crafted_vocabulary_is_read_as_llama_cpp_reads_it(
    tmp_path: Path, name: str, oracle_report: OracleReport
) -> None:
    path = write_crafted(tmp_path / f"{name}.gguf", CRAFTED_LOADED[name])
    ours = Vocab.from_gguf(path)
    with LlamaVocab(path) as llama:
        theirs = llama.pieces()
        eog = llama.eog_ids()
        attrs = llama_attrs(llama)
    same = sum(a == b for a, b in zip(ours.pieces, theirs, strict=True))
    oracle_report.add("pieces", f"crafted {name}", identical=same, total=len(theirs))
    assert list(ours.pieces) == theirs
    assert ours.eog_ids == eog
    assert ours.token_attrs is not None and list(ours.token_attrs) == attrs


@pytest.mark.oracle
@pytest.mark.parametrize("name", list(CRAFTED_REFUSED), ids=list(CRAFTED_REFUSED))
def test_crafted_vocabulary_is_refused_as_llama_cpp_refuses_it(tmp_path: Path, name: str) -> None:
    crafted, message = CRAFTED_REFUSED[name]
    path = write_crafted(tmp_path / f"{name}.gguf", crafted)
    with pytest.raises(RuntimeError, match="could not load"):
        LlamaVocab(path)
    with pytest.raises(VocabError, match=re.escape(message)) as refused:
        Vocab.from_gguf(path)
    assert str(path) in str(refused.value)


# Files llama.cpp does not refuse cleanly: it aborts the process (duplicate texts, byte tokens in a
# WordPiece vocabulary), or loads a vocabulary without tokens. Not given to llama.cpp here.
REFUSED_ONLY_BY_US = {
    "duplicate-texts": (Crafted("llama", (*SPM_TOKENS, ("▁hello", NORMAL))), "the same token text twice"),
    "wpm-byte-tokens": (Crafted("bert", SPM_TOKENS), "a WordPiece vocabulary cannot have byte tokens"),
    "no-vocab": (Crafted("no_vocab", SPM_TOKENS), "holds no vocabulary"),
}


@pytest.mark.parametrize("name", list(REFUSED_ONLY_BY_US), ids=list(REFUSED_ONLY_BY_US))
def test_vocabularies_llama_cpp_cannot_use_are_refused(tmp_path: Path, name: str) -> None:
    crafted, message = REFUSED_ONLY_BY_US[name]
    path = write_crafted(tmp_path / f"{name}.gguf", crafted)
    with pytest.raises(VocabError, match=re.escape(message)):
        Vocab.from_gguf(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), (b"PK\x03\x04" + bytes(40), "not a GGUF file")],
    ids=["missing", "zip"],
)
def test_files_that_are_not_vocabularies_are_refused(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(VocabError, match=message):
        Vocab.from_gguf(path)


def test_an_empty_token_list_is_refused(tmp_path: Path) -> None:
    # The gguf package will not write an empty array, so this file is put together by hand.
    def string(text: bytes) -> bytes:
        return struct.pack("<Q", len(text)) + text

    model = string(b"tokenizer.ggml.model") + struct.pack("<I", V.STRING) + string(b"llama")
    tokens = string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", V.ARRAY, V.STRING, 0)
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + model + tokens)
    with pytest.raises(VocabError, match="the tokenizer vocabulary is empty"):
        Vocab.from_gguf(path)
