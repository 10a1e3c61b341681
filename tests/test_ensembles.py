"""`finetune.ensembles`: groups of a fine-tuning arm's seeds combined by their mean label probabilities, written like
runs, chosen on dev beside the arm with one seed per group, and formed from every group for the report's spread."""

import json
from pathlib import Path

import pytest

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import Arm, ArmResult
from lmforge.experiments.ensembles import combine, ensemble_results, spread
from lmforge.experiments.results import render, summary_json
from lmforge.experiments.spec import ArmSpec, EnsembleSpec, Experiment, FinetuneTask, Selection

GOLD = [0, 1, 1, 0]


def _predictions(run: Path, dev: list[list[float]], test: list[list[float]] | None = None) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    data = {"labels": ["neg", "pos"], "metrics": ["accuracy"]}
    for split, probs in (("dev", dev), ("test", test)):
        if probs is not None:
            data[split] = {"ids": [f"e{i}" for i in range(len(probs))], "gold": GOLD[: len(probs)], "probs": probs}
    (run / "predictions.json").write_text(json.dumps(data))
    return run


def _right(i: int, wrong: int) -> list[float]:
    """Example i's probabilities: 0.7 on its gold label, or 0.6 on the other one when i == wrong."""
    p = 0.4 if i == wrong else 0.7
    return [1 - p, p] if GOLD[i] == 1 else [p, 1 - p]


def test_the_mean_probability_corrects_what_one_run_of_three_gets_wrong(tmp_path):
    # Each run is wrong on a different example (3 of 4 right); the mean is right on all four.
    runs = [_predictions(tmp_path / f"s{k}", [_right(i, k) for i in range(4)], [_right(i, k) for i in range(4)])
            for k in range(3)]  # fmt: skip
    final = combine(runs, tmp_path / "ens")
    assert final == {"dev": {"accuracy": 1.0}, "test": {"accuracy": 1.0}}
    assert json.loads((tmp_path / "ens" / "eval.json").read_text()) == {"accuracy": 1.0}
    assert json.loads((tmp_path / "ens" / "eval_test.json").read_text()) == {"accuracy": 1.0}
    mean = json.loads((tmp_path / "ens" / "predictions.json").read_text())
    assert mean["dev"]["probs"][0] == pytest.approx([0.6, 0.4]) and mean["members"] == [str(r) for r in runs]
    # Two runs that are wrong on the same example stay wrong there together.
    same = [_predictions(tmp_path / f"w{k}", [_right(i, 0) for i in range(4)]) for k in range(2)]
    assert combine(same, tmp_path / "ens2") == {"dev": {"accuracy": 0.75}, "test": None}
    assert not (tmp_path / "ens2" / "eval_test.json").exists()


def test_runs_on_different_examples_or_without_predictions_are_one_line_errors(tmp_path):
    a = _predictions(tmp_path / "a", [_right(i, -1) for i in range(4)])
    b = _predictions(tmp_path / "b", [_right(i, -1) for i in range(3)])
    with pytest.raises(LMForgeError, match="its dev examples differ from") as e:
        combine([a, b], tmp_path / "ens")
    (tmp_path / "c").mkdir()
    with pytest.raises(LMForgeError, match=r"c/predictions.json: not found") as e2:
        combine([a, tmp_path / "c"], tmp_path / "ens")
    assert "\n" not in str(e.value) + str(e2.value)


def _exp(tmp_path: Path, seeds: list[int], size: int) -> Experiment:
    tasks = [FinetuneTask(t, "sst2-bert") for t in ("a", "h")]
    arms = [ArmSpec("single", init="none")]
    select = Selection("accuracy", ["h"], ["single", "ens"])
    return Experiment(tmp_path / "e.yaml", "", tmp_path / "out", [0], "gpt", {}, [], None, seeds, {}, {}, arms, tasks,
                      [], select, [EnsembleSpec("ens", "single", size)])  # fmt: skip


