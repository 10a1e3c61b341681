"""Scaling-law fits: known exponents recovered from synthetic losses, the closed-form compute optimum, power laws,
the compute frontier and bootstrap intervals."""

import math

import numpy as np
import pytest

from lmforge.errors import LMForgeError
from lmforge.experiments.scaling import (
    LossSurface,
    bootstrap,
    fit_loss_surface,
    fit_power_law,
    frontier,
)

CHINCHILLA = LossSurface(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)  # Hoffmann et al. 2022 eq. 10
STEEP = LossSurface(E=2.0, A=800.0, B=900.0, alpha=0.5, beta=0.36)  # both terms ~1 nat at the smallest N, D


def grid(law: LossSurface, noise: float, seed: int = 0):
    """Losses of 6 model sizes × 5 token budgets under `law`, times exp(N(0, noise²))."""
    N, D = (x.ravel() for x in np.meshgrid(np.geomspace(1e6, 3e8, 6), np.geomspace(2e8, 2e10, 5)))
    L = law.predict(N, D) * np.exp(np.random.default_rng(seed).normal(0.0, noise, N.shape))
    return N, D, L


@pytest.mark.parametrize("law", [CHINCHILLA, STEEP])
def test_exact_losses_give_back_the_law(law):
    fit = fit_loss_surface(*grid(law, 0.0), top_k=16)
    for k in ("E", "A", "B", "alpha", "beta"):
        assert getattr(fit, k) == pytest.approx(getattr(law, k), rel=1e-4), k


@pytest.mark.parametrize("law", [CHINCHILLA, STEEP])
@pytest.mark.parametrize("seed", [0, 1])
def test_noisy_losses_recover_the_exponents_within_0_05(law, seed):
    fit = fit_loss_surface(*grid(law, 0.01, seed))  # 1% multiplicative noise
    assert abs(fit.alpha - law.alpha) < 0.05 and abs(fit.beta - law.beta) < 0.05
    assert abs(fit.a - law.a) < 0.05 and abs(fit.b - law.b) < 0.05


def test_compute_optimum_is_the_closed_form_minimum_on_the_isoflop_curve():
    law = CHINCHILLA
    assert law.a == pytest.approx(0.28 / 0.62) and law.a + law.b == pytest.approx(1.0)
    for C in (1e18, 5.76e23):  # 5.76e23: Chinchilla's own budget
        N, D = law.optimal(C)
        assert 6 * N * D == pytest.approx(C)
        ns = N * np.geomspace(0.5, 2.0, 201)
        losses = law.predict(ns, C / (6 * ns))  # along C = 6ND
        assert ns[np.argmin(losses)] == pytest.approx(N, rel=0.01)
    # Chinchilla's budget: about 40B parameters for its fitted law (Hoffmann et al. Table 3, approach 3).
    assert 3e10 < law.optimal(5.76e23)[0] < 5e10


def test_power_law_and_frontier():
    C = np.array([1e15, 2e15, 4e15, 8e15, 3e15])
    L = 3.0 * C**-0.05
    L[4] = L[4] * 1.1  # a run worse than a cheaper one: off the frontier
    assert frontier(C, L) == [0, 1, 2, 3]
    law = fit_power_law(C[:4], L[:4])
    assert law.exponent == pytest.approx(0.05) and law.k == pytest.approx(3.0)
    assert law.predict(1e16) == pytest.approx(3.0 * 1e16**-0.05)
    assert law.scale == pytest.approx(3.0 ** (1 / 0.05))  # L = (C_c / C)^γ


def intervals(noise: float, level: float):
    N, D, L = grid(STEEP, noise)
    full = fit_loss_surface(N, D, L, top_k=8)
    start = [math.log(full.A), math.log(full.B), math.log(full.E), full.alpha, full.beta]

    def stat(idx):
        f = fit_loss_surface(N[idx], D[idx], L[idx], top_k=2, extra_starts=[start])
        return {"alpha": f.alpha, "beta": f.beta}

    return full, *bootstrap(stat, len(N), 20, level=level, seed=0)


