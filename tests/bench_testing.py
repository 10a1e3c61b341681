"""What the CPU tests of bench/ scripts share: the `lmforge` command in a subprocess, and a small prepared corpus
with its own tokenizer, as a GPU run of a bench script would be given."""

import json
import subprocess
import sys
from pathlib import Path

from lmforge.data.corpus.bundled import load_default_corpus

ROOT = Path(__file__).resolve().parents[1]


def lmforge(*args: str, cwd: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "lmforge.cli", *args], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def prepared_corpus(tmp_path: Path, docs: int, val_fraction: float, *tokenizer_args: str) -> tuple[Path, Path]:
    """(prepared data dir, tokenizer dir): the first `docs` bundled documents, a BPE trained on them."""
    corpus = tmp_path / "docs.jsonl"
    text = load_default_corpus()[:docs]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in text), encoding="utf-8")
    lmforge("tokenizer", "train", str(corpus), "--out", "tok", "--kind", "bpe", *tokenizer_args, cwd=tmp_path)
    lmforge("data", "prepare", str(corpus), "--out", "data", "--tokenizer", "tok", "--val-fraction", str(val_fraction),
            "--quiet", cwd=tmp_path)  # fmt: skip
    return tmp_path / "data", tmp_path / "tok"
