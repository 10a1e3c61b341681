"""bench/train_e2e.py on CPU: the gpt-fast ablation through the CLI, as a GPU run drives it (tiny, few steps)."""

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


def test_ablation_runs_each_named_arm_and_writes_its_rows(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in load_default_corpus()[:8]), encoding="utf-8")
    lmforge("tokenizer", "train", str(corpus), "--out", "tok", "--kind", "bpe", "--vocab-size", "400", cwd=tmp_path)
    lmforge("data", "prepare", str(corpus), "--out", "data", "--tokenizer", "tok", "--val-fraction", "0.2",
            "--quiet", cwd=tmp_path)  # fmt: skip
    tiny = "--model.preset=gpt-fast-tiny --train.batch_size=2 --train.seq_len=32 --train.log_every=1"
    res = subprocess.run(
        [sys.executable, "bench/train_e2e.py", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"),
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
