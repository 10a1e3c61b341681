"""A run that ends on a wall-clock budget (`train.time_budget`) instead of a step count fixed in advance.

The run measures its own step time and plans its total steps so that the last step lands on the budget; the
schedule (warmup, WSD's decay, cosine) follows the planned total, so a slower host or a longer compilation gives
fewer steps with a complete decay rather than a run cut off at a high learning rate. The plan is redone at every
logged step (where the loop reads the device back anyway) until the final WSD decay begins; from then on it is
fixed, so the decay is one straight line. The clock runs from the loop's first step: compilation, steps and
evaluations during the run count; start-up before the loop, the final evaluation and the final save do not.
Evaluations and saves are measured apart from the steps (`paused`) and planned at the rate they have come so far:
a window that held one would otherwise plan the whole rest of the run at its slower pace, and could fix the decay
hundreds of steps early. `train.max_steps` caps the plan."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class TimeBudget:
    seconds: float
    cap: int  # train.max_steps
    decay_ratio: float | None  # schedule=wsd: the planned steps' fraction in the final decay; None: never fixed
    spent: float = 0.0  # seconds used by earlier processes of this run (a resumed run continues its budget)
    frozen: bool = False
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    _t0: float = field(default=0.0, repr=False)
    _mark: tuple[float, int, float] | None = field(default=None, repr=False)  # (time, step, paused) at the last plan
    _start_step: int = field(default=0, repr=False)
    _paused: float = field(default=0.0, repr=False)  # seconds of evaluations and saves in this process

    def start(self, step: int) -> None:
        """The loop's clock starts (each process of a run, at its first step)."""
        self._t0 = self.clock()
        self._mark = None
        self._start_step = step
        self._paused = 0.0

    @contextmanager
    def paused(self) -> Iterator[None]:
        """An evaluation or a save: its time counts against the budget but is not step time."""
        t = self.clock()
        try:
            yield
        finally:
            self._paused += self.clock() - t

    def elapsed(self) -> float:
        return self.spent + self.clock() - self._t0

    def plan(self, step: int, total: int) -> int:
        """The total steps that end the run on the budget, from the step time since the last call. The first
        call's window holds compilation, so its plan runs at least one more window of steps before WSD's decay would
        begin (a 20-s compilation would otherwise end the run a few steps later, or start a decay that the next
        plan undoes), and the next call's plan corrects it."""
        now = self.clock()
        mark, self._mark = self._mark, (now, step, self._paused)
        if self.frozen:
            return total
        t_prev, s_prev, p_prev = mark if mark is not None else (self._t0, self._start_step, 0.0)
        if step <= s_prev:
            return total
        per_step = (now - t_prev - (self._paused - p_prev)) / (step - s_prev)
        per_step += self._paused / (step - self._start_step)  # evaluations and saves to come, at their rate so far
        left = self.seconds - self.elapsed()
        new_total = min(self.cap, max(step + 1, step + math.floor(left / per_step))) if left > 0 else step
        if mark is None and left > 0:  # the first window holds compilation: measure one more before deciding
            next_plan = 2 * step - s_prev
            if self.decay_ratio is not None:  # the decay begins after that next plan
                next_plan = math.floor(next_plan / (1 - self.decay_ratio)) + 2
            return max(new_total, min(self.cap, next_plan))
        if self.decay_ratio is not None and step >= new_total - max(1, round(self.decay_ratio * new_total)):
            self.frozen = True  # the decay has begun: keep its end where it is
        return new_total

    def warn_if_cut(self, step: int) -> None:
        """A warning when the budget ends the run before WSD's decay could begin."""
        if self.decay_ratio is not None and not self.frozen:
            print(f"warning: train.time_budget ({self.seconds:g} s) was spent by step {step}, before the decay could "
                  "begin: the run ends at its peak learning rate", file=sys.stderr)  # fmt: skip

    def state_dict(self) -> dict:
        return {"spent": self.elapsed(), "frozen": self.frozen}

    def load_state_dict(self, state: dict) -> None:
        self.spent, self.frozen = float(state.get("spent", 0.0)), bool(state.get("frozen", False))
