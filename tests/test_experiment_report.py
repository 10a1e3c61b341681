"""`lmforge experiment`'s report: table rows as mean ± std over seeds, the pretraining-only table with failed runs
named, and `finetune.select`'s choice on dev with a held-out task."""

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from lmforge.config import RECIPES_DIR
from lmforge.data.labelled.readers import load_bundled
from lmforge.experiments.arms import Arm, ArmResult
from lmforge.experiments.claims import Claim, decide_all
from lmforge.experiments.results import Row, baseline_rows, build_rows, fmt, render, summary_json
from lmforge.experiments.spec import ArmSpec, Experiment, FinetuneTask, Selection


def _result(kind, name, info, final, after=()):
    return ArmResult(Arm(name, Path("/r") / name, "x", {}, 5, info, kind, after=list(after)), "finished", final)


def test_table_rows_mean_and_std_over_seeds(tmp_path):
    pre = {"stage": "pretrain", "arm": "gpt", "seed": 0, "params": 1_000_000, "steps": 10, "tokens": 5120,
           "flops": 1e12, "tokens_per_step": 512, "flops_per_step": 1e11}  # fmt: skip
    results = [_result("pretrain", "pretrain/gpt-s0", pre, {"step": 10, "val_loss": 3.5})]
    results.append(_result("eval", "eval/zs/gpt-s0", {"eval": "zs", "arm": "gpt", "seed": 0,
                                                       "pretrain_run": "pretrain/gpt-s0"},
                           {"sentiment": {"accuracy": 0.6}}))  # fmt: skip
    for arm, init, accs in (("pretrained", "gpt", (0.8, 0.7)), ("random-init", None, (0.5, 0.6))):
        for seed, acc in enumerate(accs):
            info = {"stage": "finetune", "task": "s", "arm": arm, "seed": seed, "init": init or "none",
                    "init_arm": init, "pretrain_run": "pretrain/gpt-s0" if init else None}  # fmt: skip
            results.append(_result("finetune", f"finetune/s/{arm}-s{seed}", info,
                                   {"dev": {"accuracy": acc}, "test": {"accuracy": acc - 0.1}}))  # fmt: skip
    rows, columns = build_rows(results)
    assert columns == ["val loss", "zs accuracy", "s dev accuracy", "s test accuracy"]
    assert [(r.name, r.init, r.seeds) for r in rows] == [("pretrained", "gpt", 2), ("random-init", "none", 2)]
    assert rows[0].cells["val loss"] == [3.5] and rows[0].cells["zs accuracy"] == [60.0]
    assert rows[0].cells["s dev accuracy"] == pytest.approx([80.0, 70.0]) and "val loss" not in rows[1].cells
    assert fmt(rows[0].cells["s dev accuracy"], 1) == "75.0 ± 7.1" and fmt([3.5], 4) == "3.5000"
    exp = Experiment(tmp_path / "e.yaml", "", tmp_path, [0], "gpt", {}, [], None, [0, 1], {}, {}, [], [], [])
    table = render(exp, results, "equal steps")
    assert "| pretrained | gpt | 2 | 1M | 10 | 5.12k | 1.00e+12 | 3.5000 | 60.0 | 75.0 ± 7.1 | 65.0 ± 7.1 |" in table
    assert "| random-init | none | 2 | – | – | – | – | – | – | 55.0 ± 7.1 | 45.0 ± 7.1 |" in table
    data = summary_json(exp, results, "equal steps")
    assert data["rows"][1]["values"]["s dev accuracy"]["values"] == pytest.approx([50.0, 60.0])
    json.dumps(data)  # plain JSON


