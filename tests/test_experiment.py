"""`lmforge experiment`: experiment files (bundled ones included), budgets (equal tokens, equal FLOPs per objective),
grids, seeds across stages, run selection, the runner's dependencies between runs, and bad files as one-line
errors. The results tables are in test_experiment_report.py, the end-to-end runs in test_experiment_cli.py."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmforge.config import RECIPES_DIR
from lmforge.errors import LMForgeError
from lmforge.experiments.arms import Arm, ArmResult, arm_command, arm_final
from lmforge.experiments.experiment import budget_text, select
from lmforge.experiments.plan import plan_experiment
from lmforge.experiments.runner import failure_reason, run_arms
from lmforge.experiments.spec import load_experiment
from lmforge.objectives import OBJECTIVES

BUNDLED = sorted(p.stem for p in (RECIPES_DIR / "experiments").glob("*.yaml"))
TINY = {"pretrain": {"recipe": "gpt", "overrides": {"model.preset": "gpt-tiny", "train.batch_size": 4,
                                                    "train.seq_len": 32, "train.warmup_steps": 1}}}  # fmt: skip


ENS = {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "arms": [{"name": "x", "init": "none"}]}
"""A fine-tuning section for `finetune.ensembles`' cases."""


def write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), **data}, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_experiment_plans(name, gpu_inputs):
    exp = load_experiment(name)
    plan = plan_experiment(exp, make_data=False)
    kinds = {a.kind for a in plan.arms}
    assert "pretrain" in kinds and "finetune" in kinds, name
    assert exp.description and exp.out.parts[:2] == ("runs", "experiments")
    for arm in plan.arms:  # every run a later stage needs is planned before it
        assert all(plan.arms.index(next(a for a in plan.arms if a.name == n)) < plan.arms.index(arm) for n in arm.after)


def test_bundled_tiny_variants_inherit_and_shrink():
    gpu, tiny = load_experiment("t5-architectures"), load_experiment("t5-architectures-tiny")
    assert tiny.description == gpu.description and tiny.tasks == gpu.tasks  # from base:
    half = next(a for a in tiny.arms if a.name == "enc-dec-half")  # one key of a base arm changed, the rest kept
    assert half.overrides == {"objective.style": "span", "model.n_layers": 1, "model.n_decoder_layers": 1}
    assert [a.name for a in tiny.arms] == [a.name for a in gpu.arms]
    assert tiny.overrides["model.preset"] == "t5-v1_1-tiny" and gpu.overrides["model.preset"] == "t5-v1_1-small"


def test_equal_flops_budget_gives_each_objective_its_steps():
    exp = load_experiment("t5-architectures-tiny")
    pre = {a.info["arm"]: a for a in plan_experiment(exp, make_data=False).arms if a.kind == "pretrain"}
    budget = exp.budget.value
    for arm in pre.values():
        per_step = arm.info["flops_per_step"]
        assert abs(arm.max_steps * per_step - budget) <= per_step / 2  # the nearest whole number of steps
        assert arm.info["flops"] == arm.max_steps * per_step
    assert pre["encoder-decoder"].info["objective"] == "t5" and pre["language-model"].info["objective"] == "causal_lm"
    # Half the layers: about twice the steps; the decoder-only LM reads the whole window through every layer.
    assert 1.6 < pre["enc-dec-half"].max_steps / pre["encoder-decoder"].max_steps < 2.0
    assert pre["language-model"].max_steps < pre["encoder-decoder"].max_steps
    from lmforge.experiments.arms import resolve_config

    a = pre["encoder-decoder"]
    cfg = resolve_config(a.recipe, a.overrides)
    assert a.info["flops_per_step"] == OBJECTIVES.get("t5").window_flops(cfg) * cfg.train.batch_size


def test_equal_tokens_budget_and_electra_counts_its_generator():
    pre = [a for a in plan_experiment(load_experiment("roberta-masking-tiny"), False).arms if a.kind == "pretrain"]
    assert {a.max_steps for a in pre} == {60} and {a.info["tokens"] for a in pre} == {30720}
    assert [a.overrides["objective.static"] for a in pre] == [True, True, False, False]
    assert [a.overrides["run.seed"] for a in pre] == [0, 1, 0, 1]
    plan = plan_experiment(load_experiment("electra-vs-mlm-tiny"), False)
    electra = {a.info["arm"]: a for a in plan.arms if a.kind == "pretrain"}
    assert electra["electra"].max_steps < electra["mlm"].max_steps  # the generator's FLOPs count


