"""AdaMix (Wang et al. 2022): the consistency regulariser between two stochastically routed passes (§3.2), adaptation
merging (§3.3) and module sharing (§3.4); fine-tuning with the regulariser."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import tasks_testing as T
import torch
import torch.nn.functional as F
from adapt_testing import run, tiny
from encoder_testing import one_thread  # noqa: F401

from lmforge.adapt import (
    AdaMixOptions,
    BottleneckAdapter,
    HoulsbyOptions,
    MixtureAdapter,
    apply_adamix,
    apply_houlsby,
    apply_peft,
    load_adapter,
    merge_adamix,
    save_adapter,
    symmetric_kl,
    trainable_parameters,
    with_consistency,
)
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FineTuner
from lmforge.loading import load_finetuned
from lmforge.registry import TASKS
from lmforge.tasks.config import load_finetune_config
from lmforge.tasks.inputs import collate


def test_symmetric_kl_by_hand():
    torch.manual_seed(0)
    a, b = torch.randn(5, 4), torch.randn(5, 4)
    pa, pb = a.softmax(-1), b.softmax(-1)
    kl = lambda p, q: (p * (p.log() - q.log())).sum(-1)  # noqa: E731  KL(p ‖ q) per row
    want = (0.5 * (kl(pb, pa) + kl(pa, pb))).mean()
    torch.testing.assert_close(symmetric_kl(a, b), want)
    torch.testing.assert_close(symmetric_kl(b, a), want)
    assert symmetric_kl(a, a) == 0 and abs(symmetric_kl(a, a + 3.0)) < 1e-7  # a shift leaves the softmax
    # Masked-out classes (a choice an example lacks) count for nothing, and nothing becomes NaN.
    low = torch.finfo(torch.float32).min
    am, bm = torch.cat([a, torch.full((5, 1), low)], 1), torch.cat([b, torch.full((5, 1), low)], 1)
    am.requires_grad_(True)
    got = symmetric_kl(am, bm)
    torch.testing.assert_close(got, want)
    got.backward()
    assert torch.isfinite(am.grad).all() and (am.grad[:, -1] == 0).all()


def test_each_direction_pulls_only_the_pass_it_scores():
    """The released code detaches each KL's target: the gradient into a is ½ ∂KL(b̂ ‖ a)/∂a, i.e. ½ (p_a − p_b)/N."""
    a, b = torch.randn(3, 6, requires_grad=True), torch.randn(3, 6, requires_grad=True)
    symmetric_kl(a, b).backward()
    torch.testing.assert_close(a.grad, 0.5 * (a.softmax(-1) - b.softmax(-1)).detach() / 3)
    torch.testing.assert_close(b.grad, 0.5 * (b.softmax(-1) - a.softmax(-1)).detach() / 3)


def _task(seed: int = 0, **options):
    """A GPT-format classification model on a tiny backbone with AdaMix experts that differ clearly."""
    tok = T.tokenizer("gpt")
    backbone = T.model("gpt-tiny", tok, seed=0)  # no dropout
    cls = TASKS.get("classification")
    task = cls(cls.Options(head_dropout=0.0), tok, ["negative", "positive"])
    torch.manual_seed(seed)
    model = task.build(backbone)
    o = {"bottleneck": 8, "n_experts": 3, "init_std": 0.3, **options}
    apply_peft(model, "adamix", o)
    batch = collate(task.features(T.sentiment(8, seed=2), train=True), task.pad_id)
    return task, model.train(), batch


def _route_with(monkeypatch, pairs):
    it = iter(pairs)
    monkeypatch.setattr(MixtureAdapter, "route", lambda self: next(it))


def test_regulariser_is_zero_for_identical_routes_and_positive_otherwise(monkeypatch):
    task, model, batch = _task()
    n_sites = sum(isinstance(m, MixtureAdapter) for m in model.modules())
    _route_with(monkeypatch, itertools.repeat((0, 1)))  # both passes take the same experts everywhere
    same = with_consistency(task)(model, batch)
    assert same.metrics["consistency_loss"] == 0.0
    base = float(same.metrics["task_loss"] + task.options.lm_coef * same.metrics["lm_loss"])
    assert float(same.loss.detach()) == pytest.approx(base, abs=1e-6)
    # First pass (0, 1), second pass (2, 0) at every site: other routes, other outputs.
    _route_with(monkeypatch, [(0, 1)] * n_sites + [(2, 0)] * n_sites)
    other = with_consistency(task)(model, batch)
    assert other.metrics["consistency_loss"] > 1e-4
    assert other.metrics["task_loss"] == same.metrics["task_loss"]  # the task loss is the first pass's
    want = base + 1.0 * float(other.metrics["consistency_loss"])
    assert float(other.loss.detach()) == pytest.approx(want, rel=1e-5)


