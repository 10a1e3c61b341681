"""Compression pieces: distillation losses by hand, student initialisation, int8 quantisation, magnitude and
head pruning."""

from __future__ import annotations

import math

import pytest
import torch
from model_testing import tiny

from lmforge.compress.distill import (
    DistillWeights,
    distillation_loss,
    hidden_state_loss,
    init_student_from_teacher,
    soft_target_loss,
)
from lmforge.compress.prune import (
    block_linears,
    head_importance,
    least_important_heads,
    magnitude_prune,
    make_permanent,
    mask_heads,
    remove_heads,
    weight_sparsity,
)
from lmforge.compress.quantize import count_quantized, quantize_int8
from lmforge.compress.report import state_dict_bytes
from lmforge.errors import LMForgeError

S = [[1.0, 2.0, 3.0], [0.0, 0.5, -1.0]]
T = [[3.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def _softmax(z: list[float], temp: float) -> list[float]:
    e = [math.exp(x / temp) for x in z]
    return [x / sum(e) for x in e]


def _hand_kd(temp: float) -> float:
    """T² · mean over rows of Σ_i p_t,i (log p_t,i − log p_s,i), with p = softmax(z / T)."""
    rows = []
    for s, t in zip(S, T):
        ps, pt = _softmax(s, temp), _softmax(t, temp)
        rows.append(sum(b * (math.log(b) - math.log(a)) for a, b in zip(ps, pt)))
    return temp**2 * sum(rows) / len(rows)


@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_soft_target_loss_by_hand(temp):
    got = soft_target_loss(torch.tensor(S), torch.tensor(T), temp).item()
    assert got == pytest.approx(_hand_kd(temp), rel=1e-6)
    assert soft_target_loss(torch.tensor(T), torch.tensor(T), temp).item() == pytest.approx(0.0, abs=1e-7)


def test_higher_temperature_softens_but_t_squared_keeps_the_scale():
    # Without the T² factor the T=2 loss would be ~4x smaller; with it the two stay of the same order.
    assert _hand_kd(2.0) / 4 < _hand_kd(1.0) / 2 < _hand_kd(2.0)


def test_distillation_loss_sums_the_weighted_terms():
    s, t = torch.tensor(S), torch.tensor(T)
    labels = torch.tensor([2, -100])  # the second row has no gold label
    hs, ht = torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[0.0, 1.0], [0.0, 3.0]])
    w = DistillWeights(soft=0.7, hard=0.3, hidden=2.0, temperature=2.0)
    loss, parts = distillation_loss(s, t, labels, w, hs, ht)
    hard = -math.log(_softmax(S[0], 1.0)[2])
    cos = ((1 - 0.0) + (1 - 1.0)) / 2  # orthogonal, then parallel
    assert parts["soft_loss"] == pytest.approx(_hand_kd(2.0), rel=1e-6)
    assert parts["hard_loss"] == pytest.approx(hard, rel=1e-6)
    assert parts["hidden_loss"] == pytest.approx(cos, abs=1e-6)
    assert loss.item() == pytest.approx(0.7 * _hand_kd(2.0) + 0.3 * hard + 2.0 * cos, rel=1e-6)


def test_hidden_state_losses():
    a = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [2.0, 0.0]]])
    b = torch.tensor([[[-1.0, 0.0], [1.0, 1.0], [0.0, 5.0]]])
    assert hidden_state_loss(a, b, "cosine").item() == pytest.approx((2 + 0 + 1) / 3)
    assert hidden_state_loss(a, b, "cosine", mask=torch.tensor([[1, 0, 1]])).item() == pytest.approx((2 + 1) / 2)
    assert hidden_state_loss(a, b, "mse").item() == pytest.approx((2.0 + 0.0 + (4 + 25) / 2) / 3)
    with pytest.raises(LMForgeError, match=r"hidden states differ in shape: \(1, 3, 2\) vs \(1, 3, 3\)"):
        hidden_state_loss(a, torch.zeros(1, 3, 3))


