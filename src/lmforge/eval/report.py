"""Evaluation reports: a GLUE-style markdown table with the GLUE score, and results as JSON.

`results` maps task → metric → value, values as the metrics return them (fractions: accuracy 0.873); the table
prints them ×100 with one decimal, as the GLUE leaderboard does. Task and metric names are matched loosely
("SST-2", "sst2"; "acc", "accuracy"; "mcc", "matthews_correlation"). MNLI is given as two tasks, matched
("mnli_m", or plain "mnli") and mismatched ("mnli_mm").

The GLUE score (Wang et al. 2018, §4) is the unweighted average of the per-task scores, where a task with two
metrics (MRPC and QQP F1/accuracy, STS-B Pearson/Spearman) scores the average of the two and MNLI scores the
average of matched and mismatched accuracy; the diagnostic set is not part of it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from lmforge.data.labelled.glue import GLUE_TASKS, task_key
from lmforge.errors import LMForgeError
from lmforge.files import loads_json

Results = dict[str, dict[str, float]]

# Table rows in leaderboard order: (row key, display name, GLUE task key).
_ROWS = [
    ("cola", "CoLA", "cola"),
    ("sst2", "SST-2", "sst2"),
    ("mrpc", "MRPC", "mrpc"),
    ("stsb", "STS-B", "stsb"),
    ("qqp", "QQP", "qqp"),
    ("mnli_m", "MNLI-m", "mnli"),
    ("mnli_mm", "MNLI-mm", "mnli"),
    ("qnli", "QNLI", "qnli"),
    ("rte", "RTE", "rte"),
    ("wnli", "WNLI", "wnli"),
]
_ROW_ALIASES = {"mnli": "mnli_m", "mnlim": "mnli_m", "mnlimatched": "mnli_m", "mnlimm": "mnli_mm"}
_ROW_ALIASES |= {"mnlimismatched": "mnli_mm"}
_METRIC_ALIASES = {
    "acc": "accuracy",
    "matthews": "mcc",
    "matthewscorrelation": "mcc",
    "matthewscorrcoef": "mcc",
    "spearmanr": "spearman",
    "pearsonr": "pearson",
    "f1score": "f1",
}
_METRIC_NAMES = {"mcc": "MCC", "accuracy": "acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}
N_GLUE_TASKS = 9  # MNLI-m and MNLI-mm make one task


def _row_key(task: str) -> str:
    key = task_key(task)
    key = _ROW_ALIASES.get(key, key)
    if key not in {r[0] for r in _ROWS}:
        raise LMForgeError(f"'{task}' is not a GLUE task (known: {', '.join(r[1] for r in _ROWS)})")
    return key


def _normalise(results: Results) -> dict[str, dict[str, float]]:
    """Row key → canonical metric name → value; duplicate tasks or metrics are an error."""
    out: dict[str, dict[str, float]] = {}
    for task, metrics in results.items():
        row = _row_key(task)
        if row in out:
            raise LMForgeError(f"results name GLUE task '{task}' twice")
        out[row] = {}
        for name, value in metrics.items():
            key = task_key(name)
            out[row][_METRIC_ALIASES.get(key, key)] = float(value)
    return out


def _main_scores(row: str, task: str, metrics: dict[str, float]) -> list[float]:
    names = GLUE_TASKS[task].metrics
    missing = [m for m in names if m not in metrics]
    if missing:
        have = ", ".join(sorted(metrics)) or "none"
        raise LMForgeError(f"results for {row}: missing metric '{missing[0]}' (have: {have})")
    return [metrics[m] for m in names]


def glue_score(results: Results) -> float:
    """The GLUE score of the tasks present: mean of per-task scores (two-metric tasks and MNLI-m/mm averaged)."""
    rows = _normalise(results)
    task_scores: dict[str, list[float]] = {}
    for row, _, task in _ROWS:
        if row in rows:
            scores = _main_scores(row, task, rows[row])
            task_scores.setdefault(task, []).append(sum(scores) / len(scores))
    if not task_scores:
        raise LMForgeError("no GLUE results to average")
    return sum(sum(s) / len(s) for s in task_scores.values()) / len(task_scores)


def glue_table(results: Results) -> str:
    """Markdown table: one row per GLUE task present (main metric(s), ×100) and a last row with the GLUE score
    ("Average (k/9 tasks)" when some tasks are missing)."""
    rows = _normalise(results)
    lines = ["| Task | Metric | Score |", "|---|---|---:|"]
    tasks = set()
    for row, display, task in _ROWS:
        if row not in rows:
            continue
        tasks.add(task)
        scores = _main_scores(row, task, rows[row])
        header = "/".join(_METRIC_NAMES[m] for m in GLUE_TASKS[task].metrics)
        lines.append(f"| {display} | {header} | {'/'.join(f'{100 * s:.1f}' for s in scores)} |")
    if not tasks:
        raise LMForgeError("no GLUE results to tabulate")
    label = "GLUE score" if len(tasks) == N_GLUE_TASKS else f"Average ({len(tasks)}/{N_GLUE_TASKS} tasks)"
    lines.append(f"| {label} | | {100 * glue_score(results):.1f} |")
    return "\n".join(lines) + "\n"


def write_results(path: Path | str, results: Results) -> Path:
    """Write `results` (task → metric → value) as JSON, atomically; non-finite values are an error."""
    path = Path(path)
    clean = {}
    for task, metrics in results.items():
        clean[str(task)] = {}
        for name, value in metrics.items():
            value = float(value)
            if not math.isfinite(value):
                raise LMForgeError(f"results for {task}: {name} is {value} (not a finite number)")
            clean[str(task)][str(name)] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def read_results(path: Path | str) -> Results:
    """Results written by `write_results`."""
    path = Path(path)
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LMForgeError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise LMForgeError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise LMForgeError(f"{path}: expected an object of task → {{metric: value}}")
    return data
