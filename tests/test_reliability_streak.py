"""Non-finite losses and gradients: a step with one is skipped with a warning, a loss spike is a logged warning, and
a streak stops the run naming (and keeping) the last checkpoint known good before it: never one whose weights an
overflowing update filled with infinity, never a damaged one that a resume fell back past."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_reliability_inputs import cli, last_error_line, pretrain, train_rows

from lmforge.checkpoint.read import read_weights
from lmforge.checkpoint.verify import verify_checkpoint
from lmforge.cli import main
from lmforge.objectives.causal_lm import CausalLM
from lmforge.registry import OBJECTIVES

TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4", "--train.seq_len=32"]
TINY += ["--train.log_every=1", "--train.eval_every=100", "--sample.prompts=[]", "--train.eval_batches=2"]


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


POISON: dict[int, str] = {}
"""Training step → "loss" (NaN loss) or "grad" (finite loss, infinite gradients), for the test objective."""


class _InfGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("inf")


class PoisonedLM(CausalLM):
    """causal_lm whose training loss or gradients are non-finite at the steps in POISON (grad_accum = 1)."""

    name = "test_poisoned_lm"

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self.step = 0  # training calls since this process started the run (grad_accum = 1: one per step)

    def loss(self, model, batch):
        out = super().loss(model, batch)
        if model.training:
            self.step += 1
            kind = POISON.get(self.step)
            if kind == "loss":
                out.loss = out.loss * float("nan")
            elif kind == "grad":
                out.loss = _InfGrad.apply(out.loss)
            elif kind == "spike":
                out.loss = out.loss * 20
        return out


if PoisonedLM.name not in OBJECTIVES:
    OBJECTIVES.register(PoisonedLM.name)(PoisonedLM)


def test_nonfinite_loss_or_gradient_skips_the_step_with_a_warning(prepared, tmp_path, capsys):
    POISON.clear()
    POISON.update({3: "loss", 5: "grad"})
    run = tmp_path / "run"
    args = pretrain(prepared, run, "--objective.name=test_poisoned_lm", "--train.max_steps=6", "--train.save_every=1",
                    "--train.keep_last=10")  # fmt: skip
    rc, _, err = cli(capsys, *args)
    assert rc == 0, err
    lines = err.splitlines()
    assert "warning: step 3: non-finite loss (nan), step skipped" in lines
    assert [line for line in lines if line.startswith("warning: step 5: non-finite gradient norm (")]
    rows = {r["step"]: r for r in train_rows(run) if "val_loss" not in r}
    assert rows[3] == {"step": 3, "skipped": True, "nonfinite": "loss", "loss": None, "grad_norm": None}
    assert rows[5]["skipped"] is True and rows[5]["nonfinite"] == "gradient norm" and rows[5]["grad_norm"] is None
    assert all("skipped" not in rows[s] and rows[s]["loss"] > 0 for s in (1, 2, 4, 6))
    # A skipped step leaves the weights as they were; the steps around it change them.
    w = {s: read_weights(run / "checkpoints" / f"step_{s}") for s in range(1, 7)}
    for before, after, same in [(2, 3, True), (3, 4, False), (4, 5, True), (5, 6, False)]:
        assert all(torch.equal(w[before][k], w[after][k]) for k in w[before]) is same


def test_too_many_nonfinite_steps_in_a_row_stop_the_run_with_one_line(prepared, tmp_path, capsys):
    POISON.clear()
    POISON.update({4: "loss", 5: "grad", 6: "loss"})
    run = tmp_path / "run"
    args = pretrain(prepared, run, "--objective.name=test_poisoned_lm", "--train.max_steps=10", "--train.save_every=3",
                    "--train.max_nonfinite=3")  # fmt: skip
    assert last_error_line(capsys, *args) == (
        "error: stopping at step 6: 3 consecutive steps with a non-finite loss or gradient (train.max_nonfinite=3); "
        "lower train.lr or check the data; the last checkpoint before it is step_3, which --resume continues from"
    )
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_3"]
    assert verify_checkpoint(run / "checkpoints" / "step_3") is None
    assert [r["step"] for r in train_rows(run) if r.get("skipped")] == [4, 5, 6]
    POISON.clear()  # the cause is gone (e.g. a lower lr): the run resumes from its last checkpoint
    rc, _, err = cli(capsys, *args, "--resume")
    assert rc == 0, err
    assert "resumed from" in err and [r["step"] for r in train_rows(run) if "loss" in r][-1] == 10


def test_a_nonfinite_streak_never_evicts_the_checkpoint_from_before_it(prepared, tmp_path, capsys):
    POISON.clear()
    POISON.update({s: "loss" for s in range(4, 9)})  # steps 4-8 diverge
    run = tmp_path / "run"
    args = pretrain(prepared, run, "--objective.name=test_poisoned_lm", "--train.max_steps=12", "--train.save_every=1",
                    "--train.keep_last=3", "--train.max_nonfinite=5")  # fmt: skip
    aside = run / "checkpoints" / "nonfinite"
    assert last_error_line(capsys, *args).endswith(
        "; the last checkpoint before it is step_3, which --resume continues from; 3 checkpoint(s) saved after it "
        f"(step_5, step_6, step_7) are moved to {aside}"
    )
    # keep_last=3 of the streak + the one before it; the streak's own are set aside, where --resume does not look
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["nonfinite", "step_3"]
    assert sorted(p.name for p in aside.iterdir()) == ["step_5", "step_6", "step_7"]
    assert verify_checkpoint(run / "checkpoints" / "step_3") is None
    POISON.clear()


def test_a_loss_spike_is_a_logged_warning(prepared, tmp_path, capsys):
    POISON.clear()
    POISON.update({12: "spike"})  # 20× the loss at step 12, after 11 ordinary steps
    run = tmp_path / "run"
    rc, _, err = cli(capsys, *pretrain(prepared, run, "--objective.name=test_poisoned_lm", "--train.max_steps=13"))
    POISON.clear()
    assert rc == 0, err
    assert [ln for ln in err.splitlines() if ln.startswith("warning: step 12: loss spike ")], err
    assert not [ln for ln in err.splitlines() if "loss spike" in ln and not ln.startswith("warning: step 12:")]
    spikes = [r for r in train_rows(run) if "loss_spike" in r]
    assert [r["step"] for r in spikes] == [12] and spikes[0]["loss_spike"] > 10 * spikes[0]["recent_median"]


def _finite(step_dir: Path) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in load_file(step_dir / "model.safetensors").values())


def test_an_overflowing_update_is_never_the_last_good_checkpoint(prepared, tmp_path, capsys):
    tok, data = prepared
    run = tmp_path / "run"
    base = ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
            "--train.warmup_steps=0", "--train.save_every=1", "--train.max_nonfinite=3"]  # fmt: skip
    assert main([*base, "--train.max_steps=2", "--train.lr=1e-3"]) == 0
    capsys.readouterr()
    # A resumed run at a constant lr of 1e38: step 3's gradients are finite, its update is not.
    rc = main(["pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=8", "--train.lr=1e38",
               "--train.schedule=constant", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "warning: step 3: non-finite weights after the update (overflow), weights unusable from here" in err
    assert "the last checkpoint before it is step_2, which --resume continues from; " in err.splitlines()[-1], err
    assert _finite(run / "checkpoints" / "step_2")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite"] for r in rows if r.get("step") == 3 and "nonfinite" in r] == ["weights after the update"]


def test_an_overflow_from_the_first_step_names_no_checkpoint(prepared, tmp_path, capsys):
    tok, data = prepared
    run = tmp_path / "run"
    rc = main(["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
               "--train.warmup_steps=0", "--train.save_every=1", "--train.max_nonfinite=3", "--train.lr=1e38",
               "--train.max_steps=8", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.strip().splitlines()[-1].endswith("no checkpoint is known good, so --resume starts at step 0"), err


def test_after_a_fallback_the_streak_keeps_the_checkpoint_resumed_from(prepared, tmp_path, capsys):
    tok, data = prepared
    run = tmp_path / "run"
    POISON.clear()
    args = ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
            "--objective.name=test_poisoned_lm", "--train.save_every=2", "--train.max_steps=4", "--quiet"]  # fmt: skip
    assert main([*args, "--train.keep_last=2"]) == 0
    weights = run / "checkpoints" / "step_4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # damaged: the resume falls back to step_2
    POISON.update({k: "loss" for k in range(1, 8)})  # every step of the resumed process: steps 3, 4, ...
    rc = main(["pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=10", "--train.keep_last=1",
               "--train.max_nonfinite=4", "--quiet"])  # fmt: skip
    POISON.clear()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the last checkpoint before it is step_2, which --resume continues from" in err.splitlines()[-1], err
    assert _finite(run / "checkpoints" / "step_2")  # kept through keep_last=1
