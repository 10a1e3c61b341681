"""An experiment's results: one row per arm (a fine-tuning arm, or a pretraining arm nothing fine-tunes), every
number the mean ± sample standard deviation over the seeds' runs; written as OUT/NAME.md (the table), OUT/NAME.json
(every number, every run) and OUT/plots/NAME-loss.png, NAME-metrics.png (experiments/plots.py), NAME being the
experiment file's name, so that variants of an experiment can share one OUT (and its finished runs)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.experiments import claims
from lmforge.experiments.arms import BELOW_PLATEAU, STAGES, VAL_LOSS, ArmResult, of_stage
from lmforge.experiments.spec import Experiment
from lmforge.experiments.tables import markdown_table, sci, si, write_atomic, write_json


@dataclass
class Row:
    name: str
    pretrained: str | None
    """The pretraining arm the row's pretraining and evaluation columns come from (None: no pretraining)."""
    init: str = ""
    """What the row's fine-tuning starts from, as the table shows it."""
    seeds: int = 0
    cells: dict[str, list[float]] = field(default_factory=dict)
    """Column → one value per run."""


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for one value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(values: list[float], digits: int) -> str:
    if not values:
        return "–"
    m, s = mean_std(values)
    return f"{m:.{digits}f}" + ("" if s is None else f" ± {s:.{digits}f}")


def build_rows(results: list[ArmResult]) -> tuple[list[Row], list[str]]:
    """Rows and the value columns in order: the pretraining validation loss, each evaluation's metrics, each
    fine-tuning task's metrics (dev, then test), task metrics ×100."""
    done = {r.arm.name: r for r in results if r.final is not None}
    rank: dict[str, int] = {}  # column → 0 pretraining, 1 evaluation, 2 fine-tuning (their order in the table)
    rows: dict[str, Row] = {}
    sources: dict[str, set[str]] = {}  # row → the pretraining runs its pretraining columns come from
    seeds: dict[str, set[int]] = {}

    def add(row: Row, column: str, value: float, kind: int) -> None:
        rank.setdefault(column, kind)
        row.cells.setdefault(column, []).append(value)

    for r in of_stage(results, "finetune"):
        i = r.arm.info
        shown = (i["init_arm"] or _short_init(i["init"])) + (f" → {i['via']}" if i.get("via") else "")
        row = rows.setdefault(i["arm"], Row(i["arm"], i["init_arm"], shown))
        seeds.setdefault(row.name, set()).add(i["seed"])
        if i["pretrain_run"]:
            sources.setdefault(row.name, set()).add(i["pretrain_run"])
        for column, value in STAGES["finetune"].cells(i, r.final) if r.final else ():
            add(row, column, value, STAGES["finetune"].rank)
    used = {row.pretrained for row in rows.values()}
    for r in (x for x in of_stage(results, "pretrain") if x.arm.info["arm"] not in used):
        name = r.arm.info["arm"]
        key = name if name not in rows or rows[name].pretrained == name else f"{name} (pretraining)"
        rows.setdefault(key, Row(key, name))
        sources.setdefault(key, set()).add(r.arm.name)
        seeds.setdefault(key, set()).add(r.arm.info["seed"])
    for row in rows.values():
        row.seeds = len(seeds.get(row.name, ()))
        runs = sources.get(row.name, set())
        for name in sorted(runs & set(done)):
            for column, value in STAGES["pretrain"].cells(done[name].arm.info, done[name].final):
                add(row, column, value, STAGES["pretrain"].rank)
        for r in of_stage(done.values(), "eval"):
            if r.arm.info["pretrain_run"] in runs:
                for column, value in STAGES["eval"].cells(r.arm.info, r.final):
                    add(row, column, value, STAGES["eval"].rank)
    columns = sorted(rank, key=lambda c: rank[c])  # stable: first-seen order within each kind
    return list(rows.values()), columns


BASELINES = {"majority": "majority class", "tfidf_lr": "tf-idf + LR"}


