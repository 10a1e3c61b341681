"""Reading a run while it trains: `lmforge.load(RUN)` and `lmforge generate RUN` against a live run that saves a
checkpoint every step and keeps one (so every step deletes the one a reader may be reading) never fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import lmforge
from lmforge.cli import main

# Steps of a few hundred ms (a save and a deletion each): the race the issue found, at a pace at which a read made
# again after a rotation can finish before the next one.
TINY = ["--model.preset=gpt-tiny", "--model.vocab_size=512", "--train.batch_size=8", "--train.seq_len=64",
        "--train.grad_accum=4"]  # fmt: skip
TINY += ["--train.eval_every=100000", "--train.eval_batches=1", "--sample.prompts=[]", "--train.log_every=1000"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("torch_globals")


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


def test_load_and_generate_on_a_run_rotating_its_checkpoints_every_step(prepared, tmp_path, capsys):
    tok, data = prepared
    run = tmp_path / "run"
    args = ["pretrain", "gpt", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
            "--train.max_steps=1000000", "--train.save_every=1", "--train.keep_last=1", "--quiet"]  # fmt: skip
    live = subprocess.Popen([sys.executable, "-m", "lmforge.cli", *args], env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((run / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
            assert live.poll() is None, live.stderr.read()
            time.sleep(0.2)
        steps = set()
        for i in range(100):
            if i % 10 == 0:  # the CLI too: what users run to peek at a model mid-run
                rc = main(["generate", str(run), "--prompt", "the", "--max-new-tokens", "2", "--greedy", "--quiet"])
                err = capsys.readouterr().err
                assert rc == 0, err
                continue
            model, tokenizer = lmforge.load(run)
            assert tokenizer is not None and model.config.vocab_size == 512
            steps.add(max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*")))
        assert live.poll() is None, live.stderr.read()  # the run kept training all along
        assert len(steps) > 5  # the reads really raced with rotation
    finally:
        live.terminate()
        live.wait(60)
