"""Fit a finished sweep and write its report: scaling.md (tables), scaling.json (every number) and
plots/scaling.png (experiments/plots.py)."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.errors import LMForgeError
from lmforge.experiments import scaling as S
from lmforge.experiments.arms import ArmResult
from lmforge.experiments.tables import markdown_table, sci, si, write_atomic, write_json

SURFACE_KEYS = ("E", "A", "B", "alpha", "beta", "a", "b")


def points(results: list[ArmResult], params: str, compute: str) -> list[dict[str, Any]]:
    """One record per finished arm: its N (the fit's), D, C, final validation loss and bits per byte."""
    out = []
    for r in results:
        if r.final is None:
            continue
        i = r.arm.info
        N = i["N_non_embedding"] if params == "non_embedding" else i["N_total"]
        C = 6.0 * N * i["D"] if compute == "6ND" else i["flops_per_token"] * i["D"]
        out.append({"arm": r.arm.name, "run_dir": str(r.arm.run_dir), **i, "N": N, "C": C,
                    "val_loss": r.final["val_loss"], "val_bpb": r.final.get("val_bpb"),
                    "seconds": round(r.seconds, 1) if r.state == "finished" else None})  # fmt: skip
    return out


def _surface_stats(s: S.LossSurface, budgets: list[float]) -> dict[str, float]:
    out = {"E": s.E, "A": s.A, "B": s.B, "alpha": s.alpha, "beta": s.beta, "a": s.a, "b": s.b}
    for c in budgets:
        n, d = s.optimal(c)
        out[f"N_opt@{c:.3g}"], out[f"D_opt@{c:.3g}"] = n, d
    return out


def analyse(pts: list[dict[str, Any]], fit) -> dict[str, Any]:
    """The L(N, D) fit, the frontier's L(C) power law, bootstrap intervals and compute-optimal allocations."""
    N, D, L, C = (np.array([p[k] for p in pts], dtype=np.float64) for k in ("N", "D", "val_loss", "C"))
    out: dict[str, Any] = {"n_points": len(pts)}
    front = S.frontier(C, L)
    out["frontier"] = [pts[i]["arm"] for i in front]
    if len(front) >= 2 and len(np.unique(C[front])) >= 2:
        law = S.fit_power_law(C[front], L[front])
        out["compute_law"] = {"k": law.k, "exponent": law.exponent, "C_c": law.scale}
    try:
        surface = S.fit_loss_surface(N, D, L, top_k=fit.top_k)
    except LMForgeError as e:
        out["surface_error"] = str(e)
        return out
    budgets = list(fit.budgets) or [float(C.max()) * m for m in (1, 10, 100)]
    pred = surface.predict(N, D)
    out["surface"] = asdict(surface) | {"a": surface.a, "b": surface.b, "G": surface.G,
                                        "rms_log_residual": float(np.sqrt(np.mean(np.log(pred / L) ** 2)))}  # fmt: skip
    out["optimal"] = []
    for c in budgets:
        n, d = surface.optimal(c)
        out["optimal"].append(
            {"C": c, "N_opt": n, "D_opt": d, "tokens_per_param": d / n, "loss": surface.predict(n, d)}
        )
    if fit.bootstrap:
        start = [math.log(surface.A), math.log(surface.B), math.log(surface.E), surface.alpha, surface.beta]

        def stat(idx: np.ndarray) -> dict[str, float]:
            s = S.fit_loss_surface(N[idx], D[idx], L[idx], top_k=2, extra_starts=[start])
            res = _surface_stats(s, budgets)
            f = S.frontier(C[idx], L[idx])
            if len(np.unique(C[idx][f])) >= 2:
                res["compute_exponent"] = S.fit_power_law(C[idx][f], L[idx][f]).exponent
            return res

        intervals, ok = S.bootstrap(stat, len(pts), fit.bootstrap, level=fit.level, seed=fit.seed)
        out["intervals"], out["bootstrap"] = intervals, {"resamples": fit.bootstrap, "fitted": ok, "level": fit.level}
    return out


LOOSE_FACTOR = 10


def loose_parameters(analysis: dict) -> list[str]:
    """The fit's parameters whose bootstrap interval spans more than LOOSE_FACTOR (hi / lo): the runs leave them
    open, whatever the point estimate says."""
    names = {"alpha": "α", "beta": "β"}
    out = []
    for k in SURFACE_KEYS[:5]:
        lo_hi = analysis.get("intervals", {}).get(k)
        if lo_hi and (lo_hi[0] <= 0 or lo_hi[1] / lo_hi[0] > LOOSE_FACTOR):
            out.append(names.get(k, k))
    return out


PUBLISHED = (  # (our fit's key, symbol, source, their exponent, what theirs measures)
    ("alpha", "α", "Kaplan et al. 2020", 0.076, "α_N: L(N) with data unlimited, eq. 1.1"),
    ("alpha", "α", "Hoffmann et al. 2022", 0.34, "α of approach 3, this fit's form"),
    ("beta", "β", "Kaplan et al. 2020", 0.095, "α_D: L(D) with early stopping, eq. 1.2"),
    ("beta", "β", "Hoffmann et al. 2022", 0.28, "β of approach 3, this fit's form"),
    ("compute_exponent", "γ", "Kaplan et al. 2020", 0.050, "α_C^min: L(C) on the compute frontier, eq. 1.3"),
)


def against_published(analysis: dict) -> list[dict[str, Any]]:
    """Each published exponent beside this fit's bootstrap interval of the same exponent: "inside" the interval,
    "above" or "below" it, or "unresolved" where the interval spans more than LOOSE_FACTOR (it would hold almost any
    published value)."""
    out = []
    for key, symbol, source, theirs, what in PUBLISHED:
        lo_hi = analysis.get("intervals", {}).get(key)
        if not lo_hi:
            continue
        lo, hi = lo_hi
        if lo <= 0 or hi / lo > LOOSE_FACTOR:
            verdict = "unresolved"
        else:
            verdict = "inside" if lo <= theirs <= hi else ("above" if theirs > hi else "below")
        out.append({"key": key, "exponent": symbol, "source": source, "published": theirs, "what": what,
                    "interval": [lo, hi], "verdict": verdict})  # fmt: skip
    return out


def _ci(analysis: dict, key: str, fmt=lambda x: f"{x:.4g}") -> str:
    lo_hi = analysis.get("intervals", {}).get(key)
    return f"[{fmt(lo_hi[0])}, {fmt(lo_hi[1])}]" if lo_hi else "–"


def render(title: str, meta: dict[str, Any], pts: list[dict[str, Any]], analysis: dict[str, Any]) -> str:
    """The markdown report."""
    lines = [f"# {title}\n", f"{meta['description']}\n", "## Runs\n"]
    rows = [[p["arm"], si(p["N_non_embedding"]), si(p["N_total"]), si(p["D"]), sci(p["C"]), p["steps"],
             "–" if p.get("epochs") is None else f"{p['epochs']:.2f}", f"{p['val_loss']:.4f}",
             "–" if p["val_bpb"] is None else f"{p['val_bpb']:.4f}", "–" if p["seconds"] is None else p["seconds"]]
            for p in pts]  # fmt: skip
    heads = ["arm", "N", "N (total)", "D", "C", "steps", "epochs", "val loss", "val bpb", "s"]
    lines.append(markdown_table(heads, rows))
    if "surface" not in analysis:
        lines.append(f"\nNo L(N, D) fit: {analysis.get('surface_error', 'not enough runs')}\n")
    else:
        s = analysis["surface"]
        lines.append("\n## L(N, D) = E + A / N^α + B / D^β (Chinchilla approach 3)\n")
        level = analysis.get("bootstrap", {}).get("level", 0.95)
        rows = [[k if len(k) == 1 else {"alpha": "α", "beta": "β"}[k], f"{s[k]:.4g}", _ci(analysis, k)]
                for k in SURFACE_KEYS]  # fmt: skip
        rows[-2][0], rows[-1][0] = "a = β/(α+β)", "b = α/(α+β)"
        lines.append(markdown_table(["", "estimate", f"{100 * level:.0f}% bootstrap interval"], rows, "lrr"))
        boot = analysis.get("bootstrap")
        note = f"; {boot['fitted']} of {boot['resamples']} bootstrap resamples fitted" if boot else ""
        lines.append(f"\nRMS log residual {s['rms_log_residual']:.4f} over {analysis['n_points']} runs{note}.\n")
        if s["at_bounds"]:
            lines.append(
                f"\n**On the fit's search box: {', '.join(s['at_bounds'])}.** The runs do not determine these "
                "parameters (too few, too small or too short runs to show the curvature of the law).\n"
            )
        wide = loose_parameters(analysis)
        if wide:
            lines.append(
                f"\n**Loosely determined: {', '.join(wide)}** (bootstrap intervals wider than a factor of "
                f"{LOOSE_FACTOR}). More sizes, larger token budgets or seeds narrow them; the allocation below "
                "inherits their width.\n"
            )
        lines.append("\n## Compute-optimal allocation (C = 6ND)\n")
        rows = [[sci(o["C"]), si(o["N_opt"]), _ci(analysis, f"N_opt@{o['C']:.3g}", si), si(o["D_opt"]),
                 _ci(analysis, f"D_opt@{o['C']:.3g}", si), f"{o['tokens_per_param']:.1f}", f"{o['loss']:.4f}"]
                for o in analysis["optimal"]]  # fmt: skip
        lines.append(markdown_table(["C (FLOPs)", "N_opt", "interval", "D_opt", "interval", "D/N", "loss"], rows))
    if "compute_law" in analysis:
        law = analysis["compute_law"]
        lines.append(f"\n## L(C) on the compute frontier ({meta['compute']})\n")
        lines.append(
            f"L(C) = (C_c / C)^γ with γ = {law['exponent']:.4f} {_ci(analysis, 'compute_exponent')}, "
            f"C_c = {law['C_c']:.3g}, over {len(analysis['frontier'])} frontier runs "
            f"({', '.join(analysis['frontier'])}).\n"
        )
    published = against_published(analysis)
    if published:
        lines.append("\n## Against the published exponents\n")
        lines.append("Each published value beside this sweep's bootstrap interval of the same exponent: inside it, "
                     "above or below it, or unresolved where the interval spans more than a factor of "
                     f"{LOOSE_FACTOR}. Kaplan et al. fitted models of up to 1.5B parameters, Hoffmann et al. up to "
                     "16B; their exponents need not hold at this sweep's scale.\n")  # fmt: skip
        rows = [[p["exponent"], p["source"], p["what"], f"{p['published']:g}", _ci(analysis, p["key"]), p["verdict"]]
                for p in published]  # fmt: skip
        heads = ["", "source", "their exponent", "value", "ours", "published value is"]
        lines.append(markdown_table(heads, rows, "lllrrl"))
    lines.append("\n![scaling](plots/scaling.png)\n")
    return "\n".join(lines)


def write_report(out: Path, title: str, meta: dict[str, Any], pts: list[dict[str, Any]], analysis: dict) -> list[Path]:
    """scaling.md, scaling.json and plots/scaling.png in `out`."""
    from lmforge.experiments.plots import save_figure, scaling_figure

    fitted = analysis.get("surface")
    surface = S.LossSurface(*(fitted[k] for k in ("E", "A", "B", "alpha", "beta"))) if fitted else None
    law = analysis.get("compute_law")
    N, D, L, C = ([p[k] for p in pts] for k in ("N", "D", "val_loss", "C"))
    idx = [i for i, p in enumerate(pts) if p["arm"] in set(analysis["frontier"])]
    budgets = [o["C"] for o in analysis.get("optimal", [])]
    fig = scaling_figure(N, D, L, C, surface, law and S.PowerLaw(law["k"], law["exponent"]), idx, budgets)
    return [
        write_atomic(out / "scaling.md", render(title, meta, pts, analysis)),
        write_json(out / "scaling.json", {**meta, "points": pts, **analysis, "published": against_published(analysis)}),
        save_figure(fig, out / "plots" / "scaling.png"),
    ]
