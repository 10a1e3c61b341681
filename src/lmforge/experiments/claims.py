"""A paper's claims, decided by an experiment's seeds. An experiment file's `claims:` names, per claim, the arm the
paper found better, the arm it found worse, the table column that compares them and what the paper reported:

    claims:
      - {name: "Table 1: dynamic >= static", better: dynamic, worse: static, column: sentiment test accuracy,
         paper: "78.7 vs 78.3 SQuAD 2.0 F1"}

The report pairs the two arms' runs by seed (they share the pretraining seed, and so the data order), takes the mean
difference better − worse with its 95% confidence interval (Student's t over the paired differences) and gives a
verdict: *reproduced* when the interval lies above zero, *contradicted* when below, *unresolved* otherwise, with the
smallest difference these seeds could have resolved (the interval's half-width). An arm whose accuracy is within a
point of the majority class (or of the column's `chance:` level, 50 for BLiMP's pairs) learnt nothing: the claim is
then *failed arm*, never a data point; so is an arm whose pretraining ended less than `LEARNT` nats below its
targets' unigram plateau (the report's "below plateau" column) in any of its seeds, which learnt token frequencies
and little more: each seed is a data point of the paired difference, so each must have learnt. A
column where lower is better (a validation loss) takes `lower_is_better: true`."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.eval.plateau import LEARNT

KEYS = ("name", "better", "worse", "column", "paper", "lower_is_better", "chance")
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 29: 2.045}  # fmt: skip
"""Two-sided 95% quantiles of Student's t by degrees of freedom (the next smaller entry's value between them: a wider
interval, never a narrower one; 1.96 beyond 29)."""
MAJORITY_MARGIN = 1.0
"""Points of accuracy above the majority class (or chance) an arm must reach to count as having learnt the task."""


@dataclass(frozen=True)
class Claim:
    name: str
    better: str
    worse: str
    column: str
    paper: str = ""
    lower_is_better: bool = False
    chance: float | None = None


def parse_claims(value: Any, arms: set[str], where: Any) -> list[Claim]:
    """The `claims:` list of an experiment file whose report rows are `arms`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise LMForgeError(f"{where}: claims: expected a list of {{name, better, worse, column, paper}}")
    out = []
    for i, c in enumerate(value):
        if not isinstance(c, dict):
            raise LMForgeError(f"{where}: claims[{i}]: expected a mapping with better, worse and column")
        unknown = sorted(set(c) - set(KEYS))
        if unknown:
            raise LMForgeError(f"{where}: claims[{i}]: unknown key '{unknown[0]}' (known: {', '.join(KEYS)})")
        missing = [k for k in ("better", "worse", "column") if not isinstance(c.get(k), str) or not c.get(k)]
        if missing:
            raise LMForgeError(f"{where}: claims[{i}]: '{missing[0]}' must name an arm or a column")
        if c["better"] == c["worse"]:
            raise LMForgeError(f"{where}: claims[{i}]: better and worse are the same arm '{c['better']}'")
        unknown = [a for a in (c["better"], c["worse"]) if a not in arms]
        if unknown:
            known = ", ".join(sorted(arms)) or "none"
            raise LMForgeError(f"{where}: claims[{i}]: no arm '{unknown[0]}' in this experiment (arms: {known})")
        if not isinstance(c.get("lower_is_better", False), bool):
            raise LMForgeError(f"{where}: claims[{i}]: lower_is_better must be true or false")
        chance = c.get("chance")
        if chance is not None and (isinstance(chance, bool) or not isinstance(chance, (int, float))):
            raise LMForgeError(f"{where}: claims[{i}]: chance must be a number (the column's chance level)")
        name = str(c.get("name") or f"{c['better']} over {c['worse']}")
        out.append(Claim(name, c["better"], c["worse"], c["column"], str(c.get("paper", "")),
                         c.get("lower_is_better", False), None if chance is None else float(chance)))  # fmt: skip
    return out


def t95(df: int) -> float:
    known = [d for d in T95 if d <= df]
    return T95[max(known)] if df <= 29 else 1.96


