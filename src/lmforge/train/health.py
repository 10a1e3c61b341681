"""The training loop's non-finite policy: a step whose loss or gradient norm is not finite is skipped with a warning,
too many in a row stop the run, the checkpoints saved during such a streak are set aside so that `--resume`
continues from the last good one, a loss far above the recent median is reported as a spike, and the weights about
to be saved are probed with one forward pass so that a checkpoint counts as good only when they give a finite loss."""

from __future__ import annotations

import math
import statistics
import sys
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import Tensor, nn

from lmforge.checkpoint.layout import CHECKPOINTS_DIR, NONFINITE_DIR
from lmforge.checkpoint.rotate import set_aside
from lmforge.config.sections import LoopConfig
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.train.distributed import DistInfo, barrier
from lmforge.train.metrics import MetricsLogger


class Health:
    """What the loop knows about its steps' finiteness: the current streak of non-finite steps, the last checkpoint
    before it, the newest checkpoint known good, and the recent losses a spike is measured against."""

    def __init__(self, cfg: LoopConfig, dist: DistInfo, run_dir: Path) -> None:
        self.cfg, self.dist, self.run_dir = cfg, dist, run_dir
        self.streak, self.pre_streak_ckpt = 0, None  # consecutive non-finite steps; the last checkpoint before
        # The newest checkpoint this process wrote or resumed from outside a streak: known good, unlike the newest
        # on disk (a resume may have fallen back past a damaged one).
        self.last_good: int | None = None
        self.recent: deque[float] = deque(maxlen=cfg.spike_window)

    def state(self) -> dict:
        return {"streak": self.streak, "pre_streak_ckpt": self.pre_streak_ckpt}

    def restore(self, state: dict, step: int) -> None:
        self.streak, self.pre_streak_ckpt = int(state.get("streak", 0)), state.get("pre_streak_ckpt")
        self.last_good = self.pre_streak_ckpt if self.streak else step

    def finite(self, step: int, loss: float, log: MetricsLogger) -> None:
        """A step with a finite loss and gradient: the streak ends; a spike is reported (and logged on rank 0)."""
        self.streak = 0
        c = self.cfg
        if c.spike_factor > 0 and len(self.recent) >= min(10, c.spike_window):
            median = statistics.median(self.recent)
            if median > 0 and loss > c.spike_factor * median and self.dist.is_main:
                print(f"warning: step {step}: loss spike {loss:.4g} ({loss / median:.1f}× the recent median)",
                      file=sys.stderr)  # fmt: skip
                log.log(step, loss_spike=loss, recent_median=median)
        self.recent.append(loss)

    def nonfinite(self, step: int, loss: float, gnorm: float, overflow: bool, log: MetricsLogger,
                  wait_for_saves: Callable[[], None]) -> None:  # fmt: skip
        """A skipped step (or, with `overflow`, an update that made the weights non-finite): warn, and stop the run
        at train.max_nonfinite in a row, setting aside the checkpoints saved since the last good one."""
        if self.streak == 0:
            self.pre_streak_ckpt = self.last_good
        self.streak += 1
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        value = loss if what == "loss" else gnorm
        if overflow:  # loss and gradient were finite, the update was not: the step could not be skipped
            what, value = "weights after the update", "overflow"
        if self.dist.is_main:
            skipped = "weights unusable from here" if overflow else "step skipped"
            print(f"warning: step {step}: non-finite {what} ({value}), {skipped}", file=sys.stderr)
            log.log(step, skipped=not overflow, nonfinite=what, loss=loss, grad_norm=gnorm)
        if self.streak >= self.cfg.max_nonfinite:
            raise LMForgeError(
                f"stopping at step {step}: {self.streak} consecutive steps with a non-finite loss or gradient "
                f"(train.max_nonfinite={self.cfg.max_nonfinite}); lower train.lr or check the data"
                f"{self._set_aside(wait_for_saves)}"
            )

    def _set_aside(self, wait_for_saves: Callable[[], None]) -> str:
        """Move the checkpoints saved after the last good one into RUN/checkpoints/nonfinite/, so that `--resume`
        continues from the good one → the end of the stop line, saying so."""
        wait_for_saves()  # a save still being written publishes first
        good = self.pre_streak_ckpt
        moved = set_aside(self.run_dir, good) if self.dist.is_main else []
        barrier(self.dist)
        aside = ""
        if moved:
            where = self.run_dir / CHECKPOINTS_DIR / NONFINITE_DIR
            aside = f"; {len(moved)} checkpoint(s) saved after it ({', '.join(moved)}) are moved to {where}"
        if good is None:
            return f"{aside}; no checkpoint is known good, so --resume starts at step 0"
        return f"; the last checkpoint before it is step_{good}, which --resume continues from{aside}"

    def saved(self, step: int, good: bool) -> None:
        if good:  # a checkpoint written inside a streak may hold the weights that caused it
            self.last_good = step

    def protect(self, good: bool) -> tuple[int, ...]:
        """Checkpoints rotation must keep: the last good one while the one written now is not good."""
        return (self.last_good,) if not good and self.last_good is not None else ()


def probe(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], LossOutput],
    data: dict[str, Tensor] | None,
    device: torch.device,
    autocast: AbstractContextManager,
    dist: DistInfo,
) -> bool:
    """Whether the weights about to be saved give a finite loss on the last training micro-batch (in eval mode, no
    gradient, random state kept): finite weights can still be too large for a forward pass (an update at a huge
    lr), and such a checkpoint must not count as good."""
    if data is None:
        return True
    devices = [device] if device.type == "cuda" else []
    model.eval()
    try:
        with torch.no_grad(), autocast, torch.random.fork_rng(devices=devices):
            bad = (~torch.isfinite(loss_fn(model, data).loss.float())).float()
    finally:
        model.train()
    if dist.enabled:
        torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
    return not bool(bad.item())
