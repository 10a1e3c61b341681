"""Shared helpers of the sequence-to-sequence and decoder objective tests: tiny configs, real token windows, an
overfit loop and the CLI runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import torch

from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.objectives import OBJECTIVES
from lmforge.pretraining.config import load_config
from lmforge.tokenizers import train_tokenizer

TINY_SEQ2SEQ = dict(
    arch="encoder-decoder", d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=64, max_seq_len=128,
    norm_position="pre", position="learned", dropout=0.0,
)  # fmt: skip
TINY_DECODER = dict(arch="decoder", d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=128, dropout=0.0)


@cache
def tokenizer(family: str, kind: str = "bpe", vocab_size: int = 400):
    """A small tokenizer trained on a few documents of the bundled corpus."""
    return train_tokenizer(load_default_corpus()[:4], kind, vocab_size, family=family)


def objective(name: str, tok, *, model: dict, seq_len: int = 64, **options):
    """An objective instance for a tiny model config (model.vocab_size = the tokenizer's)."""
    raw = {
        "model": {**model, "vocab_size": tok.vocab_size, "max_seq_len": max(model.get("max_seq_len", 0), seq_len)},
        "objective": {"name": name, **options},
        "train": {"seq_len": seq_len},
    }
    return OBJECTIVES.get(name)(load_config(None, raw), tok)


def windows(tok, batch: int, seq_len: int, offset: int = 0) -> torch.Tensor:
    """(batch, seq_len + 1) consecutive windows of the tokenized corpus, like the packed TokenLoader's."""
    ids = _corpus_ids(tok.family, tok.kind, tok.vocab_size)
    n = batch * seq_len + 1
    if offset + n > len(ids):
        raise ValueError(f"corpus too short for {batch} windows of {seq_len}")
    flat = torch.tensor(ids[offset : offset + n])
    return torch.stack([flat[i * seq_len : (i + 1) * seq_len + 1] for i in range(batch)])


@cache
def _corpus_ids(family: str, kind: str, vocab_size: int) -> list[int]:
    tok = tokenizer(family, kind, vocab_size)
    out: list[int] = []
    for doc in load_default_corpus()[:4]:
        out += tok.encode(doc) + [tok.eos_id]
    return out


def overfit(obj, model: torch.nn.Module, batch: dict, steps: int = 40, lr: float = 3e-3) -> list[float]:
    """Train on one fixed batch; the losses per step."""
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models run faster on one thread than on two shared with other work
    try:
        for _ in range(steps):
            out = obj.loss(model, batch)
            opt.zero_grad()
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
    finally:
        torch.set_num_threads(threads)
    return losses


def write_corpus(path: Path, n_docs: int = 6) -> Path:
    docs = load_default_corpus()[:n_docs]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    return path


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # tiny models: one thread beats two contended ones
    )


def train_losses(run: Path) -> tuple[list[float], list[float]]:
    """(train losses per logged step, validation losses) from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r], [r["val_loss"] for r in rows if "val_loss" in r]


def train_recipe(tmp_path: Path, recipe: str, *overrides: str, steps: int = 30) -> Path:
    """Pretrain `recipe` for `steps` CPU steps on a small corpus through the CLI; assert the loss clearly falls."""
    corpus = write_corpus(tmp_path / "docs.jsonl")
    run = tmp_path / "run"
    res = run_cli(
        "pretrain", recipe, f"--run.dir={run}", f"--data.inputs=[{corpus}]", "--data.vocab_size=400",
        f"--train.max_steps={steps}", "--train.batch_size=8", "--train.warmup_steps=3", "--train.log_every=1",
        f"--train.eval_every={steps}", "--train.eval_batches=2", *overrides, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    train, val = train_losses(run)
    assert len(train) == steps and len(val) == 1
    assert sum(train[-5:]) / 5 < train[0] - 1.0
    return run
