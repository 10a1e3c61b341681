"""One rank of tests/test_fsdp.py's non-finite check under fsdp (run by torchrun): the loop trains a sharded model
on batches whose loss is NaN at steps 2 and 3; rank 0 prints one JSON line: which steps changed the (gathered)
weights, which the log marks as skipped, and the gradient norm of step 1 against its one-process value."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lm_objective_testing import TINY_DECODER

from lmforge.models import ModelConfig, Transformer
from lmforge.objectives.base import LossOutput
from lmforge.pretraining.config import TrainConfig
from lmforge.train.distributed import init_distributed
from lmforge.train.loop import Loop
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.metrics import MetricsLogger, read_metrics
from lmforge.train.parallel import full_state_dict
from lmforge.train.prefetch import Batch


class Poisoned:
    """Rows of one global batch of 4 per step (rank r takes rows r·B..), NaN-scaled at the chosen steps."""

    def __init__(self, bad: set[int], rank: int, world: int) -> None:
        self.bad, self.i, self.rank, self.world = bad, 0, rank, world
        self.gen = torch.Generator().manual_seed(0)

    def __next__(self) -> Batch:
        self.i += 1
        ids = torch.randint(0, 100, (4, 9), generator=self.gen)
        b = 4 // self.world
        scale = torch.tensor(float("nan") if self.i in self.bad else 1.0)
        return Batch({"ids": ids[self.rank * b : (self.rank + 1) * b], "scale": scale})

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, s: dict) -> None:
        self.i = s["i"]


def loss_fn(model, batch) -> LossOutput:
    logits = model(batch["ids"][:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["ids"][:, 1:].flatten())
    return LossOutput(loss * batch["scale"], batch["ids"][:, 1:].numel())


def main(run_dir: Path, parallel: str) -> None:
    d = init_distributed("cpu")
    cfg = TrainConfig(max_steps=4, warmup_steps=0, lr=1e-2, log_every=4, prefetch=0, grad_clip=1.0, parallel=parallel)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=100, **TINY_DECODER))
    log = MetricsLogger(run_dir) if d.is_main else None
    loop = Loop(model, loss_fn, Poisoned({2, 3}, d.rank, d.world_size), cfg, run_dir,
                LoopSpec(saved=lambda: Saved(model, {})), dist=d, device=torch.device("cpu"), log=log)  # fmt: skip

    def snapshot() -> dict:
        return {k: v.clone() for k, v in full_state_dict(model).items()}

    weights, norms = [snapshot()], []
    for _ in range(4):
        loop.train_step()
        norms.append(float(loop.pending.norms[-1]))
        weights.append(snapshot())
    loop._read()
    if d.is_main:
        log.close()
        changed = [s for s in range(1, 5) if any(not torch.equal(weights[s][k], weights[s - 1][k]) for k in weights[s])]
        skipped = [r["step"] for r in read_metrics(run_dir) if r.get("skipped")]
        print(json.dumps({"changed": changed, "skipped": skipped, "norm1": norms[0]}), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
