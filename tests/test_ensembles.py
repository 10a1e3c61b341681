"""`finetune.ensembles`: groups of a fine-tuning arm's seeds combined by their mean label probabilities, written like
runs, chosen on dev beside the arm with one seed per group, and formed from every group for the report's spread."""

import json
import threading
from pathlib import Path

import pytest
import yaml

from lmforge.config import RECIPES_DIR
from lmforge.errors import LMForgeError
from lmforge.eval.baselines import many_baselines
from lmforge.experiments.arms import Arm, ArmResult
from lmforge.experiments.ensembles import combine, ensemble_results, spread
from lmforge.experiments.results import render, summary_json
from lmforge.experiments.spec import ArmSpec, EnsembleSpec, Experiment, FinetuneTask, Selection
from lmforge.experiments.tfidf import single_text_classes, tfidf_predictions

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


def _classify_run(tmp_path: Path) -> Path:
    """A fine-tune's run dir (its config alone) of the bundled sentiment set: 64 training, 32 dev, 32 test texts."""
    recipe = yaml.safe_load((RECIPES_DIR / "finetune" / "sst2-bert.yaml").read_text())
    recipe["data"] |= {"max_train": 64, "max_eval": 32}
    run = tmp_path / "ft-s0"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(recipe))
    return run


def test_a_tfidf_ensemble_averages_each_fine_tune_with_the_bag_of_words(tmp_path):
    """`tfidf: true` stacks the report's tf-idf + LR onto the fine-tunes with equal weight: an undecided fine-tune
    (0.5 on each label) leaves the bag of words' choice, a certain one keeps its own; the label order of the two may
    differ."""
    pytest.importorskip("sklearn")
    run = _classify_run(tmp_path)
    tfidf = tfidf_predictions(run)
    splits = single_text_classes(run)
    fit = many_baselines({"": splits})[""]["tfidf_lr"]  # the report's baseline row
    assert sorted(tfidf["labels"]) == tfidf["labels"] and len(tfidf["labels"]) == 2
    for split in ("dev", "test"):
        gold, probs = tfidf[split]["gold"], tfidf[split]["probs"]
        assert [tfidf["labels"][g] for g in gold] == splits[split][1] and len(probs) == 32
        assert all(abs(sum(p) - 1) < 1e-5 for p in probs)
        right = sum(max(range(2), key=p.__getitem__) == g for p, g in zip(probs, gold))
        assert right / 32 == pytest.approx(fit[split])  # its choices are the baseline's
    labels = tfidf["labels"][::-1]  # the fine-tune's own label order
    for name, own in (("unsure", lambda g: [0.5, 0.5]), ("sure", lambda g: [float(g == 0), float(g == 1)])):
        data = {"labels": labels, "metrics": ["accuracy"]}
        for split in ("dev", "test"):
            gold = [labels.index(tfidf["labels"][g]) for g in tfidf[split]["gold"]]
            data[split] = {"ids": [str(i) for i in range(32)], "gold": gold, "probs": [own(g) for g in gold]}
        (run / "predictions.json").write_text(json.dumps(data))
        final = combine([run], tmp_path / name, tfidf)
        mean = json.loads((tmp_path / name / "predictions.json").read_text())
        assert mean["members"] == [str(run), "tf-idf + LR"]
        if name == "unsure":
            assert final == {"dev": {"accuracy": pytest.approx(fit["dev"])},
                             "test": {"accuracy": pytest.approx(fit["test"])}}  # fmt: skip
            assert mean["dev"]["probs"][0] == pytest.approx([(0.5 + p) / 2 for p in tfidf["dev"]["probs"][0][::-1]])
        else:
            assert final == {"dev": {"accuracy": 1.0}, "test": {"accuracy": 1.0}}
    other = {**tfidf, "dev": {**tfidf["dev"], "gold": [1 - g for g in tfidf["dev"]["gold"]]}}
    with pytest.raises(LMForgeError, match="its dev examples differ from those tf-idf was fitted on") as e:
        combine([run], tmp_path / "bad", other)
    assert "\n" not in str(e.value)


