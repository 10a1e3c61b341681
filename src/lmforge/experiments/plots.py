"""Figures of experiments, as Matplotlib Figure objects (no pyplot): the scaling-law figure (losses against tokens
per model size with the fitted L(N, D), losses against compute with the frontier's power law, the compute-optimal
N and D), and an experiment's pretraining loss curves and final metrics per arm."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmforge.experiments.scaling import LossSurface, PowerLaw
from lmforge.extras import require

WHAT = "an experiment's figures"


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
    Figure = require("matplotlib.figure", WHAT).Figure
    from matplotlib import colormaps

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
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    lo, hi = ax.get_xlim()
    if hi / lo > 10:  # a power of ten is labelled: labels at 2×, 3×, ... would overlap
        ax.xaxis.set_minor_formatter(NullFormatter())
    if "loss" in ylabel:  # losses span a few tenths: plain numbers read better than powers of ten
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")


def loss_figure(results: list, x: str = "tokens"):
    """Training and validation loss of each pretraining arm against training tokens (or FLOPs, x="flops"): the
    mean over the arm's seeds at each logged step, the seeds' range shaded. None when nothing was logged."""
    Figure = require("matplotlib.figure", WHAT).Figure
    from matplotlib import colormaps

    from lmforge.train.metrics import read_metrics

    arms: dict[str, list] = {}
    for r in results:
        if (Path(r.arm.run_dir) / "metrics.jsonl").is_file():
            arms.setdefault(r.arm.info["arm"], []).append(r.arm)
    if not arms:
        return None
    fig = Figure(figsize=(13, 4.8), dpi=100)
    ax_train, ax_val = fig.subplots(1, 2)
    colors = colormaps["tab10"]
    for n, (name, runs) in enumerate(arms.items()):
        per_step = runs[0].info["flops_per_step" if x == "flops" else "tokens_per_step"]
        logs = [read_metrics(a.run_dir) for a in runs]
        for ax, key in ((ax_train, "loss"), (ax_val, "val_loss")):
            steps, lo, mean, hi = _across_seeds(logs, key)
            if not steps:
                continue
            xs = np.asarray(steps, dtype=np.float64) * per_step
            ax.plot(xs, mean, color=colors(n % 10), label=name, marker="o" if len(xs) < 30 else None, ms=3)
            if len(runs) > 1:
                ax.fill_between(xs, lo, hi, color=colors(n % 10), alpha=0.2, lw=0)
    label = "training FLOPs" if x == "flops" else "training tokens"
    for ax, title in ((ax_train, "training loss"), (ax_val, "validation loss")):
        ax.set_xlabel(label)
        ax.set_ylabel("loss (nats per predicted token)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _across_seeds(logs: list[list[dict]], key: str) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps every seed logged `key` at, min, mean, max over the seeds)."""
    series = [{r["step"]: r[key] for r in log if r.get(key) is not None} for log in logs]
    steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
    values = np.array([[s[t] for t in steps] for s in series], dtype=np.float64).reshape(len(series), len(steps))
    if not steps:
        return [], [], [], []
    return steps, list(values.min(0)), list(values.mean(0)), list(values.max(0))


def metrics_figure(rows: list, columns: list[str]):
    """One horizontal bar chart per metric column: each arm's mean, its standard deviation as an error bar and
    each run's value as a dot. None when no column has values."""
    Figure = require("matplotlib.figure", WHAT).Figure

    columns = [c for c in columns if any(r.cells.get(c) for r in rows)]
    if not columns:
        return None
    n = len(columns)
    cols = min(n, 3)
    fig = Figure(figsize=(5.2 * cols, 0.5 + (0.35 * len(rows) + 1.2) * -(-n // cols)), dpi=100)
    axes = np.atleast_1d(fig.subplots(-(-n // cols), cols, squeeze=False)).ravel()
    for ax, column in zip(axes, columns):
        names = [r.name for r in rows]
        values = [r.cells.get(column, []) for r in rows]
        means = [float(np.mean(v)) if v else np.nan for v in values]
        stds = [float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for v in values]
        y = np.arange(len(rows))
        ax.barh(y, means, xerr=stds, color="tab:blue", alpha=0.6, capsize=3)
        for i, v in enumerate(values):
            ax.plot(v, [i] * len(v), "k.", ms=4)
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        finite = [m for m in means if np.isfinite(m)]
        if finite and column == "val loss":  # losses differ in their decimals: start the axis near them
            spread = max(finite) - min(finite)
            ax.set_xlim(max(0.0, min(finite) - max(spread, 0.05) * 1.5), max(finite) + max(spread, 0.05) * 1.5)
        ax.set_title(column, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    for ax in axes[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> Path:
    """PNG via a temp file renamed into place, never through a symbolic link."""
    import io

    from lmforge.files import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    write_atomic(path, png.getvalue(), fsync=False)
    return path
