"""Every kind of run shares the one loop, so each resumes exactly: a fine-tuning, a DPO and a distillation run killed
with SIGKILL mid-run continue with `--resume` to the same losses, step for step and bit for bit, as an
uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tasks_testing as T
from training_testing import restore_torch_globals

from lmforge.data.labelled.examples import Dataset

pytestmark = pytest.mark.slow
PAUSING_CLI = Path(__file__).with_name("pausing_cli.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    full = T.sentiment(160, seed=1)
    splits = {"train": Dataset(full.examples[:128], full.labels), "dev": Dataset(full.examples[128:], full.labels)}
    return T.write_labelled_dir(tmp_path_factory.mktemp("labelled") / "sentiment", splits)


def launch(args: list[str], cwd: Path, pause: str | None = None) -> subprocess.Popen:
    entry = [str(PAUSING_CLI), pause] if pause else ["-m", "lmforge.cli"]
    return subprocess.Popen([sys.executable, *entry, *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip


def killed_at(args: list[str], cwd: Path, step: int) -> None:
    """Run until the loop pauses after `step`, then SIGKILL it."""
    proc = launch(args, cwd, pause=f"step@{step}:120")
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if line.startswith(f"pausing 120 s at step (step {step})"):
            break
        assert time.monotonic() < deadline
    else:
        raise AssertionError(f"the run ended before step {step}")
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


def finished(args: list[str], cwd: Path) -> None:
    proc = launch(args, cwd)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]


def losses(run: Path) -> list[tuple[int, str]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss_hex"]) for r in rows if "loss_hex" in r]


def check_resumes_exactly(make_args, cwd: Path, kill_step: int, n_steps: int) -> None:
    ref, run = cwd / "ref", cwd / "run"
    finished(make_args(ref), cwd)
    killed_at(make_args(run), cwd, kill_step)
    finished([*make_args(run)[:2], f"--run.dir={run}", "--resume"], cwd)  # nothing but the run dir repeated
    assert [s for s, _ in losses(ref)] == list(range(1, n_steps + 1))
    assert losses(run) == losses(ref)


def test_finetuning_resumes_bit_identically(labelled, tmp_path):
    def args(run: Path) -> list[str]:
        return ["finetune", "sst2-gpt", "--init", "gpt-tiny", f"--run.dir={run}", "--data.source=dir",
                f"--data.dir={labelled}", "--train.max_steps=8", "--train.log_every=1", "--train.eval_every=4",
                "--train.save_every=2", "--train.batch_size=8", "--data.max_eval=16", "--model.vocab_size=300",
                "--task.max_len=48", "--train.lr=1e-3"]  # fmt: skip

    check_resumes_exactly(args, tmp_path, kill_step=5, n_steps=8)


def test_dpo_resumes_bit_identically(tmp_path):
    def args(run: Path) -> list[str]:
        return ["align", "dpo", "dpo-continuation", "--init", "gpt-tiny", f"--run.dir={run}", "--data.max_train=64",
                "--data.max_eval=8", "--model.max_len=48", "--model.vocab_size=300", "--train.max_steps=6",
                "--train.batch_size=4", "--train.log_every=1", "--train.save_every=2", "--train.eval_every=6",
                "--train.deterministic"]  # fmt: skip

    check_resumes_exactly(args, tmp_path, kill_step=3, n_steps=6)


def test_distillation_resumes_bit_identically(labelled, tmp_path):
    teacher = tmp_path / "teacher"
    finished(["finetune", "sst2-gpt", "--init", "gpt-tiny", f"--run.dir={teacher}", "--data.source=dir",
              f"--data.dir={labelled}", "--train.max_steps=4", "--data.max_eval=16", "--model.vocab_size=300",
              "--task.max_len=48"], tmp_path)  # fmt: skip

    def args(out: Path) -> list[str]:
        return ["compress", "report", "sentiment-gpt", "--teacher", str(teacher), f"--out={out}",
                "--distill.max_steps=6", "--distill.save_every=2", "--distill.log_every=1", "--distill.batch_size=8",
                "--distill.deterministic", "--prune.max_steps=2", "--bench.runs=1", "--bench.warmup=0",
                "--teacher.max_eval=16"]  # fmt: skip

    ref, run = tmp_path / "ref", tmp_path / "run"
    finished(args(ref), tmp_path)
    killed_at(args(run), tmp_path, 3)
    finished([*args(run), "--resume"], tmp_path)
    assert [s for s, _ in losses(ref / "distill")] == list(range(1, 7))
    assert losses(run / "distill") == losses(ref / "distill")
    assert losses(run / "prune-magnitude") == losses(ref / "prune-magnitude")
