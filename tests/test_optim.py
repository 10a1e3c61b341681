"""The optimizers and schedule: Muon orthogonalises its updates and skips on the device like the fused AdamW;
Muon + AdamW split a model's parameters; warmup-stable-decay; hyper-parameters of a resumed run come from its
config."""

from __future__ import annotations

import pytest
import torch

from lmforge.models import Transformer, get_preset
from lmforge.pretraining.config import TrainConfig
from lmforge.train.optim import Muon, Schedule, build_optimizer, lr_factor, muon_params
from lmforge.train.parallel import clip_scale, grad_norm


def test_muon_updates_are_nearly_orthogonal_and_batched_alike():
    g = torch.randn(3, 96, 48, generator=torch.Generator().manual_seed(0))
    u = Muon.orthogonalize(g).float()
    s = torch.linalg.svdvals(u)
    assert bool(((s > 0.5) & (s < 1.5)).all())  # the quintic iteration's band around 1 (Jordan et al. 2024)
    torch.testing.assert_close(u[1], Muon.orthogonalize(g[1]).float(), atol=1e-2, rtol=0)  # batched = alone


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_step_flagged_non_finite_changes_nothing(optimizer):
    torch.manual_seed(0)
    model = Transformer(get_preset("gpt-fast-tiny"))
    opt = build_optimizer(model, TrainConfig(optimizer=optimizer, lr=1e-2, muon_lr=0.05), torch.device("cpu"))
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step(found_inf=torch.tensor(0.0))
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert "decoder.blocks.0.attn.qkv.weight" in changed and "tok_emb.weight" in changed


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_clipping_inside_the_step_equals_clipping_the_gradients_first(optimizer):
    def stepped(clip_in_step: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = Transformer(get_preset("gpt-fast-tiny"))
        opt = build_optimizer(model, TrainConfig(optimizer=optimizer, lr=1e-2, muon_lr=0.05), torch.device("cpu"))
        for _ in range(2):
            for p in model.parameters():
                p.grad = torch.randn_like(p) * 3
            params = list(model.parameters())
            if clip_in_step:
                norm = grad_norm(params, torch.device("cpu"))
                opt.step(found_inf=torch.tensor(0.0), grad_scale=clip_scale(norm, 0.5))
            else:
                assert float(torch.nn.utils.clip_grad_norm_(params, 0.5)) > 0.5  # the clip is active
                opt.step(found_inf=torch.tensor(0.0))
        return {k: v.clone() for k, v in model.state_dict().items()}

    reference, folded = stepped(False), stepped(True)
    model = Transformer(get_preset("gpt-fast-tiny"))
    ids = {id(p) for p in muon_params(model)} if optimizer == "muon" else set()
    orthogonalised = {k for k, p in model.named_parameters() if id(p) in ids}
    for k, v in reference.items():  # Muon's bf16 Newton–Schulz rounds gradients divided vs multiplied apart
        torch.testing.assert_close(folded[k], v, rtol=1e-5, atol=2e-3 if k in orthogonalised else 1e-6)
    assert clip_scale(torch.tensor(0.2), 0.5) == 1.0 and clip_scale(torch.tensor(1.0), 0.0) is None


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = Transformer(get_preset("gpt-fast-tiny"))
    opt = build_optimizer(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    muon = {id(p) for g in opt.optimizers["muon"].param_groups for p in g["params"]}
    adamw = {id(p) for g in opt.optimizers["adamw"].param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in muon} == {n for n, p in model.named_parameters() if p.dim() == 2 and ".blocks." in n}
    assert not muon & adamw and muon | adamw == {id(p) for p in model.parameters()}
    assert {id(p) for p in muon_params(model)} == muon


def test_warmup_stable_decay():
    cfg = TrainConfig(schedule="wsd", warmup_steps=10, decay_ratio=0.2, min_lr_ratio=0.0, max_steps=100)
    f = [lr_factor(s, cfg, 100) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == 1.0  # linear warmup
    assert all(x == 1.0 for x in f[10:80])  # stable
    assert f[90] == pytest.approx(0.5) and f[99] == pytest.approx(0.05)  # linear decay over the last 20%
    opt = build_optimizer(torch.nn.Linear(4, 4), cfg, torch.device("cpu"))
    sched = Schedule(opt, cfg, 100)
    for _ in range(85):
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(cfg.lr * lr_factor(85, cfg, 100))
