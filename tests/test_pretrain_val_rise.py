"""A pretraining run warns once when its validation loss rises 0.1 nats above its lowest: a small model on three
documents, seen many times over, memorises them within a few hundred steps."""

from __future__ import annotations

import json
import re

import pytest
from training_testing import write_docs

from lmforge.cli import main

pytestmark = pytest.mark.usefixtures("torch_globals")
RISE = re.compile(
    r"warning: step (\d+): validation loss ([\d.]+) is ([\d.]+) nats above its lowest \(([\d.]+) at step (\d+)\), "
    r"after about ([\d.]+) passes over the training tokens: the model is memorising its training text"
)


def pretrain(tmp_path, capsys, steps: int) -> tuple[list[tuple[int, float]], str]:
    docs = write_docs(tmp_path / "docs.jsonl", 3)
    run = tmp_path / f"run{steps}"
    args = ["pretrain", "gpt-fast", "--model.preset=gpt-fast-tiny", f"--data.inputs=[{docs}]", "--data.vocab_size=512",
            "--data.val_fraction=0.2", "--train.batch_size=16", "--train.seq_len=64", f"--train.max_steps={steps}",
            "--train.time_budget=null", "--train.eval_every=25", "--train.eval_batches=4", f"--run.dir={run}",
            f"--train.save_every={steps}", "--quiet"]  # fmt: skip
    assert main(args) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r], capsys.readouterr().err


def test_a_rising_validation_loss_is_named_once_with_its_lowest_point(tmp_path, capsys):
    vals, err = pretrain(tmp_path, capsys, 300)
    warnings = RISE.findall(err)
    assert len(warnings) == 1, err
    step, loss, rise, low, low_step, passes = warnings[0]
    by_step = dict(vals)
    # the first evaluation 0.1 nats above the lowest before it
    first_rise = next(s for i, (s, v) in enumerate(vals) if i and v >= min(v2 for _, v2 in vals[:i]) + 0.1)
    assert int(step) == first_rise
    best_step = min((v, s) for s, v in vals if s < first_rise)[1]
    assert int(low_step) == best_step and float(low) == pytest.approx(by_step[best_step], abs=5e-4)
    assert float(loss) == pytest.approx(by_step[first_rise], abs=5e-4) and float(rise) >= 0.1
    assert float(passes) > 1  # the text was seen more than once


def test_a_falling_validation_loss_draws_no_warning(tmp_path, capsys):
    vals, err = pretrain(tmp_path, capsys, 50)
    assert vals[-1][1] < vals[0][1]  # still learning at the end
    assert "nats above its lowest" not in err


def test_electras_validation_loss_may_rise_without_a_warning(tmp_path, capsys):
    """ELECTRA's validation loss is generator MLM + 50 × replaced-token detection, and the replaced tokens get harder
    to spot as the generator learns: it rises early in healthy runs (the discriminator's part climbs back to the
    entropy of the replaced share), which is no sign of memorising. The same rise warns in a language model's run."""
    from lmforge.pretraining.config import load_config
    from lmforge.pretraining.run import Pretraining

    docs = write_docs(tmp_path / "docs.jsonl", 3)
    for recipe, warns in (("electra", False), ("gpt", True)):
        run = Pretraining(load_config(recipe, [f"--data.inputs=[{docs}]", "--data.vocab_size=512",
                                               f"--run.dir={tmp_path / recipe}"]))  # fmt: skip
        assert run.objective.val_loss_fixed == warns
        for step, loss in ((250, 24.0), (500, 23.9), (750, 26.2)):
            run._note_rise(step, loss)
        run.lock.release()
        assert ("nats above its lowest (23.900 at step 500)" in capsys.readouterr().err) == warns, recipe
