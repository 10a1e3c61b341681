"""A streak of non-finite steps names (and keeps) the last checkpoint known good before it: never one whose weights an
overflowing update filled with infinity, never a damaged one that a resume fell back past."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_reliability_inputs import POISON  # registers the test_poisoned_lm objective

from lmforge.cli import main

TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=4", "--train.seq_len=32"]
TINY += ["--train.log_every=1", "--train.eval_every=100", "--sample.prompts=[]", "--train.eval_batches=2"]


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


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
    assert err.strip().splitlines()[-1].endswith("the last checkpoint before it is step_2"), err
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
    assert err.strip().splitlines()[-1].endswith("check the data"), err  # no checkpoint is called good


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
    assert err.strip().splitlines()[-1].endswith("the last checkpoint before it is step_2"), err
    assert _finite(run / "checkpoints" / "step_2")  # kept through keep_last=1
