"""The frame every run kind (pretrain, finetune, align, compress) trains in, written once: the early check of the
metric sinks, distributed init, the device, the run-dir lock, seeding, the resume checkpoint, the one loop restored
from it, the metrics log with its sinks, the saved config, and the release of all of it.

    session = RunSession(cfg.run.dir, cfg.train, seed=cfg.run.seed)
    with session.closed_on_error():               # a failed set-up releases the run dir (and the process group)
        session.find_resume(config, resume)
        ...                                       # the kind's own model, loss and batches
        loop = session.start(model, loss, batches, spec, config=config)
    with session.closing():                       # released however the run ends
        metrics = loop.run()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from lmforge.checkpoint.layout import BEST_DIR, CHECKPOINTS_DIR
from lmforge.checkpoint.resume import FROZEN_ON_RESUME, resume_checkpoint
from lmforge.checkpoint.rundir import RunLock
from lmforge.checkpoint.write import save_run_config
from lmforge.config.sections import LoopConfig
from lmforge.errors import LMForgeError
from lmforge.files import refuse_link
from lmforge.train.callbacks import Callbacks
from lmforge.train.device import pick_device, seed_everything
from lmforge.train.distributed import DistInfo, broadcast_object, check_shared_dir, cleanup, init_distributed, rank_seed
from lmforge.train.loop import Loop
from lmforge.train.loop_spec import LoopSpec
from lmforge.train.metrics import MetricsLogger
from lmforge.train.prefetch import BatchSource
from lmforge.train.sinks import check_sinks


class RunSession:
    """One run's frame. Construction checks the sinks (a missing package is refused before any work), joins the
    process group torchrun describes (`distributed`), picks `train.device`, locks the run dir (a second process is
    refused at once), checks that every rank sees that dir (nodes that each have their own are refused) and seeds
    Python's, NumPy's and torch's generators — with `rank_seeds`, each rank its own seed (rank 0 keeps `seed`: a
    one-process run's stream). `section` names the loop's config section in error lines."""

    def __init__(
        self, run_dir: str | Path, train: LoopConfig, *, seed: int, rank_seeds: bool = True,
        distributed: bool = True, section: str = "train",
    ) -> None:  # fmt: skip
        check_sinks(train.log_to, f"{section}.log_to")
        self.dir, self.train = Path(run_dir), train
        self.dist: DistInfo = (
            init_distributed("cuda" if torch.cuda.is_available() else "cpu") if distributed else DistInfo()
        )
        self.device = pick_device(train.device, self.dist, f"{section}.device")
        self.lock = lock_run_dir(self.dir, self.dist)
        self.resume_from: Path | None = None
        self.log: MetricsLogger | None = None
        with self.closed_on_error():
            check_shared_dir(self.dir, self.dist)  # every rank reads what rank 0 writes there, resumes included
            for own in (CHECKPOINTS_DIR, BEST_DIR):  # before any work, not at the first save
                refuse_link(self.dir / own)
            seed_everything(rank_seed(seed, self.dist.rank) if rank_seeds else seed)

    def find_resume(
        self, config: dict, resume: bool, frozen: tuple[str, ...] = FROZEN_ON_RESUME, saved_as: str | None = None
    ) -> Path | None:
        """The checkpoint the run continues from (None: step 0); see `resume_checkpoint`."""
        self.resume_from = resume_checkpoint(self.dir, config, resume, self.dist.is_main, frozen, saved_as)
        return self.resume_from

    def start(
        self, model: nn.Module, loss_fn, batches: BatchSource, spec: LoopSpec, *, config: dict,
        loop_cfg: LoopConfig | None = None, callbacks: Callbacks | None = None,
        reseed: Callable[[int], None] | None = None,
        save_config: Callable[[], None] | Literal[False] | None = None,
    ) -> Loop:  # fmt: skip
        """The loop (over `loop_cfg`, default the session's train section), restored from the resume checkpoint
        (`reseed(step)` re-seeds the ranks there), logging to RUN/metrics.jsonl and the sinks on rank 0 — a
        resumed run's lines after its checkpoint are dropped — and the run's `config` saved as RUN/config.yaml
        (`save_config`: the kind's own writer, or False for none)."""
        d = self.dist
        cfg = loop_cfg or self.train
        loop = Loop(model, loss_fn, batches, cfg, self.dir, spec, dist=d, device=self.device, log=None,
                    callbacks=callbacks)  # fmt: skip
        if self.resume_from is not None:
            loop.restore(self.resume_from, reseed)
        if d.is_main:
            # The logger opens at the restored step, hence after the loop: the loop gets it now.
            self.log = MetricsLogger(self.dir, loop.step, cfg.log_to, config)
            loop.log = self.log
            if save_config is None:
                save_run_config(self.dir, config)
            elif save_config is not False:
                save_config()
        return loop

    def close(self) -> None:
        """Close the metrics log and its sinks, release the run dir, leave the process group (idempotent)."""
        if self.log is not None:
            self.log.close()
        self.lock.release()
        cleanup(self.dist)

    @contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """Close the session when the block fails (a run that could not be set up)."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    @contextmanager
    def closing(self) -> Iterator[None]:
        """Close the session when the block ends, however it ends."""
        try:
            yield
        finally:
            self.close()


def lock_run_dir(run_dir: Path, dist: DistInfo) -> RunLock:
    """Rank 0 takes the run dir's lock; every rank raises the same one line when it cannot."""
    lock = RunLock(run_dir)
    error = None
    if dist.is_main:
        try:
            lock.acquire()
        except LMForgeError as e:
            error = str(e)
    error = broadcast_object(error, dist)
    if error:
        raise LMForgeError(error)
    return lock