def chosen(exp: Experiment, rows: list[Row], baselines: list[Row]) -> list[dict[str, Any]]:
    """`finetune.select`: per task, the fine-tuning row with the best mean dev metric (a held-out task: the best mean
    over the other tasks' dev means), its dev mean, test values and the baselines' test value. Only the rows of
    `select.arms` (when given) with a run of every fine-tuning seed (an ensemble: every group of them) on the tasks
    compared take part. A held-out task compares its arms on the tuned tasks that every one of them runs on (an arm
    with init: TASK/ARM does not run on TASK)."""
    sel = exp.selection
    if sel is None:
        return []
    arms = [r for r in rows if r.name not in {b.name for b in baselines} and (sel.arms is None or r.name in sel.arms)]
    tuned = [t.name for t in exp.tasks if t.name not in sel.held_out]

    def dev(row: Row, task: str) -> float | None:  # over every seed, or None
        values = row.cells.get(f"{task} dev {sel.metric}", [])
        return statistics.fmean(values) if len(values) == exp.seed_count(row.name) else None

    skips = {a.name: src[0] for a in exp.finetune_arms if (src := exp.source(a)) is not None}
    out = []
    for task in (t.name for t in exp.tasks):
        held = task in sel.held_out
        cands = [row for row in arms if dev(row, task) is not None]
        on = [t for t in tuned if all(skips.get(row.name) != t for row in cands)] if held else [task]
        scores = [(statistics.fmean(basis), row) for row in cands if None not in (basis := [dev(row, t) for t in on])]
        if not on or not scores:
            continue
        score, row = max(scores, key=lambda x: x[0])  # the first of equals
        base = {b.name: b.cells[f"{task} test {sel.metric}"][0] for b in baselines
                if f"{task} test {sel.metric}" in b.cells}  # fmt: skip
        out.append({"task": task, "arm": row.name, "held_out": held, "chosen_on": on,
                    "score": score, "dev": dev(row, task), "test": row.cells.get(f"{task} test {sel.metric}", []),
                    "baselines": base})  # fmt: skip
    return out


def render_chosen(picks: list[dict[str, Any]]) -> str:
    """The chosen arms as a table beside the baselines, with the test difference and error ratio to tf-idf + LR."""
    tfidf = BASELINES["tfidf_lr"]
    heads = ["task", "arm", "chosen by", "dev", "test", *BASELINES.values(), f"test − {tfidf}", "errors ×"]
    lines = []
    for p in picks:
        test = statistics.fmean(p["test"]) if p["test"] else None
        ref = p["baselines"].get(tfidf)
        gap = f"{test - ref:+.1f}" if test is not None and ref is not None else "–"
        ratio = f"{(100 - test) / (100 - ref):.2f}" if test is not None and ref is not None and ref < 100 else "–"
        by = f"mean dev over {', '.join(p['chosen_on'])}" if p["held_out"] else "its dev"
        lines.append([p["task"] + (" (held out)" if p["held_out"] else ""), p["arm"], by, f"{p['dev']:.1f}",
                      fmt(p["test"], 1), *(fmt([p["baselines"][b]], 1) if b in p["baselines"] else "–"
                                           for b in BASELINES.values()), gap, ratio])  # fmt: skip
    return markdown_table(heads, lines, "lll" + "r" * (len(heads) - 3))


def baseline_rows(results: list[ArmResult]) -> list[Row]:
    """A row each for the majority class and tf-idf + LR (eval/baselines.py) with the dev and test accuracy of every
    fine-tuned single-text task that chooses a label (a classifier or text-to-text with label words), fitted on the
    training examples its runs used; none without scikit-learn (the `eval` extra)."""
    from lmforge import extras
    from lmforge.eval.baselines import many_baselines
    from lmforge.experiments.tfidf import single_text_classes

    if not extras.available("sklearn"):
        return []
    runs: dict[str, Path] = {}
    for r in of_stage(results, "finetune"):
        if r.final is not None:
            runs.setdefault(r.arm.info["task"], Path(r.arm.run_dir))
    rows = {key: Row(name, None, seeds=1) for key, name in BASELINES.items()}
    sets = {task: splits for task, run_dir in runs.items() if (splits := single_text_classes(run_dir)) is not None}
    for task, result in many_baselines(sets).items():
        for key, got in result.items():
            for split in ("dev", "test"):
                if split in got:
                    rows[key].cells[f"{task} {split} accuracy"] = [100 * got[split]]
    return [row for row in rows.values() if row.cells]


def _short_init(init: str) -> str:
    return init if init == "none" or "/" not in init else Path(init).name