# --- student initialisation ---------------------------------------------------------------------------------


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("preset", ["gpt-tiny", "bert-tiny"])
def test_student_copies_every_other_layer(preset):
    teacher = tiny(preset, n_layers=4)
    student = init_student_from_teacher(teacher)
    stack = "decoder" if teacher.config.arch == "decoder" else "encoder"
    t_blocks, s_blocks = getattr(teacher, stack).blocks, getattr(student, stack).blocks
    assert student.config.n_layers == 2 and len(s_blocks) == 2
    assert _same(s_blocks[0], t_blocks[0]) and _same(s_blocks[1], t_blocks[2])
    assert not _same(s_blocks[1], t_blocks[1])
    assert torch.equal(student.tok_emb.weight, teacher.tok_emb.weight)
    rest = {k: v for k, v in student.state_dict().items() if ".blocks." not in k}
    assert rest and all(torch.equal(v, teacher.state_dict()[k]) for k, v in rest.items())  # embeddings, heads
    if teacher.config.tie_embeddings:
        assert student.lm_head.weight is student.tok_emb.weight


def test_student_layers_of_choice_and_both_stacks():
    teacher = tiny("t5-tiny", n_layers=4, n_decoder_layers=4)
    student = init_student_from_teacher(teacher, layers=[1, 3])
    assert (student.config.n_layers, student.config.decoder_layers) == (2, 2)
    for stack in ("encoder", "decoder"):
        t_blocks, s_blocks = getattr(teacher, stack).blocks, getattr(student, stack).blocks
        assert _same(s_blocks[0], t_blocks[1]) and _same(s_blocks[1], t_blocks[3])
    with pytest.raises(LMForgeError, match=r"student layers \[3, 1\] must be increasing"):
        init_student_from_teacher(teacher, layers=[3, 1])
    with pytest.raises(LMForgeError, match="ALBERT-style shared layers"):
        init_student_from_teacher(tiny("albert-tiny"))


def test_student_of_a_task_model_keeps_the_head():
    from tasks_testing import model, tokenizer

    from lmforge.tasks.classification import Classification

    tok = tokenizer("gpt")
    task = Classification(Classification.Options(), tok, ["negative", "positive"])
    teacher = task.build(model("gpt-tiny", tok, n_layers=4))
    student = init_student_from_teacher(teacher)
    assert student.backbone.config.n_layers == 2 and teacher.backbone.config.n_layers == 4
    assert _same(student.head, teacher.head)
    assert _same(student.backbone.decoder.blocks[1], teacher.backbone.decoder.blocks[2])


# --- quantisation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny", "bert-tiny", "t5-tiny"])
def test_int8_model_is_close_and_smaller(preset):
    model = tiny(preset)
    q = quantize_int8(model)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert count_quantized(q) == n_linear and count_quantized(model) == 0  # fused qkv included; original intact
    ids = torch.randint(4, 300, (2, 24), generator=torch.Generator().manual_seed(0))
    kw = {"decoder_input_ids": ids[:, :9]} if model.config.arch == "encoder-decoder" else {}
    with torch.no_grad():
        ref, out = model(ids, **kw).logits, q(ids, **kw).logits
    assert float((out - ref).norm() / ref.norm()) < 0.05
    assert state_dict_bytes(q) < 0.75 * state_dict_bytes(model)


def test_quantize_can_skip_layers():
    model = tiny("gpt-tiny")
    q = quantize_int8(model, skip=["lm_head"])
    assert isinstance(q.lm_head, torch.nn.Linear)
    assert count_quantized(q) == sum(isinstance(m, torch.nn.Linear) for m in model.modules()) - 1


# --- pruning ------------------------------------------------------------------------------------------------


