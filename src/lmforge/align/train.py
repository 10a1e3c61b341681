"""What SFT, reward-model and DPO runs share: the starting model, the optimisation loop, checkpoints."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lmforge.config import TrainConfig
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.train import checkpoint as ckpt
from lmforge.train.metrics import MetricsLogger
from lmforge.train.optim import build_optimizer, build_scheduler

FAMILY_BY_ARCH = {"decoder": "gpt", "encoder": "bert", "encoder-decoder": "t5"}


@dataclass
class LoopConfig:
    """Optimisation of an alignment run (the `train.*` keys of an align recipe)."""

    max_steps: int = 200
    batch_size: int = 16
    lr: float = 1e-4
    warmup_steps: int = 10
    """Linear warmup, then linear decay to 10% of lr at max_steps."""
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    """Clip the global gradient norm (0 = off)."""
    eval_every: int = 100
    log_every: int = 10
    device: str = "auto"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _check_decoder(arch: str, init: str) -> None:
    if arch != "decoder":
        raise LMForgeError(f"alignment needs a decoder model, '{init}' is arch '{arch}'")


def initial_model(init: str, texts: Callable[[], list[str]], tokenizer: str | None = None, vocab_size: int = 2048):
    """(decoder model, tokenizer): a run / checkpoint / Hugging Face dir (`lmforge.load`), or a preset name
    (random init, with `tokenizer` or a tokenizer trained on `texts()`)."""
    from lmforge.api import load
    from lmforge.models import Transformer, get_preset
    from lmforge.registry import MODELS
    from lmforge.tokenizers import Tokenizer, train_tokenizer

    if Path(init).exists():
        model, tok = load(init)
        _check_decoder(model.config.arch, init)
        if tok is None:
            if tokenizer is None:
                raise LMForgeError(f"{init} has no tokenizer lmforge can read: set model.tokenizer")
            tok = Tokenizer.load(Path(tokenizer))
        return model.train(), tok
    if init not in MODELS:
        raise LMForgeError(f"model.init: '{init}' is neither a run/checkpoint/model dir nor a model preset")
    base = get_preset(init)
    _check_decoder(base.arch, init)
    if tokenizer:
        tok = Tokenizer.load(Path(tokenizer))
    else:
        tok = train_tokenizer(texts(), "bpe", vocab_size, family=FAMILY_BY_ARCH[base.arch])
    cfg = dataclasses.replace(base, vocab_size=max(tok.vocab_size, base.vocab_size if tokenizer else 0))
    if tok.pad_id is not None:
        cfg.pad_id = tok.pad_id
    return Transformer(cfg), tok


def pick_device(spec: str) -> torch.device:
    from lmforge.train.distributed import DistInfo
    from lmforge.train.setup import pick_device as pick

    return pick(spec, DistInfo())


def train_loop(
    model: nn.Module,
    loss_fn: Callable[[dict], LossOutput],
    batches: Iterator[dict],
    cfg: LoopConfig,
    *,
    evaluate: Callable[[], dict[str, float]] | None = None,
    log: MetricsLogger | None = None,
) -> dict[str, float]:
    """AdamW (decay on matrices only) with warmup + linear decay for cfg.max_steps steps over `batches` (dicts of
    tensors on the model's device); evaluates every eval_every steps and at the end. Returns the last evaluation
    (or the last training loss when there is no evaluation)."""
    sched = TrainConfig(
        max_steps=cfg.max_steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps, schedule="linear", min_lr_ratio=0.1,
        weight_decay=cfg.weight_decay, beta2=0.999,
    )  # fmt: skip
    device = next(model.parameters()).device
    opt = build_optimizer(model, sched, device)
    scheduler = build_scheduler(opt, sched)
    params = [p for p in model.parameters() if p.requires_grad]
    last: dict[str, float] = {}
    running: list[float] = []
    model.train()
    for step in range(1, cfg.max_steps + 1):
        out = loss_fn(next(batches))
        loss = float(out.loss.detach())
        if not math.isfinite(loss):
            raise LMForgeError(f"step {step}: the loss became non-finite (lower train.lr or check the data)")
        out.loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        scheduler.step()
        running.append(loss)
        if log is not None and (step % cfg.log_every == 0 or step == cfg.max_steps):
            log.log(step, loss=sum(running) / len(running), lr=scheduler.get_last_lr()[0], **out.metrics)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            last = {"loss": sum(running) / len(running)}
            running = []
        if evaluate is not None and (step % cfg.eval_every == 0 or step == cfg.max_steps):
            model.eval()
            last = evaluate()
            model.train()
            if log is not None:
                log.log(step, **{f"dev_{k}": v for k, v in last.items()})
    model.eval()
    return last


def cycle(items: list, batch_size: int, seed: int) -> Iterator[list]:
    """Endless shuffled mini-batches of `items` (a new permutation every epoch; the incomplete last batch of an
    epoch is dropped unless it is the only one)."""
    if not items:
        raise LMForgeError("no training examples")
    rng = random.Random(seed)
    order = list(range(len(items)))
    n_full = max(1, len(order) // batch_size)
    while True:
        rng.shuffle(order)
        for i in range(n_full):
            yield [items[j] for j in order[i * batch_size : (i + 1) * batch_size]]


def save_run(run_dir: Path, step: int, model: nn.Module, config: dict, tokenizer) -> Path:
    """Write RUN/checkpoints/step_N (weights, config with the model section, tokenizer); `lmforge.load(RUN)` reads
    a policy saved so."""
    return ckpt.save_checkpoint(run_dir, step, model, config=config, tokenizer=tokenizer, keep_last=1)