def test_bootstrap_intervals_hold_the_estimate_and_narrow_with_less_noise():
    full, noisy, ok = intervals(0.02, 0.95)
    _, inner, _ = intervals(0.02, 0.5)
    _, clean, _ = intervals(0.002, 0.95)
    assert ok == 20
    for k in ("alpha", "beta"):
        lo, hi = noisy[k]
        assert lo <= getattr(full, k) <= hi and lo - 0.05 < getattr(STEEP, k) < hi + 0.05
        assert lo <= inner[k][0] <= inner[k][1] <= hi  # a 50% interval inside the 95% one
        assert clean[k][1] - clean[k][0] < (hi - lo) / 3  # 10× less noise: a much narrower interval


def test_bad_inputs_are_one_line_errors():
    N, D, L = grid(CHINCHILLA, 0.0)
    with pytest.raises(LMForgeError, match="at least 5 runs"):
        fit_loss_surface(N[:4], D[:4], L[:4])
    with pytest.raises(LMForgeError, match="at least 2 model sizes and 2 token counts"):
        fit_loss_surface(np.full(6, 1e6), D[:6], L[:6])
    with pytest.raises(LMForgeError, match="positive and finite"):
        fit_loss_surface(N, D, np.where(np.arange(len(L)) == 3, math.nan, L))


def test_a_fit_without_an_optimum_reports_nan_not_an_error():
    flat = LossSurface(E=2.0, A=1.0, B=5.0, alpha=0.0, beta=0.3)  # loss independent of N
    assert all(math.isnan(x) for x in flat.optimal(1e20))


def test_report_flags_parameters_the_runs_leave_open():
    """The report names the parameters whose bootstrap interval spans more than a factor of 10: none on a clean
    grid of 30 runs, every one on six noisy runs of two sizes."""
    from lmforge.experiments.report import analyse, loose_parameters, render
    from lmforge.experiments.sweep import FitOptions

    def analysed(N, D, L):
        pts = [{"N": n, "D": d, "C": 6 * n * d, "val_loss": loss, "arm": f"r{i}"}
               for i, (n, d, loss) in enumerate(zip(N, D, L))]  # fmt: skip
        return analyse(pts, FitOptions(bootstrap=20, top_k=16))

    assert loose_parameters(analysed(*grid(STEEP, 0.002))) == []
    N, D = np.repeat([1e6, 2e6], 3), np.tile([2e8, 4e8, 8e8], 2)
    few = analysed(N, D, STEEP.predict(N, D) * np.array([1.02, 0.99, 1.01, 0.98, 1.0, 1.01]))
    loose = loose_parameters(few)
    assert loose == ["E", "A", "B", "α", "β"]
    pts = [{"arm": f"r{i}", "N_non_embedding": 1, "N_total": 1, "D": 1, "C": 1.0, "steps": 1, "val_loss": 3.0,
            "val_bpb": None, "seconds": None} for i in range(6)]  # fmt: skip
    report = render("t", {"description": "d", "compute": "6ND"}, pts, few)
    assert f"**Loosely determined: {', '.join(loose)}** (bootstrap intervals wider than a factor of 10)" in report


def test_the_report_sets_each_published_exponent_beside_its_interval():
    """Kaplan's and Chinchilla's exponents against the fit's bootstrap intervals: a value inside, above and below
    its interval is named so, and an interval wider than a factor of 10 leaves the comparison unresolved."""
    from lmforge.experiments.report import against_published, render

    analysis = {"intervals": {"alpha": [0.05, 0.9], "beta": [0.13, 0.278], "compute_exponent": [0.034, 0.082]}}
    got = {(p["exponent"], p["source"][:6]): p["verdict"] for p in against_published(analysis)}
    assert got == {("α", "Kaplan"): "unresolved", ("α", "Hoffma"): "unresolved", ("β", "Kaplan"): "below",
                   ("β", "Hoffma"): "above", ("γ", "Kaplan"): "inside"}  # fmt: skip
    assert against_published({"intervals": {}}) == []
    pts = [{"arm": "r0", "N_non_embedding": 1, "N_total": 1, "D": 1, "C": 1.0, "steps": 1, "val_loss": 3.0,
            "val_bpb": None, "seconds": None}]  # fmt: skip
    report = render("t", {"description": "d", "compute": "6ND"}, pts, analysis)
    assert (
        "| β | Kaplan et al. 2020 | α_D: L(D) with early stopping, eq. 1.2 | 0.095 | [0.13, 0.278] | below |" in report
    )
