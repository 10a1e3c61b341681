"""Consecutive segments of a token stream, for recurrent models (Transformer-XL §3.2, XLNet §2.5).

The split's token stream (documents back to back, EOS after each) is cut into G = batch_size * world_size rows of
equal length L = n_tokens // G, row g covering tokens [g*L, (g+1)*L) (the global batch; rank r takes rows
[r*B, (r+1)*B)). Batch t of an epoch holds, in every row, the window of seq_len + 1 tokens starting at
o + t*seq_len: consecutive windows share one token (the last target of one is the first input of the next), so
row b of batch t + 1 continues row b of batch t exactly and a model can carry its memory from one to the next.

The offset o of epoch e is drawn from `np.random.default_rng(seed + e)` in [0, seq_len), so segment boundaries
move between epochs; every epoch has the same number of batches, (L - seq_len) // seq_len. Validation
(`eval_batches`) reads the rows from offset 0, (L - 1) // seq_len batches. The union of the ranks' rows does not
depend on how the global batch is split, so a run may resume on another number of devices."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from lmforge.data.corpus.loader import Split, open_tokens, rank_batches, read_meta, resume_position
from lmforge.errors import LMForgeError


class StreamLoader:
    """Infinite iterator of (batch_size, seq_len + 1) int64 windows; row b of each batch continues row b of the
    previous one. `on_eval_start` is called when a validation pass (`eval_batches`) begins."""

    def __init__(
        self,
        data_dir: Path,
        split: Split,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        on_eval_start: Callable[[], None] | None = None,
    ) -> None:
        if seq_len < 1 or batch_size < 1:
            raise LMForgeError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}")
        if not 0 <= rank < world_size:
            raise LMForgeError(f"rank {rank} is outside world_size {world_size}")
        self.data_dir, self.split = Path(data_dir), split
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.on_eval_start = on_eval_start
        self.meta = read_meta(self.data_dir)
        self.tokens = open_tokens(self.data_dir, split, self.meta)
        self.n_tokens = len(self.tokens)
        self.global_batch = batch_size * world_size
        self.row_len = self.n_tokens // self.global_batch
        self.batches_per_epoch = (self.row_len - seq_len) // seq_len
        if self.batches_per_epoch < 1:
            raise LMForgeError(
                f"{self.data_dir} {split} split has {self.n_tokens} tokens: {self.global_batch} streams "
                f"(batch_size*world_size) of {self.row_len} tokens each, need at least 2*seq_len = {2 * seq_len} "
                "per stream (lower train.batch_size or train.seq_len)"
            )
        rows = np.arange(rank * batch_size, (rank + 1) * batch_size, dtype=np.int64)
        self._starts = rows * self.row_len  # (B,) first token of this rank's rows
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)  # (L,) positions inside a window
        self.epoch = self.batch = 0

    def offset(self, epoch: int) -> int:
        """Where the segments of `epoch` start inside each row (identical on every rank)."""
        return int(np.random.default_rng(self.seed + epoch).integers(self.seq_len))

    def window(self, start: int, rows: np.ndarray | None = None) -> torch.Tensor:
        """Rows (default: this rank's) at tokens [start, start + seq_len] of each: (B, seq_len + 1) in one
        fancy-index read."""
        starts = self._starts if rows is None else rows * self.row_len
        idx = (starts + start)[:, None] + self._offsets[None, :]
        return torch.from_numpy(self.tokens[idx].astype(np.int64))

    def __iter__(self) -> StreamLoader:
        return self

    def __next__(self) -> torch.Tensor:
        out = self.window(self.offset(self.epoch) + self.batch * self.seq_len)
        self.batch += 1
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        """Position of the next batch, plus what must match on resume (plain ints)."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "n_tokens": self.n_tokens,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly where `state` was taken (the world size may change, the global batch not)."""
        self.epoch, self.batch = resume_position(self, state, ("seed", "seq_len", "global_batch", "n_tokens"))

    def eval_global(self, max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, slice]]:
        """Validation with memory: all G rows' consecutive windows from offset 0 (at most `max_batches`), the same on
        every rank, with the slice of rows that is this rank's (the rows it carries memory for)."""
        if self.on_eval_start is not None:
            self.on_eval_start()
        n = (self.row_len - 1) // self.seq_len
        if max_batches is not None:
            n = min(n, max_batches)
        rows, mine = np.arange(self.global_batch), slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        for t in range(n):
            yield self.window(t * self.seq_len, rows), mine

    def eval_batches(self, max_batches: int | None = None) -> Iterator[torch.Tensor]:
        """This rank's rows of `eval_global`'s windows."""
        return rank_batches(self.eval_global(max_batches))
