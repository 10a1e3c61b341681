"""bench/scale.py on CPU (gloo): the README's smoke run of the data-parallel scaling bench, 1 and 2 processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from training_testing import make_prepared

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_scale_runs_each_world_size_and_no_save_writes_no_checkpoint(tmp_path):
    tok, data = make_prepared(tmp_path, 8)
    work, out = tmp_path / "work", tmp_path / "scale.json"
    res = subprocess.run(
        [sys.executable, "bench/scale.py", "--preset", "gpt-tiny", "--batch", "2", "--seq", "32", "--steps", "4",
         "--warmup", "1", "--log-every", "1", "--gpus", "1", "2", "--device", "cpu", "--parallel", "fsdp",
         "--data", str(data), "--tokenizer", str(tok), "--work", str(work),
         "--out", str(out), "--no-save"],
        cwd=ROOT, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["results"]
    # The plain one-process loop (ddp on 1 GPU) runs first: every row is compared with it.
    assert [(r["parallel"], r["gpus"]) for r in rows] == [("ddp", 1), ("fsdp", 1), ("fsdp", 2)]
    assert all(r["tokens_per_s"] > 0 and 0 < r["final_loss"] < 10 for r in rows)
    assert rows[1]["scaling_efficiency"] == 1.0 and rows[2]["scaling_efficiency"] > 0
    assert rows[0]["per_gpu_vs_plain"] == 1.0
    assert rows[2]["per_gpu_vs_plain"] == round(rows[2]["tokens_per_s_per_gpu"] / rows[0]["tokens_per_s"], 3)
    assert "| fsdp | 2 |" in out.with_suffix(".md").read_text()
    for r in ("ddp-1gpu", "fsdp-1gpu", "fsdp-2gpu"):
        assert (work / "runs" / r / "metrics.jsonl").exists()
        assert not (work / "runs" / r / "checkpoints").exists()
