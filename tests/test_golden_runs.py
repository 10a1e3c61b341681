"""Golden runs: one short CPU run of each run kind — pretrain, fine-tune, DPO and the compression report's
distillation and pruning runs — re-run through the CLI, their metrics.jsonl (less the wall-clock fields) equal to
the files recorded in tests/fixtures/golden/: the same rows and fields, every number within a relative 1e-4 or an
absolute 1e-5. Not bit for bit: a CPU of another model rounds the last bits differently, and over a fine-tune and a
distillation from it that grew to 1e-5 (DPO's margins, differences of near-equal log-probabilities, to 1e-6
absolute). A refactoring of the runs' set-up that changes what they train moves them far more, and fails here.

Re-record (only when a change of numbers is intended): LMFORGE_RECORD_GOLDEN=1 pytest tests/test_golden_runs.py"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from training_testing import restore_torch_globals, write_docs

from lmforge.cli import main

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
RECORD = os.environ.get("LMFORGE_RECORD_GOLDEN") == "1"
TIMED = {"tokens_per_s", "mfu"}
"""Fields that depend on the clock, not on what was trained."""


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMED} for r in rows]


def _cli(*args: str) -> None:
    assert main(list(args)) == 0


def _check(name: str, run: Path) -> None:
    got = _rows(run)
    path = GOLDEN / f"{name}.jsonl"
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in got))
    want = [json.loads(line) for line in path.read_text().splitlines()]
    assert any("loss" in r for r in want)
    assert [_numbers(r) for r in got] == [pytest.approx(_numbers(r), rel=1e-4, abs=1e-5) for r in want], name


def _numbers(row: dict) -> dict:
    """The row with the exact loss (a float's hex digits) read back as a number."""
    return {k: float.fromhex(v) if k == "loss_hex" else v for k, v in row.items()}


def test_each_run_kind_logs_the_recorded_metrics(tmp_path):
    docs = write_docs(tmp_path / "docs.jsonl", 12)
    pre, ft, dpo, out = (tmp_path / x for x in ("pretrain", "finetune", "dpo", "compress"))
    det = ["--train.deterministic=true", "--train.device=cpu", "--run.seed=3"]
    _cli("pretrain", "gpt", f"--run.dir={pre}", f"--data.inputs=[{docs}]", "--data.vocab_size=400",
         "--model.preset=gpt-tiny", "--train.seq_len=32", "--train.batch_size=4", "--train.max_steps=6",
         "--train.warmup_steps=2", "--train.log_every=1", "--train.eval_every=3", "--train.eval_batches=1",
         "--sample.prompts=[]", "--quiet", *det)  # fmt: skip
    _check("pretrain", pre)
    _cli("finetune", "sst2-gpt", "--init", str(pre), f"--run.dir={ft}", "--data.max_train=48",
         "--data.max_eval=16", "--train.batch_size=8", "--train.epochs=2", "--train.lr=1e-3", "--task.max_len=32",
         "--train.log_every=1", "--quiet", *det)  # fmt: skip
    _check("finetune", ft)
    _cli("align", "dpo", "dpo-sentiment", "--init", str(pre), f"--run.dir={dpo}", "--data.max_train=24",
         "--data.max_eval=8", "--train.batch_size=4", "--train.max_steps=4", "--train.eval_every=2",
         "--train.log_every=1", "--model.max_len=48", "--train.lr=1e-3", "--quiet", *det)  # fmt: skip
    _check("dpo", dpo)
    _cli("compress", "report", "sentiment-gpt", "--teacher", str(ft), f"--out={out}", "--seed=3",
         "--distill.max_steps=4", "--distill.batch_size=8", "--distill.lr=1e-3", "--prune.max_steps=3",
         "--prune.batch_size=8", "--teacher.max_eval=16", "--bench.runs=1", "--bench.warmup=0",
         *(f"--{s}.{k}" for s in ("distill", "prune") for k in ("log_every=1", "deterministic=true")))  # fmt: skip
    for variant in ("distill", "prune-magnitude", "prune-heads"):
        _check(f"compress-{variant}", out / variant)
