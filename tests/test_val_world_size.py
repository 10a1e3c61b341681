"""Validation does not depend on the number of processes: one process with batch 8 and two fsdp processes (gloo, CPU)
with batch 4 score the same windows with the same corruptions from the same initial weights, so val_loss agrees.

Run as a script (by the test, under torchrun or alone), it builds each run and prints rank 0's validation metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from process_testing import launch_script

from lmforge.data.corpus.loader import TokenLoader

# name -> (recipe, overrides): 2 global batches of windows, all of them, and prefix LM (a random prefix per window,
# fixed for validation by a hash of the global batch).
RUNS = {
    "gpt": ("gpt", ["--train.eval_batches=2"]),
    "gpt-all": ("gpt", ["--train.eval_batches=1000"]),
    "prefix-lm": ("prefix-lm", ["--train.eval_batches=2", "--model.mask=prefix"]),
}


def evaluate_runs(out: Path, overrides: list[str]) -> None:
    """Build each run on this rank and evaluate its initial weights as the training loop does."""
    import torch

    from lmforge.pretraining.config import load_config
    from lmforge.pretraining.run import Pretraining
    from lmforge.train.distributed import cleanup

    torch.set_num_threads(1)
    metrics, p = {}, None
    for name, (recipe, extra) in RUNS.items():
        p = Pretraining(load_config(recipe, [f"--run.dir={out / name}", *overrides, *extra]))
        p.loop._evaluate()
        metrics[name] = p.loop.last_eval
        p.lock.release()
    cleanup(p.dist)
    if p.dist.is_main:
        print(json.dumps(metrics), flush=True)


def launch(n: int, out: Path, *overrides: str) -> dict:
    return launch_script(__file__, n, out, *overrides)


def test_val_loss_is_the_same_for_one_process_and_two(tmp_path, prepared_docs):
    tok, data = prepared_docs(30)
    # A seq_len whose val windows leave 1 in the last global batch of 8: the second process gets no row there.
    n_tokens = TokenLoader(data, "val", 16, 1).tokens.size
    seq_len = next(s for s in range(16, 65) if (n_tokens - 1) // s % 8 == 1 and (n_tokens - 1) // s > 16)
    common = [f"--data.tokenizer={tok}", f"--data.prepared={data}", "--model.preset=gpt-tiny",
              "--model.vocab_size=512", f"--train.seq_len={seq_len}", "--sample.prompts=[]"]  # fmt: skip
    one = launch(1, tmp_path / "one", *common, "--train.batch_size=8")
    two = launch(2, tmp_path / "two", *common, "--train.batch_size=4", "--train.parallel=fsdp")
    for name in RUNS:
        assert one[name]["val_loss"] == pytest.approx(two[name]["val_loss"], abs=1e-6, rel=0), name
    # The check can fail: scoring fewer windows (2 global batches, not all) moves the loss.
    assert abs(one["gpt"]["val_loss"] - one["gpt-all"]["val_loss"]) > 1e-4


if __name__ == "__main__":
    evaluate_runs(Path(sys.argv[1]), sys.argv[2:])
