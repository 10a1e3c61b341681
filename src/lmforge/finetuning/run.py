"""Fine-tuning: a task model on labelled splits, trained by the one loop (`train/loop.py`) — AdamW with linear warmup
and decay, dev evaluation after every epoch, the best dev checkpoint kept in RUN/best, final metrics in
RUN/eval.json, resumable checkpoints in RUN/checkpoints.

Under torchrun every rank takes its share of each global batch (train.batch_size per rank) and DDP averages the
gradients; a rank's loss is weighted by its share, so N processes train like one with an N-times larger batch
(exactly for losses averaged over examples; a loss averaged over tokens, like GPT-1's auxiliary LM loss, is averaged
per rank first). Rank 0 evaluates and writes."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

from lmforge.adapt.adamix import with_consistency
from lmforge.adapt.finetune import AdapterWeights, apply_peft_section
from lmforge.checkpoint.read import load_weights
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.data.labelled.examples import Dataset, example_texts
from lmforge.errors import LMForgeError
from lmforge.files import write_atomic
from lmforge.loading import load_backbone
from lmforge.models.init import reinit_top_blocks
from lmforge.progress import status
from lmforge.tasks.backbone import checkpoint_config, task_token_rows
from lmforge.tasks.config import FinetuneConfig, finetune_to_dict
from lmforge.tasks.inputs import collate, feature_length, length_grouped
from lmforge.tasks.mixing import MixtureSampler
from lmforge.tasks.model import set_dropout
from lmforge.tasks.multi_task import load_task_splits, train_sampler
from lmforge.train.distributed import DistInfo, barrier, rank_seed
from lmforge.train.gradual_prune import finetuning_callbacks
from lmforge.train.loop_spec import LoopSpec, Saved, Selection
from lmforge.train.prefetch import Batch
from lmforge.train.session import RunSession

PREDICTIONS = "predictions.json"
"""A finished run's per-example label probabilities on dev and test (`FineTuner.finish`)."""
FROZEN = ("model", "task", "data", "peft")
"""Sections a resumed fine-tuning run may not change."""


class FeatureBatches:
    """Epochs of a seeded shuffle of the training features cut into global batches (a multi-task run's `sampler`
    draws each epoch's features by its mixing rates instead; `by_length` then groups them into batches of similar
    length, `tasks/inputs.py` `length_grouped`); this rank takes every world_size-th example of each, weighted by its
    share (a rank left without examples in a short last batch runs one example at weight 0, so DDP's collective still
    sees every rank)."""

    def __init__(self, features: list[dict], global_batch: int, dist: DistInfo, seed: int, pad_id: int,
                 sampler: MixtureSampler | None = None, by_length: bool = False) -> None:  # fmt: skip
        self.features, self.global_batch, self.dist = features, global_batch, dist
        self.seed, self.pad_id, self.sampler = seed, pad_id, sampler
        self.lengths = [feature_length(f) for f in features] if by_length else None
        self.per_epoch = math.ceil((sampler.epoch_size if sampler else len(features)) / global_batch)
        self.epoch = self.index = 0
        self._chunks: list[list[dict]] | None = None

    def __next__(self) -> Batch:
        if self._chunks is None:
            gen = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
            if self.sampler is None:
                order = torch.randperm(len(self.features), generator=gen).tolist()
            else:
                order = self.sampler.indices(gen)
            size = self.global_batch
            if self.lengths is not None:
                order = length_grouped(order, self.lengths, size, gen)
            self._chunks = [[self.features[j] for j in order[i : i + size]] for i in range(0, len(order), size)]
        chunk = self._chunks[self.index]
        self.index += 1
        if self.index == self.per_epoch:
            self.epoch, self.index, self._chunks = self.epoch + 1, 0, None
        world = self.dist.world_size
        mine = chunk[self.dist.rank :: world]
        weight = len(mine) * world / len(chunk)
        if not mine:
            mine, weight = chunk[:1], 0.0
        return Batch(collate(mine, self.pad_id), weight, len(mine))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.index, "n_features": len(self.features),
                "global_batch": self.global_batch}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("n_features", len(self.features)), ("global_batch", self.global_batch)):
            if int(state[key]) != mine:
                raise LMForgeError(f"cannot resume fine-tuning data: {key} was {state[key]}, now {mine}")
        self.epoch, self.index, self._chunks = int(state["epoch"]), int(state["batch"]), None