def test_chosen_on_dev_with_a_held_out_task(tmp_path):
    """finetune.select: each task takes the arm with its best mean dev accuracy; the held-out task takes the arm best
    on the other tasks' dev, whatever its own dev says, and only among arms that have them all; an arm missing a seed
    takes no part."""
    dev = {"lo": {"a": (80, 80), "b": (60, 60), "h": (90, 90)}, "hi": {"a": (70, 70), "b": (75, 75), "h": (50, 52)},
           "part": {"h": (99, 99), "b": (99, 99)}, "one-seed": {"a": (99,), "b": (99,), "h": (99,)}}  # fmt: skip
    results = []
    for arm, tasks in dev.items():
        for task, values in tasks.items():
            for seed, v in enumerate(values):
                info = {"stage": "finetune", "task": task, "arm": arm, "seed": seed, "init": "none", "init_arm": None,
                        "pretrain_run": None}  # fmt: skip
                final = {"dev": {"accuracy": v / 100}, "test": {"accuracy": (v - 10 + seed) / 100}}
                results.append(_result("finetune", f"finetune/{task}/{arm}-s{seed}", info, final))
    tasks = [FinetuneTask(t, "sst2-bert") for t in "abh"]
    exp = Experiment(tmp_path / "e.yaml", "", tmp_path, [0], "gpt", {}, [], None, [0, 1], {}, {}, [], tasks, [],
                     Selection("accuracy", ["h"]))  # fmt: skip
    tfidf = Row("tf-idf + LR", None, seeds=1, cells={"a test accuracy": [65.0], "h test accuracy": [30.0]})
    picks = {p["task"]: p for p in summary_json(exp, results, "–", [tfidf])["chosen"]}
    assert {t: p["arm"] for t, p in picks.items()} == {"a": "lo", "b": "part", "h": "hi"}
    assert picks["h"]["held_out"] and picks["h"]["chosen_on"] == ["a", "b"] and picks["h"]["dev"] == 51
    assert picks["h"]["score"] == pytest.approx(72.5)
    assert picks["a"]["test"] == pytest.approx([70.0, 71.0]) and picks["a"]["baselines"] == {"tf-idf + LR": 65.0}
    table = render(exp, results, "–", [tfidf])
    assert "| a | lo | its dev | 80.0 | 70.5 ± 0.7 | – | 65.0 | +5.5 | 0.84 |" in table
    assert "| h (held out) | hi | mean dev over a, b | 51.0 | 41.5 ± 2.1 | – | 30.0 | +11.5 | 0.84 |" in table


def test_chosen_only_among_the_select_arms(tmp_path):
    """finetune.select.arms: the arms outside it are reported but never chosen, even with the better dev."""
    dev = {"linear": {"a": 90, "h": 90}, "prompt": {"a": 70, "h": 60}, "prompt-lo": {"a": 60, "h": 99}}
    results = []
    for arm, tasks in dev.items():
        for task, v in tasks.items():
            info = {"stage": "finetune", "task": task, "arm": arm, "seed": 0, "init": "none", "init_arm": None,
                    "pretrain_run": None}  # fmt: skip
            final = {"dev": {"accuracy": v / 100}, "test": {"accuracy": v / 100}}
            results.append(_result("finetune", f"finetune/{task}/{arm}-s0", info, final))
    tasks = [FinetuneTask(t, "sst2-bert") for t in "ah"]
    exp = Experiment(tmp_path / "e.yaml", "", tmp_path, [0], "gpt", {}, [], None, [0], {}, {}, [], tasks, [],
                     Selection("accuracy", ["h"], ["prompt", "prompt-lo"]))  # fmt: skip
    picks = {p["task"]: p["arm"] for p in summary_json(exp, results, "–")["chosen"]}
    assert picks == {"a": "prompt", "h": "prompt"}
    table = render(exp, results, "–")
    assert "Among prompt, prompt-lo (`finetune.select.arms`)" in table and "| linear |" in table
    exp.selection = Selection("accuracy", ["h"])
    assert {p["task"]: p["arm"] for p in summary_json(exp, results, "–")["chosen"]} == {"a": "linear", "h": "linear"}


def test_pretraining_only_table(tmp_path):
    results = []
    for arm, losses in (("causal", (3.4, 3.6)), ("prefix", (3.0, 3.1))):
        for seed, loss in enumerate(losses):
            info = {"stage": "pretrain", "arm": arm, "seed": seed, "params": 2000, "steps": 8, "tokens": 4096,
                    "flops": 3e9, "tokens_per_step": 512, "flops_per_step": 3.75e8}  # fmt: skip
            results.append(_result("pretrain", f"pretrain/{arm}-s{seed}", info, {"step": 8, "val_loss": loss}))
    results[-1].state, results[-1].final = "failed", None
    exp = Experiment(tmp_path / "p.yaml", "", tmp_path, [0, 1], "gpt", {}, [], None, [0, 1], {}, {}, [], [], [])
    table = render(exp, results, "equal steps, 8 steps an arm")
    assert "| arm | seeds | params | steps | tokens | FLOPs | val loss |" in table  # no init column
    assert "| causal | 2 | 2k | 8 | 4.1k | 3.00e+09 | 3.5000 ± 0.1414 |" in table
    assert "| prefix | 2 | 2k | 8 | 4.1k | 3.00e+09 | 3.0000 |" in table  # the failed seed is left out ...
    assert "**Failed, so missing from the table:** pretrain/prefix-s1 (their arm.log" in table  # ... and named


