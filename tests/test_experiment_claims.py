"""experiments/claims.py: a paper's claim decided by an experiment's seeds: the paired difference with its 95%
interval (Student's t), reproduced / contradicted / unresolved, and an arm at the majority class failed."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from lmforge.errors import LMForgeError
from lmforge.experiments.claims import Claim, decide, decide_all, parse_claims, render
from lmforge.experiments.results import Row

CLAIM = Claim("dyn over static", better="dynamic", worse="static", column="sentiment test accuracy", paper="+0.4")


def by_seed(a: list[float], b: list[float]) -> dict[str, dict[int, float]]:
    return {"dynamic": dict(enumerate(a)), "static": dict(enumerate(b))}


def test_the_interval_is_students_t_over_the_seed_paired_differences():
    a, b = [80.0, 82.0, 81.5, 83.0], [78.0, 79.5, 80.0, 80.5]
    d = [x - y for x, y in zip(a, b)]
    got = decide(CLAIM, by_seed(a, b), majority=50.0)
    half = 3.182 * statistics.stdev(d) / 2  # t(0.975, 3 df) · s / sqrt(4)
    assert got["difference"] == pytest.approx(statistics.fmean(d))
    assert got["ci95"] == pytest.approx([statistics.fmean(d) - half, statistics.fmean(d) + half])
    assert got["verdict"] == "reproduced" and got["seeds"] == [0, 1, 2, 3]


def test_contradicted_unresolved_and_one_seed():
    assert decide(CLAIM, by_seed([70, 71, 70.5], [75, 76, 75.2]), None)["verdict"] == "contradicted"
    got = decide(CLAIM, by_seed([75.8, 74.0, 76.1], [75.0, 75.9, 74.3]), None)
    assert got["verdict"] == "unresolved" and got["detectable"] > abs(got["difference"])
    assert "resolve only differences beyond" in got["why"]
    assert decide(CLAIM, by_seed([80.0], [70.0]), None)["verdict"] == "unresolved"


def test_only_seeds_both_arms_finished_are_paired():
    got = decide(CLAIM, {"dynamic": {0: 80.0, 1: 81.0, 2: 82.0}, "static": {1: 79.0, 2: 80.5}}, None)
    assert got["seeds"] == [1, 2] and got["differences"] == [2.0, 1.5]
    assert decide(CLAIM, {"dynamic": {0: 80.0}}, None)["verdict"] == "not run"


def test_an_arm_at_the_majority_class_is_a_failed_arm_not_a_data_point():
    got = decide(CLAIM, by_seed([53.7, 53.9, 54.1], [60.0, 61.0, 62.0]), majority=53.7)
    assert got["verdict"] == "failed arm" and "dynamic" in got["why"] and "difference" not in got


def test_lower_is_better_flips_the_sign():
    loss = Claim("lower loss", "dynamic", "static", "val loss", lower_is_better=True)
    got = decide(loss, by_seed([4.20, 4.22, 4.21], [4.30, 4.31, 4.33]), None)
    assert got["difference"] == pytest.approx(0.1033, abs=1e-3) and got["verdict"] == "reproduced"
    assert "| +0.103 [+0.065, +0.141] |" in render([got])  # a loss difference keeps the interval's two digits


def test_values_come_from_the_runs_by_arm_and_seed_and_the_report_renders_them():
    def ft(arm, seed, acc):
        info = {"arm": arm, "seed": seed, "task": "sentiment"}
        return SimpleNamespace(final={"test": {"accuracy": acc}}, arm=SimpleNamespace(kind="finetune", info=info))

    results = [ft("dynamic", s, a) for s, a in enumerate((0.80, 0.82, 0.81))]
    results += [ft("static", s, a) for s, a in enumerate((0.78, 0.795, 0.795))]
    majority = Row("majority class", None, seeds=1, cells={"sentiment test accuracy": [52.0]})
    (got,) = decide_all([CLAIM], results, [majority])
    assert got["differences"] == pytest.approx([2.0, 2.5, 1.5]) and got["verdict"] == "reproduced"
    text = render([got])
    assert "| dyn over static | dynamic − static | sentiment test accuracy | +0.4 | +2.00 [" in text
    assert "| 3 | reproduced |" in text


def test_bad_claims_get_one_line():
    arms = {"static", "dynamic"}
    with pytest.raises(LMForgeError, match="no arm 'dinamic'"):
        parse_claims([{"better": "dinamic", "worse": "static", "column": "c"}], arms, "x.yaml")
    with pytest.raises(LMForgeError, match="same arm"):
        parse_claims([{"better": "static", "worse": "static", "column": "c"}], arms, "x.yaml")
    with pytest.raises(LMForgeError, match="unknown key 'better_arm'"):
        parse_claims([{"better_arm": "static", "worse": "dynamic", "column": "c"}], arms, "x.yaml")
    with pytest.raises(LMForgeError, match="'column' must name"):
        parse_claims([{"better": "dynamic", "worse": "static"}], arms, "x.yaml")
    with pytest.raises(LMForgeError, match="expected a list"):
        parse_claims({"better": "dynamic"}, arms, "x.yaml")


def test_an_arm_at_the_columns_chance_level_is_a_failed_arm():
    blimp = Claim("grammar", "dynamic", "static", "blimp accuracy", chance=50.0)
    got = decide(blimp, by_seed([51.4, 50.9, 50.6], [50.7, 50.3, 51.0]), majority=None)
    assert got["verdict"] == "failed arm" and "of chance (50)" in got["why"]
    assert decide(blimp, by_seed([61.4, 60.9, 61.6], [58.7, 58.3, 59.0]), None)["verdict"] == "reproduced"
    with pytest.raises(LMForgeError, match="chance must be a number"):
        parse_claims(
            [{"better": "dynamic", "worse": "static", "column": "c", "chance": "half"}], {"dynamic", "static"}, "x"
        )


def test_a_fine_tune_of_a_pretraining_run_at_its_plateau_is_a_failed_arm():
    """Fine-tunes take their pretraining arm's distance below its unigram plateau: an arm whose pretraining ended
    within LEARNT nats of it (token frequencies learnt, little more) fails the claim, however well it fine-tunes."""

    def run(kind, info, final):
        return SimpleNamespace(final=final, arm=SimpleNamespace(kind=kind, info=info))

    def results(plateau_static: float):
        out = []
        for seed in range(3):
            for arm, plateau in (("dynamic", 6.5), ("static", plateau_static)):
                out.append(run("pretrain", {"arm": arm, "seed": seed}, {"val_loss": 6.0, "val_plateau": plateau}))
                info = {"arm": f"{arm}-ft", "init_arm": arm, "seed": seed, "task": "sentiment"}
                out.append(
                    run("finetune", info, {"test": {"accuracy": (0.80 if arm == "dynamic" else 0.70) + seed / 100}})
                )
        out.append(run("finetune", {"arm": "scratch", "init_arm": None, "seed": 0, "task": "sentiment"},
                       {"test": {"accuracy": 0.6}}))  # fmt: skip
        return out

    ft = Claim("ft", better="dynamic-ft", worse="static-ft", column="sentiment test accuracy")
    pre = Claim("loss", better="dynamic", worse="static", column="val loss", lower_is_better=True)
    (got,) = decide_all([ft], results(6.04), [])  # static ends 0.04 nats below its plateau
    assert (
        got["verdict"] == "failed arm"
        and got["why"] == "pretraining of static-ft (+0.040) ended less than 0.05 nats below its plateau"
    )
    (got,) = decide_all([pre], results(6.04), [])
    assert got["verdict"] == "failed arm" and "static (+0.040)" in got["why"]
    (got,) = decide_all([ft], results(6.2), [])  # 0.2 nats below: learnt
    assert got["verdict"] == "reproduced" and got["differences"] == pytest.approx([10.0] * 3)
    assert "less than 0.05 nats below its unigram plateau in any seed, is a failed arm" in render([got])
    mixed = results(6.2)  # static's seed 1 ends 0.02 below its plateau: its mean (0.14) is not what counts
    next(r for r in mixed if r.arm.info == {"arm": "static", "seed": 1}).final["val_plateau"] = 6.02
    (got,) = decide_all([ft], mixed, [])
    assert got["verdict"] == "failed arm" and "static-ft (+0.020)" in got["why"]
