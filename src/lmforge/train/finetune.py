"""The fine-tuning loop: a task model on labelled splits, AdamW with linear warmup and decay, dev evaluation after
every epoch, the best dev checkpoint kept, final metrics in RUN/eval.json.

Under torchrun every rank takes its share of each batch (train.batch_size per rank) and the gradients are
averaged over ranks before each update, so N processes train like one with an N-times larger batch (exactly
for losses averaged over examples; a loss averaged over tokens, like GPT-1's auxiliary LM loss, is averaged per
rank first, as under DDP); rank 0 evaluates, writes the logs and checkpoints.

Writes RUN/config.yaml (the resolved fine-tuning config), RUN/metrics.jsonl (train loss, lr, dev metrics),
RUN/checkpoints/step_N (the best checkpoint so far: task model weights, tokenizer, config) and RUN/eval.json
(dev metrics of the best checkpoint; RUN/eval_test.json too when the test split is labelled)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import torch

from lmforge.adapt.finetune import AdapterWeights, apply_peft_section
from lmforge.config import TrainConfig
from lmforge.errors import LMForgeError
from lmforge.tasks.backbone import checkpoint_config, load_backbone, task_token_rows
from lmforge.tasks.config import FinetuneConfig, save_finetune_config
from lmforge.tasks.data import example_texts, load_splits
from lmforge.tasks.examples import Dataset
from lmforge.tasks.inputs import batches, collate
from lmforge.tasks.model import set_dropout
from lmforge.train import checkpoint as ckpt
from lmforge.train.distributed import (
    average_gradients,
    barrier,
    broadcast_parameters,
    cleanup,
    init_distributed,
    rank_seed,
    sum_across,
)
from lmforge.train.metrics import MetricsLogger, plot_metrics
from lmforge.train.optim import build_optimizer, build_scheduler
from lmforge.train.setup import autocast_for, pick_device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def schedule_config(cfg: FinetuneConfig, total_steps: int) -> TrainConfig:
    """The pretraining TrainConfig that `train/optim.py` reads: linear warmup, linear decay to 0 at the end."""
    t = cfg.train
    return TrainConfig(
        max_steps=total_steps, lr=t.lr, schedule="linear", min_lr_ratio=0.0,
        warmup_steps=max(1, round(t.warmup_ratio * total_steps)), weight_decay=t.weight_decay,
        beta1=t.beta1, beta2=t.beta2, eps=t.eps, grad_clip=t.grad_clip,
    )  # fmt: skip


class FineTuner:
    """Builds a fine-tuning run from a FinetuneConfig and trains it: `FineTuner(cfg).fit()` → final dev metrics."""

    def __init__(self, cfg: FinetuneConfig) -> None:
        from lmforge.registry import TASKS

        self.cfg = cfg
        t = cfg.train
        self.run_dir = Path(cfg.run.dir)
        if (self.run_dir / ckpt.CHECKPOINTS_DIR).is_dir() and any((self.run_dir / ckpt.CHECKPOINTS_DIR).iterdir()):
            raise LMForgeError(f"run dir {self.run_dir} already has checkpoints: choose another --run.dir")
        self.dist = init_distributed("cuda" if torch.cuda.is_available() else "cpu")
        self.device = pick_device(t.device, self.dist)
        self.autocast = autocast_for(self.device, t.precision)
        seed_everything(cfg.run.seed)
        self.splits = load_splits(cfg.data)
        task_cls = TASKS.get(cfg.task.type)
        backbone, self.tokenizer = load_backbone(cfg.model, lambda: example_texts([self.splits["train"]]))
        if cfg.model.dropout is not None:
            set_dropout(backbone, cfg.model.dropout)
        self.labels = task_cls.label_set(self.splits["train"])
        self.task = task_cls(cfg.task.options, self.tokenizer, self.labels)
        self.model = self.task.build(backbone).to(self.device)
        self.peft = apply_peft_section(self.model, cfg.peft)  # None: full fine-tuning
        self.trainable = list({id(p): p for p in self.model.parameters() if p.requires_grad}.values())
        if self.dist.enabled:  # one starting point, then each rank its own dropout
            broadcast_parameters(self.model, self.dist)
            torch.manual_seed(rank_seed(cfg.run.seed, self.dist.rank))
        main = self.dist.is_main
        # What checkpoints hold: with PEFT from a pretrained dir, only the adapter, head and task-token rows.
        self.weights = self.model
        if self.peft is not None:
            if main:
                print(self.peft)
            if Path(cfg.model.init).exists():
                self.weights = AdapterWeights(self.model, task_token_rows(self.tokenizer))
        self.train_features = self.task.features(self.splits["train"], train=True)
        if self.task.n_truncated and main:
            print(
                f"warning: {self.task.n_truncated} of {len(self.splits['train'].examples)} training examples are "
                f"longer than task.max_len={self.task.max_len} tokens and were truncated (task.overlong=error "
                "refuses them instead)",
                file=sys.stderr,
            )
        if not self.train_features:
            raise LMForgeError("no training features: every training example was skipped")
        self.global_batch = t.batch_size * self.dist.world_size
        per_epoch = math.ceil(len(self.train_features) / self.global_batch)
        self.total_steps = t.max_steps or per_epoch * t.epochs
        self.epochs = math.ceil(self.total_steps / per_epoch)
        sched = schedule_config(cfg, self.total_steps)
        self.optimizer = build_optimizer(self.model, sched, self.device, t.layer_decay)
        self.scheduler = build_scheduler(self.optimizer, sched)
        self.select = t.select_metric or self.task.main_metric
        self.best: tuple[float, int] | None = None
        self.log: MetricsLogger | None = None
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_finetune_config(cfg, self.run_dir / ckpt.CONFIG_FILE)
            self.log = MetricsLogger(self.run_dir, resume_step=0)  # drops lines of an attempt that died early
            if self.peft is not None:
                self.log.log(0, trainable_params=self.peft.trainable, total_params=self.peft.total)

    def evaluate(self, split: str = "dev") -> dict[str, float]:
        with self.autocast:
            return self.task.evaluate(self.model, self.splits[split], self.cfg.train.eval_batch_size)

    def _step(self, chunk: list[dict]) -> tuple[float, dict]:
        """One update on a global batch; this rank computes its share (every world_size-th example)."""
        world = self.dist.world_size
        mine = chunk[self.dist.rank :: world]
        local, parts = None, {}
        if mine:
            batch = {k: v.to(self.device) for k, v in collate(mine, self.task.pad_id).items()}
            with self.autocast:
                out = self.task.loss(self.model, batch)
            local, parts = out.loss, out.metrics
        # The batch's mean loss: each rank's mean weighted by its share (shares differ only in a last, short batch).
        if self.dist.enabled:
            loss = sum_across(float(local.detach()) * len(mine) if mine else 0.0, self.dist) / len(chunk)
        else:
            loss = float(local.detach())
        if not math.isfinite(loss):  # stop before the update: the best checkpoint on disk stays good
            raise LMForgeError("the loss became non-finite (lower train.lr or check the data)")
        if mine:
            (local * (len(mine) * world / len(chunk))).backward()
        average_gradients(self.trainable, self.dist)
        if self.cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss, parts

    def _dev(self, step: int, epoch: float) -> None:
        if self.dist.is_main:
            self._evaluate_and_keep(step, epoch)
        barrier(self.dist)

    def _evaluate_and_keep(self, step: int, epoch: float) -> None:
        metrics = self.evaluate("dev")
        if self.select not in metrics:
            raise LMForgeError(f"train.select_metric '{self.select}' is not among the dev metrics {list(metrics)}")
        self.log.log(step, epoch=epoch, **{f"dev_{k}": v for k, v in metrics.items()})
        value = metrics[self.select]
        print(f"step {step} (epoch {epoch:g}): dev " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if self.best is None or value > self.best[0]:
            self.best = (value, step)
            config = {**checkpoint_config(self.cfg, self.model.backbone, self.labels), "dev": metrics}
            if self.peft is not None:
                config["adapter_only"] = self.weights is not self.model
                config["trainable_params"] = {"trainable": self.peft.trainable, "total": self.peft.total}
            ckpt.save_checkpoint(self.run_dir, step, self.weights, config=config, tokenizer=self.tokenizer, keep_last=1)

    def fit(self) -> dict[str, float]:
        """Train, keep the best dev checkpoint, reload it and write eval.json; returns its dev metrics (on rank 0;
        {} on the other ranks)."""
        t = self.cfg.train
        step, running = 0, []
        per_epoch = math.ceil(len(self.train_features) / self.global_batch)
        self.model.train()
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=self.device.type == "cuda")
        try:
            for epoch in range(self.epochs):
                gen = torch.Generator().manual_seed(self.cfg.run.seed * 1000 + epoch)
                for chunk in batches(self.train_features, self.global_batch, gen):
                    loss, parts = self._step(chunk)
                    step += 1
                    running.append(loss)
                    if step % t.log_every == 0 or step == self.total_steps:
                        if self.log:  # rank 0
                            lr = self.scheduler.get_last_lr()[0]
                            self.log.log(step, loss=sum(running) / len(running), lr=lr, **parts)
                        running = []
                    # Mid-epoch dev evaluations; the epoch's last step is evaluated below.
                    if t.eval_every and step % t.eval_every == 0 and step % per_epoch and step != self.total_steps:
                        self._dev(step, step / per_epoch)
                    if step >= self.total_steps:
                        break
                self._dev(step, step / per_epoch)
                if step >= self.total_steps:
                    break
        finally:
            if self.log:
                self.log.close()
            torch.use_deterministic_algorithms(was_deterministic)
        final = self.finish() if self.dist.is_main else {}
        barrier(self.dist)
        cleanup(self.dist)
        return final

    def finish(self) -> dict[str, float]:
        """Reload the best checkpoint, evaluate dev (and a labelled test split) and write eval.json."""
        best = ckpt.latest_checkpoint(self.run_dir)
        ckpt.load_weights(best, self.weights)
        final = self.evaluate("dev")
        write_json(self.run_dir / "eval.json", final)
        test = self.splits.get("test")
        if test is not None and _labelled(test):
            write_json(self.run_dir / "eval_test.json", self.evaluate("test"))
        try:
            plot_metrics(self.run_dir)
        except Exception as e:  # a plotting problem must not lose a finished run
            print(f"warning: could not plot metrics: {e}", file=sys.stderr)
        return final


def _labelled(ds: Dataset) -> bool:
    return bool(ds.examples) and all(
        e.label is not None or e.answers is not None or e.tags is not None or e.target is not None for e in ds.examples
    )


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def finetune(cfg: FinetuneConfig) -> tuple[FineTuner, dict[str, float]]:
    tuner = FineTuner(cfg)
    return tuner, tuner.fit()
