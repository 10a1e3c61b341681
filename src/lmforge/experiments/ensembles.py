"""`finetune.ensembles` (experiments/spec.py): a fine-tuning arm's runs, `size` seeds at a time, combined into one
model that predicts the label of highest mean probability over the group's runs (a prediction ensemble). Formed
from each run's predictions.json (train/finetune.py) when the report is written, so it costs no training; each
group is written like a run, as OUT/ensemble/TASK/NAME-sJ/ (eval.json, eval_test.json, predictions.json), and is a
row of the report with one seed per group."""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.experiments.runner import LOG_FILE, Arm, ArmResult
from lmforge.experiments.spec import EnsembleSpec, Experiment
from lmforge.files import write_atomic
from lmforge.train.finetune import PREDICTIONS


def ensemble_results(exp: Experiment, results: list[ArmResult]) -> list[ArmResult]:
    """One result per ensemble, task and group of seeds whose member runs were part of this invocation: finished
    with its scores when every member finished, else failed with the reason (in its arm.log too)."""
    runs = {(r.arm.info["task"], r.arm.info["arm"], r.arm.info["seed"]): r for r in results if r.arm.kind == "finetune"}
    out = []
    for ens in exp.ensembles:
        for task in (t.name for t in exp.tasks):
            for j in range(len(exp.finetune_seeds) // ens.size):
                seeds = exp.finetune_seeds[j * ens.size : (j + 1) * ens.size]
                members = [runs.get((task, ens.arm, s)) for s in seeds]
                if all(m is None for m in members):
                    continue  # not run here (another task's intermediate arm, or left out by --only)
                out.append(_group(exp, ens, task, j, seeds, members))
    return out


def _group(exp: Experiment, ens: EnsembleSpec, task: str, j: int, seeds: list[int], members: list) -> ArmResult:
    run_dir = exp.out / "ensemble" / task / f"{ens.name}-s{j}"
    first = next(m for m in members if m is not None)
    info = {k: first.arm.info.get(k) for k in ("task", "recipe", "init", "init_arm", "pretrain_run", "via")}
    info |= {"stage": "finetune", "arm": ens.name, "seed": j, "ensemble_of": ens.arm, "seeds": seeds}
    arm = Arm(f"ensemble/{task}/{ens.name}-s{j}", run_dir, first.arm.recipe, {}, None, info, "finetune")
    try:
        missing = [f"{ens.arm}-s{s}" for s, m in zip(seeds, members) if m is None or m.final is None]
        if missing:
            raise LMForgeError(f"needs the fine-tunes {', '.join(missing)} of {task}, which did not finish")
        final = combine([Path(m.arm.run_dir) for m in members], run_dir)
    except LMForgeError as e:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / LOG_FILE, f"ensemble {ens.name} of {task}: {e}\n")
        return ArmResult(arm, "failed", error=str(e))
    return ArmResult(arm, "finished", final)


def combine(run_dirs: list[Path], out: Path) -> dict:
    """Average the runs' label probabilities per example, score the labels of highest mean with the runs' metrics,
    write OUT/eval.json (dev), eval_test.json and predictions.json; returns {"dev": ..., "test": ... or None}."""
    from lmforge.tasks.scoring import score

    preds = [_read(d / PREDICTIONS) for d in run_dirs]
    first = preds[0]
    splits = [s for s in ("dev", "test") if s in first]
    for d, p in zip(run_dirs[1:], preds[1:]):
        if p["labels"] != first["labels"] or [s for s in ("dev", "test") if s in p] != splits:
            raise LMForgeError(f"{d / PREDICTIONS}: its labels or splits differ from {run_dirs[0] / PREDICTIONS}")
    final: dict = {"dev": None, "test": None}
    mean: dict = {"labels": first["labels"], "metrics": first["metrics"], "members": [str(d) for d in run_dirs]}
    for split in splits:
        for d, p in zip(run_dirs[1:], preds[1:]):
            if p[split]["ids"] != first[split]["ids"] or p[split]["gold"] != first[split]["gold"]:
                raise LMForgeError(f"{d / PREDICTIONS}: its {split} examples differ from {run_dirs[0] / PREDICTIONS}")
        probs = [[sum(col) / len(preds) for col in zip(*rows)] for rows in zip(*(p[split]["probs"] for p in preds))]
        labels = [max(range(len(x)), key=x.__getitem__) for x in probs]
        final[split] = score(first["metrics"], labels, first[split]["gold"])
        mean[split] = {"ids": first[split]["ids"], "gold": first[split]["gold"], "probs": probs}
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / PREDICTIONS, json.dumps(mean) + "\n")
    if final["test"] is not None:
        write_atomic(out / "eval_test.json", json.dumps(final["test"], indent=2) + "\n")
    write_atomic(out / "eval.json", json.dumps(final["dev"], indent=2) + "\n")
    return final


def _read(path: Path) -> dict:
    if not path.is_file():
        raise LMForgeError(f"{path}: not found (a fine-tune writes it when it finishes a task that chooses a label)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ok = isinstance(data, dict) and isinstance(data.get("labels"), list) and "dev" in data
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise LMForgeError(f"{path}: not a predictions file (labels, metrics, and per split ids, gold, probs)")
    return data
