"""`finetune.ensembles` (experiments/spec.py): a fine-tuning arm's runs, `size` seeds at a time, combined into one
model that predicts the label of highest mean probability over the group's runs (a prediction ensemble). Formed
from each run's predictions.json (finetuning/run.py) when the report is written, so it costs no training; each
group is written like a run, as OUT/ensemble/TASK/NAME-sJ/ (eval.json, eval_test.json, predictions.json), and is a
row of the report with one seed per group. With `tfidf`, the group's mean is averaged again, with equal weight, with
the probabilities of the task's tf-idf + logistic regression (the report's baseline, eval/baselines.py: n-gram range
and C chosen on dev), fitted on the same training split: a bag of words stacked onto the fine-tunes. The report also
forms the ensemble from every group of `size` of the arm's finished runs (`spread`), to show how much its figure
depends on which seeds were grouped."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import LOG_FILE, Arm, ArmResult, of_stage
from lmforge.experiments.spec import EnsembleSpec, Experiment
from lmforge.experiments.tfidf import tfidf_predictions
from lmforge.files import loads_json, write_atomic
from lmforge.finetuning.run import PREDICTIONS


def ensemble_results(exp: Experiment, results: list[ArmResult]) -> list[ArmResult]:
    """One result per ensemble, task and group of seeds whose member runs were part of this invocation: finished
    with its scores when every member finished, else failed with the reason (in its arm.log too)."""
    runs = {(r.arm.info["task"], r.arm.info["arm"], r.arm.info["seed"]): r for r in of_stage(results, "finetune")}
    tfidf = _TfidfCache()  # fitted already where the runner's fit_in_background reached the task
    out = []
    for ens in exp.ensembles:
        for task in (t.name for t in exp.tasks):
            for j, seeds in enumerate(exp.seed_groups(ens)):
                members = [runs.get((task, ens.arm, s)) for s in seeds]
                if all(m is None for m in members):
                    continue  # not run here (another task's intermediate arm, or left out by --only)
                out.append(_group(exp, ens, task, j, seeds, members, tfidf))
    return out


class _TfidfCache(dict):
    """Each task's tf-idf + LR predictions, fitted once (from the first run dir asked with) and kept: {task: dict}."""

    def of(self, task: str, run_dir: Path) -> dict:
        if task not in self:
            self[task] = tfidf_predictions(run_dir)
        return self[task]


def _group(
    exp: Experiment, ens: EnsembleSpec, task: str, j: int, seeds: list[int], members: list, tfidf: _TfidfCache
) -> ArmResult:
    run_dir = exp.out / "ensemble" / task / f"{ens.name}-s{j}"
    first = next(m for m in members if m is not None)
    info = {k: first.arm.info.get(k) for k in ("task", "recipe", "init", "init_arm", "pretrain_run", "via")}
    info |= {"stage": "finetune", "arm": ens.name, "seed": j, "ensemble_of": ens.arm, "seeds": seeds}
    arm = Arm(f"ensemble/{task}/{ens.name}-s{j}", run_dir, first.arm.recipe, {}, None, info, "finetune")
    try:
        missing = [f"{ens.arm}-s{s}" for s, m in zip(seeds, members) if m is None or m.final is None]
        if missing:
            raise LMForgeError(f"needs the fine-tunes {', '.join(missing)} of {task}, which did not finish")
        dirs = [Path(m.arm.run_dir) for m in members]
        final = combine(dirs, run_dir, tfidf.of(task, dirs[0]) if ens.tfidf else None)
    except LMForgeError as e:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / LOG_FILE, f"ensemble {ens.name} of {task}: {e}\n")
        return ArmResult(arm, "failed", error=str(e))
    return ArmResult(arm, "finished", final)


MAX_GROUPS = 1000
"""`spread` forms every group up to this many, else this many drawn at random (seeded)."""


def spread(exp: Experiment, results: list[ArmResult], metric: str | None = None) -> list[dict]:
    """Per ensemble and task: `metric` (default: the runs' first) ×100 on dev and test of the ensemble of every group
    of `size` of its arm's finished runs there; tasks with fewer runs than `size`, or without predictions, are left
    out."""
    runs: dict[tuple[str, str], list[Path]] = {}
    for r in of_stage(results, "finetune"):
        if r.final is not None:
            runs.setdefault((r.arm.info["task"], r.arm.info["arm"]), []).append(Path(r.arm.run_dir))
    out = []
    tfidf = _TfidfCache()
    for ens in exp.ensembles:
        for task in (t.name for t in exp.tasks):
            dirs = runs.get((task, ens.arm), [])
            if len(dirs) < ens.size:
                continue
            try:
                preds = [_read(d / PREDICTIONS) for d in dirs]
                extra = _aligned(preds[0], tfidf.of(task, dirs[0]), dirs[0]) if ens.tfidf else {}
            except LMForgeError:
                continue
            key = metric if metric in preds[0]["metrics"] else preds[0]["metrics"][0]
            n = math.comb(len(dirs), ens.size)
            if n <= MAX_GROUPS:
                groups = list(itertools.combinations(range(len(dirs)), ens.size))
            else:
                rng = random.Random(0)
                groups = [tuple(sorted(rng.sample(range(len(dirs)), ens.size))) for _ in range(MAX_GROUPS)]
            row: dict = {"ensemble": ens.name, "task": task, "runs": len(dirs), "size": ens.size, "groups": len(groups),
                         "every": n <= MAX_GROUPS, "metric": key}  # fmt: skip
            for split in (s for s in ("dev", "test") if all(s in p for p in preds)):
                row[split] = [100 * _scored([preds[i] for i in g], split, extra.get(split))[0][key] for g in groups]
            out.append(row)
    return out


