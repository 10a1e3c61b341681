"""Scaling-law fits over finished runs: Chinchilla's parametric loss L(N, D), power laws in compute, bootstrap
intervals and the compute-optimal model size and token count for a budget.

- `fit_loss_surface`: L(N, D) = E + A/N^α + B/D^β by Hoffmann et al. 2022 (Chinchilla) approach 3 (§3.3, App. D.2):
  minimise Σ Huber_δ(LSE(a − α log N, b − β log D, e) − log L) with δ = 1e-3 over (a, b, e, α, β), A = eᵃ,
  B = eᵇ, E = eᵉ, by L-BFGS from the paper's grid of initialisations (α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1},
  a, b ∈ {0, 5, …, 25}). The objective is evaluated at all 4,500 grid points at once; L-BFGS runs from the best
  `top_k` of them (all of them with top_k=None: about a minute on one core instead of about a second).
- compute-optimal allocation under C = 6ND (Hoffmann et al. 2022 §3.3): N_opt = G (C/6)^a, D_opt = G⁻¹ (C/6)^b with
  a = β/(α+β), b = α/(α+β), G = (αA/(βB))^(1/(α+β)).
- `fit_power_law`: y = k·x^(−γ) by least squares in log-log space, e.g. Kaplan et al. 2020's L(C) = (C_c/C)^α_C
  (their eq. 1.3) over the compute frontier (`frontier`: the runs no cheaper run beats).
- `bootstrap`: percentile intervals of every fitted quantity over fits to runs resampled with replacement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lmforge.errors import LMForgeError
from lmforge.extras import require

HUBER_DELTA = 1e-3
BOUNDS = [(-30.0, 100.0)] * 3 + [(0.0, 5.0)] * 2
"""Box for (a, b, e, α, β): loose enough never to bind on data that follow the law, tight enough that a fit to
flat or noisy losses ends at finite A, B, E and non-negative exponents."""
_GRID = np.array(
    list(
        itertools.product(
            np.arange(0, 26, 5.0),  # a
            np.arange(0, 26, 5.0),  # b
            np.arange(-1, 1.01, 0.5),  # e
            np.arange(0, 2.01, 0.5),  # alpha
            np.arange(0, 2.01, 0.5),  # beta
        )
    )
)  # (4500, 5): Chinchilla App. D.2's initialisations


@dataclass(frozen=True)
class LossSurface:
    """L(N, D) = E + A/N^α + B/D^β."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    objective: float = float("nan")
    """The minimised sum of Huber losses."""
    at_bounds: tuple[str, ...] = ()
    """Parameters the fit left on the search box (`BOUNDS`): the runs do not determine them."""

    def predict(self, N, D):
        return self.E + self.A / np.power(N, self.alpha) + self.B / np.power(D, self.beta)

    @property
    def a(self) -> float:
        """N_opt ∝ C^a (NaN when both exponents are 0: no optimum)."""
        s = self.alpha + self.beta
        return self.beta / s if s > 0 else math.nan

    @property
    def b(self) -> float:
        """D_opt ∝ C^b."""
        s = self.alpha + self.beta
        return self.alpha / s if s > 0 else math.nan

    @property
    def G(self) -> float:
        try:
            return (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        except (ZeroDivisionError, OverflowError):
            return math.nan

    def optimal(self, C: float) -> tuple[float, float]:
        """Compute-optimal (N, D) for a budget of C FLOPs with C = 6ND (NaN when the fit has no optimum: a zero
        exponent makes one of the terms a constant)."""
        G = self.G
        if not (math.isfinite(G) and G > 0):
            return C * math.nan, C * math.nan
        return G * (C / 6.0) ** self.a, (C / 6.0) ** self.b / G


def _huber_objective(params: np.ndarray, logN: np.ndarray, logD: np.ndarray, logL: np.ndarray, delta: float):
    """Σ Huber_δ(LSE(a − α log N, b − β log D, e) − log L) and its gradient. params (5,) = a, b, e, α, β."""
    a, b, e, alpha, beta = params
    z = np.stack([a - alpha * logN, b - beta * logD, np.full_like(logN, e)])  # (3, n)
    top = z.max(axis=0)
    w = np.exp(z - top)
    total = w.sum(axis=0)
    r = top + np.log(total) - logL  # log-space residuals
    w /= total  # softmax: d LSE / d z
    ar = np.abs(r)
    loss = np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta)).sum()
    g = np.clip(r, -delta, delta)  # d Huber / d r
    grad = np.array(
        [(g * w[0]).sum(), (g * w[1]).sum(), (g * w[2]).sum(), -(g * w[0] * logN).sum(), -(g * w[1] * logD).sum()]
    )
    return float(loss), grad


def _grid_objectives(logN: np.ndarray, logD: np.ndarray, logL: np.ndarray, delta: float) -> np.ndarray:
    """The objective at every grid initialisation at once: (4500,)."""
    a, b, e, alpha, beta = (_GRID[:, i : i + 1] for i in range(5))
    z = np.stack([a - alpha * logN, b - beta * logD, np.broadcast_to(e, (len(_GRID), len(logN)))])
    r = np.logaddexp.reduce(z, axis=0) - logL
    ar = np.abs(r)
    return np.where(ar <= delta, 0.5 * r * r, delta * (ar - 0.5 * delta)).sum(axis=1)


