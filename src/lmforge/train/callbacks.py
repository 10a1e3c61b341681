"""Named points of the training loop where code from outside can run: `step` (after each optimizer step), `eval`
(before each evaluation) and `checkpoint` (in the middle of each checkpoint write, after the first files are in its
scratch dir and before its weights and manifest). Tests install callbacks here to pause or kill a run at a chosen
point; a normal run has none, and each point costs one dict lookup."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

Point = Literal["step", "eval", "checkpoint"]
POINTS: tuple[str, ...] = ("step", "eval", "checkpoint")


class Callbacks:
    """Callables per point, each called with the current step."""

    _installed: Callbacks | None = None

    def __init__(self) -> None:
        self.by_point: dict[str, list[Callable[[int], None]]] = {}

    def add(self, point: Point, fn: Callable[[int], None]) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown loop point {point!r} (known: {', '.join(POINTS)})")
        self.by_point.setdefault(point, []).append(fn)

    def fire(self, point: Point, step: int) -> None:
        for fn in self.by_point.get(point, ()):
            fn(step)

    @classmethod
    def installed(cls) -> Callbacks:
        """The process-wide callbacks every loop of this process uses."""
        if cls._installed is None:
            cls._installed = Callbacks()
        return cls._installed


def install(point: Point, fn: Callable[[int], None]) -> None:
    """Run `fn(step)` at `point` in every training loop of this process."""
    Callbacks.installed().add(point, fn)