def test_a_held_out_task_compares_arms_on_the_tasks_they_all_ran_on(tmp_path):
    """An arm with init: TASK/ARM does not run on TASK, so the held-out task leaves TASK out of every arm's basis
    instead of leaving that arm out."""
    dev = {"pre": {"big": 90, "a": 60, "h": 70}, "via": {"a": 80, "h": 60}}
    results = []
    for arm, tasks in dev.items():
        for task, v in tasks.items():
            info = {"stage": "finetune", "task": task, "arm": arm, "seed": 0, "init": "none", "init_arm": None,
                    "pretrain_run": None}  # fmt: skip
            results.append(_result("finetune", f"finetune/{task}/{arm}-s0", info, {"dev": {"accuracy": v / 100}}))
    arms = [ArmSpec("pre", init="none"), ArmSpec("via", init="big/pre")]
    tasks = [FinetuneTask(t, "sst2-bert") for t in ("big", "a", "h")]
    exp = Experiment(tmp_path / "e.yaml", "", tmp_path, [0], "gpt", {}, [], None, [0], {}, {}, arms, tasks, [],
                     Selection("accuracy", ["h"]))  # fmt: skip
    picks = {p["task"]: p for p in summary_json(exp, results, "–")["chosen"]}
    assert picks["h"]["arm"] == "via" and picks["h"]["chosen_on"] == ["a"] and picks["h"]["score"] == 80
    assert picks["big"]["arm"] == "pre" and picks["a"]["arm"] == "via"


def test_text_to_text_fine_tunes_get_the_majority_class_and_its_failed_arms(tmp_path):
    """A text-to-text task with label words chooses a label like a classifier: its report has the majority-class and
    tf-idf rows, and an arm at the majority class is a failed arm (not a data point of a claim)."""
    pytest.importorskip("sklearn")
    recipe = yaml.safe_load((RECIPES_DIR / "finetune" / "sst2-t5.yaml").read_text())
    recipe["data"] |= {"max_train": 64, "max_eval": 32}
    results = []
    for arm in ("learnt", "majority"):
        for seed in (0, 1):
            run = tmp_path / f"{arm}-s{seed}"
            run.mkdir()
            (run / "config.yaml").write_text(yaml.safe_dump(recipe))
            info = {"stage": "finetune", "task": "sentiment", "arm": arm, "seed": seed, "init": "none",
                    "init_arm": None, "pretrain_run": None}  # fmt: skip
            results.append(ArmResult(Arm(f"finetune/sentiment/{arm}-s{seed}", run, "x", {}, 5, info, "finetune"),
                                     "finished", {"dev": {"accuracy": 0.5}, "test": {"accuracy": 0}}))  # fmt: skip
    sets = zip(load_bundled("sentiment").items(), (64, 32, 32))
    split = {k: [e.label for e in ds.examples[:n]] for (k, ds), n in sets}
    top = Counter(split["train"]).most_common(1)[0][0]
    floor = 100 * split["test"].count(top) / 32
    for r in results:  # the learnt arm 20 points above the floor, the other within a point of it
        above = 20 + r.arm.info["seed"] if r.arm.info["arm"] == "learnt" else 0.5
        r.final["test"]["accuracy"] = (floor + above) / 100
    rows = baseline_rows(results)
    assert [row.name for row in rows] == ["majority class", "tf-idf + LR"]
    assert rows[0].cells["sentiment test accuracy"] == [pytest.approx(floor)]
    claim = Claim("learnt > majority", "learnt", "majority", "sentiment test accuracy")
    (got,) = decide_all([claim], results, rows)
    assert got["verdict"] == "failed arm" and "majority within 1 of the majority class" in got["why"]
