"""`lmforge experiment EXPERIMENT.yaml`: pretrain a grid of arms at one budget, fine-tune and evaluate each the
same way, and tabulate mean ± std over seeds (experiments/spec.py: the file; plan.py: the runs; results.py: the
table and plots). Every run is an ordinary run dir; a rerun skips finished runs and resumes killed ones."""

from __future__ import annotations

import shlex
import time
from fnmatch import fnmatchcase
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import Arm
from lmforge.experiments.plan import Plan, plan_experiment
from lmforge.experiments.spec import Experiment, load_experiment
from lmforge.experiments.tables import markdown_table, sci, si


def budget_text(exp: Experiment) -> str:
    """The budget as the report states it."""
    own = [f"{a.name} {a.budget.amount()}" for a in exp.arms if a.budget is not None]
    if exp.budget is None:
        default = "the recipes' train.max_steps"
        if exp.overrides.get("train.time_budget") is not None:
            default = f"{exp.overrides['train.time_budget']:g} s of training (train.time_budget), at most {default}"
        text = "per arm: " if len(own) == len(exp.arms) else default + "; "
        return text + ", ".join(own) if own else default
    return exp.budget.describe() + (f" (arms with their own: {', '.join(own)})" if own else "")


def select(plan: Plan, only: list[str] | None) -> list[Arm]:
    """The runs whose names match one of the `only` patterns (globs such as 'finetune/sentiment/*'), with the runs
    they need; all runs when `only` is empty."""
    if not only:
        return plan.arms
    by_name = {a.name: a for a in plan.arms}
    keep = {a.name for a in plan.arms if any(fnmatchcase(a.name, p) for p in only)}
    if not keep:
        raise LMForgeError(f"--only {' '.join(only)}: no run matches (runs are named like {plan.arms[0].name})")
    todo = list(keep)
    while todo:
        for need in by_name[todo.pop()].after:
            if need not in keep:
                keep.add(need)
                todo.append(need)
    return [a for a in plan.arms if a.name in keep]


def cmd_experiment(
    path: str,
    overrides: list[str] | None = None,
    out: str | None = None,
    jobs: int = 1,
    devices: list[str] | None = None,
    dry_run: bool = False,
    only: list[str] | None = None,
    pretrain_procs: int = 1,
) -> dict[str, Any]:
    """Run (or, dry_run, list) an experiment's unfinished runs (`only`: those matching the patterns, and what they
    need), then write OUT/NAME.md, NAME.json and plots/ (results.py); print the table. Returns the JSON summary.
    Failed runs are reported after the table is written. `pretrain_procs` > 1: each pretraining run on that many
    processes (GPUs), one at a time."""
    from lmforge.checkpoint.rundir import RunLock
    from lmforge.experiments.arms import arm_command
    from lmforge.experiments.ensembles import ensemble_results
    from lmforge.experiments.results import summary_json, write_report
    from lmforge.experiments.runner import check_all_finished, run_arms, spread_pretraining
    from lmforge.experiments.tfidf import fit_in_background
    from lmforge.extras import check

    exp = load_experiment(path, overrides, out)
    if dry_run:  # nothing written: the runs as they would run, before any shared tokenizer exists
        arms = select(plan_experiment(exp, make_data=False), only)
        spread_pretraining(arms, pretrain_procs, devices)
        rows = [[a.name, a.kind, ", ".join(a.after) or "–", a.max_steps or "–",
                 si(a.info["tokens"]) if "tokens" in a.info else "–",
                 sci(a.info["flops"]) if "flops" in a.info else "–"] for a in arms]  # fmt: skip
        print(f"{exp.name}: {len(arms)} runs in {exp.out}; pretraining budget: {budget_text(exp)}\n")
        print(markdown_table(["run", "kind", "after", "steps", "tokens", "FLOPs"], rows, "lllrrr"))
        firsts: dict[str, Arm] = {}  # each kind's first arm: pretrain, finetune, eval
        for a in sorted(arms, key=lambda a: ("pretrain", "finetune", "eval").index(a.kind)):
            firsts.setdefault(a.kind, a)
        for first in firsts.values():
            print(shlex.join(arm_command(first)))  # pasteable: a template's spaces stay in one argument
        for e in exp.ensembles:
            groups = " | ".join(map(str, exp.seed_groups(e)))
            stack = " averaged with tf-idf + LR's" if e.tfidf else ""
            print(f"ensemble {e.name}: {e.arm}'s fine-tunes of seeds {groups}, the label of highest mean "
                  f"probability{stack}, formed when the report is written")  # fmt: skip
        return {}
    check("an experiment's figures", "matplotlib")  # now, not after the runs
    started = time.perf_counter()
    lock = RunLock(exp.out, "experiment dir", "--out")  # one runner per experiment dir
    lock.acquire()
    try:
        arms = select(plan_experiment(exp), only)  # trains the shared tokenizer and prepares the shared corpus
        spread_pretraining(arms, pretrain_procs, devices)
        fitting = fit_in_background(arms)  # the report's tf-idf baselines, while the runs train
        results = run_arms(arms, jobs=jobs, devices=devices)
        if fitting is not None:
            fitting.join()
        results += ensemble_results(exp, results)
        paths = write_report(exp, results, budget_text(exp), started)
    finally:
        lock.release()
    text = paths[0].read_text(encoding="utf-8")
    print(text[: text.index("\n![loss curves]")])
    print("report: " + ", ".join(str(p) for p in paths))
    check_all_finished(results)
    return summary_json(exp, results, budget_text(exp))
