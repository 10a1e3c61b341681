"""Batches built ahead of the training step in a background thread, in pinned memory, so the host never makes the
GPU wait for data: the step copies them with `non_blocking=True`.

A batch source is an iterator of `Batch`es with `state_dict()` / `load_state_dict()`. The prefetcher records the
source's state after drawing each batch and reports, as its own state, the one after the last batch handed out —
so a checkpoint taken mid-run resumes exactly where the training step was, not where the thread had got to, and
the batches are those of the synchronous source, in the same order."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor


@dataclass
class Batch:
    """One micro-batch of CPU tensors for a loss function."""

    data: dict[str, Tensor]
    weight: float = 1.0
    """Multiplies this rank's loss: a rank's share of an uneven global batch (fine-tuning under DDP), 0 for a
    padding batch of a rank with no examples left."""
    examples: int = 0
    """Examples in the batch (logging), 0 = unknown."""
    extra: dict[str, Any] = field(default_factory=dict)


class BatchSource(Protocol):
    def __next__(self) -> Batch: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def pin(batch: Batch) -> Batch:
    return Batch({k: v.pin_memory() for k, v in batch.data.items()}, batch.weight, batch.examples, batch.extra)


_DONE = object()


class Prefetcher:
    """Iterates `source` through a queue of `depth` batches filled by a daemon thread (depth 0: no thread)."""

    def __init__(self, source: BatchSource, depth: int = 2, pin_memory: bool = False) -> None:
        self.source, self.depth, self.pin_memory = source, depth, pin_memory
        self._state = source.state_dict()
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _draw(self) -> tuple[Batch, dict]:
        batch = next(self.source)
        return (pin(batch) if self.pin_memory else batch), self.source.state_dict()

    def _work(self) -> None:
        try:
            while not self._stop.is_set():
                self._put(self._draw())
        except BaseException as e:  # handed to the training thread, which raises it
            self._put((_DONE, e))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.depth == 0:
            batch, self._state = self._draw()
            return batch
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="lmforge-prefetch", daemon=True)
            self._thread.start()
        batch, state = self._queue.get()
        if batch is _DONE:
            self.close()
            raise state
        self._state = state
        return batch

    def state_dict(self) -> dict:
        """The source's state after the last batch handed out."""
        return self._state

    def load_state_dict(self, state: dict) -> None:
        if self._thread is not None:
            raise RuntimeError("load_state_dict after the prefetch thread started")
        self.source.load_state_dict(state)
        self._state = self.source.state_dict()

    def close(self) -> None:
        """Stop the thread (it may be blocked on a full queue) and drop what it built."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None
