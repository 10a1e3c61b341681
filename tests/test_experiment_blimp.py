"""`lmforge experiment` with the blimp evaluation: an experiment file's `eval:` entry names the task and its data dir,
the plan runs `lmforge eval ARM_RUN --task blimp --data.dir=DIR` on each pretraining arm, and the report gets its
accuracies as columns (as many as `eval.breakdown` asks)."""

import json
from pathlib import Path

import pytest
import yaml
from training_testing import write_docs

from lmforge.cli import main
from lmforge.errors import LMForgeError
from lmforge.experiments.arms import arm_command
from lmforge.experiments.plan import plan_experiment
from lmforge.experiments.spec import load_experiment

FIXTURE = Path(__file__).parent / "fixtures" / "blimp"
PRETRAIN = {  # 10 steps of 8 × 32 tokens of gpt-tiny on a 512-token vocabulary
    "recipe": "gpt", "seeds": [0], "arms": ["gpt"],
    "overrides": {"model.preset": "gpt-tiny", "data.vocab_size": 512, "train.batch_size": 8, "train.seq_len": 32,
                  "train.warmup_steps": 2, "train.eval_every": 10, "train.eval_batches": 2, "train.save_every": 10,
                  "train.log_every": 5, "sample.prompts": []},
}  # fmt: skip


def experiment_file(tmp_path: Path, breakdown: list[str]) -> Path:
    grammar = {"name": "grammar", "task": "blimp", "overrides": {"data.dir": str(FIXTURE), "eval.breakdown": breakdown}}
    data = {"out": str(tmp_path / "out"), "budget": {"tokens": 2560}, "pretrain": PRETRAIN, "eval": [grammar]}
    path = tmp_path / "grammar.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_the_plan_evaluates_each_pretraining_arm_on_blimp(tmp_path):
    plan = plan_experiment(load_experiment(experiment_file(tmp_path, ["field"])), make_data=False)
    [ev] = [a for a in plan.arms if a.kind == "eval"]
    assert ev.name == "eval/grammar/gpt-s0" and ev.after == ["pretrain/gpt-s0"]
    cmd = arm_command(ev)
    assert cmd[3:7] == ["eval", str(tmp_path / "out" / "pretrain" / "gpt-s0"), "--task", "blimp"]
    assert f"--data.dir={FIXTURE}" in cmd and '--eval.breakdown=["field"]' in cmd
    with pytest.raises(LMForgeError, match="eval: grammar: eval.breakdown: expected one of 'field', 'phenomenon'"):
        plan_experiment(load_experiment(experiment_file(tmp_path, ["fields"])), make_data=False)


@pytest.mark.slow
def test_experiment_reports_the_blimp_accuracies_of_its_pretrained_arm(tmp_path, capsys, monkeypatch):
    docs = write_docs(tmp_path / "docs.jsonl", 8)
    monkeypatch.chdir(tmp_path)
    rc = main(["experiment", str(experiment_file(tmp_path, ["field"])), f"--data.inputs=[{docs}]"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    out = tmp_path / "out"
    results = json.loads((out / "eval" / "grammar" / "gpt-s0" / "results.json").read_text())["BLiMP"]
    assert sorted(results) == ["accuracy", "accuracy_pairs", "field/morphology", "field/syntax"]
    [row] = json.loads((out / "grammar.json").read_text())["rows"]
    assert row["arm"] == "gpt"
    assert row["values"]["grammar accuracy"]["values"] == [pytest.approx(100 * results["accuracy"])]
    assert row["values"]["grammar field/syntax"]["values"] == [pytest.approx(100 * results["field/syntax"])]
    assert "grammar accuracy" in (out / "grammar.md").read_text()
