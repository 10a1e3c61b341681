"""Range-checked field types for config dataclasses: `max_steps: PosInt = 1000` is an int that a recipe or an
override must give as > 0, refused with one line at load time ("train.max_steps must be > 0, got 0")."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from lmforge.errors import LMForgeError


@dataclass(frozen=True)
class Range:
    """Allowed interval of a numeric field; open or closed at each end, either end optional."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def check(self, key: str, value: float) -> None:
        below = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        above = self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi)
        if below or above:
            raise LMForgeError(f"{key} must be {self.describe()}, got {value!r}")

    def describe(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        return f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"


def _num(x: float | None) -> str:
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 2**53):
        return str(int(x))  # a bound such as 2**32 - 1 in full, not 4.29497e+09
    return f"{x:g}"


PosInt = Annotated[int, Range(0, lo_open=True)]
NonNegInt = Annotated[int, Range(0)]
PosFloat = Annotated[float, Range(0, lo_open=True)]
NonNegFloat = Annotated[float, Range(0)]
Fraction = Annotated[float, Range(0, 1)]
"""In [0, 1]."""
OpenFraction = Annotated[float, Range(0, 1, hi_open=True)]
"""In [0, 1)."""
UnitFraction = Annotated[float, Range(0, 1, lo_open=True)]
"""In (0, 1]."""
SEED_MAX = 2**32 - 1
Seed = Annotated[int, Range(0, SEED_MAX)]
"""A seed, in [0, 2**32 - 1]: what NumPy's legacy generator takes, with room for what a run derives from it (the
step and 1_000_003 × the rank are added, a fine-tuning epoch's shuffle uses seed × 1000 + epoch) under torch's
limit of 2**64 - 1 (a larger seed overflowed there)."""


def check_ranges(obj: Any, prefix: str) -> None:
    """Check every range-annotated field of dataclass `obj` (and that its numbers are finite), as the config loader
    does for values it reads: for objects built in Python."""
    hints = typing.get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise LMForgeError(f"{prefix}{f.name} must be a finite number, got {value!r}")
        t = hints.get(f.name)
        if typing.get_origin(t) is Annotated and isinstance(value, (int, float)) and not isinstance(value, bool):
            for check in t.__metadata__:
                if isinstance(check, Range):
                    check.check(f"{prefix}{f.name}", value)
