"""The scaling-law figure: losses against tokens per model size with the fitted L(N, D), losses against compute
with the frontier's power law, and the compute-optimal N and D. Matplotlib Figure objects, no pyplot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmforge.experiments.scaling import LossSurface, PowerLaw


def scaling_figure(
    N: Sequence[float],
    D: Sequence[float],
    L: Sequence[float],
    C: Sequence[float],
    surface: LossSurface | None,
    compute_law: PowerLaw | None,
    frontier_idx: Sequence[int],
    budgets: Sequence[float] = (),
):
    """A 3-panel Figure of the sweep (see the module docstring); `surface`/`compute_law` None: points only."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    N, D, L, C = (np.asarray(x, dtype=np.float64) for x in (N, D, L, C))
    fig = Figure(figsize=(16, 4.8), dpi=100)
    ax_d, ax_c, ax_opt = fig.subplots(1, 3)
    sizes = np.unique(N)
    colors = [colormaps["viridis"](i / max(len(sizes) - 1, 1)) for i in range(len(sizes))]
    d_grid = np.geomspace(D.min() / 1.5, D.max() * 1.5, 100)
    for n, color in zip(sizes, colors):
        m = N == n
        ax_d.scatter(D[m], L[m], color=color, s=25, label=f"N = {n:.3g}", zorder=3)
        if surface is not None:
            ax_d.plot(d_grid, surface.predict(n, d_grid), color=color, lw=1)
    _axes(ax_d, "training tokens D", "final validation loss", "L(N, D) fit per model size")
    ax_d.legend(fontsize=7)

    ax_c.scatter(C, L, c=np.log(N), cmap="viridis", s=25, zorder=3)
    f = list(frontier_idx)
    ax_c.plot(C[f], L[f], "o", mfc="none", mec="red", ms=9, label="frontier")
    if compute_law is not None:
        c_grid = np.geomspace(C.min() / 1.5, C.max() * 10, 100)
        ax_c.plot(c_grid, compute_law.predict(c_grid), "r--", lw=1, label=f"L ∝ C^-{compute_law.exponent:.3f}")
    _axes(ax_c, "training compute C (FLOPs)", "final validation loss", "loss against compute")
    ax_c.legend(fontsize=7)

    if surface is not None:
        c_grid = np.geomspace(C.min() / 10, max([C.max() * 1e3, *budgets]), 100)
        n_opt, d_opt = surface.optimal(c_grid)
        ax_opt.plot(c_grid, n_opt, label=f"N_opt ∝ C^{surface.a:.2f}")
        ax_opt.plot(c_grid, d_opt, label=f"D_opt ∝ C^{surface.b:.2f}")
        for c in budgets:
            ax_opt.plot([c, c], list(surface.optimal(c)), "k.", ms=6)
    ax_opt.scatter(C, N, s=10, color="gray", label="runs (N)")
    ax_opt.legend(fontsize=7)
    _axes(ax_opt, "training compute C (FLOPs)", "parameters N / tokens D", "compute-optimal allocation (C = 6ND)")
    fig.tight_layout()
    return fig


def _axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    from matplotlib.ticker import FormatStrFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    if "loss" in ylabel:  # losses span a few tenths: plain numbers read better than powers of ten
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")


def save_figure(fig, path: Path) -> Path:
    """PNG via a temp file renamed into place."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    return path
