"""bench/encoder_ttl.py on CPU: the Hugging Face RoBERTa run and an encoder-fast run scored on the same validation
masks (tiny sizes, a few steps, eager)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.data import load_default_corpus

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def lmforge(*args: str, cwd: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "lmforge.cli", *args], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_both_models_are_scored_on_the_hf_runs_masks(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in load_default_corpus()[:12]), encoding="utf-8")
    lmforge("tokenizer", "train", str(corpus), "--out", "tok", "--kind", "bpe", "--family", "bart",
            "--vocab-size", "600", cwd=tmp_path)  # fmt: skip
    lmforge("data", "prepare", str(corpus), "--out", "data", "--tokenizer", "tok", "--val-fraction", "0.25",
            "--quiet", cwd=tmp_path)  # fmt: skip
    fast = "--model.preset=encoder-fast-tiny --train.max_steps=3 --train.eval_every=3 --train.save_every=3"
    res = subprocess.run(
        [sys.executable, "bench/encoder_ttl.py", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"),
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
