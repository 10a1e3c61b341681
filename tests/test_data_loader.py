"""TokenLoader: windows, determinism, exact resume, world-size invariance, eval pass, unigram baseline."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.data.corpus.loader import TokenLoader, take_rows, unigram_cross_entropy
from lmforge.errors import LMForgeError

SEQ = 8


def write_prepared(root: Path, train: np.ndarray, val: np.ndarray, vocab_size: int = 1 << 16) -> Path:
    """A prepared dir in the on-disk format, written directly (independent of prepare())."""
    root.mkdir(parents=True, exist_ok=True)
    meta: dict = {"dtype": "uint16", "vocab_size": vocab_size, "eos_id": 0}
    for split, arr in (("train", train), ("val", val)):
        arr.astype(np.uint16).tofile(root / f"{split}.bin")
        meta[split] = {"n_tokens": len(arr), "n_docs": 1, "n_bytes": len(arr)}
    (root / "meta.json").write_text(json.dumps(meta))
    return root


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    # Token value == position, so a row's first token tells which window it is (start = k * SEQ).
    return write_prepared(tmp_path / "d", np.arange(803), np.arange(100))  # 100 windows


def _rows(batch: torch.Tensor) -> list[int]:
    return (batch[:, 0] // SEQ).tolist()


def test_window_shape_and_contents(data: Path) -> None:
    loader = TokenLoader(data, "train", seq_len=SEQ, batch_size=4)
    batch = next(loader)
    assert batch.shape == (4, SEQ + 1) and batch.dtype == torch.int64
    # Each row is a contiguous slice starting at a multiple of SEQ; targets are inputs shifted by one.
    assert torch.equal(batch - batch[:, :1], torch.arange(SEQ + 1).expand(4, -1))
    assert (batch[:, 0] % SEQ == 0).all()
    assert loader.n_windows == 100 and loader.batches_per_epoch == 25


def test_every_window_once_per_epoch_then_new_order(data: Path) -> None:
    loader = TokenLoader(data, "train", seq_len=SEQ, batch_size=5, seed=3)
    epoch0 = [w for _ in range(20) for w in _rows(next(loader))]
    assert sorted(epoch0) == list(range(100))
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 0
    epoch1 = [w for _ in range(20) for w in _rows(next(loader))]
    assert sorted(epoch1) == list(range(100)) and epoch1 != epoch0
    assert epoch0 == np.random.default_rng(3).permutation(100).tolist()
    assert epoch1 == np.random.default_rng(4).permutation(100).tolist()


def test_incomplete_tail_batch_dropped(data: Path) -> None:
    loader = TokenLoader(data, "train", seq_len=SEQ, batch_size=3)  # 33 batches, 1 window left over
    rows = [w for _ in range(33) for w in _rows(next(loader))]
    assert len(set(rows)) == 99
    assert loader.state_dict()["epoch"] == 1


def test_deterministic_and_seed_dependent(data: Path) -> None:
    a = [next(it) for it in [TokenLoader(data, "train", SEQ, 4, seed=1)] for _ in range(30)]
    b = [next(it) for it in [TokenLoader(data, "train", SEQ, 4, seed=1)] for _ in range(30)]
    c = [next(it) for it in [TokenLoader(data, "train", SEQ, 4, seed=2)] for _ in range(30)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("stop", [7, 24, 25, 26])  # mid-epoch, last batch, right at and after the boundary
def test_exact_resume(data: Path, stop: int) -> None:
    ref = TokenLoader(data, "train", SEQ, 4, seed=5)
    expected = [next(ref) for _ in range(stop + 30)][stop:]
    first = TokenLoader(data, "train", SEQ, 4, seed=5)
    for _ in range(stop):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # plain ints survive a JSON round trip
    assert all(type(v) is int for v in state.values())
    resumed = TokenLoader(data, "train", SEQ, 4, seed=5)
    resumed.load_state_dict(state)
    got = [next(resumed) for _ in range(30)]
    assert all(torch.equal(x, y) for x, y in zip(got, expected))


def test_world_size_invariance(data: Path) -> None:
    single = TokenLoader(data, "train", SEQ, batch_size=6, seed=9)
    ranks = [TokenLoader(data, "train", SEQ, batch_size=3, rank=r, world_size=2, seed=9) for r in range(2)]
    for _ in range(40):  # crosses the epoch boundary (16 batches per epoch)
        both = torch.cat([next(ranks[0]), next(ranks[1])])
        assert torch.equal(both, next(single))
    assert ranks[0].state_dict() == single.state_dict()


def test_resume_on_another_world_size(data: Path) -> None:
    single = TokenLoader(data, "train", SEQ, batch_size=6, seed=9)
    for _ in range(5):
        next(single)
    state = single.state_dict()
    ranks = [TokenLoader(data, "train", SEQ, 3, rank=r, world_size=2, seed=9) for r in range(2)]
    for r in ranks:
        r.load_state_dict(state)
    assert torch.equal(torch.cat([next(ranks[0]), next(ranks[1])]), next(single))
    other = TokenLoader(data, "train", SEQ + 1, 6, seed=9)
    with pytest.raises(LMForgeError, match="^cannot resume data loader: seq_len was 8, now 9$"):
        other.load_state_dict(state)


def test_eval_batches_in_order_and_complete(data: Path) -> None:
    loader = TokenLoader(data, "val", SEQ, batch_size=5)  # val: 99 tokens → 12 windows
    batches = list(loader.eval_batches())
    assert [len(b) for b in batches] == [5, 5, 2]
    assert [w for b in batches for w in _rows(b)] == list(range(12))
    assert [len(b) for b in loader.eval_batches(max_batches=2)] == [5, 5]
    assert all(torch.equal(x, y) for x, y in zip(batches, loader.eval_batches()))
    ranks = [TokenLoader(data, "val", SEQ, 3, rank=r, world_size=2) for r in range(2)]
    per_rank = [[w for b in r.eval_batches() for w in _rows(b)] for r in ranks]
    assert sorted(per_rank[0] + per_rank[1]) == list(range(12))
    assert per_rank[0] == [0, 1, 2, 6, 7, 8]


def test_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError, match="does not exist$"):
        TokenLoader(tmp_path / "missing", "train", SEQ, 2)
    with pytest.raises(LMForgeError, match=r"is not a prepared data dir \(no meta.json"):
        TokenLoader(tmp_path, "train", SEQ, 2)
    small = write_prepared(tmp_path / "s", np.arange(8), np.arange(50))
    with pytest.raises(LMForgeError, match=r"train split has 8 tokens, need at least seq_len\+1 = 9$"):
        TokenLoader(small, "train", SEQ, 2)
    too_few = r"split has 50 tokens = 6 windows of 9, need at least batch_size\*world_size = 8$"
    with pytest.raises(LMForgeError, match="train " + too_few):
        TokenLoader(write_prepared(tmp_path / "t", np.arange(50), np.arange(50)), "train", SEQ, 4, world_size=2)
    # A validation split smaller than one global batch is scored whole, in one smaller batch; it cannot train.
    val = [TokenLoader(small, "val", SEQ, 4, rank=r, world_size=2) for r in range(2)]
    assert [[len(b) for b in v.eval_batches()] for v in val] == [[3], [3]]
    with pytest.raises(LMForgeError, match="val " + too_few):
        next(val[0])
    (small / "val.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(LMForgeError, match="val.bin: 10 bytes, meta.json says 50 uint16 tokens$"):
        TokenLoader(small, "val", SEQ, 1)


def test_unigram_cross_entropy(tmp_path: Path) -> None:
    d = write_prepared(tmp_path / "u", np.array([1, 1, 1, 2]), np.array([1, 2, 3]), vocab_size=4)
    # add-one counts over 4 ids: [1, 4, 2, 1] / 8
    expected = -(math.log(4 / 8) + math.log(2 / 8) + math.log(1 / 8)) / 3
    assert unigram_cross_entropy(d) == pytest.approx(expected, rel=1e-12)


def test_a_ranks_rows_of_an_mlm_batch_leave_its_flat_index_out():
    # MLM's mlm_index holds flat positions into the whole global batch: rows 2-3 of it would point elsewhere (and
    # here it has as many entries as the batch has rows, so a shape test could not tell).
    labels = torch.full((4, 6), -100)
    labels[0, 1], labels[2, 3], labels[3, 0], labels[3, 5] = 5, 7, 9, 11
    batch = {"input_ids": torch.randint(0, 50, (4, 6)), "labels": labels,
             "mlm_index": (labels != -100).flatten().nonzero().squeeze(1)}  # fmt: skip
    part = take_rows(batch, slice(2, 4))
    assert "mlm_index" not in part and torch.equal(part["labels"], labels[2:4])
    assert take_rows(batch, slice(0, 4)) is batch  # one process: the whole batch, index kept
