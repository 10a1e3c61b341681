"""An experiment's pretraining budget: what every arm gets the same of (tokens, FLOPs or optimizer steps), and how
each kind is written in the report and drawn in its loss curves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from lmforge.errors import LMForgeError
from lmforge.experiments.tables import sci, si

BudgetKind = Literal["tokens", "flops", "steps"]


@dataclass(frozen=True)
class BudgetUnit:
    """How a budget kind is written and drawn."""

    name: str
    """What it counts, as the report writes it ('equal FLOPs', '2.00e+14 FLOPs')."""
    number: Callable[[float], str]
    """The amount as the report writes it ('6.29M', '2.00e+14', '1200')."""
    loss_x: str
    """What the loss curves' x axis counts (`plots.loss_figure`'s x)."""


BUDGET_UNITS: dict[str, BudgetUnit] = {
    "tokens": BudgetUnit("tokens", si, "tokens"),
    "flops": BudgetUnit("FLOPs", sci, "flops"),
    "steps": BudgetUnit("steps", lambda v: str(int(v)), "tokens"),
}
"""Budget kind → its unit."""


@dataclass
class Budget:
    """What every pretraining arm gets the same of: training tokens (batch × seq_len × grad_accum a step),
    training FLOPs (`Objective.window_flops` × batch × grad_accum a step) or optimizer steps."""

    kind: BudgetKind
    value: float

    @property
    def unit(self) -> BudgetUnit:
        return BUDGET_UNITS[self.kind]

    def amount(self) -> str:
        """'6.29M tokens', '2.00e+14 FLOPs', '1200 steps'."""
        return f"{self.unit.number(self.value)} {self.unit.name}"

    def describe(self) -> str:
        return f"equal {self.unit.name}, {self.amount()} an arm"


def parse_budget(value: Any, where: str) -> Budget | None:
    """The budget a file gives at `where` (None: none given), with one-line errors."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in BUDGET_UNITS:
        raise LMForgeError(f"{where}: expected one of {{tokens: N}}, {{flops: N}} or {{steps: N}}, got {value!r}")
    kind, n = next(iter(value.items()))
    try:
        n = float(n)
    except (TypeError, ValueError):
        n = -1.0
    if not n > 0:
        raise LMForgeError(f"{where}.{kind}: expected a positive number, got {value[kind]!r}")
    return Budget(kind, n)