def test_global_magnitude_pruning_hits_the_sparsity_and_survives_training():
    model = tiny("gpt-tiny").train()
    linears = [m for _, m in block_linears(model)]
    weights = torch.cat([m.weight.detach().abs().flatten() for m in linears])
    n = magnitude_prune(model, 0.6)
    assert n == round(0.6 * weights.numel())
    assert weight_sparsity(linears) == pytest.approx(0.6, abs=1 / weights.numel())
    kept = torch.cat([m.weight.detach()[m.weight_mask.bool()].abs() for m in linears])
    dropped = torch.cat([m.weight_orig.detach()[~m.weight_mask.bool()].abs() for m in linears])
    assert float(dropped.max()) <= float(kept.min())  # the smallest magnitudes went, across layers
    per_layer = [float((m.weight == 0).float().mean()) for m in linears]
    assert max(per_layer) - min(per_layer) > 0.05  # global, not layer by layer
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randint(4, 300, (2, 16))).logits.pow(2).mean().backward()
    opt.step()
    assert weight_sparsity(linears) == pytest.approx(0.6, abs=1 / weights.numel())  # masks hold while training
    make_permanent(model)
    assert not any(hasattr(m, "weight_orig") for m in linears)
    assert weight_sparsity(linears) == pytest.approx(0.6, abs=1 / weights.numel())
    assert model.tok_emb.weight.ne(0).all() and model.lm_head.weight.ne(0).all()  # embeddings untouched


def test_head_importance_and_selection():
    model = tiny("gpt-tiny")
    imp = head_importance(model)
    assert set(imp) == {("decoder", 0), ("decoder", 1)} and imp[("decoder", 0)].shape == (4,)
    o = model.decoder.blocks[1].attn.o.weight.detach()
    assert float(imp[("decoder", 1)][2]) == pytest.approx(float(o[:, 32:48].norm()))
    fake = {("decoder", 0): torch.tensor([0.1, 0.2, 5.0, 6.0]), ("decoder", 1): torch.tensor([0.3, 0.4, 0.5, 0.05])}
    assert least_important_heads(fake, 0.5) == {("decoder", 0): [0, 1], ("decoder", 1): [0, 3]}
    one_layer = {("decoder", 0): torch.tensor([0.1, 0.2, 0.3, 0.4]), ("decoder", 1): torch.tensor([9.0] * 4)}
    assert least_important_heads(one_layer, 0.5)[("decoder", 0)] == [0, 1, 2]  # a layer keeps one head


@pytest.mark.parametrize("preset", ["gpt-tiny", "bert-tiny"])
def test_removing_zeroed_heads_changes_nothing(preset):
    model = tiny(preset)
    stack = "decoder" if model.config.arch == "decoder" else "encoder"
    heads = {(stack, 0): [1, 3], (stack, 1): [0]}
    ids = torch.randint(4, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        mask_heads(model, heads)
        zeroed = model(ids).logits
        make_permanent(model)
        remove_heads(model, heads)
        removed = model(ids).logits
    assert (zeroed - before).abs().max() > 1e-4  # zeroing the heads did change the model
    torch.testing.assert_close(removed, zeroed, atol=1e-5, rtol=1e-5)
    attn0 = getattr(model, stack).blocks[0].attn
    assert attn0.n_heads == 2 and attn0.qkv.weight.shape == (3 * 2 * 16, 64) and attn0.o.weight.shape == (64, 32)


def test_remove_heads_refusals():
    with pytest.raises(LMForgeError, match="removing heads needs multi-head attention"):
        remove_heads(tiny("llama-tiny"), {("decoder", 0): [1]})
    with pytest.raises(LMForgeError, match=r"per-head position biases \(alibi\)"):
        remove_heads(tiny("gpt-tiny", position="alibi"), {("decoder", 0): [1]})
    with pytest.raises(LMForgeError, match="one head must stay"):
        remove_heads(tiny("gpt-tiny"), {("decoder", 0): [0, 1, 2, 3]})
    with pytest.raises(LMForgeError, match=r"sparsity must be in \[0, 1\), got 1.0"):
        magnitude_prune(tiny("gpt-tiny"), 1.0)
