"""bench/encoder_ttl.py on CPU: the Hugging Face RoBERTa run and an encoder-fast run scored on the same validation
masks (tiny sizes, a few steps, eager)."""

import json
import os
import subprocess
import sys

import pytest
from bench_testing import ROOT, prepared_corpus

pytestmark = pytest.mark.slow


def test_both_models_are_scored_on_the_hf_runs_masks(tmp_path):
    data, tok = prepared_corpus(tmp_path, 12, 0.25, "--family", "bart", "--vocab-size", "600")
    fast = "--model.preset=encoder-fast-tiny --train.max_steps=3 --train.eval_every=3 --train.save_every=3"
    res = subprocess.run(
        [sys.executable, "bench/encoder_ttl.py", "--data", str(data), "--tokenizer", str(tok),
         "--steps", "3", "--val-batches", "2", "--batch", "4", "--eager", "--hf-set", "model.preset=roberta-tiny",
         "model.n_layers=2", f"--fast-args={fast}", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o.json")],
        cwd=ROOT, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads((tmp_path / "o.json").read_text())
    hf, (row,) = out["hf"], out["encoder_fast"]
    assert hf["model_class"] == "RobertaForMaskedLM" and 0 < hf["val_loss"] < 10 and hf["wall_s"] > 0
    assert row["steps"] == 3 and 0 < row["val_loss"] < 10 and row["reached"] == (row["val_loss"] <= hf["val_loss"])
    assert row["time_ratio"] == pytest.approx(row["wall_s"] / hf["wall_s"])
