"""StreamLoader: row b of every batch continues row b of the previous one, exactly; epochs move the segment
boundaries; exact resume; world-size invariance; validation from the start of each row."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmforge.data.corpus.stream import StreamLoader
from lmforge.errors import LMForgeError

N = 5000


@pytest.fixture
def data(tmp_path):
    """A prepared dir whose token i is i % 60000 (so every window says where it came from)."""
    tokens = (np.arange(N) % 60000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    tokens[:1000].tofile(tmp_path / "val.bin")
    meta = {"dtype": "uint16", "vocab_size": 65536, "train": {"n_tokens": N}, "val": {"n_tokens": 1000}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path


def test_rows_continue_from_batch_to_batch_and_tile_the_stream(data):
    loader = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=3)
    assert loader.row_len == N // 4 and loader.batches_per_epoch == (N // 4 - 16) // 16
    batches = [next(loader) for _ in range(loader.batches_per_epoch)]
    start = loader.offset(0)
    for t, x in enumerate(batches):
        assert x.shape == (4, 17) and x.dtype == torch.int64
        expected = torch.arange(4)[:, None] * loader.row_len + start + t * 16 + torch.arange(17)[None, :]
        assert torch.equal(x, expected)
    for prev, cur in zip(batches, batches[1:]):
        assert torch.equal(cur[:, 0], prev[:, -1])  # one shared token: every target is predicted once


def test_each_epoch_moves_the_segment_boundaries_and_rolls_over(data):
    loader = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=0)
    offsets = {loader.offset(e) for e in range(20)}
    assert len(offsets) > 5 and all(0 <= o < 16 for o in offsets)
    for _ in range(loader.batches_per_epoch):
        next(loader)
    assert (loader.epoch, loader.batch) == (1, 0)
    assert int(next(loader)[0, 0]) == loader.offset(1)


def test_resume_continues_exactly(data):
    a = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=1)
    for _ in range(loader_steps := a.batches_per_epoch + 3):
        next(a)
    state = a.state_dict()
    assert all(isinstance(v, int) for v in state.values()) and loader_steps > 3
    b = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=1)
    b.load_state_dict(state)
    for _ in range(5):
        assert torch.equal(next(a), next(b))


def test_resume_checks_what_must_match(data):
    state = StreamLoader(data, "train", seq_len=16, batch_size=4).state_dict()
    with pytest.raises(LMForgeError, match="cannot resume data loader: seq_len was 16, now 8"):
        StreamLoader(data, "train", seq_len=8, batch_size=4).load_state_dict(state)


def test_ranks_split_the_global_batch_rows(data):
    whole = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=2)
    ranks = [StreamLoader(data, "train", seq_len=16, batch_size=2, rank=r, world_size=2, seed=2) for r in range(2)]
    for _ in range(3):
        assert torch.equal(torch.cat([next(r) for r in ranks]), next(whole))
    # A checkpoint of the 2-rank run resumes on one rank with the same global batch.
    one = StreamLoader(data, "train", seq_len=16, batch_size=4, seed=2)
    one.load_state_dict(ranks[0].state_dict())
    assert torch.equal(next(one), next(whole))


def test_eval_batches_read_each_row_from_its_start_and_announce_the_pass(data):
    calls = []
    loader = StreamLoader(data, "val", seq_len=16, batch_size=2, on_eval_start=lambda: calls.append(1))
    batches = list(loader.eval_batches())
    assert len(batches) == (500 - 1) // 16 and calls == [1]
    assert torch.equal(batches[0][:, 0], torch.tensor([0, 500]))
    assert all(torch.equal(b[:, 0], a[:, -1]) for a, b in zip(batches, batches[1:]))
    assert len(list(loader.eval_batches(3))) == 3 and calls == [1, 1]


def test_a_split_too_small_for_the_batch_is_one_clear_error(data):
    with pytest.raises(LMForgeError) as e:
        StreamLoader(data, "val", seq_len=100, batch_size=8)
    assert str(e.value) == (
        f"{data} val split has 1000 tokens: 8 streams (batch_size*world_size) of 125 tokens each, need at least "
        "2*seq_len = 200 per stream (lower train.batch_size or train.seq_len)"
    )
