"""What SFT, reward-model and DPO runs share: the starting model, the `train` section, resumable shuffled batches,
and the run frame around the one training loop (`train/loop.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from lmforge.config.sections import LoopConfig, OptimConfig, optim_defaults
from lmforge.config.types import PosInt
from lmforge.errors import LMForgeError
from lmforge.tokenizers.specials import FAMILY_BY_ARCH
from lmforge.train.distributed import DistInfo
from lmforge.train.prefetch import Batch


@dataclass
@optim_defaults(lr=1e-4, warmup_steps=10, schedule="linear", min_lr_ratio=0.1, weight_decay=0.0, beta2=0.999)
class AlignTrainConfig(LoopConfig, OptimConfig):
    """Optimisation of an alignment run (the `train.*` keys of an align recipe): AdamW, linear warmup, then linear
    decay to 10% of lr."""

    max_steps: PosInt = 200
    batch_size: PosInt = 16
    eval_every: PosInt = 100
    save_every: PosInt | None = None
    """Save a resumable checkpoint every N steps (None = at each evaluation)."""
    keep_last: PosInt = 1


class ShuffledBatches:
    """Endless shuffled mini-batches of `items` (a new permutation each epoch, seeded by (seed, epoch); the
    incomplete last global batch is dropped unless it is the only one), each made into tensors by `make`. This
    rank takes its `batch_size` slice of each global batch. Resumable: the state is (epoch, batch)."""

    def __init__(self, items: list, batch_size: int, seed: int, make: Callable[[list], dict[str, Tensor]],
                 dist: DistInfo | None = None) -> None:  # fmt: skip
        if not items:
            raise LMForgeError("no training examples")
        self.items, self.batch_size, self.seed, self.make = items, batch_size, seed, make
        self.dist = dist or DistInfo()
        self.global_batch = batch_size * self.dist.world_size
        self.per_epoch = max(1, len(items) // self.global_batch)
        self.epoch = self.index = 0
        self._order: np.ndarray | None = None

    def __iter__(self) -> ShuffledBatches:
        return self

    def __next__(self) -> Batch:
        if self._order is None:
            self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.items))
        lo = self.index * self.global_batch + self.dist.rank * self.batch_size
        chunk = [self.items[j] for j in self._order[lo : lo + self.batch_size]]
        self.index += 1
        if self.index == self.per_epoch:
            self.epoch, self.index, self._order = self.epoch + 1, 0, None
        return Batch(self.make(chunk), examples=len(chunk))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.index, "n_items": len(self.items), "global_batch": self.global_batch}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("n_items", len(self.items)), ("global_batch", self.global_batch)):
            if int(state[key]) != mine:
                raise LMForgeError(f"cannot resume the training examples: {key} was {state[key]}, now {mine}")
        self.epoch, self.index, self._order = int(state["epoch"]), int(state["batch"]), None


def _check_decoder(cfg, init: str) -> None:
    if not cfg.is_decoder:
        raise LMForgeError(f"alignment needs a decoder model, '{init}' is arch '{cfg.arch}'")


def initial_model(init: str, texts: Callable[[], list[str]], tokenizer: str | None = None, vocab_size: int = 2048):
    """(decoder model, tokenizer): a run / checkpoint / Hugging Face dir (`lmforge.load`), or a preset name
    (random init, with `tokenizer` or a tokenizer trained on `texts()`)."""
    from lmforge.loading import load
    from lmforge.models import Transformer, get_preset
    from lmforge.registry import MODELS
    from lmforge.tokenizers import Tokenizer, train_tokenizer

    if Path(init).exists():
        model, tok = load(init)
        _check_decoder(model.config, init)
        if tok is None:
            if tokenizer is None:
                raise LMForgeError(f"{init} has no tokenizer lmforge can read: set model.tokenizer")
            tok = Tokenizer.load(Path(tokenizer))
        return model.train(), tok
    if init not in MODELS:
        raise LMForgeError(f"model.init: '{init}' is neither a run/checkpoint/model dir nor a model preset")
    base = get_preset(init)
    _check_decoder(base, init)
    if tokenizer:
        tok = Tokenizer.load(Path(tokenizer))
    else:
        tok = train_tokenizer(texts(), "bpe", vocab_size, family=FAMILY_BY_ARCH[base.arch],
                              size_key="model.vocab_size", frequency_key=None)  # fmt: skip
    cfg = dataclasses.replace(base, vocab_size=max(tok.vocab_size, base.vocab_size if tokenizer else 0))
    if tok.pad_id is not None:
        cfg.pad_id = tok.pad_id
    return Transformer(cfg), tok


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