def test_regulariser_weight_passes_and_modes():
    task, model, batch = _task(consistency_weight=2.5)
    calls = []
    model.backbone.register_forward_pre_hook(lambda m, a: calls.append(1))
    torch.manual_seed(0)
    out = with_consistency(task)(model, batch)
    assert len(calls) == 2 and out.metrics["consistency_loss"] > 0  # random routes differ (3 x 3 pairs)
    base = float(out.metrics["task_loss"] + task.options.lm_coef * out.metrics["lm_loss"])
    assert float(out.loss.detach()) == pytest.approx(base + 2.5 * float(out.metrics["consistency_loss"]), rel=1e-5)
    calls.clear()
    model.eval()  # evaluation: one pass, no regulariser
    assert "consistency_loss" not in with_consistency(task)(model, batch).metrics and len(calls) == 1
    task, model, batch = _task(consistency_weight=0.0)
    assert "consistency_loss" not in with_consistency(task)(model, batch).metrics
    task, model, batch = _task(n_experts=1)  # one expert: every route is the same
    assert with_consistency(task)(model, batch).metrics["consistency_loss"] == 0.0
    with pytest.raises(LMForgeError, match="adamix.consistency_weight must be >= 0, got -1.0"):
        _task(consistency_weight=-1.0)


def test_merged_model_equals_the_weight_averaged_model():
    model = apply_adamix(tiny("bert-tiny"), AdaMixOptions(bottleneck=4, n_experts=3, init_std=0.5))
    merged = merge_adamix(copy.deepcopy(model).eval())
    with torch.no_grad():
        want = run(model.eval())  # eval mode: the experts' averaged weights
        got = run(merged)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not any(isinstance(m, MixtureAdapter) for m in merged.modules())
    assert merged.peft_config.method == "houlsby" and merged.peft_config.sites == model.peft_config.sites
    # By hand: a Houlsby model whose adapters hold the averages gives the same outputs, at the size of one adapter.
    houlsby = apply_houlsby(tiny("bert-tiny"), HoulsbyOptions(bottleneck=4))
    sd = houlsby.state_dict()
    for name, mix in model.named_modules():
        if isinstance(mix, MixtureAdapter):
            sd[f"{name}.down.weight"], sd[f"{name}.down.bias"] = mix.down_weight.mean(0), mix.down_bias.mean(0)
            sd[f"{name}.up.weight"], sd[f"{name}.up.bias"] = mix.up_weight.mean(0), mix.up_bias.mean(0)
    houlsby.load_state_dict(sd)
    with torch.no_grad():
        torch.testing.assert_close(run(houlsby), want, rtol=0, atol=1e-6)
    assert trainable_parameters(merged) == trainable_parameters(houlsby)
    assert trainable_parameters(model)[0] > trainable_parameters(merged)[0]
    # Averaging weights is not averaging the experts' outputs.
    mix = model.encoder.blocks[0].mlp.down.adapter
    h = torch.randn(2, 3, 64)
    with torch.no_grad():
        outputs = torch.stack([_expert(mix, h, i) for i in range(3)]).mean(0)
        assert not torch.allclose(mix(h), outputs, atol=1e-4)
        torch.testing.assert_close(merged.encoder.blocks[0].mlp.down.adapter(h), mix(h))
    with pytest.raises(LMForgeError, match="merge_adamix needs a model adapted with adamix, this one has peft method"):
        merge_adamix(merged)


def _expert(mix: MixtureAdapter, h: torch.Tensor, i: int) -> torch.Tensor:
    z = torch.relu(F.linear(h, mix.down_weight[i], mix.down_bias[i]))
    return F.linear(z, mix.up_weight[i], mix.up_bias[i])


def test_merged_adapter_saves_and_reloads_as_houlsby(tmp_path):
    model = merge_adamix(apply_adamix(tiny("gpt-tiny"), AdaMixOptions(bottleneck=4, n_experts=2, init_std=0.5)))
    save_adapter(tmp_path / "a", model)
    fresh, info = load_adapter(tmp_path / "a", tiny("gpt-tiny"))
    assert info.method == "houlsby" and isinstance(fresh.decoder.blocks[1].attn.o.adapter, BottleneckAdapter)
    with torch.no_grad():
        torch.testing.assert_close(run(fresh), run(model.eval()), rtol=0, atol=0)


def test_shared_projections():
    model = apply_adamix(tiny("gpt-tiny"), AdaMixOptions(bottleneck=4, n_experts=4, share_up=True))
    mix = model.decoder.blocks[0].attn.o.adapter
    assert mix.down_weight.shape == (4, 4, 64) and mix.up_weight.shape == (1, 64, 4)
    both = apply_adamix(tiny("gpt-tiny"), AdaMixOptions(bottleneck=4, n_experts=4, share_up=True, share_down=True))
    assert both.decoder.blocks[0].attn.o.adapter.down_weight.shape == (1, 4, 64)
    torch.manual_seed(0)
    assert {mix.route()[1] for _ in range(20)} == {0} and len({mix.route()[0] for _ in range(40)}) == 4