def pretrain_facts(results: list[ArmResult]) -> dict[str, dict[str, Any]]:
    """Pretraining arm → its planned parameters, steps, tokens, FLOPs (and epochs) (the same for every seed); an arm
    that ended on `train.time_budget` before its planned steps: those of its first seed's run, as it ran."""
    out: dict[str, dict[str, Any]] = {}
    for r in of_stage(results, "pretrain"):
        if r.arm.info["arm"] not in out:
            info, step = r.arm.info, (r.final or {}).get("step")
            if isinstance(step, int) and 0 < step < info["steps"]:  # the clock ended it
                scale = step / info["steps"]
                info = {
                    **info,
                    **{k: info[k] * scale for k in ("tokens", "flops", "epochs") if k in info},
                    "steps": step,
                }
            out[info["arm"]] = info
    return out


def render(
    exp: Experiment,
    results: list[ArmResult],
    budget: str,
    baselines: list[Row] = (),
    spreads: list[dict] = (),
    wall_s: float | None = None,
) -> str:
    """The markdown report: the description, the budget (and `wall_s`, the invocation's seconds up to its report),
    the results table (with the baselines' rows), the choice on dev and the ensembles over every group of seeds
    (`ensembles.spread`)."""
    rows, columns = build_rows(results)
    rows += baselines
    facts = pretrain_facts(results)
    has_ft = any(row.init not in ("", row.name) for row in rows)  # an init column only when it says something
    epochs = any("epochs" in f for f in facts.values())
    heads = ["arm"] + (["init"] if has_ft else []) + ["seeds"]
    if facts:
        heads += ["params", "steps", "tokens", "FLOPs"] + (["epochs"] if epochs else [])
    heads += columns
    lines = []
    for row in rows:
        cells: list[Any] = [row.name] + ([row.init or "–"] if has_ft else []) + [row.seeds]
        if facts:
            f = facts.get(row.pretrained or "")
            cells += [si(f["params"]), f["steps"], si(f["tokens"]), sci(f["flops"])] if f else ["–"] * 4
            cells += [f"{f['epochs']:.2f}" if f and "epochs" in f else "–"] if epochs else []
        cells += [fmt(row.cells.get(c, []), 4 if c in (VAL_LOSS, BELOW_PLATEAU) else 1) for c in columns]
        lines.append(cells)
    failed = [r.arm.name for r in results if r.state == "failed"]
    out = [f"# Experiment {exp.name}\n"]
    if exp.description:
        out.append(exp.description + "\n")
    out.append(f"Pretraining budget: {budget}. Mean ± standard deviation over the seeds' runs; task metrics × 100 "
               "(dev, and test where the task has labelled test data); val loss: the pretraining objective's final "
               "validation loss (nats per predicted token; objectives score different tokens, so compare it only "
               "between arms of one objective)" + ("; below plateau: how far it ends below the unigram plateau of "
               "its targets (`lmforge.eval.plateau`), the loss of knowing token frequencies alone"
               if BELOW_PLATEAU in columns else "") + ".\n")  # fmt: skip
    if wall_s is not None:
        out.append(f"Wall time: {wall_s:.0f} s ({wall_s / 60:.1f} min) from this invocation's start to its report: "
                   "the shared tokenizer and corpus, every run it started and the baselines (runs finished by an "
                   "earlier invocation are not counted).\n")  # fmt: skip
    out.append(markdown_table(heads, lines, "l" * (len(heads) - len(columns)) + "r" * len(columns)))
    picks = chosen(exp, rows, list(baselines))
    if picks:
        out.append(f"\n## Chosen on dev ({exp.selection.metric})\n")
        if exp.selection.arms is not None:
            out.append(f"Among {', '.join(exp.selection.arms)} (`finetune.select.arms`); the other arms are not "
                       "chosen.\n")  # fmt: skip
        out.append(render_chosen(picks))
        out.append("\nerrors ×: the chosen arm's test errors over tf-idf + LR's (below 1: fewer).\n")
    if baselines:
        out.append("\nmajority class: the training examples' most frequent label; tf-idf + LR: tf-idf n-grams with "
                   "logistic regression, n-gram range and C chosen on dev (`lmforge.eval.baselines`); both fitted on "
                   "the examples the fine-tunes trained on.\n")  # fmt: skip
    if spreads:
        out.append(render_spread(spreads))
    if exp.claims:
        out.append(claims.render(claims.decide_all(exp.claims, results, list(baselines))))
    if failed:
        out.append(f"\n**Failed, so missing from the table:** {', '.join(failed)} (their arm.log says why).\n")
    out.append(f"\n![loss curves](plots/{exp.name}-loss.png)\n\n![final metrics](plots/{exp.name}-metrics.png)\n")
    return "\n".join(out)


