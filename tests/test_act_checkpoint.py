"""train.activation_checkpointing with train.checkpoint_policy full | selective and train.checkpoint_every: the same
gradients as no checkpointing; full recomputes every matrix product of a checkpointed block in backward, selective
recomputes none of them (only the elementwise work)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lmforge.config.sections import LoopConfig
from lmforge.models import Transformer, get_preset
from lmforge.train.distributed import DistInfo
from lmforge.train.parallel import parallelize, reshards_after_forward

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


class CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func in MATMULS
        return func(*args, **(kwargs or {}))


def _grads_and_backward_matmuls(preset: str, **train) -> tuple[dict[str, torch.Tensor], int]:
    torch.manual_seed(0)
    cfg = replace(get_preset(preset), dropout=0.0, attn_dropout=0.0, n_layers=4)
    model = parallelize(Transformer(cfg), LoopConfig(**train), DistInfo(), torch.device("cpu"))
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    loss = model(ids).logits.float().logsumexp(-1).mean()
    with CountMatmuls() as count:
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, count.n


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny"])
def test_every_policy_gives_the_gradients_of_no_checkpointing(preset):
    base, plain = _grads_and_backward_matmuls(preset)
    full = _grads_and_backward_matmuls(preset, activation_checkpointing=True)
    selective = _grads_and_backward_matmuls(preset, activation_checkpointing=True, checkpoint_policy="selective")
    every2 = _grads_and_backward_matmuls(preset, activation_checkpointing=True, checkpoint_every=2)
    for grads, _ in (full, selective, every2):
        for name, g in base.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=name)
    per_block = (full[1] - plain) / 4  # the forward matrix products of one block, run again in backward
    assert per_block >= 3  # the projections (recomputation stops after the last product backward needs)
    assert selective[1] == plain  # the products' outputs were kept
    assert every2[1] == plain + 2 * per_block  # blocks 0 and 2 of 4


def test_fsdp_reshard_setting():
    cpu, model = torch.device("cpu"), torch.nn.Linear(4, 4)
    assert reshards_after_forward(model, LoopConfig(fsdp_reshard="always"), cpu)
    assert not reshards_after_forward(model, LoopConfig(fsdp_reshard="never"), cpu)
    assert reshards_after_forward(model, LoopConfig(), cpu)  # auto off a GPU: the memory-saving choice