def _trained_disagreement(weight: float, steps: int = 30) -> float:
    """Mean symmetric KL between pairs of randomly routed passes after `steps` updates on one batch."""
    tok = T.tokenizer("gpt")
    backbone = T.model("gpt-tiny", tok, seed=0)
    cls = TASKS.get("classification")
    task = cls(cls.Options(head_dropout=0.0, lm_coef=0.0), tok, ["negative", "positive"])
    torch.manual_seed(0)
    model = task.build(backbone)
    apply_peft(model, "adamix", {"bottleneck": 8, "n_experts": 4, "init_std": 0.3, "consistency_weight": weight})
    batch = collate(task.features(T.sentiment(16, seed=2), train=True), task.pad_id)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    torch.manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        with_consistency(task)(model, batch).loss.backward()
        opt.step()
    with torch.no_grad():
        return sum(float(symmetric_kl(model(batch).logits, model(batch).logits)) for _ in range(20)) / 20


def test_the_regulariser_makes_differently_routed_passes_agree(one_thread):  # noqa: F811
    free, regularised = _trained_disagreement(0.0), _trained_disagreement(10.0)
    assert regularised < 0.5 * free, (regularised, free)


def test_finetuning_with_the_regulariser_runs_the_loss_drops_and_reloads_merged(tmp_path, one_thread):  # noqa: F811
    """Text-to-text fine-tuning of a decoder (the label word after the text): AdaMix's two passes compare the
    next-token distributions at the target tokens."""
    full = T.sentiment(320, seed=1)
    splits = {"train": Dataset(full.examples[:240], full.labels), "dev": Dataset(full.examples[240:], full.labels)}
    data = T.write_labelled_dir(tmp_path / "sentiment", splits)
    over = [f"--run.dir={tmp_path / 'run'}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16",
            "--train.lr=1e-2", "--train.warmup_ratio=0.1", "--task.max_len=96", "--train.epochs=2",
            "--train.log_every=1", "--peft.method=adamix", "--peft.bottleneck=16", "--peft.n_experts=4",
            "--model.vocab_size=300", "--model.tokenizer_kind=bpe"]  # fmt: skip
    tuner = FineTuner(load_finetune_config("sst2-t5", over, init="gpt-tiny"))
    dev = tuner.fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "task_loss" in r]
    assert len(steps) == 30 and all(r["consistency_loss"] > 0 for r in steps)
    losses = [r["loss"] for r in steps]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.1, losses
    # The reloaded run infers with one merged adapter per site and scores what training's evaluation scored.
    task, model, _, cfg = load_finetuned(tmp_path / "run")
    assert cfg.peft.method == "adamix" and not any(isinstance(m, MixtureAdapter) for m in model.modules())
    assert sum(isinstance(m, BottleneckAdapter) for m in model.modules()) == 4
    assert task.evaluate(model, tuner.splits["dev"]) == pytest.approx(dev)


@pytest.mark.parametrize("task_type", ["seq2seq", "token_tagging"])
def test_the_regulariser_wraps_generation_and_tagging_tasks(task_type, monkeypatch):
    """The wrapper adds consistency_weight × the task's own divergence (next-token distributions at the label tokens;
    tags at tagged tokens) to the first pass's loss, which `task.loss` alone returns unchanged."""
    tok = T.tokenizer("gpt")
    cls = TASKS.get(task_type)
    if task_type == "seq2seq":
        task = cls(cls.Options(), tok, None)
        data = Dataset([Example(text="It is a truth", target="universally acknowledged")] * 4)
    else:
        task = cls(cls.Options(head_dropout=0.0), tok, ["O", "B-X"])
        data = Dataset([Example(tokens=["It", "is", "true"], tags=["O", "B-X", "O"])] * 4, ["O", "B-X"])
    torch.manual_seed(0)
    model = task.build(T.model("gpt-tiny", tok, seed=0))
    apply_peft(model, "adamix", {"bottleneck": 8, "n_experts": 3, "init_std": 0.3, "consistency_weight": 2.0})
    batch = collate(task.features(data, train=True), task.pad_id)
    n_sites = sum(isinstance(m, MixtureAdapter) for m in model.modules())
    _route_with(monkeypatch, [(0, 1)] * (2 * n_sites) + [(2, 0)] * n_sites)  # plain; first and second pass
    plain = task.loss(model.train(), batch)
    assert "consistency_loss" not in plain.metrics
    out = with_consistency(task)(model, batch)
    assert out.metrics["consistency_loss"] > 1e-5 and out.metrics["task_loss"] == plain.metrics["task_loss"]
    want = float(plain.loss.detach()) + 2.0 * float(out.metrics["consistency_loss"])
    assert float(out.loss.detach()) == pytest.approx(want, rel=1e-5)