def combine(run_dirs: list[Path], out: Path, tfidf: dict | None = None) -> dict:
    """Average the runs' label probabilities per example (and that mean with `tfidf`'s, tfidf_predictions of the same
    splits, with equal weight), score the labels of highest mean with the runs' metrics, write OUT/eval.json (dev),
    eval_test.json and predictions.json; returns {"dev": ..., "test": ... or None}."""
    preds = [_read(d / PREDICTIONS) for d in run_dirs]
    first = preds[0]
    splits = [s for s in ("dev", "test") if s in first]
    for d, p in zip(run_dirs[1:], preds[1:]):
        if p["labels"] != first["labels"] or [s for s in ("dev", "test") if s in p] != splits:
            raise LMForgeError(f"{d / PREDICTIONS}: its labels or splits differ from {run_dirs[0] / PREDICTIONS}")
    final: dict = {"dev": None, "test": None}
    mean: dict = {"labels": first["labels"], "metrics": first["metrics"], "members": [str(d) for d in run_dirs]}
    extra = _aligned(first, tfidf, run_dirs[0]) if tfidf is not None else {}
    if tfidf is not None:
        mean["members"].append("tf-idf + LR")
    for split in splits:
        for d, p in zip(run_dirs[1:], preds[1:]):
            if p[split]["ids"] != first[split]["ids"] or p[split]["gold"] != first[split]["gold"]:
                raise LMForgeError(f"{d / PREDICTIONS}: its {split} examples differ from {run_dirs[0] / PREDICTIONS}")
        final[split], probs = _scored(preds, split, extra.get(split))
        mean[split] = {"ids": first[split]["ids"], "gold": first[split]["gold"], "probs": probs}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / PREDICTIONS, json.dumps(mean) + "\n")
    if final["test"] is not None:
        write_atomic(out / "eval_test.json", json.dumps(final["test"], indent=2) + "\n")
    write_atomic(out / "eval.json", json.dumps(final["dev"], indent=2) + "\n")
    return final


def _aligned(first: dict, tfidf: dict, run_dir: Path) -> dict[str, list[list[float]]]:
    """`tfidf`'s probabilities per split of `first` (a run's predictions), its columns in `first`'s label order;
    an error unless both hold the same labels and, split by split, the same gold labels in the same order."""
    if sorted(tfidf["labels"]) != sorted(first["labels"]):
        raise LMForgeError(f"{run_dir / PREDICTIONS}: its labels differ from those of the training split's tf-idf fit")
    cols = [tfidf["labels"].index(label) for label in first["labels"]]
    out = {}
    for split in (s for s in ("dev", "test") if s in first):
        gold = [first["labels"][g] for g in first[split]["gold"]]
        if split not in tfidf or gold != [tfidf["labels"][g] for g in tfidf[split]["gold"]]:
            raise LMForgeError(f"{run_dir / PREDICTIONS}: its {split} examples differ from those tf-idf was fitted on")
        out[split] = [[row[c] for c in cols] for row in tfidf[split]["probs"]]
    return out


def _scored(
    preds: list[dict], split: str, extra: list[list[float]] | None = None
) -> tuple[dict[str, float], list[list[float]]]:
    """The metrics of the label of highest mean probability over `preds` on `split` (that mean averaged with `extra`'s
    probabilities, with equal weight, when given), and those probabilities."""
    from lmforge.tasks.scoring import score

    probs = [[sum(col) / len(preds) for col in zip(*rows)] for rows in zip(*(p[split]["probs"] for p in preds))]
    if extra is not None:
        probs = [[(a + b) / 2 for a, b in zip(mine, theirs)] for mine, theirs in zip(probs, extra)]
    labels = [max(range(len(x)), key=x.__getitem__) for x in probs]
    return score(preds[0]["metrics"], labels, preds[0][split]["gold"]), probs


def _read(path: Path) -> dict:
    if not path.is_file():
        raise LMForgeError(f"{path}: not found (a fine-tune writes it when it finishes a task that chooses a label)")
    try:
        data = loads_json(path.read_text(encoding="utf-8"))
        ok = isinstance(data, dict) and isinstance(data.get("labels"), list) and "dev" in data
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise LMForgeError(f"{path}: not a predictions file (labels, metrics, and per split ids, gold, probs)")
    return data
