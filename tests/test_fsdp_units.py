"""train.fsdp_unit_blocks: consecutive blocks of one stack share an FSDP unit, never across stacks; a grouped model
(one process, gloo) computes the gradients of the unsharded one, also as one unit (0), whose output shows FSDP its
tensors; train.ddp_split_graph sets Dynamo's DDP graph splitting."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lmforge.config.sections import LoopConfig
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.train.distributed import DistInfo
from lmforge.train.parallel import check_parallel, parallelize, unit_groups


def _model(preset: str, layers: int = 4) -> Transformer:
    torch.manual_seed(0)
    return Transformer(replace(get_preset(preset), dropout=0.0, attn_dropout=0.0, n_layers=layers))


def _sizes(groups) -> list[int]:
    return [len(g) for g in groups]


def test_units_are_runs_of_consecutive_blocks_within_one_stack():
    gpt = _model("gpt-tiny")
    blocks = list(gpt.decoder.blocks)
    assert unit_groups(gpt, 1) == [[b] for b in blocks]
    assert unit_groups(gpt, 3) == [blocks[:3], blocks[3:]]
    assert unit_groups(gpt, 0) == []  # the root unit holds them all
    t5 = _model("t5-tiny")
    enc, dec = list(t5.encoder.blocks), list(t5.decoder.blocks)
    assert unit_groups(t5, 100) == [enc, dec]  # one unit per stack, however many blocks a unit may take
    pairs = unit_groups(t5, 2)
    assert [b for g in pairs for b in g] == enc + dec and max(_sizes(pairs)) == 2
    assert all(all(b in enc for b in g) or all(b in dec for b in g) for g in pairs)


def _grads(model: torch.nn.Module, **train) -> dict[str, torch.Tensor]:
    model = parallelize(model, LoopConfig(**train), DistInfo(), torch.device("cpu"))
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    model(ids).logits.float().logsumexp(-1).mean().backward()
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name.replace("_orig_mod.", "")] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


@pytest.mark.parametrize("per_unit", [0, 1, 3])
def test_grouped_units_give_the_gradients_of_the_plain_model(per_unit):
    plain = _grads(_model("gpt-tiny"))
    sharded = _grads(_model("gpt-tiny"), parallel="fsdp", fsdp_unit_blocks=per_unit)
    assert sharded.keys() == plain.keys()
    for name, g in plain.items():
        torch.testing.assert_close(sharded[name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_unit_blocks_need_fsdp():
    with pytest.raises(LMForgeError, match=r"train.fsdp_unit_blocks needs train.parallel=fsdp \(it is ddp\)"):
        check_parallel(LoopConfig(fsdp_unit_blocks=2))


def test_model_and_task_outputs_show_their_tensors_to_tree_flatten():
    """FSDP2 (torch 2.11) hooks the backward of the tensors tree_flatten finds in a unit's output; a model sharded as
    one unit (fsdp_unit_blocks=0) has no other unit to start its gradient reduction."""
    from torch.utils._pytree import tree_flatten

    from lmforge.tasks.model import TaskOutput

    model = _model("gpt-tiny", layers=1)
    out = model(torch.randint(0, 256, (2, 8)))
    leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    assert any(t is out.logits for t in leaves) and any(t is out.last_hidden_state for t in leaves)
    task = TaskOutput(out.last_hidden_state, torch.ones(2, 8), out.logits)
    assert sum(isinstance(t, torch.Tensor) for t in tree_flatten(task)[0]) == 3


@pytest.mark.parametrize("split", [False, True])
def test_ddp_split_graph_chooses_dynamos_ddp_graph_splitting(split):
    from torch.nn.parallel import DistributedDataParallel

    from lmforge.train.parallel import ensure_process_group

    ensure_process_group(torch.device("cpu"))
    before = torch._dynamo.config.optimize_ddp
    try:
        torch._dynamo.config.optimize_ddp = not split
        model = parallelize(_model("gpt-tiny", 1), LoopConfig(ddp_split_graph=split), DistInfo(world_size=2),
                            torch.device("cpu"))  # fmt: skip
        assert isinstance(model, DistributedDataParallel) and torch._dynamo.config.optimize_ddp is split
    finally:
        torch._dynamo.config.optimize_ddp = before
