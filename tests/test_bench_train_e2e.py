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


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train_e2e", ROOT / "bench" / "train_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nanogpt_last_evaluation_is_read_from_its_log():
    module = _bench_module()
    log = "step 0: train loss 10.9, val loss 10.9\niter 1150: loss 2.8\nstep 1200: train loss 2.7667, val loss 3.1849\n"
    assert module.nanogpt_last_eval(log) == {"step": 1200, "train_loss": 2.7667, "val_loss": 3.1849}
    assert module.nanogpt_last_eval("iter 0: loss 10.9\n") is None


def test_a_timed_runs_start_up_compilation_and_step_rate_are_read_from_its_log_and_metrics():
    module = _bench_module()
    log = (
        "[   2.06 s] model gpt-fast-124m: 123.55M parameters (decoder, d_model 768)\n"
        "[  10.69 s] step 10/2000 (0.5%) | loss 8.3649 | lr 1.10e-02 | 24.5k tok/s\n"
        "[  11.58 s] step 20/40 (50.0%) | loss 5.1878 | lr 2.00e-02 | 185.4k tok/s\n"
    )
    rates = {10: 24500.0, 20: 185400.0, 30: 190000.0, 40: 180000.0}  # the first window holds the compilation
    rows = [{"step": k, "tokens_per_s": v} for k, v in rates.items()] + [{"step": 40, "val_loss": 4.1}]
    assert module.run_timing(log, rows) == {"model_line_s": 2.06, "first_step_log_s": 10.69, "tokens_per_s": 185400.0}
    assert module.run_timing("", [{"step": 10, "tokens_per_s": 1.0}]) == {
        "model_line_s": None, "first_step_log_s": None, "tokens_per_s": None}  # fmt: skip