def test_grid_names_and_arm_keys_over_the_grid(tmp_path):
    data = {**TINY, "budget": {"steps": 5}}
    data["pretrain"] = {**data["pretrain"], "grid": {"train.lr": [0.001, 0.002], "model.position": ["learned", "rope"]},
                        "arms": [{"name": "a"}, {"name": "b", "train.lr": 0.01}]}  # fmt: skip
    exp = load_experiment(write(tmp_path, data))
    names = [a.name for a in exp.arms]
    assert names == [f"{x}-{lr}-{pos}" for x in "ab" for lr in (0.001, 0.002) for pos in ("learned", "rope")]
    assert exp.arms[0].overrides == {"train.lr": 0.001, "model.position": "learned"}
    assert exp.arms[5].overrides["train.lr"] == 0.01  # the arm's own key wins over the grid's
    plan = plan_experiment(exp, make_data=False)
    assert [a.max_steps for a in plan.arms] == [5] * 8
    assert "--model.position=rope" in arm_command(plan.arms[1]) and "--train.max_steps=5" in arm_command(plan.arms[1])


def test_later_stages_pair_seeds_with_pretraining(tmp_path):
    data = {**TINY, "seeds": [0, 1, 2], "finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}]}}
    data["pretrain"] = {**data["pretrain"], "seeds": [0], "arms": ["x"]}
    data["eval"] = [{"name": "zs", "task": "sentiment-zeroshot"}]
    plan = plan_experiment(load_experiment(write(tmp_path, data)), make_data=False)
    ft = [a for a in plan.arms if a.kind == "finetune"]
    assert [a.name for a in ft] == [f"finetune/s/x-s{s}" for s in (0, 1, 2)]
    assert {tuple(a.after) for a in ft} == {("pretrain/x-s0",)}  # one pretrained model, three fine-tuning seeds
    assert [a.overrides["run.seed"] for a in ft] == [0, 1, 2]
    assert ft[0].init == str(tmp_path / "out" / "pretrain" / "x-s0")
    ev = [a for a in plan.arms if a.kind == "eval"]
    assert [a.name for a in ev] == ["eval/zs/x-s0"] and ev[0].tasks == ["sentiment-zeroshot"]
    cmd = arm_command(ev[0])
    assert cmd[3:7] == ["eval", ev[0].init, "--task", "sentiment-zeroshot"] and cmd[-2:] == ["--out", cmd[-1]]
    data["pretrain"]["seeds"] = [0, 1]
    with pytest.raises(LMForgeError, match=r"arm 'x' was pretrained with seeds \[0, 1\], not 2"):
        plan_experiment(load_experiment(write(tmp_path, data)), make_data=False)


def test_finetune_arms_random_init_and_recipe_per_architecture(tmp_path):
    data = {**TINY, "pretrain": {**TINY["pretrain"], "arms": ["gpt"]}}
    data["finetune"] = {
        "tasks": [{"name": "s", "recipe": {"decoder": "sst2-gpt", "encoder": "sst2-bert"}}],
        "arms": {"pre": {"init": "gpt"}, "scratch": {"init": "none", "model.preset": "bert-tiny"}},
    }
    arms = {a.info["arm"]: a for a in plan_experiment(load_experiment(write(tmp_path, data)), False).arms}
    assert arms["pre"].recipe == "sst2-gpt" and arms["scratch"].recipe == "sst2-bert"
    assert arms["scratch"].init == "none" and arms["scratch"].after == []
    assert arm_command(arms["scratch"])[3:7] == ["finetune", "sst2-bert", "--init", "none"]
    data["finetune"]["arms"]["scratch"]["model.preset"] = "t5-tiny"
    with pytest.raises(LMForgeError, match="task s has no recipe for the arm's architecture 'encoder-decoder'"):
        plan_experiment(load_experiment(write(tmp_path, data)), make_data=False)


def test_an_arm_from_another_tasks_fine_tune_runs_after_it_on_the_other_tasks(tmp_path):
    data = {**TINY, "seeds": [0, 1], "pretrain": {**TINY["pretrain"], "arms": ["gpt"]}}
    data["finetune"] = {"tasks": [{"name": t, "recipe": "sst2-gpt"} for t in ("big", "small", "other")],
                        "arms": {"pre": {"init": "gpt"}, "via": {"init": "big/pre", "train.lr": 1e-5}}}  # fmt: skip
    exp = load_experiment(write(tmp_path, data))
    assert [exp.source(a) for a in exp.finetune_arms] == [None, ("big", "pre")]
    ft = {a.name: a for a in plan_experiment(exp, make_data=False).arms if a.kind == "finetune"}
    assert "finetune/big/via-s0" not in ft and len(ft) == 3 * 2 + 2 * 2  # not on its own intermediate task
    out = tmp_path / "out" / "finetune"
    for task in ("small", "other"):
        for seed in (0, 1):
            arm = ft[f"finetune/{task}/via-s{seed}"]
            assert arm.after == [f"finetune/big/pre-s{seed}"] and arm.init == str(out / "big" / f"pre-s{seed}")
            assert arm.overrides["train.lr"] == 1e-5 and arm.info["via"] == "big/pre"
            assert arm.info["init_arm"] == "gpt" and arm.info["pretrain_run"] == f"pretrain/gpt-s{seed}"


@pytest.mark.parametrize(
    ("init", "message"),
    [
        ("s/nope", "init: 's/nope': 'nope' is not a fine-tuning arm (pre, via)"),
        ("s/via", "init: 's/via' starts from another task's fine-tune itself"),
    ],
)
def test_an_intermediate_task_names_an_arm_that_starts_from_pretraining(tmp_path, init, message):
    data = {**TINY, "pretrain": {**TINY["pretrain"], "arms": ["gpt"]}}
    data["finetune"] = {"tasks": [{"name": "s", "recipe": "sst2-gpt"}],
                        "arms": {"pre": {"init": "gpt"}, "via": {"init": init}}}  # fmt: skip
    with pytest.raises(LMForgeError) as e:
        load_experiment(write(tmp_path, data))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seedz": [0]}, "unknown key 'seedz' — did you mean 'seeds'?"),
        ({"budget": {"tokens": -5}}, "budget.tokens: expected a positive number, got -5"),
        ({"budget": {"epochs": 3}}, "budget: expected one of {tokens: N}, {flops: N} or {steps: N}"),
        ({"seeds": [0, 0]}, "seeds: expected a list of distinct integer seeds"),
        ({"pretrain": {**TINY["pretrain"], "arms": [{"name": "a", "run.seed": 3}]}},
         "pretrain.arms: a: run.seed is set by the experiment for each run"),
        ({"pretrain": {**TINY["pretrain"], "arms": ["a", "a"]}}, "two arms are named 'a'"),
        ({"pretrain": {**TINY["pretrain"], "arms": [{"name": "a", "inti": "b"}]}},
         "pretrain.arms: a: unknown key 'inti' — did you mean 'init'?"),
        ({"pretrain": {**TINY["pretrain"], "arms": [{"name": "a/b"}]}}, "arm name 'a/b' must be letters"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": {"decoders": "sst2-gpt"}}]}},
         "recipe: a recipe name, or one per architecture"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "arms": [{"name": "x"}]}},
         "finetune arm 'x' has no init:"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "select": {"held_out": ["t"]}}},
         "finetune.select.held_out: expected names of this experiment's tasks (s), got ['t']"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "select": {"held_out": "s"}}},
         "finetune.select.held_out: every task is held out"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "arms": [{"name": "x", "init": "none"}],
                       "select": {"arms": ["y"]}}},
         "finetune.select.arms: expected names of this experiment's fine-tuning arms (x), got ['y']"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "select": {"metrc": "f1"}}},
         "unknown key 'finetune.select.metrc' — did you mean 'finetune.select.metric'?"),
        ({"seeds": [0, 1, 2, 3], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "y", "size": 2}]}},
         "finetune.ensembles: e: arm: expected one of this experiment's fine-tuning arms (x), got 'y'"),
        ({"seeds": [0, 1, 2, 3], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "x", "size": 3}]}},
         "finetune.ensembles: e: size: expected an integer ≥ 2 that divides the 4 fine-tuning seeds into groups"),
        ({"seeds": [0, 1], "finetune": {**ENS, "ensembles": [{"name": "x", "arm": "x", "size": 2}]}},
         "finetune.ensembles: x: the name is taken by another arm or ensemble"),
        ({"seeds": [0, 1], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "x", "size": 1}]}},
         "finetune.ensembles: e: size: expected an integer ≥ 2 that divides the 2 fine-tuning seeds into groups"),
        ({"seeds": [0, 1], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "x", "size": 1, "tfidf": 1}]}},
         "finetune.ensembles: e: tfidf: expected true or false, got 1"),
        ({"seeds": [0, 1], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "x", "sise": 2}]}},
         "finetune.ensembles: e: unknown key 'sise' — did you mean 'size'?"),
        ({"seeds": [0, 1], "finetune": {**ENS, "ensembles": [{"name": "e", "arm": "x", "size": 2}],
                                        "select": {"arms": ["x", "f"]}}},
         "finetune.select.arms: expected names of this experiment's fine-tuning arms (x, e), got ['x', 'f']"),
    ],
)  # fmt: skip
def test_bad_experiment_files_are_one_line_errors(tmp_path, change, message):
    with pytest.raises(LMForgeError) as e:
        load_experiment(write(tmp_path, {**TINY, **change}))
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pretrain": {**TINY["pretrain"], "arms": [{"name": "a", "train.lrr": 1}]}},
         "pretraining arm a: unknown config key 'train.lrr' — did you mean 'train.lr'?"),
        ({"pretrain": {**TINY["pretrain"], "arms": [{"name": "a", "init": "b"}]}},
         "pretraining arm a: init: 'b' is not a pretraining arm"),
        ({"budget": {"steps": 1}}, "pretraining arm gpt: 1 steps, not more than train.warmup_steps=1"),
        ({"finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt", "overrides": {"task.lm_cof": 0}}]}},
         "fine-tuning arm gpt (s): unknown config key 'task.lm_cof'"),
        ({"eval": [{"name": "e", "task": "sentiment-zeroshot", "arms": ["nope"]}]},
         "eval: e: arms: 'nope' is not a pretraining arm"),
    ],
)  # fmt: skip
def test_bad_runs_fail_before_anything_runs(tmp_path, change, message):
    with pytest.raises(LMForgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_experiment(load_experiment(write(tmp_path, {**TINY, **change})), make_data=False)


def test_a_budget_runs_a_time_budgeted_recipe_for_its_steps(tmp_path):
    data = {"budget": {"steps": 40}, "pretrain": {"recipe": "gpt-fast", "overrides": {"model.preset": "gpt-fast-tiny"}}}
    (arm,) = [a for a in plan_experiment(load_experiment(write(tmp_path, data)), False).arms if a.kind == "pretrain"]
    assert arm.max_steps == 40 and arm.overrides["train.time_budget"] is None
    data["pretrain"]["overrides"]["train.time_budget"] = 60
    with pytest.raises(LMForgeError, match=r"the budget \(equal steps, 40 steps an arm\) fixes its steps"):
        plan_experiment(load_experiment(write(tmp_path, data)), False)


def test_the_report_names_the_budget_that_ends_pretraining(tmp_path):
    assert budget_text(load_experiment(write(tmp_path, TINY))) == "the recipes' train.max_steps"
    timed = {"pretrain": {**TINY["pretrain"], "overrides": {**TINY["pretrain"]["overrides"], "train.time_budget": 90}}}
    assert budget_text(load_experiment(write(tmp_path, timed))) == (
        "90 s of training (train.time_budget), at most the recipes' train.max_steps"
    )


def test_command_line_overrides_reach_their_stage(tmp_path):
    task = {"name": "s", "recipe": "sst2-gpt", "overrides": {"train.epochs": 5, "data.max_train": 100}}
    data = {
        **TINY,
        "finetune": {"tasks": [task], "arms": {"a": {"init": "gpt"}, "b": {"init": "gpt", "train.epochs": 7}}},
    }
    data["pretrain"] = {**data["pretrain"], "budget": {"steps": 9}, "arms": {"gpt": {"train.lr": 0.5}}}
    cli = ["--train.lr=0.01", "--train.batch_size=2", "--finetune.train.epochs=1", "--seeds=3,4", "--budget.steps=4"]
    exp = load_experiment(write(tmp_path, data), cli)
    assert exp.overrides["train.batch_size"] == 2 and exp.finetune_cli == {"train.epochs": 1}
    assert exp.seeds == exp.finetune_seeds == [3, 4] and (exp.budget.kind, exp.budget.value) == ("steps", 4.0)
    plan = plan_experiment(exp, make_data=False)
    pre = plan.arms[0]
    assert pre.max_steps == 4 and pre.overrides["train.lr"] == 0.5  # the arm's own key wins over the command line
    ft = {a.info["arm"]: a.overrides for a in plan.arms if a.kind == "finetune" and a.info["seed"] == 3}
    assert ft["a"]["train.epochs"] == 1 and ft["a"]["data.max_train"] == 100 and ft["b"]["train.epochs"] == 7
    with pytest.raises(LMForgeError, match="--eval.\\*: this experiment has no evaluations"):
        load_experiment(write(tmp_path, data), ["--eval.data.max_eval=3"])


def test_command_line_sets_a_sections_seeds(tmp_path):
    """--pretrain.seeds / --finetune.seeds replace a section's own seeds; --seeds, which those shadow, is refused
    rather than changing nothing."""
    data = {**TINY, "seeds": [0], "finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}], "seeds": [0, 1]}}
    data["pretrain"] = {**data["pretrain"], "seeds": [0]}
    exp = load_experiment(write(tmp_path, data), ["--pretrain.seeds=5", "--finetune.seeds=2,3,4"])
    assert exp.seeds == [5] and exp.finetune_seeds == [2, 3, 4]
    ft = [a for a in plan_experiment(exp, make_data=False).arms if a.kind == "finetune"]
    assert {tuple(a.after) for a in ft} == {("pretrain/gpt-s5",)} and len(ft) == 3
    with pytest.raises(LMForgeError, match=r"^--seeds: this file sets pretrain.seeds and finetune.seeds, which the "
                       r"top-level seeds do not reach; use --pretrain.seeds=0,1 or --finetune.seeds=0,1$"):  # fmt: skip
        load_experiment(write(tmp_path, data), ["--seeds=7"])
    assert load_experiment(write(tmp_path, {**data, "finetune": {"tasks": data["finetune"]["tasks"]}}),
                           ["--seeds=7"]).finetune_seeds == [7]  # fmt: skip
    with pytest.raises(LMForgeError, match=r"^--pretrain.\*: only --pretrain.seeds"):
        load_experiment(write(tmp_path, data), ["--pretrain.train.lr=0.1"])
    with pytest.raises(LMForgeError, match="--finetune.seeds: this experiment has no finetune section"):
        load_experiment(write(tmp_path, TINY), ["--finetune.seeds=1"])


def test_cli_bad_file_is_one_line(tmp_path):
    path = write(tmp_path, {**TINY, "budgett": {"steps": 3}})
    r = subprocess.run([sys.executable, "-m", "lmforge.cli", "experiment", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr == f"error: {path}: unknown key 'budgett' — did you mean 'budget'?\n"


def test_a_second_runner_on_one_experiment_or_sweep_dir_is_refused(tmp_path, capsys):
    """Two runners on one dir would start the same arms twice and each fail on the other's run locks; the second
    is refused before it starts anything, naming the first."""
    from lmforge.checkpoint.rundir import RunLock
    from lmforge.cli import main

    path = write(tmp_path, {**TINY, "budget": {"steps": 3}})
    holder = RunLock(tmp_path / "out")  # held through another open file: flock refuses it as it would a process
    holder.acquire()
    try:
        assert main(["experiment", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: experiment dir {tmp_path / 'out'} is in use by process ")
        assert err.endswith(": wait for it to finish, or choose another --out")
        assert not (tmp_path / "out" / "shared").exists()  # nothing prepared, nothing started
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "sizes": ["gpt-tiny"], "tokens": [256, 512]}))
        assert main(["scaling", str(sweep)]) == 2
        assert capsys.readouterr().err.startswith(f"error: sweep dir {tmp_path / 'out'} is in use by process ")
    finally:
        holder.release()


def test_only_selects_runs_and_what_they_need(tmp_path):
    data = {**TINY, "seeds": [0, 1], "finetune": {"tasks": [{"name": "s", "recipe": "sst2-gpt"}]}}
    data["pretrain"] = {**data["pretrain"], "arms": ["a", {"name": "b", "init": "a"}]}
    plan = plan_experiment(load_experiment(write(tmp_path, data)), make_data=False)
    names = [a.name for a in select(plan, ["finetune/s/b-s1"])]
    assert names == ["pretrain/a-s1", "pretrain/b-s1", "finetune/s/b-s1"]  # b continues a: both are needed
    assert len(select(plan, None)) == len(plan.arms) == 8
    with pytest.raises(LMForgeError, match="--only x: no run matches"):
        select(plan, ["x"])


def test_a_failed_arm_says_its_error_line_or_the_signal_that_killed_it(tmp_path):
    log = tmp_path / "arm.log"
    log.write_text("model gpt-base: 98.03M parameters\nstep 10/2400\n")
    assert failure_reason(log, -9) == "killed by SIGKILL (out of memory? the kernel's OOM killer sends it)"
    assert failure_reason(log, -15) == "killed by SIGTERM"
    assert failure_reason(log, 1) == "step 10/2400"
    log.write_text("model gpt-base\nerror: train.lr: expected a number\nstep 10\n")
    assert failure_reason(log, -9) == "error: train.lr: expected a number"
    assert failure_reason(tmp_path / "missing.log", 2) == "no output"


def test_runner_waits_for_and_skips_after_failed_runs(tmp_path):
    bad = Arm("a", tmp_path / "a", str(tmp_path / "missing.yaml"), {}, 5)
    child = Arm("b", tmp_path / "b", "sst2-gpt", {}, None, kind="finetune", init=str(bad.run_dir), after=["a"])
    grandchild = Arm("c", tmp_path / "c", "sentiment-zeroshot", {}, None, kind="eval", init="x", after=["b"])
    done = Arm("d", tmp_path / "d", "sentiment-zeroshot", {}, None, kind="eval", init="x", tasks=["t"])
    done.run_dir.mkdir()
    (done.run_dir / "results.json").write_text('{"sentiment": {"accuracy": 0.5}}')
    results = run_arms([bad, child, grandchild, done], jobs=2, poll_s=0.1)
    assert [r.state for r in results] == ["failed", "failed", "failed", "skipped"]
    assert results[1].error == "not run: a failed" and results[2].error == "not run: b failed"
    assert not child.run_dir.exists() and not grandchild.run_dir.exists()  # never launched
    with pytest.raises(LMForgeError, match="waits for arms that never run"):
        run_arms([Arm("x", tmp_path / "x", "gpt", {}, 5, after=["y"]), Arm("y", tmp_path / "y", "gpt", {}, 5,
                                                                             after=["x"])])  # fmt: skip


def test_an_arm_that_cannot_start_fails_alone(tmp_path):
    """A run dir that cannot be made (a full disk, here a file in the way) fails that arm with one line; the
    runner does not die, and arms that need it fail without running."""
    (tmp_path / "file").write_text("")
    blocked = Arm("a", tmp_path / "file" / "a", "gpt", {}, 5)
    child = Arm("b", tmp_path / "b", "sst2-gpt", {}, None, kind="finetune", init="x", after=["a"])
    other = Arm("c", tmp_path / "c", str(tmp_path / "missing.yaml"), {}, 5)
    results = run_arms([blocked, child, other], poll_s=0.1)
    assert [r.state for r in results] == ["failed", "failed", "failed"]
    assert results[0].error.startswith("could not start: Not a directory") and "file" in results[0].error
    assert results[1].error == "not run: a failed"
    assert "missing.yaml" in results[2].error  # it ran, in the slot the first one left free


@pytest.mark.slow
def test_sigterm_stops_the_runner_and_its_arms_which_then_resume(tmp_path):
    """A scheduler's SIGTERM to the runner alone: the running arm is stopped too (it saves a checkpoint first, so a
    rerun resumes it) and the runner exits 143 with one line saying how to continue."""
    import os
    import signal
    import threading
    import time

    from lmforge.experiments.arms import has_checkpoint
    from lmforge.train.signals import Stopped

    if threading.current_thread() is not threading.main_thread():  # signal handlers are the main thread's
        pytest.skip("the runner catches SIGTERM only on the main thread")
    over = {"model.preset": "gpt-tiny", "train.log_every": 1, "train.eval_every": 10**6, "train.save_every": 10**6}
    arm = Arm("p", tmp_path / "p", "gpt", over, 10**6)

    def preempt():  # once the arm is training
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "step 3/" not in _text(arm.run_dir / "arm.log"):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=preempt, daemon=True).start()
    with pytest.raises(Stopped) as err:
        run_arms([arm], poll_s=0.1)
    assert err.value.exit_code == 143 and str(err.value).startswith("stopped by SIGTERM: 1 running arm(s) stopped")
    assert "stopped by SIGTERM at step" in _text(arm.run_dir / "arm.log") and has_checkpoint(arm.run_dir)
    assert arm_command(arm)[-1] == "--resume"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""


def test_finished_finetune_and_eval_runs_are_read_back(tmp_path):
    ft = Arm("f", tmp_path / "f", "sst2-gpt", {"train.lr": 0.001}, None, kind="finetune", init="runs/p")
    assert arm_final(ft) is None and arm_command(ft)[-1] == "--train.lr=0.001"
    ft.run_dir.mkdir()
    (ft.run_dir / "eval.json").write_text('{"accuracy": 0.75}')
    assert arm_final(ft) == {"dev": {"accuracy": 0.75}, "test": None}
    (ft.run_dir / "eval_test.json").write_text('{"accuracy": 0.7}')
    assert arm_final(ft)["test"] == {"accuracy": 0.7}
    (ft.run_dir / "checkpoints" / "step_3").mkdir(parents=True)
    assert arm_command(ft)[-1] == "--resume"
    ev = Arm("e", tmp_path / "e", "t", {}, None, kind="eval", init="runs/p", tasks=["t"])
    ev.run_dir.mkdir()
    (ev.run_dir / "results.json").write_text('{"sentiment": {"acc')  # a half-written file is not a result
    assert arm_final(ev) is None


def test_a_pretraining_arm_that_ended_on_its_clock_is_finished(tmp_path):
    """A time-budgeted recipe ends before train.max_steps: its newest checkpoint sits at the budget's last planned
    step. A run stopped early (its checkpoint short of the planned total) is not finished; it resumes."""
    import torch

    arm = Arm("p", tmp_path / "p", "gpt-fast", {}, 2000, {"arm": "p", "steps": 2000, "tokens": 2000 * 512})
    ckpt = arm.run_dir / "checkpoints" / "step_230"
    ckpt.mkdir(parents=True)
    (arm.run_dir / "metrics.jsonl").write_text('{"step": 230, "loss": 3.0}\n{"step": 230, "val_loss": 2.9}\n')
    torch.save({"step": 230, "budget": {"spent": 27.0, "frozen": True, "total": 240}}, ckpt / "train_state.pt")
    assert arm_final(arm) is None and arm_command(arm)[-1] == "--resume"
    torch.save({"step": 230, "budget": {"spent": 27.0, "frozen": True, "total": 230}}, ckpt / "train_state.pt")
    assert arm_final(arm) == {"step": 230, "val_loss": 2.9}
    from lmforge.experiments.results import pretrain_facts

    facts = pretrain_facts([ArmResult(arm, "finished", arm_final(arm))])["p"]
    assert facts["steps"] == 230 and facts["tokens"] == 230 * 512  # the table shows the steps it ran


def test_pretraining_on_several_processes(tmp_path):
    """--pretrain-procs N: each pretraining arm under torch.distributed.run with N processes and 1/N of the global
    batch each; fine-tuning arms unchanged; what cannot be cut is a one-line error."""
    from lmforge.experiments.runner import spread_pretraining

    pre = Arm("pretrain/a-s0", tmp_path / "a", "gpt", {"train.lr": 0.001}, 10, {"batch_size": 8})
    ft = Arm("finetune/t/a-s0", tmp_path / "f", "sst2-gpt", {}, None, {}, "finetune", init=str(tmp_path / "a"))
    spread_pretraining([pre, ft], 2, ["0", "1", "2"])
    cmd = arm_command(pre)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert cmd[5:8] == ["-m", "lmforge.cli", "pretrain"] and cmd[-1] == "--train.batch_size=4"
    assert ft.procs == 1 and "torch.distributed.run" not in arm_command(ft)
    with pytest.raises(LMForgeError, match=r"^pretrain/a-s0: train.batch_size 8 \(the global batch\) does not divide"):
        spread_pretraining([pre], 3, None)
    with pytest.raises(LMForgeError, match=r"^--pretrain-procs 4 needs as many --devices, got 3: 0,1,2$"):
        spread_pretraining([pre], 4, ["0", "1", "2"])
