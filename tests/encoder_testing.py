"""Shared helpers of the encoder-objective tests: small tokenizers, token windows, tiny configs, prepared data."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest
import torch

from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.data.corpus.prepare import prepare
from lmforge.models import ModelConfig
from lmforge.objectives import OBJECTIVES
from lmforge.pretraining.config import load_config
from lmforge.tokenizers import Tokenizer, train_tokenizer


@pytest.fixture(autouse=False)
def one_thread():
    """Tiny models train fastest on one thread, above all on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@cache
def docs(n: int = 12) -> tuple[str, ...]:
    return tuple(load_default_corpus()[:n])


@cache
def tokenizer(kind: str = "wordpiece", family: str = "bert", vocab_size: int = 512) -> Tokenizer:
    return train_tokenizer(list(docs()), kind, vocab_size, family=family)


def windows(tok: Tokenizer, seq_len: int, n_tokens: int) -> torch.Tensor:
    """Packed (n, seq_len + 1) windows of the corpus, documents separated by EOS, like TokenLoader's."""
    ids: list[int] = []
    for text in docs():
        ids += tok.encode(text) + [tok.eos_id]
        if len(ids) > n_tokens:
            break
    flat = torch.tensor(ids[:n_tokens])
    n = (len(flat) - 1) // seq_len
    return flat[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len)


def objective(name: str, tok: Tokenizer, *overrides: str):
    cfg = load_config(None, [f"--objective.name={name}", *overrides])
    return OBJECTIVES.get(name)(cfg, tok)


def tiny_encoder(vocab_size: int, **kw) -> ModelConfig:
    base = dict(
        arch="encoder", vocab_size=vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=128,
        norm_position="post", final_norm=False, embedding_norm=True, activation="gelu", lm_head_transform=True,
        lm_head_bias=True, type_vocab_size=2,
    )  # fmt: skip
    return ModelConfig(**{**base, **kw})


def prepared(root: Path, tok: Tokenizer, n_docs: int = 12, val_fraction: float = 0.2) -> Path:
    """A prepared data dir of the first n_docs corpus documents."""
    root.mkdir(parents=True, exist_ok=True)
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs()[:n_docs]), encoding="utf-8")
    prepare([src], root / "data", tok, val_fraction=val_fraction)
    return root / "data"


def overfit(model: torch.nn.Module, obj, batch: dict, steps: int = 40, lr: float = 3e-3) -> list[float]:
    """Losses of `steps` Adam steps on one fixed batch."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    torch.manual_seed(0)
    losses = []
    for _ in range(steps):
        out = obj.loss(model, batch)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(float(out.loss.detach()))
    return losses