def _runs(tmp_path: Path, seeds: list[int], wrong: dict[int, int], failed: tuple = ()) -> list[ArmResult]:
    """Fine-tunes of arm `single` on tasks a and h; seed s is wrong on example wrong[s] of dev and test."""
    out = []
    for task in ("a", "h"):
        for s in seeds:
            run = tmp_path / "ft" / task / f"single-s{s}"
            probs = [_right(i, wrong[s]) for i in range(4)]
            _predictions(run, probs, probs)
            acc = sum(i != wrong[s] for i in range(4)) / 4
            info = {"stage": "finetune", "task": task, "arm": "single", "seed": s, "init": "none", "init_arm": None,
                    "pretrain_run": None, "recipe": "sst2-bert"}  # fmt: skip
            arm = Arm(f"finetune/{task}/single-s{s}", run, "sst2-bert", {}, None, info, "finetune")
            done = (task, s) not in failed
            final = {"dev": {"accuracy": acc}, "test": {"accuracy": acc}} if done else None
            out.append(ArmResult(arm, "finished" if done else "failed", final))
    return out


def test_ensembles_are_rows_of_the_report_chosen_on_dev_with_one_seed_per_group(tmp_path):
    seeds = [0, 1, 2, 3, 4, 5]
    exp = _exp(tmp_path, seeds, 3)
    results = _runs(tmp_path, seeds, {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1})
    groups = ensemble_results(exp, results)
    assert [(r.arm.name, r.state) for r in groups] == [(f"ensemble/{t}/ens-s{j}", "finished") for t in "ah"
                                                       for j in (0, 1)]  # fmt: skip
    assert [g.final["test"]["accuracy"] for g in groups] == [1.0, 1.0, 1.0, 1.0]
    assert groups[0].arm.info["seeds"] == [0, 1, 2] and groups[1].arm.info["seeds"] == [3, 4, 5]
    assert (exp.out / "ensemble" / "a" / "ens-s1" / "eval_test.json").is_file()
    results += groups
    picks = {p["task"]: p for p in summary_json(exp, results, "–")["chosen"]}
    assert {t: p["arm"] for t, p in picks.items()} == {"a": "ens", "h": "ens"}  # two groups make a full row
    assert picks["a"]["test"] == [100.0, 100.0]
    table = render(exp, results, "–")
    assert "| single | none | 6 |" in table and "| ens | none | 2 |" in table


def test_a_group_with_a_failed_member_fails_and_says_which(tmp_path):
    seeds = [0, 1, 2, 3]
    exp = _exp(tmp_path, seeds, 2)
    results = _runs(tmp_path, seeds, {s: s for s in seeds}, failed=(("h", 3),))
    groups = {r.arm.name: r for r in ensemble_results(exp, results)}
    assert groups["ensemble/h/ens-s0"].state == "finished"
    bad = groups["ensemble/h/ens-s1"]
    assert bad.state == "failed" and bad.error == "needs the fine-tunes single-s3 of h, which did not finish"
    assert "single-s3" in (bad.arm.run_dir / "arm.log").read_text()
    picks = {p["task"]: p["arm"] for p in summary_json(exp, results + list(groups.values()), "–")["chosen"]}
    assert picks == {"a": "ens"}  # on h neither the arm nor its ensemble has every seed: nothing is chosen


def test_spread_forms_the_ensemble_from_every_group_of_seeds(tmp_path):
    seeds = [0, 1, 2, 3]
    exp = _exp(tmp_path, seeds, 2)
    # Seeds 0 and 1 are wrong on the same example (so is their pair); every other pair is right on all four.
    results = _runs(tmp_path, seeds, {0: 0, 1: 0, 2: 2, 3: 3})
    (a, h) = spread(exp, results, "accuracy")
    assert (a["ensemble"], a["task"], a["runs"], a["size"], a["groups"], a["every"]) == ("ens", "a", 4, 2, 6, True)
    assert a["test"] == pytest.approx([75.0] + [100.0] * 5) and a["dev"] == a["test"]  # (0, 1), then the others
    table = render(exp, results, "–", spreads=[a, h])
    assert "## Ensembles of every group of seeds (accuracy)" in table
    assert "| ens | a | 2 of 4 | 6 | 95.8 (75.0–100.0) | 95.8 (75.0–100.0) |" in table
