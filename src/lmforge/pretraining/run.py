"""Pretraining: a locked run dir, the run's tokenizer and token shards, an objective's model, loss and batches,
trained by the one loop (`train/loop.py`). It knows objectives through their interface and nothing of families."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from lmforge.checkpoint.read import EXPORT_MODULES, load_weights
from lmforge.data.corpus.loader import take_rows
from lmforge.errors import LMForgeError
from lmforge.eval.plateau import context_free_floor, special_ids, target_rows, unigram_log_probs
from lmforge.objectives import OBJECTIVES
from lmforge.objectives.rng import use_rng
from lmforge.pretraining.config import Config, to_dict
from lmforge.pretraining.setup import (
    apply_init,
    check_inputs,
    check_vocab,
    load_or_train_tokenizer,
    model_summary,
    prepare_data,
    warmup_note,
)
from lmforge.progress import status
from lmforge.train.callbacks import Callbacks
from lmforge.train.distributed import DistInfo, rank_seed, sums_across
from lmforge.train.gradual_prune import check_prune_config, pretraining_callbacks
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.memory import available_memory, check_model_fits
from lmforge.train.metrics import peak_flops
from lmforge.train.prefetch import Batch
from lmforge.train.seq_len_schedule import DrawLengths, check_schedule, cut_windows, stage_lengths
from lmforge.train.session import RunSession


class ObjectiveBatches:
    """A loader's packed windows (or sentence pairs) turned into model batches by an objective's transform, every
    random choice drawn from this source's own generator: a batch depends only on the seed and the position, and
    the state (position + generator + draws) resumes it exactly.

    `lengths` (train.seq_len_schedule): draw index → window length; a batch drawn at a shorter length has each
    window cut into consecutive pieces (`cut_windows`) before the transform, the same tokens in more rows. The
    length depends on the batch's own index, counted here, so batches built ahead keep their step's length."""

    def __init__(self, loader, transform, seed: int, lengths: Callable[[int], int] | None = None) -> None:
        self.loader, self.transform, self.lengths = loader, transform, lengths
        self.generator = torch.Generator().manual_seed(seed)
        self.draws = 0

    def __next__(self) -> Batch:
        tokens = next(self.loader)
        if self.lengths is not None:
            tokens = cut_windows(tokens, self.lengths(self.draws))
        self.draws += 1
        with use_rng(self.generator):
            data = self.transform(tokens)
        return Batch(data)

    def state_dict(self) -> dict:
        return {"loader": self.loader.state_dict(), "generator": self.generator.get_state(), "draws": self.draws}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state["loader"])
        self.generator.set_state(state["generator"])
        self.draws = int(state.get("draws", 0))  # checkpoints from before the count: 0


RISE_NATS = 0.1
"""A validation loss this far above its lowest of the run is not noise (`Pretraining._note_rise`)."""


class Pretraining:
    """Builds a pretraining run from a Config and trains it: `Pretraining(cfg, resume=False).fit()`."""

    def __init__(self, cfg: Config, resume: bool = False, callbacks: Callbacks | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(cfg.run.dir)
        # Each rank draws its own random numbers (noise, dropout); DDP gives every rank rank 0's initial weights.
        self.session = RunSession(self.run_dir, cfg.train, seed=cfg.run.seed)
        self.dist: DistInfo = self.session.dist
        self.device, self.lock = self.session.device, self.session.lock
        with self.session.closed_on_error():
            self._build(resume, callbacks)

    def _build(self, resume: bool, callbacks: Callbacks | None) -> None:
        cfg, d = self.cfg, self.dist
        self.init_from = apply_init(cfg)  # before the config is saved or compared: it sets model.* and the tokenizer
        self.resume_from = self.session.find_resume(to_dict(cfg), resume)
        check_inputs(cfg)
        check_schedule(cfg)  # also for configs not made by load_config (resumed, built in Python)
        check_prune_config(cfg.prune, cfg.train)
        t = cfg.train  # a model too large to train here is refused before the tokenizer, data or model are made
        room = available_memory(self.device, t.parallel, d.world_size, t.cpu_offload)
        check_model_fits(cfg.model, t.optimizer, *room)
        if d.is_main and (note := warmup_note(cfg)):
            status(note)
        self.tokenizer = load_or_train_tokenizer(cfg, self.run_dir, d)
        check_vocab(cfg, self.tokenizer)
        self.data_dir = prepare_data(cfg, self.run_dir, self.tokenizer, d)
        self.objective = OBJECTIVES.get(cfg.objective.name)(cfg, self.tokenizer)
        self._check_stages()
        if cfg.train.parallel == "fsdp":  # FSDP moves the model block by block as it shards it
            self.raw_model = self.objective.build_model(cfg.model)
        else:  # built and initialised where it trains (a 162M-parameter init takes 2 s on a CPU)
            with self.device:
                self.raw_model = self.objective.build_model(cfg.model).to(self.device)
        if d.is_main:  # counted on the network built, not on a second one (a meta-device init takes seconds)
            net = self.raw_model.get_submodule(EXPORT_MODULES.get(cfg.objective.name, ""))  # ELECTRA: discriminator
            status(model_summary(cfg, net.num_params()))
        if self.init_from is not None and self.resume_from is None:  # a resumed run's checkpoint is newer
            load_weights(self.init_from, self.raw_model)
            if d.is_main:
                status(f"initialised from {self.init_from}")
        loader = self.objective.make_loader(self.data_dir, "train", rank=d.rank, world_size=d.world_size)
        # Stage lengths follow the loop's planned steps (set once the loop exists; a time budget replans them).
        lengths = DrawLengths(t.seq_len_schedule, t.grad_accum, lambda: t.max_steps) if t.seq_len_schedule else None
        seed = rank_seed(cfg.run.seed, d.rank) + 0x0B1E
        batches = ObjectiveBatches(loader, self.objective.transform, seed, lengths)
        self.val_loader = self.objective.make_loader(self.data_dir, "val", rank=d.rank, world_size=d.world_size)
        self.val_low: tuple[float, int] | None = None  # the lowest validation loss so far, and its step
        self.rise_said = False
        self.val_plateau: float | None = None  # the validation targets' context-free floor, found at the first eval
        self.tokens_per_step = t.batch_size * t.seq_len * t.grad_accum * d.world_size
        spec = LoopSpec(
            saved=lambda: Saved(self.raw_model, to_dict(cfg), self.tokenizer),
            evaluate=self.evaluate,
            tokens_per_step=self.tokens_per_step,
            flops_per_token=self.objective.window_flops(cfg) / t.seq_len,  # per window token, as tokens_per_step
            peak_flops=peak_flops(self.device, torch.bfloat16 if t.precision != "fp32" else torch.float32),
            resume_hint=f"lmforge pretrain --run.dir={self.run_dir} --resume",
            stop_when=(lambda m: m["val_loss"] <= t.target_loss) if t.target_loss is not None else None,
            worker_batches=lengths is None or t.time_budget is None,
        )

        def reseed(step: int) -> None:
            """A rank the resumed checkpoint did not have: its own streams, not a copy of the last saved rank's
            (the batch source's generator included; its prefetch starts after this)."""
            torch.manual_seed(rank_seed(cfg.run.seed + step, d.rank))
            batches.generator.manual_seed(rank_seed(cfg.run.seed + step, d.rank) + 0x0B1E)

        # prune.during_pretraining: masks recomputed on Gordon et al.'s schedule after each optimizer step.
        callbacks, self.pruner = pretraining_callbacks(cfg.prune, self.raw_model, t, callbacks, lambda: self.loop.total)
        self.loop = self.session.start(
            self.raw_model, self.objective.loss, batches, spec, config=to_dict(cfg), callbacks=callbacks, reseed=reseed
        )
        if lengths is not None:
            lengths.total = lambda: self.loop.total
        if self.pruner is not None:
            self.pruner.start(self.loop.step)  # resumed: the checkpoint's zeros are the mask
        self.log = self.session.log
        # Always said, also with --quiet: where a run continued belongs in its log.
        if self.resume_from is not None and d.is_main:
            pos = self.loop.batches.state_dict()["loader"]
            print(
                f"resumed from {self.resume_from} at step {self.loop.step} "
                f"(data position: epoch {pos.get('epoch')}, batch {pos.get('batch')})",
                file=sys.stderr,
            )
            if self.loop.step >= t.max_steps:
                print(
                    f"note: the run is at step {self.loop.step} and train.max_steps is {t.max_steps}: nothing "
                    "to train (a larger --train.max_steps continues it)",
                    file=sys.stderr,
                )

    def _check_stages(self) -> None:
        """The objective's own checks of train.seq_len (T5's spans, MTP's heads, ...) at each shorter stage length."""
        cfg = self.cfg
        for length in stage_lengths(cfg.train.seq_len_schedule):
            if length == cfg.train.seq_len:
                continue
            short = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_len=length))
            try:
                OBJECTIVES.get(cfg.objective.name)(short, self.tokenizer)
            except LMForgeError as e:
                raise LMForgeError(f"train.seq_len_schedule: at length {length}: {e}") from None

    @property
    def model(self):
        return self.loop.model

    def evaluate(self, step: int) -> dict[str, float]:
        """Validation loss (nats/token), perplexity and bits per byte over the deterministic val pass: the same
        windows, corruptions and number, however many processes share each global batch. For an objective whose
        loss is its targets' cross-entropy (`Objective.scores_labels`), also the unigram plateau of those targets
        (`val_plateau`, lmforge.eval.plateau): a run that has not gone below it has learnt token frequencies only."""
        total, n = 0.0, 0
        targets = [] if self.val_plateau is None and self.objective.scores_labels else None
        # Objectives that corrupt at random may give validation fixed corruptions (e.g. static MLM masks).
        transform = getattr(self.objective, "eval_transform", self.objective.transform)
        for tokens, rows in self.val_loader.eval_global(self.cfg.train.eval_batches):
            # The whole global batch is corrupted on every rank (its noise is a function of the whole batch), then
            # each rank scores its rows. A rank left without rows in the last batch still runs a forward on one
            # row, which it does not count: under fsdp every rank must take part in each forward's all-gathers.
            mine = rows.stop > rows.start
            whole = transform(tokens)
            if targets is not None:
                targets += target_rows([whole])
            batch = take_rows(whole, rows if mine else slice(0, 1))
            out = self.objective.loss(self.raw_model, {k: v.to(self.device) for k, v in batch.items()})
            if mine:
                total += float(out.loss) * int(out.n_tokens)
                n += int(out.n_tokens)
        total, n = sums_across([total, n], self.dist)
        loss = total / max(n, 1)
        self._note_rise(step, loss)
        if targets:
            log_u = unigram_log_probs(self.data_dir)
            self.val_plateau = context_free_floor(targets, log_u, special_ids(self.tokenizer))
        out = {"val_loss": loss} | ({"val_plateau": self.val_plateau} if self.val_plateau is not None else {})
        if not self.objective.language_model:
            return out
        meta = json.loads((self.data_dir / "meta.json").read_text())
        bytes_per_token = meta["val"]["n_bytes"] / max(1, meta["val"]["n_tokens"])
        return out | {"val_ppl": math.exp(min(loss, 50)), "val_bpb": loss / math.log(2) / bytes_per_token}

    def _note_rise(self, step: int, loss: float) -> None:
        """Warn once when the validation loss has risen RISE_NATS above its lowest: the model memorises its training
        text (text seen many times, with little dropout or weight decay) or the run diverges. Not for an objective
        whose validation targets move with training (`Objective.val_loss_fixed`)."""
        if not self.objective.val_loss_fixed:
            return
        if self.val_low is None or loss < self.val_low[0]:
            self.val_low = (loss, step)
            return
        low, at = self.val_low
        if not loss - low >= RISE_NATS or self.rise_said or not self.dist.is_main:  # not: a NaN loss is not a rise
            return
        self.rise_said = True
        seen = step * self.tokens_per_step
        train_tokens = json.loads((self.data_dir / "meta.json").read_text())["train"]["n_tokens"]
        print(f"warning: step {step}: validation loss {loss:.3f} is {loss - low:.2f} nats above its lowest ({low:.3f} "
              f"at step {at}), after about {seen / max(1, train_tokens):.1f} passes over the training tokens: the "
              "model is memorising its training text, or diverging. model.dropout, train.weight_decay, more text or "
              "fewer steps help", file=sys.stderr)  # fmt: skip

    def fit(self) -> dict[str, float]:
        """Train to train.max_steps; returns the last validation metrics."""
        with self.session.closing():
            return self.loop.run()