class FineTuner:
    """Builds a fine-tuning run from a FinetuneConfig and trains it: `FineTuner(cfg).fit()` → best dev metrics."""

    def __init__(self, cfg: FinetuneConfig, resume: bool = False) -> None:
        self.cfg, self.run_dir = cfg, Path(cfg.run.dir)
        self.tested: dict[str, float] | None = None  # the test split's metrics, set by finish()
        # step → (dev metrics, dev label probabilities or None) of the last evaluation and of the best one so far:
        # finish() scores the best checkpoint from them instead of a second pass over dev.
        self._dev_scored: dict[int, tuple[dict[str, float], dict | None]] = {}
        # One seed on every rank while the model is built (each rank's own dropout comes after).
        self.session = RunSession(self.run_dir, cfg.train, seed=cfg.run.seed, rank_seeds=False)
        self.dist, self.device, self.lock = self.session.dist, self.session.device, self.session.lock
        with self.session.closed_on_error():
            self._build(resume)

    def _build(self, resume: bool) -> None:
        from lmforge.registry import TASKS

        cfg, t, d = self.cfg, self.cfg.train, self.dist
        self.resume_from = self.session.find_resume(finetune_to_dict(cfg), resume, FROZEN)
        task_cls = TASKS.get(cfg.task.type)
        _check_select_metric(t.select_metric, getattr(cfg.task.options, "metrics", None) or task_cls.default_metrics)
        self.splits = load_task_splits(cfg)  # a multi_task run: every task's, tagged (tasks/multi_task.py)
        backbone, self.tokenizer = load_backbone(cfg.model, lambda: example_texts([self.splits["train"]]))
        if cfg.model.dropout is not None:
            set_dropout(backbone, cfg.model.dropout)
        if cfg.model.reinit_top:
            reinit_top_blocks(backbone, cfg.model.reinit_top)
        # A backbone pruned while pretraining keeps its zeros (Gordon et al. 2020); read before adapters wrap it.
        callbacks, self.pruned = finetuning_callbacks(cfg.model.init, backbone, t.parallel)
        self.labels = task_cls.label_set(self.splits["train"])
        self.task = task_cls(cfg.task.options, self.tokenizer, self.labels)
        self.model = self.task.build(backbone).to(self.device)
        self.peft = apply_peft_section(self.model, cfg.peft)  # None: full fine-tuning
        torch.manual_seed(rank_seed(cfg.run.seed, d.rank))  # one start (DDP copies rank 0's), then each rank's dropout
        # What checkpoints hold: with PEFT from a pretrained dir, only the adapter, head and task-token rows.
        self.weights = self.model
        if self.peft is not None:
            if d.is_main:
                print(self.peft)
            if Path(cfg.model.init).exists():
                self.weights = AdapterWeights(self.model, task_token_rows(self.tokenizer))
        self.train_features = self.task.features(self.splits["train"], train=True)
        self._warn_truncated()
        if not self.train_features:
            raise LMForgeError("no training features: every training example was skipped")
        global_batch = t.batch_size * d.world_size
        sampler = train_sampler(self.task, self.train_features)  # a multi_task run's mixing rates
        source = FeatureBatches(
            self.train_features, global_batch, d, cfg.run.seed, self.task.pad_id, sampler, t.group_by_length
        )
        self.per_epoch = source.per_epoch
        self.total_steps = t.max_steps or self.per_epoch * max(t.epochs, math.ceil(t.min_steps / self.per_epoch))
        loop_cfg = dataclasses.replace(t, max_steps=self.total_steps)
        spec = LoopSpec(
            saved=self._saved,
            evaluate=self._evaluate,
            eval_at=lambda step: step % self.per_epoch == 0,
            eval_prefix="dev_",
            eval_fields=lambda step: {"epoch": step / self.per_epoch},
            select=Selection(t.select_metric or self.task.main_metric),
            resume_hint=f"lmforge finetune --run.dir={self.run_dir} --resume",
        )
        config = finetune_to_dict(cfg)
        loss_fn = with_consistency(self.task) if cfg.peft.method == "adamix" else self.task.loss
        self.loop = self.session.start(
            self.model, loss_fn, source, spec, config=config, loop_cfg=loop_cfg, callbacks=callbacks
        )
        self.log = self.session.log
        if self.resume_from is not None and d.is_main:
            print(f"resumed from {self.resume_from} at step {self.loop.step}", file=sys.stderr)
        if d.is_main and self.peft is not None and self.loop.step == 0:
            self.log.log(0, trainable_params=self.peft.trainable, total_params=self.peft.total)

    def _warn_truncated(self) -> None:
        if self.task.n_truncated and self.dist.is_main:
            print(
                f"warning: {self.task.n_truncated} of {len(self.splits['train'].examples)} training examples are "
                f"longer than task.max_len={self.task.max_len} tokens and were truncated (task.overlong=error "
                "refuses them instead)",
                file=sys.stderr,
            )

    def _saved(self) -> Saved:
        config = checkpoint_config(self.cfg, self.model.backbone, self.labels)
        if self.peft is not None:
            config["adapter_only"] = self.weights is not self.model
            config["trainable_params"] = {"trainable": self.peft.trainable, "total": self.peft.total}
        return Saved(self.weights, config, self.tokenizer)

    def evaluate(self, split: str = "dev") -> dict[str, float]:
        from lmforge.train.device import autocast_for

        with autocast_for(self.device, self.cfg.train.precision):
            return self.task.evaluate(self.model, self.splits[split], self.cfg.train.eval_batch_size)

    def label_probabilities(self, split: str) -> dict:
        """`split`'s example ids, gold label indices and each example's probability of each label, in one pass of the
        model (a task that chooses a label)."""
        from lmforge.train.device import autocast_for

        ds = self.splits[split]
        with autocast_for(self.device, self.cfg.train.precision):
            probs = self.task.predict_all(self.model, ds, self.cfg.train.eval_batch_size, self.task.probabilities)
        return {"ids": [e.id or str(i) for i, e in enumerate(ds.examples)], "gold": self.task.gold(ds), "probs": probs}

    def _score_dev(self) -> tuple[dict[str, float], dict | None]:
        """The dev metrics, with the label probabilities they come from for a task that chooses a label (what
        predictions.json keeps): one pass over dev."""
        from lmforge.tasks.scoring import score

        if not self.task.chooses_label:
            return self.evaluate("dev"), None
        per = self.label_probabilities("dev")
        return score(self.task.metric_names, _argmax(per["probs"]), per["gold"]), per

    @property
    def _every_rank(self) -> bool:
        """Whether every rank evaluates: a sharded model's forward needs them all."""
        return self.cfg.train.parallel == "fsdp"

    def _evaluate(self, step: int) -> dict[str, float]:
        if not (self.dist.is_main or self._every_rank):
            return {}
        metrics, per = self._score_dev()
        best = self.loop.best[1] if self.loop.best else None
        self._dev_scored = {k: v for k, v in self._dev_scored.items() if k == best}
        self._dev_scored[step] = (metrics, per)
        if not self.dist.is_main:
            return metrics
        epoch = step / self.per_epoch
        status(f"step {step} (epoch {epoch:g}): dev " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        return metrics

    def fit(self) -> dict[str, float]:
        """Train, keep the best dev checkpoint, reload it and write eval.json; returns its dev metrics (on rank 0;
        {} on the other ranks)."""
        with self.session.closing():
            self.loop.run()
            final = self.finish() if self.dist.is_main or self._every_rank else {}
            barrier(self.dist)
        return final

    def finish(self) -> dict[str, float]:
        """Reload the best checkpoint, evaluate dev (and a labelled test split) and write eval.json. A task that
        chooses a label is scored from one pass a split that also gives predictions.json (written first)."""
        from lmforge.tasks.scoring import score

        load_weights(model_checkpoint(self.run_dir), self.weights)
        test = self.splits.get("test")
        splits = ["dev"] + (["test"] if test is not None and _labelled(test) else [])
        # The best checkpoint's dev pass during training, when this process ran it, is its dev score.
        scored = self._dev_scored.get(self.loop.best[1]) if self.loop.best else None
        per: dict[str, dict] = {}
        if self.task.chooses_label:
            per = {s: scored[1] if s == "dev" and scored else self.label_probabilities(s) for s in splits}
            scores = {s: score(self.task.metric_names, _argmax(p["probs"]), p["gold"]) for s, p in per.items()}
        else:
            scores = {s: scored[0] if s == "dev" and scored else self.evaluate(s) for s in splits}
        final, self.tested = scores["dev"], scores.get("test")
        if not self.dist.is_main:
            return {}
        if per:
            for p in per.values():
                p["probs"] = [[round(x, 6) for x in row] for row in p["probs"]]
            predictions = {"labels": self.labels, "metrics": self.task.metric_names, **per}
            write_atomic(self.run_dir / PREDICTIONS, json.dumps(predictions) + "\n")
        write_json(self.run_dir / "eval.json", final)
        if self.tested is not None:
            write_json(self.run_dir / "eval_test.json", self.tested)
        return final


def _check_select_metric(name: str | None, metrics) -> None:
    """Refuse, before any training, a train.select_metric the task does not report on dev."""
    if name is not None and name not in metrics:
        raise LMForgeError(
            f"train.select_metric '{name}' is not among the task's dev metrics {list(metrics)} (task.metrics sets them)"
        )


def _argmax(probs: list[list[float]]) -> list[int]:
    return [max(range(len(row)), key=row.__getitem__) for row in probs]


def _labelled(ds: Dataset) -> bool:
    return bool(ds.examples) and all(
        e.label is not None or e.answers is not None or e.tags is not None or e.target is not None for e in ds.examples
    )


def write_json(path: Path, obj: dict) -> None:
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def finetune(cfg: FinetuneConfig) -> tuple[FineTuner, dict[str, float]]:
    tuner = FineTuner(cfg)
    return tuner, tuner.fit()
