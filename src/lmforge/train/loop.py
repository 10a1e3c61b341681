"""The one training loop. Pretraining, fine-tuning, alignment and compression runs supply a model, a loss, a batch
source, an evaluation and what a checkpoint holds; the loop does the rest, once: micro-batching and gradient
accumulation, autocast, compile, data parallelism, clipping, optimizer and schedule steps, the non-finite policy,
logging, evaluation, best-checkpoint selection, checkpoints, signals and exact resume.

The step never waits for the GPU: losses, gradient norms and the non-finite flag stay on the device until a log
step reads them all at once, and a non-finite step is skipped by the optimizer itself (`found_inf`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.checkpoint.layout import BEST_DIR, CHECKPOINTS_DIR, TRAIN_STATE_FILE, is_sharded
from lmforge.checkpoint.read import load_weights
from lmforge.checkpoint.rng import capture_rng_state, restore_rng_state
from lmforge.checkpoint.train_state import load_train_state
from lmforge.checkpoint.write import save_checkpoint, write_checkpoint_dir
from lmforge.config.sections import LoopConfig
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.train import parallel
from lmforge.train.budget import TimeBudget
from lmforge.train.callbacks import Callbacks
from lmforge.train.device import autocast_for
from lmforge.train.distributed import DistInfo, barrier, broadcast_object
from lmforge.train.health import Health, probe
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.metrics import BackgroundPlot, MetricsLogger, Progress, Throughput, plot_metrics
from lmforge.train.optim import Schedule, build_optimizer
from lmforge.train.prefetch import Batch, BatchSource, Prefetcher
from lmforge.train.signals import Stopped, StopRequest


@dataclass
class _Pending:
    """Device values of the steps since the last read."""

    steps: list[int] = field(default_factory=list)
    losses: list[Tensor] = field(default_factory=list)
    norms: list[Tensor] = field(default_factory=list)
    bad: list[Tensor] = field(default_factory=list)
    """1.0 for a skipped step (non-finite loss or gradient norm), else 0.0 (`_read` marks an update that made the
    weights non-finite with 2.0)."""


class LossStep(nn.Module):
    """`loss_fn(model, batch)` as one module → (loss, the objective's metrics)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, dict[str, Tensor]], LossOutput]) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        out = self.loss_fn(self.model, batch)
        return out.loss, out.metrics


def _in_process(cfg: LoopConfig, spec: LoopSpec, device: torch.device) -> bool:
    """Whether a worker process builds the batches ahead (train.prefetch_worker)."""
    if cfg.prefetch_worker == "process" and not spec.worker_batches:
        raise LMForgeError(
            "train.prefetch_worker=process: this run's batches follow the training loop (fine-tuning, or a "
            "sequence-length schedule under a time budget); use thread or auto"
        )
    return cfg.prefetch_worker == "process" or (cfg.prefetch_worker == "auto" and device.type == "cuda"
                                                 and spec.worker_batches)  # fmt: skip


class Loop:
    """Trains `model` with `loss_fn(model, batch) -> LossOutput` over `batches` for `cfg.max_steps` steps."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, dict[str, Tensor]], LossOutput],
        batches: BatchSource,
        cfg: LoopConfig,  # with the OptimConfig keys too (each run kind's `train` section)
        run_dir: Path,
        spec: LoopSpec,
        *,
        dist: DistInfo,
        device: torch.device,
        log: MetricsLogger | None,
        callbacks: Callbacks | None = None,
    ) -> None:
        self.raw, self.loss_fn, self.cfg, self.spec = model, loss_fn, cfg, spec
        self.run_dir, self.dist, self.device, self.log = Path(run_dir), dist, device, log
        self.callbacks = callbacks or Callbacks.installed()
        # DDP wraps the model; FSDP shards it in place: the optimizer is built on the shards.
        self.model = parallel.parallelize(model, cfg, dist, device)
        # One module of the model and its loss, so torch.compile sees (and fuses) the LM head and the cross-entropy
        # with the forward, as a training step is timed alone (bench/run.py).
        self.step_fn: nn.Module = LossStep(self.model, loss_fn)
        if cfg.compile and not parallel.compiles_regions(cfg):
            self.step_fn = torch.compile(self.step_fn, mode=cfg.compile_mode)
        self.cuda_graphs = cfg.compile and cfg.compile_mode == "reduce-overhead"
        self.sharded = None
        if parallel.is_sharded(model):
            from lmforge.checkpoint.sharded import ShardedCheckpoints

            self.sharded = ShardedCheckpoints(dist, cfg.async_save)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(model, cfg, device)
        self.schedule = Schedule(self.optimizer, cfg, cfg.max_steps)
        self.total = cfg.max_steps  # planned steps: max_steps, or what the time budget allows
        self.budget, self.progress = None, None
        if getattr(cfg, "time_budget", None) is not None:
            decay = cfg.decay_ratio if cfg.schedule == "wsd" else None
            self.budget = TimeBudget(cfg.time_budget, cfg.max_steps, decay)
        self.autocast = autocast_for(device, cfg.precision)
        if device.type == "cuda":  # float32 matmuls outside autocast (optimizer-free parts, fp32 runs) on TF32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        self.batches = Prefetcher(
            batches, cfg.prefetch, pin_memory=device.type == "cuda", process=_in_process(cfg, spec, device)
        )
        self.step = 0
        self.best: tuple[float, int] | None = None
        self.health = Health(cfg, dist, self.run_dir)
        self.last_data: dict[str, Tensor] | None = None  # the last micro-batch, for the probe of saved weights
        self.pending = _Pending()
        self.grads_seen = False  # checked once, after this process's first backward
        self.parts: dict[str, Any] = {}
        self.last_eval: dict[str, float] = {}
        self.done_early = False

    # --- resume -------------------------------------------------------------------------------------------------

    def train_state(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "loader": self._gather(self.batches.state_dict()),
            "rng": self._gather(capture_rng_state()),
            "step": self.step,
            "best": list(self.best) if self.best else None,
            **self.health.state(),
            **({"budget": {**self.budget.state_dict(), "total": self.total}} if self.budget is not None else {}),
        }

    def restore(self, path: Path, on_rank: Callable[[int], None] | None = None) -> None:
        """Continue from checkpoint `path`: weights, optimizer, schedule, data position, RNG and step."""
        state = load_train_state(path)
        # The run's config sets every hyper-parameter (a resumed run's --train.lr, betas, weight decay apply
        # from here on); the checkpoint gives the optimizer's state and the step.
        fresh = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        if is_sharded(path):  # any world size, any parallelism
            from lmforge.checkpoint.sharded import load_sharded

            load_sharded(path, self.raw, self.optimizer, self.spec.saved().weights, state)
        elif self.sharded is not None:
            raise LMForgeError(f"checkpoint {path} was saved by a train.parallel=ddp run: resume it with ddp")
        else:
            load_weights(path, self.spec.saved().weights)
        try:
            if not is_sharded(path):
                self.optimizer.load_state_dict(state["optimizer"])
            for group, hyper in zip(self.optimizer.param_groups, fresh):
                group.update(hyper)
            self.schedule.load_state_dict(state["scheduler"])
            loaders = state["loader"]  # one per rank; positions are global, so any rank's serves a new world size
            self.batches.load_state_dict(loaders[min(self.dist.rank, len(loaders) - 1)])
            rngs = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
            self.step = int(state["step"])
            if self.budget is not None and "budget" in state:
                self.budget.load_state_dict(state["budget"])
                self._set_total(int(state["budget"]["total"]))
            self.best = tuple(state["best"]) if state.get("best") else None
            self.health.restore(state, self.step)
        except (KeyError, IndexError, TypeError, ValueError) as e:
            where = path / TRAIN_STATE_FILE
            raise LMForgeError(f"{where} does not match this run: {type(e).__name__}: {e}") from e
        if self.dist.rank < len(rngs):
            restore_rng_state(rngs[self.dist.rank])
        elif on_rank is not None:  # more ranks than the checkpoint saved: a new rank's own stream
            on_rank(self.step)

    def _gather(self, state: dict) -> list[dict]:
        """Every rank's `state`, in rank order (a one-item list in one process)."""
        if not self.dist.enabled:
            return [state]
        out: list = [None] * self.dist.world_size
        torch.distributed.all_gather_object(out, state)
        return out

    # --- one step -----------------------------------------------------------------------------------------------

    def _micro_step(self, batch: Batch, last: bool) -> Tensor:
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs may be reused
        data = {k: v.to(self.device, non_blocking=True) for k, v in batch.data.items()}
        self.last_data = data
        scale = batch.weight / self.cfg.grad_accum
        with parallel.no_sync(self.model, last):
            with self.autocast:
                loss, self.parts = self.step_fn(data)
            (loss if scale == 1 else loss * scale).backward()  # a launch fewer per step where it is 1
        return loss.detach() if batch.weight == 1 else loss.detach() * batch.weight

    def train_step(self) -> None:
        """One optimizer step over grad_accum micro-batches; its loss, norm and finiteness stay on the device."""
        c = self.cfg
        losses = [self._micro_step(next(self.batches), i == c.grad_accum - 1) for i in range(c.grad_accum)]
        loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        if not self.grads_seen:
            self._check_grads()
        gnorm = parallel.grad_norm(self.params, loss.device)  # over every rank's shards
        bad = (~torch.isfinite(loss.float() + gnorm)).float()  # either non-finite makes the sum so
        if self.dist.enabled:  # every rank must skip the same steps, or their weights would drift apart
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        # Clipping happens inside the optimizer step (fused AdamW divides each gradient as it reads it), which
        # saves a pass over every gradient.
        self.optimizer.step(found_inf=bad, grad_scale=parallel.clip_scale(gnorm, c.grad_clip))
        if c.float8 and self.sharded is not None:
            from lmforge.train.float8 import precompute_scales  # float8 all-gathers need the new weights' scales

            precompute_scales(self.raw)
        self.optimizer.zero_grad()
        self.schedule.step()
        self.step += 1
        p = self.pending
        p.steps.append(self.step)
        p.losses.append(loss)
        p.norms.append(gnorm)
        p.bad.append(bad)

    def _check_grads(self) -> None:
        """Some trainable parameter has a gradient after the first backward; else nothing would ever train, and
        silently (a loss that ignores the parameters, or a parallel wrapper whose hooks never delivered them)."""
        if not any(p.grad is not None for p in self.params):
            raise LMForgeError(
                "the first training step gave no trainable parameter a gradient: the loss does not depend on them, "
                "or the parallel wrapper did not deliver them; nothing would train"
            )
        self.grads_seen = True

    # --- reading back ---------------------------------------------------------------------------------------------

    def _read(self) -> tuple[list[float], float | None]:
        """Read the pending steps' values (one device sync), handle non-finite steps and spikes → (losses of the
        finite steps, last grad norm).

        A finite gradient can still overflow the weights (a huge lr). The weights are checked here, once per read
        rather than after every step (a read comes before every checkpoint, so no checkpoint is written in between):
        when they hold NaN or infinity, the last step whose loss and gradient were finite made them so (the steps
        after it see non-finite losses), and it is marked as such, so the run never counts its checkpoint good."""
        p, self.pending = self.pending, _Pending()
        if not p.steps:
            return [], None
        loss = torch.stack(p.losses).float()
        if self.dist.enabled:
            torch.distributed.all_reduce(loss)
            loss /= self.dist.world_size
        overflow = parallel.nonfinite_params(self.params, loss.device)
        if self.dist.enabled:
            torch.distributed.all_reduce(overflow, op=torch.distributed.ReduceOp.MAX)
        rows = [loss, torch.stack(p.norms), torch.stack(p.bad), overflow.expand(len(p.steps))]
        *values, (overflowed, *_) = torch.stack(rows).tolist()
        finite = [i for i, bad in enumerate(values[2]) if not bad]
        if overflowed and finite:
            values[2][finite[-1]] = 2.0
        kept = []
        for step, lv, gn, bad in zip(p.steps, *values):
            if bad:
                overflow = bad == 2.0 and math.isfinite(lv) and math.isfinite(gn)
                self.health.nonfinite(step, lv, gn, overflow, self.log, self._wait_for_saves)
                continue
            self.health.finite(step, lv, self.log)
            kept.append(lv)
        return kept, values[1][-1]

    def _wait_for_saves(self) -> None:
        if self.sharded is not None:
            self.sharded.wait()

    def _log_train(self, losses: list[float], gnorm: float | None) -> None:
        if not losses:
            return
        tps = self.clock.tokens_per_s(self.step)
        s = self.spec
        mfu = None
        if s.flops_per_token and s.peak_flops:
            mfu = tps * s.flops_per_token / (s.peak_flops * self.dist.world_size)
        lr = self.schedule.get_last_lr()[0]
        parts = {k: float(v) for k, v in self.parts.items()}
        if self.dist.is_main:
            loss = sum(losses) / len(losses)
            extra = {"loss_hex": float.hex(losses[-1])} if self.cfg.deterministic else {}
            rate = {"tokens_per_s": tps, "mfu": mfu} if s.tokens_per_step else {}
            self.log.log(self.step, loss=loss, lr=lr, grad_norm=gnorm, **rate, **parts, **extra)
            self.progress.update(self.step, loss, lr, tps if s.tokens_per_step else None, mfu)

    # --- evaluation and checkpoints -------------------------------------------------------------------------------

    def _evaluate(self) -> None:
        self.callbacks.fire("eval", self.step)
        self.model.eval()
        with torch.no_grad(), self.autocast:
            metrics = self.spec.evaluate(self.step)
        self.model.train()
        self.last_eval = metrics
        if self.spec.stop_when is not None:  # every rank decides alike: each evaluates, or all see rank 0's
            self.done_early = bool(broadcast_object(bool(metrics) and self.spec.stop_when(metrics), self.dist))
        if self.dist.is_main and metrics:
            extra = self.spec.eval_fields(self.step) if self.spec.eval_fields else {}
            self.log.log(self.step, **extra, **{f"{self.spec.eval_prefix}{k}": v for k, v in metrics.items()})
        if self.spec.select is not None:
            self._select(metrics)

    def _select(self, metrics: dict[str, float]) -> None:
        """Keep this evaluation's model in RUN/best if it is the best so far (decided on rank 0; under fsdp every
        rank takes part in gathering the weights)."""
        sel, best = self.spec.select, None
        if self.dist.is_main and metrics:
            if sel.metric not in metrics:
                raise LMForgeError(f"train.select_metric '{sel.metric}' is not among the dev metrics {list(metrics)}")
            if sel.better(metrics[sel.metric], self.best[0] if self.best else None):
                best = (metrics[sel.metric], self.step)
        if self.sharded is not None:
            best = broadcast_object(best, self.dist)
        if best is None:
            return
        self.best = best
        saved = self.spec.saved()
        weights = parallel.full_state_dict(saved.weights) if self.sharded is not None else saved.weights
        if self.dist.is_main:
            config = {**saved.config, "dev": metrics, "step": self.step}
            write_checkpoint_dir(self.run_dir / BEST_DIR, weights, config=config,
                                      tokenizer=saved.tokenizer, step=self.step)  # fmt: skip

    def save(self) -> None:
        streak = self.health.streak
        good = not streak and probe(self.model, self.loss_fn, self.last_data, self.device, self.autocast, self.dist)
        if not good and not streak and self.dist.is_main:
            print(f"warning: step {self.step}: the weights saved as step_{self.step} give a non-finite loss; "
                  "not counted as a good checkpoint", file=sys.stderr)  # fmt: skip
        state = self.train_state()  # every rank takes part in gathering loader and RNG states
        # Rotation never evicts the last good checkpoint while the one written now is not good.
        protect = self.health.protect(good)
        if self.sharded is not None:  # every rank writes its shards (checkpoint/sharded.py)
            del state["optimizer"]
            saved, step = self.spec.saved(), self.step  # with async_save, on_partial fires later, in the writer
            self.sharded.save(
                self.run_dir, self.step, self.raw, self.optimizer, saved.weights, config=saved.config,
                tokenizer=saved.tokenizer, train_state=state, keep_last=self.cfg.keep_last, protect=protect,
                on_partial=lambda: self.callbacks.fire("checkpoint", step),
            )  # fmt: skip
            self.health.saved(self.step, good)
            return
        if self.dist.is_main:
            saved = self.spec.saved()
            save_checkpoint(
                self.run_dir, self.step, saved.weights, config=saved.config, tokenizer=saved.tokenizer,
                train_state=state, keep_last=self.cfg.keep_last, protect=protect,
                on_partial=lambda: self.callbacks.fire("checkpoint", self.step),
            )  # fmt: skip
        barrier(self.dist)
        self.health.saved(self.step, good)

    # --- the run ----------------------------------------------------------------------------------------------------

    def _due(self, every: int | None) -> bool:
        """Every `every` steps and at the last one (None: only at the last one)."""
        return self.step == self.total or bool(every and self.step % every == 0)

    def _set_total(self, total: int) -> None:
        self.total = total
        self.schedule.set_total(total)
        if self.progress is not None:
            self.progress.set_total(total)

    def _budget_paused(self) -> AbstractContextManager:
        return self.budget.paused() if self.budget is not None else nullcontext()

    def _replan(self) -> None:
        """Fit the planned steps to what is left of the time budget (decided on rank 0, at logged steps)."""
        total = self.budget.plan(self.step, self.total) if self.dist.is_main else None
        if self.dist.enabled:
            total = broadcast_object(total, self.dist)
        if total != self.total:
            self._set_total(total)
        if total == self.step and self.dist.is_main:
            self.budget.warn_if_cut(self.step)

    def _stop_signal(self, stop: StopRequest) -> int | None:
        if not self.dist.enabled:
            return stop.signum
        flag = torch.tensor(float(stop.signum or 0), device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item()) or None

    def run(self) -> dict[str, float]:
        """Train from the current step to cfg.max_steps; returns the last evaluation's metrics."""
        c, s = self.cfg, self.spec
        self.progress = Progress(self.total, every=s.progress_every) if self.dist.is_main else None
        if self.budget is not None:
            self.budget.start(self.step)
        self.clock = Throughput(s.tokens_per_step, self.step)
        was_deterministic = torch.are_deterministic_algorithms_enabled()
        if c.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=self.device.type == "cuda")
        self.model.train()
        plot: BackgroundPlot | None = None
        try:
            with StopRequest() as stop:
                while self.step < self.total:
                    self.train_step()
                    self.callbacks.fire("step", self.step)
                    if self.budget is not None and self.step % c.log_every == 0:  # before deciding on the last step
                        self._log_train(*self._read())
                        self._replan()
                    evaluate = s.evaluate is not None and (
                        self._due(c.eval_every) or bool(s.eval_at and s.eval_at(self.step))
                    )
                    save = self._due(c.save_every) if c.save_every else evaluate  # None: with each evaluation
                    signum = self._stop_signal(stop) if not self.dist.enabled or self._due(c.log_every) else None
                    if self._due(c.log_every) or evaluate or save or signum:
                        self._log_train(*self._read())
                    with self.clock.paused(), self._budget_paused():
                        if evaluate:
                            self._evaluate()
                        if self.step == self.total and self.dist.is_main:  # drawn while the last save is written
                            plot = BackgroundPlot(self.run_dir)
                        if save or signum or self.done_early:
                            self.save()
                    if signum:
                        raise Stopped(
                            f"stopped by {stop.name} at step {self.step}: checkpoint saved in "
                            f"{self.run_dir / CHECKPOINTS_DIR / f'step_{self.step}'}; continue with "
                            f"{s.resume_hint or '--resume'}", signum,
                        )  # fmt: skip
                    if self.done_early:
                        break
                self._log_train(*self._read())
        finally:
            self.batches.close()
            torch.use_deterministic_algorithms(was_deterministic)
            if self.sharded is not None:
                self.sharded.wait()  # an asynchronous save still being written
            if self.progress is not None:
                self.progress.close()
        if self.dist.is_main:
            try:
                plot.wait() if plot is not None else plot_metrics(self.run_dir)
            except Exception as e:  # noqa: BLE001 — a plotting problem must not lose a finished run
                print(f"warning: could not plot metrics: {e}", file=sys.stderr)
        return self.last_eval


def fit(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, dict[str, Tensor]], LossOutput],
    batches: BatchSource,
    cfg: LoopConfig,
    run_dir: Path,
    evaluate: Callable[[int], dict[str, float]] | None = None,
) -> dict[str, float]:
    """Train `model` in this process on the device its parameters are on, logging to RUN/metrics.jsonl (and
    saving resumable checkpoints only when cfg.save_every is set); returns the last evaluation."""
    spec = LoopSpec(saved=lambda: Saved(model, {}), evaluate=evaluate)
    device = next(model.parameters()).device
    with MetricsLogger(run_dir) as log:
        return Loop(model, loss_fn, batches, cfg, run_dir, spec, dist=DistInfo(), device=device, log=log).run()
