"""Multi-task mixing (Raffel et al. 2020 §3.5.2): how often each task's training examples are drawn when one
text-to-text model trains on several tasks at once (`task.mix.*` of a `multi_task` run, tasks/multi_task.py).

With e_m the training examples of task m and K the artificial data-set size limit (`limit`; none = no limit):

- proportional ("examples-proportional mixing"): r_m = min(e_m, K) / Σ_n min(e_n, K). Without a limit this is
  sampling from the concatenated data sets; K keeps a large task from crowding out the others (T5: K = 2^16..2^21).
- temperature ("temperature-scaled mixing", multilingual BERT's): the proportional rates raised to the power 1/T
  and renormalised, the limit applied first (T5 keeps K = 2^21 and tries T = 2, 4, 8). T = 1 is examples-
  proportional mixing; as T grows the rates approach equal mixing.
- equal: r_m = 1/N; each example of a batch comes from a task drawn uniformly.

A mixture's epoch is Σ_m min(e_m, K) draws: each draw picks a task by the rates, then the task's next example in a
fresh shuffle of its examples (a task drawn more often than it has examples starts another shuffle). Every
epoch's order is a function of the run's seed and the epoch alone, so a resumed run draws what the first would have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from lmforge.config.types import PosFloat, PosInt
from lmforge.errors import LMForgeError

Rate = Literal["proportional", "temperature", "equal"]


@dataclass
class MixOptions:
    """The mixing strategy of a multi-task run (the `task.mix.*` keys)."""

    rate: Rate = "proportional"
    """proportional: r_m ∝ min(e_m, K); temperature: r_m ∝ min(e_m, K)^(1/T); equal: r_m = 1/N."""
    limit: PosInt | None = None
    """K, the artificial data-set size limit of proportional and temperature mixing (None = no limit)."""
    temperature: PosFloat | None = None
    """T of temperature mixing (T5 Table 11: 2, 4, 8; 1 = examples-proportional)."""

    def __post_init__(self) -> None:
        if self.rate == "temperature" and self.temperature is None:
            raise LMForgeError("task.mix.rate=temperature needs task.mix.temperature (T5 tries 2, 4 and 8)")
        if self.rate != "temperature" and self.temperature is not None:
            raise LMForgeError(
                f"task.mix.temperature applies to task.mix.rate=temperature, not {self.rate} (set one or the other)"
            )
        if self.rate == "equal" and self.limit is not None:
            raise LMForgeError("task.mix.limit caps the data-set sizes of proportional and temperature mixing; "
                               "equal mixing does not use them")  # fmt: skip

    def describe(self) -> str:
        """The strategy as T5's Table 11 names it."""
        limit = f", K={self.limit}" if self.limit is not None else ""
        if self.rate == "equal":
            return "equal"
        if self.rate == "temperature":
            return f"temperature-scaled, T={self.temperature:g}{limit}"
        return f"examples-proportional{limit}"


def capped_sizes(sizes: Sequence[int], limit: int | None) -> list[int]:
    """min(e_m, K) of each task (e_m itself without a limit)."""
    return [min(e, limit) if limit is not None else e for e in sizes]


def mixing_rates(sizes: Sequence[int], mix: MixOptions) -> list[float]:
    """Each task's probability of being drawn, from its number of training examples (T5 §3.5.2)."""
    if not sizes:
        raise LMForgeError("a mixture needs at least one task")
    if min(sizes) <= 0:
        raise LMForgeError(f"every task of a mixture needs training examples, got sizes {list(sizes)}")
    if mix.rate == "equal":
        return [1.0 / len(sizes)] * len(sizes)
    capped = capped_sizes(sizes, mix.limit)
    total = sum(capped)
    rates = [c / total for c in capped]
    if mix.rate == "temperature":
        assert mix.temperature is not None
        # Scaled in log space: r^(1/T) of a tiny rate at a small T underflows as a plain power.
        logs = [math.log(r) / mix.temperature for r in rates]
        top = max(logs)
        weights = [math.exp(v - top) for v in logs]
        rates = [w / sum(weights) for w in weights]
    return rates


class MixtureSampler:
    """The order of a multi-task run's training features, epoch by epoch: each draw a task by `rates`, then that
    task's next feature in a shuffle of its own (tasks/mixing.py's docstring)."""

    def __init__(self, task_of: Sequence[int], rates: Sequence[float], epoch_size: int) -> None:
        tasks = torch.tensor(list(task_of), dtype=torch.long)
        if len(rates) == 0 or len(tasks) == 0 or int(tasks.max()) >= len(rates):
            raise LMForgeError("a mixture needs one rate per task and the task of every feature")
        # Feature indices of each task, in feature order.
        self.members = [torch.nonzero(tasks == m).flatten() for m in range(len(rates))]
        if any(len(m) == 0 for m in self.members):
            raise LMForgeError("every task of a mixture needs training features")
        self.rates = torch.tensor(list(rates), dtype=torch.double)
        self.epoch_size = epoch_size

    def indices(self, generator: torch.Generator) -> list[int]:
        """One epoch's feature indices (epoch_size of them), drawn with `generator`."""
        slots = torch.multinomial(self.rates, self.epoch_size, replacement=True, generator=generator)  # (S,) task
        order = torch.empty(self.epoch_size, dtype=torch.long)
        for m, members in enumerate(self.members):  # a loop over the tasks, not the examples
            where = torch.nonzero(slots == m).flatten()
            if len(where) == 0:
                continue
            rounds = math.ceil(len(where) / len(members))
            shuffles = [members[torch.randperm(len(members), generator=generator)] for _ in range(rounds)]
            order[where] = torch.cat(shuffles)[: len(where)]
        return order.tolist()


def mixture_sampler(task_of: Sequence[int], n_tasks: int, mix: MixOptions) -> MixtureSampler:
    """The sampler of features whose tasks are `task_of` (0..n_tasks-1), with `mix`'s rates; its epoch is
    Σ_m min(e_m, K) draws."""
    sizes = [0] * n_tasks
    for m in task_of:
        sizes[m] += 1
    return MixtureSampler(task_of, mixing_rates(sizes, mix), sum(capped_sizes(sizes, mix.limit)))
