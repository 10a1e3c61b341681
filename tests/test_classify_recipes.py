"""The bundled classify experiment files plan the runs their docs describe (docs/classify.md): classify-nodrop,
classify-prompt and classify-ensemble against the classify they change, and `--dry-run`'s command lines for them.
The pipeline end to end at CPU size is in test_experiment_classify.py."""

import shlex

from lmforge.experiments.arms import arm_command
from lmforge.experiments.plan import plan_experiment
from lmforge.experiments.spec import load_experiment


def test_classify_nodrop_pretrains_without_dropout_and_fine_tunes_with_and_without(gpu_inputs):
    """classify-nodrop is classify but for dropout: none in pretraining (cramming), 0.1 or none in the fine-tunes."""
    plan, base = (plan_experiment(load_experiment(n), make_data=False) for n in ("classify-nodrop", "classify"))
    (pre,), (base_pre,) = ([a for a in p.arms if a.kind == "pretrain"] for p in (plan, base))
    assert pre.overrides == {**base_pre.overrides, "model.dropout": 0.0, "model.attn_dropout": 0.0}
    tunes = {a.name.split("/", 1)[1]: a.overrides for a in plan.arms if a.kind == "finetune"}
    base_tunes = {a.name.split("/", 1)[1]: a.overrides for a in base.arms if a.kind == "finetune"}
    for name, over in tunes.items():
        assert name.rsplit("/", 1)[0] in ("rotten-tomatoes", "hedge", "drug-reviews", "spam"), name
        same = base_tunes[name.replace("pre-0.0001", "pre-0.0002").replace("nodrop-", "pre-")]
        want = {**same, "train.lr": 1e-4 if "0.0001" in name else 2e-4}
        if not name.split("/")[1].startswith("nodrop-"):
            want["model.dropout"] = 0.1  # dropout back on for fine-tuning, as cramming does
        assert over == want, name
    assert len(tunes) == 36


def test_classify_prompt_chooses_the_prompt_arm_with_templates_fixed_per_set(gpu_inputs):
    """classify-prompt pretrains as classify and fine-tunes each set with the linear head (classify's pre-0.0002)
    and in the prompt format, the arm chosen, with hedge held out; each set's template and words are the same in
    every arm."""
    exp = load_experiment("classify-prompt")
    assert exp.selection.arms == ["prompt-0.0002"] and exp.selection.held_out == ["hedge"]
    plan, base = plan_experiment(exp, make_data=False), plan_experiment(load_experiment("classify"), make_data=False)
    (pre,), (base_pre,) = ([a for a in p.arms if a.kind == "pretrain"] for p in (plan, base))
    assert pre.overrides == base_pre.overrides
    tunes = {a.name.split("/", 1)[1]: a.overrides for a in plan.arms if a.kind == "finetune"}
    base_tunes = {a.name.split("/", 1)[1]: a.overrides for a in base.arms if a.kind == "finetune"}
    sentiment = "{text} It was {mask}."
    prompts = {
        "rotten-tomatoes": (sentiment, ["negative=terrible", "positive=great"]),
        "drug-reviews": (sentiment, ["negative=terrible", "neutral=okay", "positive=great"]),
        "hedge": ("{text} This statement is {mask}.", None),  # held out: the label names as words
        "spam": ("{text} This email is {mask}.", None),
    }
    for name, over in tunes.items():
        task, arm = name.split("/")
        template, words = prompts[task]
        keys = {"task.template": template} | ({"task.verbalizer": words} if words else {})
        base_over = base_tunes[f"{task}/pre-0.0002-{arm.rsplit('-', 1)[1]}"]
        fmt = {"task.format": "prompt"} if arm.startswith("prompt-") else {}
        assert over == {**base_over, **keys, **fmt, "train.lr": 2e-4}, name
    assert len(tunes) == 24


def test_classify_ensemble_tunes_nine_seeds_of_classify_prompts_arm_and_groups_them_in_threes(gpu_inputs, capsys):
    """classify-ensemble: the same pretraining and prompt-format fine-tunes as classify-prompt's chosen arm, with
    nine seeds; dev chooses between one fine-tune and the ensembles of seeds 0-2, 3-5, 6-8; hedge held out."""
    from lmforge.cli import main

    exp = load_experiment("classify-ensemble")
    assert [(e.name, e.arm, e.size) for e in exp.ensembles] == [("prompt-0.0002-x3", "prompt-0.0002", 3)]
    assert exp.seed_count("prompt-0.0002-x3") == 3 and exp.seed_count("prompt-0.0002") == 9
    assert exp.selection.arms == ["prompt-0.0002", "prompt-0.0002-x3"] and exp.selection.held_out == ["hedge"]
    plan, base = (
        plan_experiment(load_experiment(n), make_data=False) for n in ("classify-ensemble", "classify-prompt")
    )
    (pre,), (base_pre,) = ([a for a in p.arms if a.kind == "pretrain"] for p in (plan, base))
    assert pre.overrides == base_pre.overrides
    tunes = {a.name.split("/", 1)[1]: a.overrides for a in plan.arms if a.kind == "finetune"}
    base_tunes = {a.name.split("/", 1)[1]: a.overrides for a in base.arms if a.kind == "finetune"}
    assert len(tunes) == 36 and all("/prompt-0.0002-s" in name for name in tunes)
    for name, over in tunes.items():
        task, seed = name.split("/")[0], int(name.rsplit("-s", 1)[1])
        assert over == {**base_tunes[f"{task}/prompt-0.0002-s0"], "run.seed": seed}, name
    assert main(["experiment", "classify-ensemble", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "ensemble prompt-0.0002-x3: prompt-0.0002's fine-tunes of seeds [0, 1, 2] | [3, 4, 5] | [6, 7, 8]" in out


def test_classify_ensemble_on_a_fresh_pretraining_changes_only_the_pretraining_seed(gpu_inputs):
    """docs/classify.md's second run: --pretrain.seeds=1 pretrains from seed 1, and every fine-tune is the first
    run's, from that pretraining."""
    one, two = (load_experiment("classify-ensemble", cli) for cli in ([], ["--pretrain.seeds=1"]))
    (a, b) = (plan_experiment(e, make_data=False).arms for e in (one, two))
    assert b[0].name == "pretrain/pre-s1" and b[0].overrides == {**a[0].overrides, "run.seed": 1}
    tunes = [(x, y) for x, y in zip(a[1:], b[1:], strict=True) if x.kind == "finetune"]
    assert len(tunes) == 36 and all(x.overrides == y.overrides and y.after == ["pretrain/pre-s1"] for x, y in tunes)


def test_dry_run_prints_command_lines_a_shell_splits_back_into_the_runs_own(gpu_inputs, capsys):
    """--dry-run's command lines paste into a shell: a template's spaces and a list of label words stay one argument
    each."""
    from lmforge.cli import main

    assert main(["experiment", "classify-prompt", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if " -m lmforge.cli " in x]
    arms = plan_experiment(load_experiment("classify-prompt"), make_data=False).arms
    tune = next(a for a in arms if a.kind == "finetune")
    assert [shlex.split(x) for x in lines] == [arm_command(next(a for a in arms if a.kind == "pretrain")),
                                               arm_command(tune)]  # fmt: skip
    assert '--task.template="{text} It was {mask}."' in shlex.split(lines[1])
