"""Text-to-text regression (T5's STS-B): scores written as rounded text, generated outputs read back as numbers,
invalid outputs counted, and the training scores' range saved with the run."""

import json
from pathlib import Path

import pytest
import tasks_testing as T

from lmforge.cli.eval import cmd_eval
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FineTuner
from lmforge.tasks.config import load_finetune_config
from lmforge.tasks.text_to_text_regression import TextToTextRegression, parse_score, score_text

GLUE = Path(__file__).parent / "fixtures" / "glue"


@pytest.mark.parametrize(
    "value, step, text",
    [(2.57, 0.2, "2.6"), (4.9, 0.2, "4.8"), (5.0, 0.2, "5.0"), (0.0, 0.2, "0.0"),
     (3.74, 0.5, "3.5"), (3.76, 0.5, "4.0"), (2.6, 1.0, "3"), (1.234, 0.05, "1.25")],
)  # fmt: skip
def test_scores_round_to_the_step_and_print_its_decimals(value, step, text):
    assert score_text(value, step) == text


def test_generated_text_is_a_score_only_inside_the_training_range():
    assert parse_score(" 3.8 ", 0.0, 5.0) == 3.8
    assert parse_score("5", 0.0, 5.0) == 5.0
    for bad in ("", "three", "5.2", "-0.4", "nan", "inf", "3.8 3.8"):
        assert parse_score(bad, 0.0, 5.0) is None, bad


def test_label_set_is_the_training_range_and_mean_and_bad_scores_are_refused():
    train = Dataset([Example(text="a", text_pair="b", label=x) for x in (1.0, 4.0, 2.5)])
    assert [float(x) for x in TextToTextRegression.label_set(train)] == [1.0, 4.0, 2.5]
    with pytest.raises(LMForgeError, match="not a number"):
        TextToTextRegression.label_set(Dataset([Example(text="a", label="high")]))


def test_invalid_outputs_score_as_the_mean_and_are_counted(monkeypatch):
    tok = T.tokenizer("t5")
    cfg = load_finetune_config("stsb-t5", [])
    task = TextToTextRegression(cfg.task.options, tok, ["0.0", "5.0", "2.0"])
    model = task.build(T.model("t5-tiny", tok))
    dev = Dataset([Example(text=f"s{i}", text_pair="t", label=g) for i, g in enumerate([1.0, 2.0, 3.0, 4.0])])
    outputs = ["1.2", "oops", "2.8", "4.0"]
    monkeypatch.setattr(task, "generate_batch", lambda m, feats, beams, n: outputs[: len(feats)])
    metrics = task.evaluate(model, dev)
    assert metrics["invalid"] == 0.25
    # "oops" counts as the training mean 2.0: predictions (1.2, 2.0, 2.8, 4.0) against (1, 2, 3, 4).
    assert metrics["spearman"] == pytest.approx(1.0)
    assert 0.98 < metrics["pearson"] < 1.0


def test_glue_stsb_t5_recipe_fine_tunes_and_a_reloaded_run_scores_the_same(tmp_path):
    tok = tmp_path / "tok"
    T.tokenizer("t5").save(tok)
    run = tmp_path / "run"
    over = [f"--run.dir={run}", f"--data.dir={GLUE}", f"--model.tokenizer={tok}", "--train.max_steps=2",
            "--train.batch_size=2", "--task.max_new_tokens=3"]  # fmt: skip
    FineTuner(load_finetune_config("stsb-t5", over, init="t5-tiny")).fit()
    metrics = json.loads((run / "eval.json").read_text())
    assert list(metrics) == ["pearson", "spearman", "invalid"] and 0.0 <= metrics["invalid"] <= 1.0
    assert cmd_eval(str(run))["stsb"] == metrics