def render_spread(spreads: list[dict]) -> str:
    """Each ensemble's metric over every group of its arm's runs: mean, lowest and highest, dev and test."""
    lines = []
    for s in spreads:
        cells = [f"{statistics.fmean(v):.1f} ({min(v):.1f}–{max(v):.1f})" if (v := s.get(k)) else "–"
                 for k in ("dev", "test")]  # fmt: skip
        groups = f"{s['groups']}" + ("" if s["every"] else " drawn at random")
        lines.append([s["ensemble"], s["task"], f"{s['size']} of {s['runs']}", groups, *cells])
    table = markdown_table(["ensemble", "task", "runs", "ensembles", "dev: mean (min–max)", "test: mean (min–max)"],
                           lines, "llrrrr")  # fmt: skip
    return (f"\n## Ensembles of every group of seeds ({spreads[0]['metric']})\n\nEach ensemble formed from every group "
            "of its size among its arm's finished runs, not only the groups in the table above: how much its figure "
            "depends on which seeds were grouped.\n\n" + table + "\n")  # fmt: skip


def summary_json(
    exp: Experiment, results: list[ArmResult], budget: str, baselines: list[Row] = (), spreads: list[dict] = ()
) -> dict[str, Any]:
    rows, columns = build_rows(results)
    rows += baselines
    facts = pretrain_facts(results)

    def stats(values: list[float]) -> dict[str, Any]:
        m, s = mean_std(values)
        return {"mean": m, "std": s, "n": len(values), "values": values}

    return {
        "experiment": str(exp.path), "description": exp.description, "budget": budget, "columns": columns,
        "rows": [{"arm": r.name, "init": r.init, "pretrained": r.pretrained, "seeds": r.seeds,
                  "pretraining": facts.get(r.pretrained or ""),
                  "values": {c: stats(v) for c, v in r.cells.items() if v}} for r in rows],
        "chosen": chosen(exp, rows, list(baselines)),
        "ensemble_groups": list(spreads),
        "claims": claims.decide_all(exp.claims, results, list(baselines)),
        "runs": [{"name": r.arm.name, "kind": r.arm.kind, "state": r.state, "run_dir": str(r.arm.run_dir),
                  "seconds": round(r.seconds, 1), "error": r.error or None, "info": r.arm.info, "results": r.final}
                 for r in results],
    }  # fmt: skip


def write_report(exp: Experiment, results: list[ArmResult], budget: str, started: float | None = None) -> list[Path]:
    """OUT/NAME.md, OUT/NAME.json, OUT/plots/NAME-loss.png and OUT/plots/NAME-metrics.png; `started`: the
    invocation's time.perf_counter() at its start, for the report's wall time."""
    import time

    from lmforge.experiments.ensembles import spread
    from lmforge.experiments.plots import loss_figure, metrics_figure, save_figure

    baselines = baseline_rows(results)
    spreads = spread(exp, results, exp.selection.metric if exp.selection else None)
    wall = time.perf_counter() - started if started is not None else None
    summary = summary_json(exp, results, budget, baselines, spreads) | {"wall_s": wall and round(wall, 1)}
    paths = [
        write_atomic(exp.out / f"{exp.name}.md", render(exp, results, budget, baselines, spreads, wall)),
        write_json(exp.out / f"{exp.name}.json", summary),
    ]
    x_kind = "tokens" if exp.budget is None else exp.budget.unit.loss_x
    fig = loss_figure(of_stage(results, "pretrain"), x_kind)
    if fig is not None:
        paths.append(save_figure(fig, exp.out / "plots" / f"{exp.name}-loss.png"))
    rows, columns = build_rows(results)
    fig = metrics_figure(rows, columns)
    if fig is not None:
        paths.append(save_figure(fig, exp.out / "plots" / f"{exp.name}-metrics.png"))
    return paths