def decide(
    claim: Claim, by_seed: dict[str, dict[int, float]], majority: float | None, unlearnt: dict[str, float] | None = None
) -> dict[str, Any]:
    """The verdict of one claim from {arm: {seed: value}} of its column, the majority class's value (or None) and
    {arm: nats below its plateau, its least-learnt seed's} of the arms whose pretraining stayed within `LEARNT` of it
    in a seed."""
    floors = [(v, what) for v, what in ((majority, "the majority class"), (claim.chance, "chance")) if v is not None]
    out: dict[str, Any] = {"claim": claim.name, "better": claim.better, "worse": claim.worse,
                           "column": claim.column, "paper": claim.paper}  # fmt: skip
    a, b = by_seed.get(claim.better, {}), by_seed.get(claim.worse, {})
    seeds = sorted(a.keys() & b.keys())
    out["seeds"] = seeds
    if not seeds:
        return out | {"verdict": "not run", "why": "the two arms have no finished seed in common in this column"}
    behind = [f"{arm} ({unlearnt[arm]:+.3f})" for arm in (claim.better, claim.worse) if arm in (unlearnt or {})]
    if behind:
        why = f"pretraining of {', '.join(behind)} ended less than {LEARNT:g} nats below its plateau"
        return out | {"verdict": "failed arm", "why": why}
    if floors:
        floor, what = max(floors)
        failed = [arm for arm, v in ((claim.better, a), (claim.worse, b))
                  if statistics.fmean(v[s] for s in seeds) <= floor + MAJORITY_MARGIN]  # fmt: skip
        if failed:
            return out | {"verdict": "failed arm", "floor": floor,
                          "why": f"{', '.join(failed)} within {MAJORITY_MARGIN:g} of {what} ({floor:g})"}  # fmt: skip
    sign = -1.0 if claim.lower_is_better else 1.0
    diffs = [sign * (a[s] - b[s]) for s in seeds]
    mean = statistics.fmean(diffs)
    out |= {"differences": diffs, "difference": mean}
    if len(diffs) < 2:
        return out | {"verdict": "unresolved", "why": "one seed: no interval"}
    half = t95(len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    out["ci95"] = [mean - half, mean + half]
    if mean - half > 0:
        return out | {"verdict": "reproduced"}
    if mean + half < 0:
        return out | {"verdict": "contradicted"}
    return out | {"verdict": "unresolved", "detectable": half,
                  "why": f"these seeds resolve only differences beyond ±{half:.2g}"}  # fmt: skip


def decimals(half: float) -> int:
    """Decimals that show an interval of half-width `half` to two significant digits (at least 2: accuracy points
    read as +1.23; a loss difference of 0.004 nats as +0.0040)."""
    return max(2, 1 - math.floor(math.log10(half))) if half > 0 else 2


def render(decided: list[dict[str, Any]]) -> str:
    """The report's "Claims" section: one row per claim."""
    from lmforge.experiments.tables import markdown_table

    rows = []
    for d in decided:
        if "difference" in d and "ci95" in d:
            lo, hi = d["ci95"]
            n = decimals((hi - lo) / 2)
            ours = f"{d['difference']:+.{n}f} [{lo:+.{n}f}, {hi:+.{n}f}]"
        elif "difference" in d:
            ours = f"{d['difference']:+.2f}"
        else:
            ours = "–"
        verdict = d["verdict"] + (f" ({d['why']})" if d.get("why") else "")
        rows.append([d["claim"], f"{d['better']} − {d['worse']}", d["column"], d["paper"] or "–", ours,
                     len(d["seeds"]), verdict])  # fmt: skip
    table = markdown_table(["claim", "difference", "column", "paper", "ours: mean [95% CI]", "seeds", "verdict"], rows,
                           "lllllrl")  # fmt: skip
    return ("\n## Claims\n\nEach claim's difference (the better arm's value − the worse arm's; for a loss, worse − "
            "better) paired by seed, with its 95% confidence interval: reproduced when the interval lies above zero, "
            "contradicted below, unresolved across it. An arm within a point of the majority class, or whose "
            f"pretraining ended less than {LEARNT:g} nats below its unigram plateau in any seed, is a failed arm, "
            "not a data point.\n\n" + table)  # fmt: skip


def values_by_seed(results: list, column: str) -> dict[str, dict[int, float]]:
    """{arm: {seed: value}} of one report column over the finished runs (the table's own column names and scale:
    task and evaluation metrics × 100, "val loss" as it is)."""
    from lmforge.experiments.arms import STAGES

    out: dict[str, dict[int, float]] = {}
    for r in results:
        if r.final is None:
            continue
        for name, value in STAGES[r.arm.kind].cells(r.arm.info, r.final):
            if name == column:
                out.setdefault(r.arm.info["arm"], {})[r.arm.info["seed"]] = value
    return out


def decide_all(claims: list[Claim], results: list, baselines: list) -> list[dict[str, Any]]:
    """Every claim's verdict; `baselines` are the report's baseline rows (the majority class among them)."""
    from lmforge.experiments.arms import BELOW_PLATEAU

    majority = next((row for row in baselines if row.name == "majority class"), None)
    below = {arm: min(v.values()) for arm, v in values_by_seed(results, BELOW_PLATEAU).items()}  # least-learnt seed
    # each report arm's pretraining arm: a fine-tune's init_arm (None from random init), else the arm itself
    pretrained = {r.arm.info["arm"]: r.arm.info.get("init_arm", r.arm.info["arm"]) for r in results}
    unlearnt = {arm: below[p] for arm, p in pretrained.items() if p in below and below[p] < LEARNT}
    out = []
    for c in claims:
        floor = (majority.cells.get(c.column) or [None])[0] if majority is not None else None
        out.append(decide(c, values_by_seed(results, c.column), floor, unlearnt))
    return out
