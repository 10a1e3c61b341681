"""bench/train_e2e.py on CPU: the gpt-fast ablation through the CLI, as a GPU run drives it (tiny, few steps)."""

import json
import os
import subprocess
import sys

import pytest
from bench_testing import ROOT, prepared_corpus

pytestmark = pytest.mark.slow


def test_ablation_runs_each_named_arm_and_writes_its_rows(tmp_path):
    data, tok = prepared_corpus(tmp_path, 8, 0.2, "--vocab-size", "400")
    tiny = "--model.preset=gpt-fast-tiny --train.batch_size=2 --train.seq_len=32 --train.log_every=1"
    res = subprocess.run(
        [sys.executable, "bench/train_e2e.py", "--data", str(data), "--tokenizer", str(tok),
         "--models", "--ablation", "--arms", "gpt-fast", "gelu", "--ablation-steps", "4", f"--ablation-args={tiny}",
         "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out.json")],
        cwd=ROOT, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads((tmp_path / "out.json").read_text())["ablation"]
    assert [r["arm"] for r in rows] == ["gpt-fast", "gelu"]
    assert rows[1]["args"] == ["--model.activation=gelu_tanh"] and rows[1]["change"] == "GELU instead of ReLU²"
    assert all(r["steps"] == 4 and 0 < r["val_loss"] < 10 and r["ms_per_step"] > 0 for r in rows)
    config = (tmp_path / "work" / "ablation-1" / "config.yaml").read_text()
    assert "activation: gelu_tanh" in config and "max_steps: 4" in config
    log = (tmp_path / "work" / "ablation-1.log").read_text().splitlines()
    stamps = [float(line[1:].split(" s]")[0]) for line in log]  # every line: "[seconds since the start s] ..."
    assert stamps == sorted(stamps) and any("run saved in" in line for line in log)


def test_nanogpt_last_evaluation_is_read_from_its_log():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_e2e", ROOT / "bench" / "train_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    log = "step 0: train loss 10.9, val loss 10.9\niter 1150: loss 2.8\nstep 1200: train loss 2.7667, val loss 3.1849\n"
    assert module.nanogpt_last_eval(log) == {"step": 1200, "train_loss": 2.7667, "val_loss": 3.1849}
    assert module.nanogpt_last_eval("iter 0: loss 10.9\n") is None
