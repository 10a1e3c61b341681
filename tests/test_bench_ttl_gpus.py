"""bench/time_to_loss_gpus.sh: which processes it starts, in which order, with which bytecode settings (PYTHON is
a stand-in that records its arguments and environment instead of training)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -c ]; then echo 1; exit 0; fi
echo "prefix=${PYTHONPYCACHEPREFIX:-} nowrite=${PYTHONDONTWRITEBYTECODE:-} gpu=${CUDA_VISIBLE_DEVICES:-} $*" >> "$CALLS"
case "$*" in *warm-up*) exit "${WARM_EXIT:-0}";; esac
"""


def _run(tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.touch()
    full = {**os.environ, "PYTHON": str(fake), "CALLS": str(calls), "NANOGPT": "peers/nanoGPT",
            "OUT_DIR": str(tmp_path / "out"), "PYTHONDONTWRITEBYTECODE": "1", **env}  # fmt: skip
    done = subprocess.run(["bash", "bench/time_to_loss_gpus.sh", "data/code", "data/bible", "--", "--train.compile"],
                          cwd=ROOT, env=full, capture_output=True, text=True)  # fmt: skip
    return done, calls.read_text().splitlines()


def test_a_bytecode_cache_is_written_by_one_untimed_warm_up_before_every_timed_process(tmp_path):
    done, calls = _run(tmp_path, PYC=str(tmp_path / "pyc"))
    assert done.returncode == 0, done.stderr
    assert len(calls) == 3
    warm, *timed = calls
    assert "--data data/code" in warm and "--out " + str(tmp_path / "out" / "warm-up.json") in warm
    assert "--nanogpt-args=--max_iters=30 --eval_interval=30" in warm and "--train.time_budget=8" in warm
    for call in calls:  # every process reads (and the warm-up writes) the same cache; none is barred from writing
        assert call.startswith(f"prefix={tmp_path / 'pyc'} nowrite= gpu=0 ")
    assert ["--data data/code" in c for c in timed] == [True, False] and "--data data/bible" in timed[1]
    assert all("--fast-args=--train.compile" in c and "warm-up" not in c for c in timed)


def test_without_a_bytecode_cache_nothing_runs_untimed_and_the_environment_is_left_as_it_is(tmp_path):
    done, calls = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2 and all(c.startswith("prefix= nowrite=1 gpu=0 ") for c in calls)


def test_a_failed_warm_up_stops_before_any_timed_process(tmp_path):
    done, calls = _run(tmp_path, PYC=str(tmp_path / "pyc"), WARM_EXIT="3")
    assert done.returncode == 1
    assert len(calls) == 1 and "warm-up" in calls[0]
    assert done.stderr.strip() == f"warm-up failed: see {tmp_path / 'out'}/warm-up.log"