def _check_points(N: Sequence[float], D: Sequence[float], L: Sequence[float]) -> tuple[np.ndarray, ...]:
    N, D, L = (np.asarray(x, dtype=np.float64) for x in (N, D, L))
    if not (N.shape == D.shape == L.shape) or N.ndim != 1:
        raise LMForgeError("N, D and L must be equally long lists")
    if len(N) < 5:
        raise LMForgeError(f"fitting L(N, D) needs at least 5 runs (5 parameters), got {len(N)}")
    if (N <= 0).any() or (D <= 0).any() or (L <= 0).any() or not np.isfinite(L).all():
        raise LMForgeError("N, D and L must be positive and finite")
    if len(np.unique(N)) < 2 or len(np.unique(D)) < 2:
        raise LMForgeError("fitting L(N, D) needs runs of at least 2 model sizes and 2 token counts")
    return np.log(N), np.log(D), np.log(L)


def fit_loss_surface(
    N: Sequence[float],
    D: Sequence[float],
    L: Sequence[float],
    *,
    delta: float = HUBER_DELTA,
    top_k: int | None = 64,
    extra_starts: Sequence[Sequence[float]] = (),
) -> LossSurface:
    """Chinchilla approach 3 (see the module docstring). `extra_starts`: more (a, b, e, α, β) initialisations."""
    minimize = require("scipy.optimize", "the scaling-law fit").minimize
    threadpool_limits = require("threadpoolctl", "the scaling-law fit").threadpool_limits

    logN, logD, logL = _check_points(N, D, L)
    order = np.argsort(_grid_objectives(logN, logD, logL, delta), kind="stable")
    starts = list(_GRID[order[:top_k]] if top_k is not None else _GRID) + [np.asarray(s, float) for s in extra_starts]
    best = None
    with threadpool_limits(1):  # tiny arrays: BLAS threads only contend
        for p0 in starts:
            res = minimize(
                _huber_objective, p0, args=(logN, logD, logL, delta), jac=True, method="L-BFGS-B", bounds=BOUNDS,
                options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-12},
            )  # fmt: skip
            if np.all(np.isfinite(res.x)) and (best is None or res.fun < best.fun):
                best = res
    a, b, e, alpha, beta = best.x
    edge = tuple(
        name for name, x, (lo, hi) in zip(("A", "B", "E", "alpha", "beta"), best.x, BOUNDS)
        if min(x - lo, hi - x) < 1e-6 * max(1.0, abs(x))
    )  # fmt: skip
    return LossSurface(math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta), float(best.fun), edge)


@dataclass(frozen=True)
class PowerLaw:
    """y = k · x^(−exponent)."""

    k: float
    exponent: float

    def predict(self, x):
        return self.k * np.power(x, -self.exponent)

    @property
    def scale(self) -> float:
        """x_c of the form y = (x_c / x)^exponent (Kaplan et al. 2020's C_c, N_c, D_c)."""
        return self.k ** (1.0 / self.exponent) if self.exponent else float("nan")


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLaw:
    """Least-squares line through (log x, log y)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or len(np.unique(x)) < 2:
        raise LMForgeError("a power law needs at least 2 points with different x")
    if (x <= 0).any() or (y <= 0).any():
        raise LMForgeError("power-law fits need positive x and y")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return PowerLaw(math.exp(intercept), -float(slope))


def frontier(C: Sequence[float], L: Sequence[float]) -> list[int]:
    """Indices of the compute-efficient runs, by increasing C: those with a lower loss than every cheaper run."""
    out, best = [], math.inf
    for i in sorted(range(len(C)), key=lambda i: (C[i], L[i])):
        if L[i] < best:
            out.append(i)
            best = L[i]
    return out


def bootstrap(
    stat: Callable[[np.ndarray], dict[str, float]],
    n_points: int,
    n_resamples: int = 200,
    *,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[dict[str, tuple[float, float]], int]:
    """Percentile intervals ({name: (low, high)}, resamples that fitted) of `stat(indices)` over `n_resamples`
    draws of n_points indices with replacement; a draw whose fit fails (LMForgeError: too few distinct
    points) is skipped."""
    rng = np.random.default_rng(seed)
    values: dict[str, list[float]] = {}
    ok = 0
    for _ in range(n_resamples):
        idx = rng.integers(0, n_points, n_points)
        try:
            out = stat(idx)
        except LMForgeError:
            continue
        ok += 1
        for k, v in out.items():
            values.setdefault(k, []).append(v)
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    out = {}
    for k, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        v = v[np.isfinite(v)]  # e.g. no compute-optimal point in a resample whose fit has a zero exponent
        if len(v):
            out[k] = tuple(float(x) for x in np.percentile(v, q))
    return out, ok
