"""The training loop. It knows models, an objective's `transform` and `loss`, and nothing of families."""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from lmforge.config import Config, to_dict
from lmforge.errors import LMForgeError
from lmforge.objectives import OBJECTIVES
from lmforge.train import checkpoint as ckpt
from lmforge.train.distributed import DistInfo, cleanup, init_distributed, mean_across, rank_seed
from lmforge.train.faults import Faults
from lmforge.train.metrics import MetricsLogger, Progress, flops_per_token, peak_flops, plot_metrics
from lmforge.train.metrics import mfu as compute_mfu
from lmforge.train.optim import build_optimizer, build_scheduler
from lmforge.train.resume import resume_checkpoint
from lmforge.train.rng_state import capture_rng_state, restore_rng_state
from lmforge.train.setup import (
    apply_init,
    autocast_for,
    check_vocab,
    load_or_train_tokenizer,
    pick_device,
    prepare_data,
)


class Trainer:
    """Builds a run from a Config and trains it: `Trainer(cfg, resume=False).fit()`."""

    def __init__(self, cfg: Config, resume: bool = False) -> None:
        self.cfg, self.resume = cfg, resume
        self.run_dir = Path(cfg.run.dir)
        self.dist: DistInfo = init_distributed("cuda" if torch.cuda.is_available() else "cpu")
        self.device = pick_device(cfg.train.device, self.dist)
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        # Each rank draws its own random numbers (dynamic masks, noise, dropout): with one seed everywhere, every
        # rank would mask the same positions of its batch. Rank 0 keeps run.seed (a one-process run's stream) and
        # DDP gives every rank rank 0's initial weights.
        torch.manual_seed(rank_seed(cfg.run.seed, self.dist.rank))
        self.init_from = apply_init(cfg)  # before the config is saved or compared: it sets model.* and the tokenizer
        self.faults = Faults()  # test-only pauses (LMFORGE_FAULT_SLEEP); read once, here
        self.resume_from = resume_checkpoint(self.run_dir, to_dict(cfg), resume, self.dist.is_main)
        self.resume = self.resume_from is not None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer = load_or_train_tokenizer(cfg, self.run_dir, self.dist)
        check_vocab(cfg, self.tokenizer, trained_here=not cfg.data.tokenizer)
        self.data_dir = prepare_data(cfg, self.run_dir, self.tokenizer, self.dist)
        self.objective = OBJECTIVES.get(cfg.objective.name)(cfg, self.tokenizer)
        self._build_model()
        self._build_loaders()
        self.start_step = 0
        self.parts: dict[str, float] = {}
        if self.resume:
            self._restore()
        if self.dist.is_main:
            ckpt.save_run_config(self.run_dir, to_dict(cfg))
        # A fresh run drops metrics left by an attempt that died before its first checkpoint.
        self.log = MetricsLogger(self.run_dir, resume_step=self.start_step) if self.dist.is_main else None

    # --- construction -------------------------------------------------------------------------------------

    def _build_model(self) -> None:
        cfg = self.cfg
        self.model = self.objective.build_model(cfg.model).to(self.device)
        self.raw_model = self.model
        if self.init_from is not None and not self.resume:  # a resumed run's checkpoint holds newer weights
            ckpt.load_weights(self.init_from, self.model)
            if self.dist.is_main:
                print(f"initialised from {self.init_from}", file=sys.stderr)
        self.optimizer = build_optimizer(self.model, cfg.train, self.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.train)
        if cfg.train.compile:
            self.model = torch.compile(self.model, mode=cfg.train.compile_mode)
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.model, device_ids=ids)
        self.autocast = autocast_for(self.device, cfg.train.precision)
        count = getattr(self.raw_model, "num_params", None)
        n_params = count(non_embedding=True) if count else sum(p.numel() for p in self.raw_model.parameters())
        self.flops_per_token = flops_per_token(n_params, cfg.model.n_layers, cfg.model.d_model, cfg.train.seq_len)
        self.peak = peak_flops(self.device, torch.bfloat16 if cfg.train.precision != "fp32" else torch.float32)

    def _build_loaders(self) -> None:
        d = self.dist
        self.train_loader = self.objective.make_loader(self.data_dir, "train", rank=d.rank, world_size=d.world_size)
        self.val_loader = self.objective.make_loader(self.data_dir, "val")
        self.train_iter = iter(self.train_loader)

    def _restore(self) -> None:
        ckpt.load_weights(self.resume_from, self.raw_model)
        state = ckpt.load_train_state(self.resume_from)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            loaders = state["loader"]  # one per rank; positions are global, so any rank's serves a new world size
            self.train_loader.load_state_dict(loaders[min(self.dist.rank, len(loaders) - 1)])
            rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]  # one per rank
            self.start_step = int(state["step"])
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise LMForgeError(
                f"{self.resume_from / ckpt.TRAIN_STATE_FILE} does not match this run: {type(e).__name__}: {e}"
            ) from e
        self.train_iter = iter(self.train_loader)
        if self.dist.rank < len(rngs):
            restore_rng_state(rngs[self.dist.rank])
        else:  # more ranks than the checkpoint saved: a new rank's stream, distinct from the others'
            torch.manual_seed(rank_seed(self.cfg.run.seed + self.start_step, self.dist.rank))
        if self.dist.is_main:
            pos = self.train_loader.state_dict()
            print(
                f"resumed from {self.resume_from} at step {self.start_step} "
                f"(data position: epoch {pos.get('epoch')}, batch {pos.get('batch')})",
                file=sys.stderr,
            )

    # --- the loop ------------------------------------------------------------------------------------------

    def _micro_step(self, last: bool) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()  # with CUDA graphs: the last replay's outputs may be reused
        batch = self.objective.transform(next(self.train_iter))
        batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
        # DDP: all-reduce gradients only on the last micro-batch of an accumulation.
        sync = self.model.no_sync() if self.dist.enabled and not last else nullcontext()
        with sync:
            with self.autocast:
                out = self.objective.loss(self.model, batch)
            (out.loss / self.cfg.train.grad_accum).backward()
        self.parts = out.metrics  # the objective's own numbers (MLM accuracy, loss terms), logged with the step
        return out.loss.detach()

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step over grad_accum micro-batches → (mean loss, grad norm, skipped)."""
        t = self.cfg.train
        losses = [self._micro_step(i == t.grad_accum - 1) for i in range(t.grad_accum)]
        loss = mean_across(torch.stack(losses).mean(), self.dist)
        params = self.raw_model.parameters()
        if t.grad_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip)
        else:
            gnorm = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in self.raw_model.parameters() if p.grad is not None])
            )
        finite = bool(torch.isfinite(loss)) and bool(torch.isfinite(gnorm))
        if finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(loss), float(gnorm), not finite

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation loss (nats/token), perplexity and bits per byte over the deterministic val pass."""
        self.model.eval()
        total, n = 0.0, 0
        # Objectives that corrupt at random may give validation fixed corruptions (e.g. static MLM masks).
        transform = getattr(self.objective, "eval_transform", self.objective.transform)
        for tokens in self.val_loader.eval_batches(self.cfg.train.eval_batches):
            batch = {k: v.to(self.device) for k, v in transform(tokens).items()}
            with self.autocast:
                out = self.objective.loss(self.raw_model, batch)
            total += float(out.loss) * out.n_tokens
            n += out.n_tokens
        self.model.train()
        loss = total / max(n, 1)
        if not self.objective.language_model:
            return {"val_loss": loss}
        meta = json.loads((self.data_dir / "meta.json").read_text())
        bytes_per_token = meta["val"]["n_bytes"] / max(1, meta["val"]["n_tokens"])
        return {
            "val_loss": loss,
            "val_ppl": math.exp(min(loss, 50)),
            "val_bpb": loss / math.log(2) / bytes_per_token,
        }

    def save(self, step: int) -> None:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "loader": self._gather(self.train_loader.state_dict()),
            "rng": self._gather(capture_rng_state()),
            "step": step,
        }
        if self.dist.is_main:
            ckpt.save_checkpoint(
                self.run_dir,
                step,
                self.raw_model,
                config=to_dict(self.cfg),
                tokenizer=self.faults.checkpoint_tokenizer(self.tokenizer, step),
                train_state=state,
                keep_last=self.cfg.train.keep_last,
            )

    def _gather(self, state: dict) -> list[dict]:
        """Every rank's `state`, in rank order (a one-item list without DDP)."""
        if not self.dist.enabled:
            return [state]
        out: list = [None] * self.dist.world_size
        torch.distributed.all_gather_object(out, state)
        return out

    def fit(self) -> dict[str, float]:
        """Train from start_step to train.max_steps; returns the last validation metrics."""
        t = self.cfg.train
        self.progress = Progress(t.max_steps, every=1) if self.dist.is_main else None
        self.clock = Throughput(t.batch_size * t.seq_len * t.grad_accum * self.dist.world_size, self.start_step)
        self.model.train()
        nonfinite, last_eval = 0, {}
        try:
            for step in range(self.start_step, t.max_steps):
                loss, gnorm, skipped = self.train_step()
                done = step + 1
                if skipped:
                    nonfinite = self._skip_nonfinite(done, loss, gnorm, nonfinite + 1)
                else:
                    nonfinite = 0
                    if done % t.log_every == 0 or done == t.max_steps:
                        self._log_train(done, loss, gnorm)
                with self.clock.paused():
                    if done % t.eval_every == 0 or done == t.max_steps:
                        self.faults.pause("eval", done)
                        last_eval = self.evaluate()
                        if self.dist.is_main:
                            self.log.log(done, **last_eval)
                    if done % t.save_every == 0 or done == t.max_steps:
                        self.save(done)
        finally:
            if self.progress is not None:
                self.progress.close()
        if self.dist.is_main:
            plot_metrics(self.run_dir)
        cleanup(self.dist)
        return last_eval

    def _skip_nonfinite(self, done: int, loss: float, gnorm: float, count: int) -> int:
        """Record a skipped step (the optimizer did not step); stop after train.max_nonfinite in a row."""
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        value = loss if what == "loss" else gnorm
        if self.dist.is_main:
            print(f"warning: step {done}: non-finite {what} ({value}), step skipped", file=sys.stderr)
            self.log.log(done, skipped=True, nonfinite=what, loss=loss, grad_norm=gnorm)
        limit = self.cfg.train.max_nonfinite
        if count >= limit:
            last = ckpt.list_checkpoints(self.run_dir)
            kept = f"; the last checkpoint is {last[-1].name}" if last else ""
            raise LMForgeError(
                f"stopping at step {done}: {count} consecutive steps with a non-finite loss or gradient "
                f"(train.max_nonfinite={limit}); lower train.lr or check the data{kept}"
            )
        return count

    def _log_train(self, done: int, loss: float, gnorm: float) -> None:
        tps = self.clock.tokens_per_s(done)
        mfu = compute_mfu(tps, self.flops_per_token, self.peak, n_devices=self.dist.world_size)
        lr = self.scheduler.get_last_lr()[0]
        if self.dist.is_main:
            # Deterministic runs also log the exact loss (the JSON value is rounded) for bitwise comparisons.
            exact = {"loss_hex": float.hex(loss)} if self.cfg.train.deterministic else {}
            self.log.log(done, loss=loss, lr=lr, grad_norm=gnorm, tokens_per_s=tps, mfu=mfu, **self.parts, **exact)
            self.progress.update(done, loss, lr, tps, mfu)


class Throughput:
    """Tokens/s over the steps since the last reading, excluding time spent evaluating and saving."""

    def __init__(self, tokens_per_step: int, step: int) -> None:
        self.tokens_per_step, self.step = tokens_per_step, step
        self.t0, self.excluded = time.perf_counter(), 0.0

    @contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t

    def tokens_per_s(self, step: int) -> float:
        now = time.perf_counter()
        rate = self.tokens_per_step * (step - self.step) / max(now - self.t0 - self.excluded, 1e-9)
        self.step, self.t0, self.excluded = step, now, 0.0
        return rate


def train(cfg: Config, resume: bool = False) -> tuple[Trainer, dict[str, float]]:
    trainer = Trainer(cfg, resume=resume)
    return trainer, trainer.fit()
