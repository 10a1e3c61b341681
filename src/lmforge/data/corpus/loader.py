"""Deterministic, resumable, world-size-invariant batches of packed token windows.

The split's token stream (documents back to back, EOS after each) is cut into fixed windows of
``seq_len + 1`` tokens with stride ``seq_len``: window k covers tokens [k*seq_len, (k+1)*seq_len]
and shares its last token with window k+1, so every token after the first is a target exactly once
per epoch. The last ``< seq_len`` tokens that do not fill a window are not used.

Epoch e shuffles the windows with ``np.random.default_rng(seed + e).permutation``. Global batch i is
windows ``perm[i*B*W : (i+1)*B*W]`` (B = per-rank batch size, W = world size) and rank r takes rows
``[r*B, (r+1)*B)`` of it, so the union over ranks does not depend on how the global batch is split.
The incomplete last global batch of an epoch is dropped and the next epoch starts automatically.
Validation (``eval_global``) reads the windows in order, a global batch at a time, each rank scoring its rows:
the windows scored, and any noise drawn for a global batch, do not depend on the number of processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from lmforge.errors import LMForgeError
from lmforge.files import loads_json

Split = Literal["train", "val"]


def read_meta(data_dir: Path) -> dict:
    """``meta.json`` of a prepared data directory (LMForgeError when it is not one)."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise LMForgeError(f"data dir {data_dir} does not exist")
    meta_file = data_dir / "meta.json"
    if not meta_file.is_file():
        raise LMForgeError(f"{data_dir} is not a prepared data dir (no meta.json; run 'lmforge data prepare')")
    try:
        meta = loads_json(meta_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LMForgeError(f"{meta_file}: malformed JSON ({e.msg}, line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise LMForgeError(f"{meta_file}: not UTF-8 text (byte {e.start})") from None
    if not isinstance(meta, dict):
        raise LMForgeError(f"{meta_file}: expected a JSON object, got {type(meta).__name__}")
    return meta


def open_tokens(data_dir: Path, split: Split, meta: dict | None = None) -> np.memmap:
    """The split's token array, memory-mapped read-only."""
    meta = meta or read_meta(data_dir)
    path = Path(data_dir) / f"{split}.bin"
    if split not in meta or not path.is_file():
        raise LMForgeError(f"{data_dir} has no '{split}' split ({path.name} missing)")
    try:
        n, dtype = int(meta[split]["n_tokens"]), np.dtype(meta["dtype"])
    except (KeyError, TypeError, ValueError) as e:
        raise LMForgeError(f"{Path(data_dir) / 'meta.json'}: no valid dtype and {split}.n_tokens ({e!r})") from None
    if dtype.kind not in "ui" or n < 0:
        raise LMForgeError(f"{Path(data_dir) / 'meta.json'}: dtype {dtype} and {n} {split} tokens are no token array")
    if path.stat().st_size != n * dtype.itemsize:
        raise LMForgeError(f"{path}: {path.stat().st_size} bytes, meta.json says {n} {dtype} tokens")
    if n == 0:
        return np.zeros(0, dtype=dtype)  # np.memmap cannot map an empty file
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


_SCAN = 1 << 24  # tokens a chunk: bounds the temporary arrays of a scan over a memory-mapped split


def check_token_ids(data_dir: Path, vocab_size: int, bound: str, meta: dict | None = None) -> None:
    """Refuse a prepared dir whose splits hold an id outside [0, vocab_size) (`bound` names the limit in the message,
    e.g. "model.vocab_size=512"): the first step would fail on it inside an embedding lookup (IndexError on a CPU, a
    device-side assert on a GPU). One vectorised pass over each memory-mapped split, skipped when its dtype cannot
    hold such an id (uint16 shards and a vocabulary of 65,536 or more)."""
    meta = meta or read_meta(data_dir)
    for split in ("train", "val"):
        if split not in meta:
            continue
        tokens = open_tokens(data_dir, split, meta)
        info = np.iinfo(tokens.dtype)
        if info.max < vocab_size and info.min >= 0:
            continue
        for i in range(0, len(tokens), _SCAN):
            part = tokens[i : i + _SCAN]
            if part.max() >= vocab_size or part.min() < 0:
                pos = i + int(np.argmax((part >= vocab_size) | (part < 0)))
                raise LMForgeError(
                    f"{Path(data_dir) / f'{split}.bin'}: token id {int(tokens[pos])} at position {pos} is not below "
                    f"{bound} (the shards were made with a larger vocabulary, or are damaged: prepare them again)"
                )


def read_doc_index(data_dir: Path, split: str, n_tokens: int, meta: dict) -> np.ndarray:
    """The split's document index `SPLIT.idx` (int64 start of each document in SPLIT.bin), checked: one dimension of
    integers, as many as meta.json's documents, from 0, increasing, inside the split's `n_tokens` tokens. Loaders
    that need document boundaries (sentence pairs, document chunks) index the tokens with it."""
    path = Path(data_dir) / f"{split}.idx"
    if not path.is_file():
        raise LMForgeError(f"{data_dir} has no document index {path.name} (prepare the data again)")
    try:
        starts = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError) as e:  # numpy reads a file that is not .npy as a pickle, refused here
        why = "it is not in .npy format" if "pickle" in str(e) else str(e).splitlines()[0]
        problem = f"not a document index (cannot read it as a .npy array: {why})"
    else:
        problem = _index_problem(starts, n_tokens, meta.get(split, {}).get("n_docs"))
    if problem:
        raise LMForgeError(f"{path}: {problem} (prepare the data again)")
    return starts.astype(np.int64)


def _index_problem(starts: np.ndarray, n_tokens: int, n_docs: object) -> str | None:
    """What is wrong with a document index, or None."""
    if not isinstance(starts, np.ndarray) or starts.dtype.kind not in "ui":
        return f"not a document index (dtype {getattr(starts, 'dtype', type(starts).__name__)}, expected integers)"
    if starts.ndim != 1:
        return f"not a document index (shape {starts.shape}, expected one dimension)"
    if isinstance(n_docs, int) and len(starts) != n_docs:
        return f"holds {len(starts)} document starts, meta.json says {n_docs} documents"
    if len(starts) == 0:
        return "holds no document starts" if n_tokens else None
    if starts[0] != 0:
        return f"the first document starts at {starts[0]}, not 0"
    down = np.flatnonzero(np.diff(starts.astype(np.int64)) <= 0)
    if len(down):
        i = int(down[0]) + 1
        return f"document starts are not increasing (entry {i}: {starts[i]} after {starts[i - 1]})"
    if starts[-1] >= n_tokens:
        return f"document start {starts[-1]} (entry {len(starts) - 1}) is beyond the split's {n_tokens} tokens"
    return None


def resume_position(loader, state: dict, keys: tuple[str, ...]) -> tuple[int, int]:
    """The (epoch, batch) of a loader's saved `state`, after checking that its `keys` match `loader`'s and the
    position lies inside an epoch of `loader.batches_per_epoch` batches."""
    for key in keys:
        if key in state and int(state[key]) != getattr(loader, key):
            raise LMForgeError(f"cannot resume data loader: {key} was {state[key]}, now {getattr(loader, key)}")
    epoch, batch = int(state["epoch"]), int(state["batch"])
    if not (epoch >= 0 and 0 <= batch < loader.batches_per_epoch):
        raise LMForgeError(f"cannot resume data loader: bad position epoch={epoch} batch={batch}")
    return epoch, batch


class TokenLoader:
    """Infinite iterator of (batch_size, seq_len + 1) int64 token windows for one rank."""

    def __init__(
        self,
        data_dir: Path,
        split: Split,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        if seq_len < 1 or batch_size < 1:
            raise LMForgeError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}")
        if not 0 <= rank < world_size:
            raise LMForgeError(f"rank {rank} is outside world_size {world_size}")
        self.data_dir, self.split = Path(data_dir), split
        self.seq_len, self.batch_size = seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.meta = read_meta(self.data_dir)
        self.tokens = open_tokens(self.data_dir, split, self.meta)
        n = len(self.tokens)
        if n < seq_len + 1:
            raise LMForgeError(f"{self.data_dir} {split} split has {n} tokens, need at least seq_len+1 = {seq_len + 1}")
        self.n_windows = (n - 1) // seq_len
        self.global_batch = batch_size * world_size
        self.batches_per_epoch = self.n_windows // self.global_batch
        if self.batches_per_epoch == 0 and split == "train":  # validation scores what there is (`eval_global`)
            raise LMForgeError(self._too_small())
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)  # (L,) positions inside a window
        self.epoch = self.batch = 0
        self._perm: np.ndarray | None = None

    def _windows(self, ids: np.ndarray) -> torch.Tensor:
        """Gather windows ``ids`` (n,) → LongTensor (n, seq_len + 1) in one fancy-index read."""
        starts = ids.astype(np.int64) * self.seq_len
        rows = self.tokens[starts[:, None] + self._offsets[None, :]]  # (n, L)
        return torch.from_numpy(rows.astype(np.int64))

    def permutation(self, epoch: int) -> np.ndarray:
        """The window order of ``epoch`` (identical on every rank)."""
        return np.random.default_rng(self.seed + epoch).permutation(self.n_windows)

    def __iter__(self) -> TokenLoader:
        return self

    def _too_small(self) -> str:
        return (f"{self.data_dir} {self.split} split has {len(self.tokens)} tokens = {self.n_windows} windows of "
                f"{self.seq_len + 1}, need at least batch_size*world_size = {self.global_batch}")  # fmt: skip

    def __next__(self) -> torch.Tensor:
        if self.batches_per_epoch == 0:
            raise LMForgeError(self._too_small())
        if self._perm is None:
            self._perm = self.permutation(self.epoch)
        start = self.batch * self.global_batch + self.rank * self.batch_size
        out = self._windows(self._perm[start : start + self.batch_size])
        self.batch += 1
        if self.batch == self.batches_per_epoch:  # drop the incomplete tail, roll over
            self.epoch, self.batch, self._perm = self.epoch + 1, 0, None
        return out

    def state_dict(self) -> dict[str, int]:
        """Position of the next batch, plus what must match on resume (plain ints)."""
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
            "n_windows": self.n_windows,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume exactly where ``state`` was taken (the world size may change, the global batch not)."""
        self.epoch, self.batch = resume_position(self, state, ("seed", "seq_len", "global_batch", "n_windows"))
        self._perm = None

    def eval_global(self, max_batches: int | None = None) -> Iterator[tuple[torch.Tensor, slice]]:
        """Validation: windows in stream order (no shuffle), each global batch whole (the same on every rank) with
        the slice of its rows that is this rank's.

        Covers every window once, including a final smaller batch; ``max_batches`` caps the number of global
        batches, so the windows scored depend on batch_size * world_size, not on how it is split. Every rank gets
        the same number of batches; in the last one a rank's slice may be empty (fewer windows than ranks).
        """
        n_global = -(-self.n_windows // self.global_batch)
        if max_batches is not None:
            n_global = min(n_global, max_batches)
        for i in range(n_global):
            lo = i * self.global_batch
            hi = min(lo + self.global_batch, self.n_windows)
            yield self._windows(np.arange(lo, hi)), rank_rows(hi - lo, self.rank, self.world_size)

    def eval_batches(self, max_batches: int | None = None) -> Iterator[torch.Tensor]:
        """This rank's rows of each of `eval_global`'s batches (none where its slice is empty), so reduce sums of
        loss and token counts over ranks after the loop, not inside it."""
        return rank_batches(self.eval_global(max_batches))


def rank_rows(n: int, rank: int, world_size: int) -> slice:
    """Rank `rank`'s rows of an n-row global batch: contiguous, sizes differing by at most one
    (`np.array_split`'s)."""
    q, r = divmod(n, world_size)
    start = rank * q + min(rank, r)
    return slice(start, start + q + (rank < r))


def take_rows(batch: torch.Tensor | dict, rows: slice) -> torch.Tensor | dict:
    """Rows of a batch: a tensor, or a dict of batch-first tensors (values of another length are kept whole).

    A `*_index` value holds flat positions into the whole batch (e.g. MLM's selected positions), which no slice of
    rows keeps valid: a proper subset of the rows leaves it out, and its consumer derives it from the labels."""
    if isinstance(batch, torch.Tensor):
        return batch[rows]
    n = next(v.shape[0] for v in batch.values() if isinstance(v, torch.Tensor) and v.dim())
    if range(n)[rows] == range(n):
        return batch
    return {
        k: v[rows] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v
        for k, v in batch.items()
        if not k.endswith("_index")
    }


def rank_batches(global_batches: Iterator[tuple[torch.Tensor | dict, slice]]) -> Iterator[torch.Tensor | dict]:
    """The non-empty rank slices of (global batch, rows) pairs."""
    for batch, rows in global_batches:
        if rows.stop > rows.start:
            yield take_rows(batch, rows)


def token_counts(data_dir: Path, split: str) -> np.ndarray:
    """(V,) float64: how often each token id occurs in a split of a prepared dir, counted in chunks (np.bincount
    makes an int64 copy of what it counts: a whole memory-mapped split would need 8 bytes a token)."""
    meta = read_meta(Path(data_dir))
    vocab, arr = int(meta["vocab_size"]), open_tokens(data_dir, split, meta)
    counts = np.zeros(vocab, dtype=np.float64)
    step = 1 << 24
    for i in range(0, len(arr), step):
        counts += np.bincount(arr[i : i + step], minlength=vocab)[:vocab]
    return counts


def unigram_cross_entropy(data_dir: Path) -> float:
    """Cross-entropy (nats/token) on val of an add-one-smoothed unigram model fit on train.

    The floor a language model must beat to have learned anything beyond token frequencies.
    """
    val_counts = token_counts(data_dir, "val")
    if val_counts.sum() == 0:
        raise LMForgeError(f"{data_dir} val split is empty")
    counts = token_counts(data_dir, "train") + 1.0
    log_p = np.log(counts) - np.log(counts.sum())
    return float(-(val_counts * log_p).sum() / val_counts.sum())
