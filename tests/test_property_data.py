"""Property tests of the data path: readers, the packer (`pack_with_eos`, `prepare`) and the resumable,
rank-aware `TokenLoader`, for arbitrary documents, token streams, window sizes, batch sizes and world sizes."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lmforge.data.corpus.loader import TokenLoader
from lmforge.data.corpus.prepare import pack_with_eos, prepare, split_documents
from lmforge.data.corpus.readers import decode_counting, read_documents
from lmforge.errors import LMForgeError

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\ufeff") | st.just("\n"))


class CharTokenizer:
    """One id per character (Latin-1 range), EOS = 0."""

    eos_id = 0
    vocab_size = 257

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[ord(c) + 1 for c in t] for t in texts]


def write_stream(root: Path, tokens: np.ndarray) -> Path:
    """A prepared dir whose train and val splits are `tokens` (uint16)."""
    tokens = tokens.astype(np.uint16)
    for s in ("train", "val"):
        tokens.tofile(root / f"{s}.bin")
    split = {"n_tokens": len(tokens), "n_docs": 1, "n_bytes": len(tokens)}
    meta = {"format": "lmforge-tokens", "version": 1, "dtype": "uint16", "vocab_size": 1000, "eos_id": 0,
            "train": split, "val": split}  # fmt: skip
    (root / "meta.json").write_text(json.dumps(meta))
    return root


# --- readers -------------------------------------------------------------------------------------------------------


@SETTINGS
@given(data=st.binary(max_size=200) | TEXT.map(lambda t: t.encode("utf-8")))
def test_decode_counting_replaces_exactly_the_invalid_bytes(data):
    text, n = decode_counting(data)
    text.encode("utf-8")  # no lone surrogates survive
    valid = data.decode("utf-8", "ignore")  # the decodable part, invalid bytes dropped
    assert len(text) == len(valid) + n  # one U+FFFD per invalid byte, everything else kept
    assert text.count("\ufffd") == valid.count("\ufffd") + n
    assert (n == 0) == (text == valid)


@SETTINGS
@given(docs=st.lists(TEXT, min_size=1, max_size=6), fmt=st.sampled_from(["jsonl", "csv", "tsv"]))
def test_jsonl_and_csv_round_trip_any_text(docs, fmt):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"docs.{fmt}"
        if fmt == "jsonl":
            path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in docs), "utf-8")
        else:
            buf = io.StringIO(newline="")
            writer = csv.writer(buf, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
            writer.writerows([["text"], *[[t] for t in docs]])
            path.write_text(buf.getvalue(), "utf-8", newline="")
        kept = [t for t in docs if t.strip()]
        if not kept:
            with pytest.raises(LMForgeError, match=r"empty file \(no documents\)$"):
                list(read_documents([path]))
        else:
            assert list(read_documents([path])) == kept


# --- packer -------------------------------------------------------------------------------------------------------


@SETTINGS
@given(docs=st.lists(st.lists(st.integers(1, 999), max_size=20), max_size=8))
def test_pack_with_eos_puts_each_document_then_eos(docs):
    tokens, lengths = pack_with_eos(docs, eos_id=0)
    assert lengths.tolist() == [len(d) + 1 for d in docs]
    assert len(tokens) == sum(len(d) + 1 for d in docs)
    ends = np.cumsum(lengths) - 1
    assert (tokens[ends] == 0).all() and (np.delete(tokens, ends) != 0).all()
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(int) if len(docs) else []
    assert [tokens[s:e].tolist() for s, e in zip(starts, ends)] == docs


@SETTINGS
@given(docs=st.lists(TEXT.filter(lambda t: all(ord(c) < 256 for c in t)), max_size=8),
       val_fraction=st.floats(0.05, 0.95), seed=st.integers(0, 2**16))  # fmt: skip
def test_prepare_keeps_every_document_once_across_the_splits(docs, val_fraction, seed):
    kept = [t for t in docs if t.strip()]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "docs.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs) or "\n", "utf-8")
        if len(kept) < 2:
            with pytest.raises(LMForgeError):
                prepare([src], Path(d) / "out", CharTokenizer(), val_fraction=val_fraction, seed=seed)
            return
        meta = prepare([src], Path(d) / "out", CharTokenizer(), val_fraction=val_fraction, seed=seed)
        found = []
        for split in ("train", "val"):
            tokens = np.fromfile(Path(d) / "out" / f"{split}.bin", dtype=np.uint16).astype(np.int64)
            starts = np.load(Path(d) / "out" / f"{split}.idx")
            assert meta[split]["n_tokens"] == len(tokens) and meta[split]["n_docs"] == len(starts)
            for s, e in zip(starts, [*starts[1:], len(tokens)]):
                assert tokens[e - 1] == 0  # each document ends with EOS
                found.append("".join(chr(i - 1) for i in tokens[s : e - 1]))
        assert Counter(found) == Counter(kept)
        assert meta["val"]["n_docs"] == int(split_documents(len(kept), val_fraction, seed).sum()) >= 1
        assert meta["train"]["n_docs"] >= 1


# --- loader -------------------------------------------------------------------------------------------------------

loader_args = dict(
    n=st.integers(0, 300), seq_len=st.integers(1, 16), batch_size=st.integers(1, 4), world=st.integers(1, 3),
    seed=st.integers(0, 100), steps=st.integers(0, 12),
)  # fmt: skip


@SETTINGS
@given(**loader_args)
def test_token_loader_batches_are_stream_windows_split_over_ranks(n, seq_len, batch_size, world, seed, steps):
    stream = np.random.default_rng(n).integers(0, 1000, n)
    with tempfile.TemporaryDirectory() as d:
        data = write_stream(Path(d), stream)
        n_windows = (n - 1) // seq_len if n > 0 else 0
        if n < seq_len + 1 or n_windows < batch_size * world:
            with pytest.raises(LMForgeError):
                TokenLoader(data, "train", seq_len, batch_size, rank=0, world_size=world, seed=seed)
            return
        ranks = [TokenLoader(data, "train", seq_len, batch_size, rank=r, world_size=world, seed=seed)
                 for r in range(world)]  # fmt: skip
        per_epoch = ranks[0].batches_per_epoch
        seen: list[int] = []
        for i in range(max(steps, per_epoch)):
            epoch, b = divmod(i, per_epoch)
            ids = ranks[0].permutation(epoch)[b * batch_size * world : (b + 1) * batch_size * world]
            rows = np.concatenate([next(loader).numpy() for loader in ranks])
            expected = np.stack([stream[w * seq_len : w * seq_len + seq_len + 1] for w in ids])
            assert rows.shape == (batch_size * world, seq_len + 1)
            assert (rows == expected).all()
            if epoch == 0:
                seen += ids.tolist()
        assert len(seen) == len(set(seen)) == per_epoch * batch_size * world  # an epoch visits a window once


@SETTINGS
@given(**loader_args)
def test_token_loader_resumes_exactly_from_its_state(n, seq_len, batch_size, world, seed, steps):
    stream = np.random.default_rng(seed).integers(0, 1000, n)
    assume(n >= seq_len + 1 and (n - 1) // seq_len >= batch_size * world)
    with tempfile.TemporaryDirectory() as d:
        data = write_stream(Path(d), stream)
        run = TokenLoader(data, "train", seq_len, batch_size, rank=world - 1, world_size=world, seed=seed)
        for _ in range(steps):
            next(run)
        state = json.loads(json.dumps(run.state_dict()))  # plain data, as stored in a checkpoint
        resumed = TokenLoader(data, "train", seq_len, batch_size, rank=world - 1, world_size=world, seed=seed)
        resumed.load_state_dict(state)
        assert resumed.state_dict() == run.state_dict()
        for _ in range(3):
            assert (next(resumed) == next(run)).all()


@SETTINGS
@given(**loader_args)
def test_eval_batches_cover_every_window_once_over_the_ranks(n, seq_len, batch_size, world, seed, steps):
    stream = np.random.default_rng(seed).integers(0, 1000, n)
    assume(n >= seq_len + 1 and (n - 1) // seq_len >= batch_size * world)
    with tempfile.TemporaryDirectory() as d:
        data = write_stream(Path(d), stream)
        rows = [row for r in range(world)
                for batch in TokenLoader(data, "val", seq_len, batch_size, rank=r, world_size=world).eval_batches()
                for row in batch.numpy().tolist()]  # fmt: skip
    n_windows = (n - 1) // seq_len
    expected = [stream[w * seq_len : w * seq_len + seq_len + 1].tolist() for w in range(n_windows)]
    assert sorted(rows) == sorted(expected) and len(rows) == n_windows
