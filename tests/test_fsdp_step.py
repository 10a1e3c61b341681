"""Under fsdp the fused AdamW steps the parameters' local shards and the gradient norm sums the local shards' norms
(one process, gloo): the same updates, states and norm as torch's own DTensor step and norm, skipped steps and
clipping included."""

from __future__ import annotations

from dataclasses import replace

import torch

from lmforge.config.sections import LoopConfig
from lmforge.models import Transformer, get_preset
from lmforge.pretraining.config import TrainConfig
from lmforge.train.distributed import DistInfo
from lmforge.train.optim import build_optimizer
from lmforge.train.parallel import clip_scale, grad_norm, parallelize

KERNEL = torch._fused_adamw_


def _sharded() -> torch.nn.Module:
    torch.manual_seed(0)
    model = Transformer(replace(get_preset("gpt-tiny"), dropout=0.0, attn_dropout=0.0, n_layers=2))
    return parallelize(model, LoopConfig(parallel="fsdp"), DistInfo(), torch.device("cpu"))


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _train(use_ours: bool, monkeypatch) -> tuple[dict, dict, list]:
    """Three steps (the second flagged non-finite, the third clipped) → weights, AdamW states, what the fused
    kernel was given (DTensor or plain) at each call."""
    model = _sharded()
    opt = build_optimizer(model, TrainConfig(lr=1e-2, weight_decay=0.1), torch.device("cpu"))
    kinds: list[str] = []

    def spy(params, *args, **kwargs):
        kinds.append(type(params[0]).__name__)
        return KERNEL(params, *args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adamw_", spy)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    for flag, clip in [(0.0, 0.0), (1.0, 0.0), (0.0, 1e-3)]:
        model(ids).logits.float().logsumexp(-1).mean().backward()
        scale = clip_scale(grad_norm(list(model.parameters()), torch.device("cpu")), clip)
        found_inf = torch.tensor(flag)
        if use_ours:
            opt.step(found_inf=found_inf, grad_scale=scale)
        else:  # torch's AdamW on the DTensors, as before
            adamw = opt.optimizers["adamw"]
            adamw.found_inf, adamw.grad_scale = found_inf, scale
            adamw.step()
        opt.zero_grad()
    adamw = opt.optimizers["adamw"]
    states = {
        name: {k: _full(v).clone() for k, v in adamw.state[p].items()} for name, p in model.named_parameters()
    }  # fmt: skip
    weights = {name: _full(p).detach().clone() for name, p in model.named_parameters()}
    return weights, states, kinds


def test_the_step_on_local_shards_equals_torchs_dtensor_step(monkeypatch):
    ours_w, ours_s, ours_kinds = _train(True, monkeypatch)
    ref_w, ref_s, ref_kinds = _train(False, monkeypatch)
    assert ref_kinds == ["DTensor"] * 6  # two param groups (decay / no decay), three steps
    assert ours_kinds == ["DTensor"] * 2 + ["Tensor"] * 4  # the first step makes the state; then local shards
    for name, w in ref_w.items():
        torch.testing.assert_close(ours_w[name], w, rtol=0, atol=0, msg=name)
        for key, v in ref_s[name].items():
            torch.testing.assert_close(ours_s[name][key], v, rtol=0, atol=0, msg=f"{name} {key}")
    assert all(float(s["step"]) == 2.0 for s in ours_s.values())  # the flagged step did not count


def test_the_norm_of_sharded_gradients_is_the_full_norm():
    model = _sharded()
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    model(ids).logits.float().logsumexp(-1).mean().backward()
    params = list(model.parameters())
    full = torch.linalg.vector_norm(torch.stack([_full(p.grad).double().norm() for p in params]))
    torch.testing.assert_close(grad_norm(params, torch.device("cpu")).double(), full, rtol=1e-6, atol=0)


def _gathers(monkeypatch) -> list[int]:
    """Counts FSDP's own gathers (torch's per-parameter path), one per unit gathered, into the returned list."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    seen = [0]
    wait = FSDPParamGroup.wait_for_unshard

    def spy(self):
        seen[0] += bool(self._all_gather_result)
        return wait(self)

    monkeypatch.setattr(FSDPParamGroup, "wait_for_unshard", spy)
    return seen


def _steps(parallel: str, monkeypatch) -> tuple[list[float], dict, int]:
    """Four steps on one process, with an evaluation forward between two steps (it gathers the units and no
    backward frees them) and a state dict taken between steps → losses, weights, FSDP's own gathers."""
    torch.manual_seed(0)
    model = Transformer(replace(get_preset("gpt-tiny"), dropout=0.0, attn_dropout=0.0, n_layers=3))
    model = parallelize(model, LoopConfig(parallel=parallel), DistInfo(), torch.device("cpu"))
    opt = build_optimizer(model, TrainConfig(lr=1e-2), torch.device("cpu"))
    gathers = _gathers(monkeypatch)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    losses = []
    for step in range(4):
        loss = model(ids).logits.float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if step == 1:
            with torch.no_grad():
                model(ids)
        if step == 2:
            model.state_dict()  # FSDP puts the shards back into the modules
        if parallel == "fsdp" and step != 1:  # the shards between steps (not after a forward without backward)
            assert all(type(p).__name__ == "DTensor" for p in model.parameters())
    weights = {name: _full(p).detach().clone() for name, p in model.named_parameters()}
    return losses, weights, gathers[0]


def test_one_process_gathers_with_one_copy_and_trains_as_the_plain_model(monkeypatch):
    from lmforge.train.parallel import keeps_gathered

    assert keeps_gathered(LoopConfig(parallel="fsdp"), 1) and not keeps_gathered(LoopConfig(parallel="fsdp"), 2)
    assert not keeps_gathered(LoopConfig(parallel="fsdp", fsdp_reshard="always"), 1)
    losses, weights, gathers = _steps("fsdp", monkeypatch)
    ref_losses, ref_weights, _ = _steps("ddp", monkeypatch)  # one process: the plain model
    torch.testing.assert_close(losses, ref_losses, rtol=1e-6, atol=0)
    for name, w in ref_weights.items():
        torch.testing.assert_close(weights[name], w, rtol=1e-5, atol=1e-7, msg=name)
    assert gathers == 3 + 1  # FSDP gathered the blocks and the root at the first forward only