def test_a_tfidf_ensemble_of_size_one_is_a_row_per_seed_and_its_spread_stacks_too(tmp_path):
    pytest.importorskip("sklearn")
    run = _classify_run(tmp_path)
    tfidf = tfidf_predictions(run)
    data = {"labels": tfidf["labels"], "metrics": ["accuracy"]}
    for split in ("dev", "test"):
        gold = tfidf[split]["gold"]
        data[split] = {"ids": [str(i) for i in range(32)], "gold": gold, "probs": [[0.5, 0.5] for _ in gold]}
    (run / "predictions.json").write_text(json.dumps(data))
    info = {"stage": "finetune", "task": "s", "arm": "ft", "seed": 0, "init": "none", "init_arm": None,
            "pretrain_run": None, "recipe": "sst2-bert"}  # fmt: skip
    results = [ArmResult(Arm("finetune/s/ft-s0", run, "sst2-bert", {}, None, info, "finetune"), "finished",
                         {"dev": {"accuracy": 0.5}, "test": {"accuracy": 0.5}})]  # fmt: skip
    exp = Experiment(tmp_path / "e.yaml", "", tmp_path / "out", [0], "gpt", {}, [], None, [0], {}, {},
                     [ArmSpec("ft", init="none")], [FinetuneTask("s", "sst2-bert")], [], None,
                     [EnsembleSpec("ft-tfidf", "ft", 1, tfidf=True)])  # fmt: skip
    (got,) = ensemble_results(exp, results)
    fit = many_baselines({"": single_text_classes(run)})[""]["tfidf_lr"]
    assert got.state == "finished" and got.arm.info["seeds"] == [0]
    assert got.final["test"]["accuracy"] == pytest.approx(fit["test"])
    (row,) = spread(exp, results)
    assert row["groups"] == 1 and row["test"] == [pytest.approx(100 * fit["test"])]


def test_the_runner_fits_tfidf_while_the_runs_train_and_the_report_reuses_it(tmp_path, monkeypatch):
    """fit_in_background fits each fine-tuned task's splits (its first arm's config, as its command resolves it) in a
    thread; the report's fit of the same splits, from the run's saved config, then costs nothing. A task that cannot
    be fitted (a set that does not exist) leaves the thread quietly: the report raises its error, in one line."""
    pytest.importorskip("sklearn")
    import lmforge.eval.baselines as eval_baselines
    from lmforge.experiments.tfidf import fit_in_background

    calls = []
    real = eval_baselines._fits
    monkeypatch.setattr(eval_baselines, "_fits", lambda *a: calls.append(a[3]) or real(*a))
    eval_baselines._FITTED.clear()
    over = {"data.max_train": 64, "data.max_eval": 32}
    arms = [Arm("pretrain/pre-s0", tmp_path / "pre", "encoder-fast", {}),
            *(Arm(f"finetune/sentiment/a-s{s}", tmp_path / f"a-s{s}", "sst2-bert", over | {"train.lr": 1e-4 * (s + 1)},
                  info={"task": "sentiment"}, kind="finetune") for s in range(3))]  # fmt: skip
    thread = fit_in_background(arms)
    thread.join()
    assert len(calls) == 3  # one task: its three n-gram ranges, once
    run = _classify_run(tmp_path)  # the same set and limits, as the fine-tune's saved config
    got = many_baselines({"sentiment": single_text_classes(run)})["sentiment"]
    assert len(calls) == 3 and got["tfidf_lr"]["dev"] > 0.5  # found fitted
    assert fit_in_background(arms[:1]) is None  # nothing fine-tuned: no thread
    bad = Arm("finetune/x/a-s0", tmp_path / "x", "sst2-bert", {"data.source": "fetched", "data.name": "no-such-set"},
              info={"task": "x"}, kind="finetune")  # fmt: skip
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    fit_in_background([bad]).join()
    assert escaped == []  # left to the report, which says what is missing in one line
