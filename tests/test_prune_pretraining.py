"""Pruning while pretraining (Gordon et al. 2020, "Compressing BERT"): Zhu & Gupta's cubic schedule written out,
per-matrix and global magnitude masks, zeros that stay zero through AdamW steps, a resumed pruner reading its mask
back from the zeros, the CLI pretraining `bert-pruned` and fine-tuning from it with every zero kept, and the bad
settings' one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from model_testing import tiny
from training_testing import restore_torch_globals, run_main, write_docs

from lmforge.checkpoint.read import read_weights
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.errors import LMForgeError
from lmforge.train.gradual_prune import (
    GradualPruner,
    PruneConfig,
    check_prune_config,
    magnitude_masks,
    prunable_weights,
    sparsity_at,
)


@pytest.fixture(autouse=True)
def _torch_globals():
    yield from restore_torch_globals()


def zhu_gupta(t: int, s_i: float, s_f: float, t0: int, t_end: int, power: float = 3.0) -> float:
    """Zhu & Gupta (2017) eq. 1: s_t = s_f + (s_i − s_f)(1 − (t − t0) / (t_end − t0))³ for t0 ≤ t ≤ t_end, s_i
    before t0 and s_f after t_end (the model_pruning library clips p to [0, 1])."""
    if t <= t0:
        return s_i
    if t >= t_end:
        return s_f
    return s_f + (s_i - s_f) * (1 - (t - t0) / (t_end - t0)) ** power


def test_schedule_is_zhu_and_gupta_cubic():
    cfg = PruneConfig(during_pretraining=True, sparsity=0.6, initial_sparsity=0.1, begin_step=100, end_step=300)
    for t in (0, 50, 100, 150, 200, 250, 299, 300, 1000):
        assert sparsity_at(t, cfg, 300) == pytest.approx(zhu_gupta(t, 0.1, 0.6, 100, 300), abs=1e-12)
    assert sparsity_at(200, cfg, 300) == pytest.approx(0.6 - 0.5 * 0.5**3)  # halfway: 7/8 of the way up
    square = dataclasses.replace(cfg, exponent=2.0)
    assert sparsity_at(200, square, 300) == pytest.approx(0.6 - 0.5 * 0.5**2)


def test_masks_keep_the_largest_magnitudes_per_matrix_or_globally():
    a = torch.tensor([0.5, -3.0, 0.1, 2.0, -0.2, 1.0, 0.05, -4.0, 0.3, 0.7])
    (keep,) = magnitude_masks([a], 0.3, "layer")
    assert keep.sum() == 7  # round(10 · 0.7)
    assert sorted(a.abs()[~keep].tolist()) == pytest.approx([0.05, 0.1, 0.2])
    small, large = torch.tensor([[0.1, -0.2], [0.3, 0.05]]), torch.tensor([[5.0, -6.0], [7.0, -8.0]])
    per_layer = magnitude_masks([small, large], 0.5, "layer")
    assert [int(m.sum()) for m in per_layer] == [2, 2]
    globally = magnitude_masks([small, large], 0.5, "global")
    assert [int(m.sum()) for m in globally] == [0, 4]  # one threshold over both: the small matrix goes first


def test_prunable_weights_are_gordon_et_al_s_masked_layers():
    model = tiny("bert-tiny", pooler=True)
    names = [n for n, _ in prunable_weights(model)]
    blocks = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".blocks." in f".{n}"]
    assert names == ["tok_emb.weight", *[f"{n}.weight" for n in blocks], "pooler.weight"]
    assert all("pos_emb" not in n and "type_emb" not in n and "lm_head" not in n for n in names)  # lm_head: tied
    assert "tok_emb.weight" not in [n for n, _ in prunable_weights(model, embeddings=False)]


def _zeros(named) -> list[torch.Tensor]:
    return [w.detach() == 0 for _, w in named]


def test_sparsity_follows_the_schedule_and_pruned_weights_stay_zero_through_adamw():
    torch.manual_seed(0)
    model = tiny("bert-tiny").train()
    cfg = PruneConfig(during_pretraining=True, sparsity=0.5, begin_step=2, end_step=8, every=2)
    pruner = GradualPruner(cfg, model, total=lambda: 12)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    ids = torch.randint(4, 100, (4, 16))
    before = None
    revived = 0
    for step in range(1, 13):
        opt.zero_grad()
        model(ids).logits.logsumexp(-1).mean().backward()
        opt.step()
        if before is not None:  # AdamW's moments move pruned weights off zero: the callback is what keeps them
            revived += sum(int((z & (w.detach() != 0)).sum()) for z, (_, w) in zip(before, pruner.named))
        pruner(step)
        zeros = _zeros(pruner.named)
        want = zhu_gupta(step if (step - 2) % 2 == 0 else step - 1, 0.0, 0.5, 2, 8)
        for z, (name, w) in zip(zeros, pruner.named):
            assert int(z.sum()) == w.numel() - round(w.numel() * (1 - want)), (step, name)
        if before is not None:
            assert all(bool((b <= z).all()) for b, z in zip(before, zeros)), step  # once zero, zero for good
        before = zeros
    assert revived > 0
    assert pruner.sparsity == 0.5


def test_a_resumed_pruner_reads_its_mask_back_from_the_zeros():
    model = tiny("bert-tiny")
    cfg = PruneConfig(during_pretraining=True, sparsity=0.4, begin_step=0, end_step=10, every=10)
    GradualPruner(cfg, model, total=lambda: 20)(10)  # an update step: 40% of each matrix zeroed
    zeros = _zeros(prunable_weights(model))
    resumed = GradualPruner(cfg, model, total=lambda: 20)
    resumed.start(12)  # the loop restored step 12's checkpoint
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # the first optimizer step after the resume moves every weight
    resumed(13)  # not an update step: the mask is the zeros the checkpoint held
    assert [bool((z == now).all()) for z, now in zip(zeros, _zeros(resumed.named))] == [True] * len(zeros)


def test_bad_settings_are_refused_in_one_line():
    train = SimpleNamespace(max_steps=100, parallel="ddp")
    on = PruneConfig(during_pretraining=True)
    with pytest.raises(LMForgeError, match=r"^prune.initial_sparsity \(0.6\) is above prune.sparsity \(0.5\)"):
        check_prune_config(dataclasses.replace(on, initial_sparsity=0.6), train)
    with pytest.raises(LMForgeError, match=r"^prune.end_step \(5\) must be after prune.begin_step \(5\)$"):
        check_prune_config(dataclasses.replace(on, begin_step=5, end_step=5), train)
    with pytest.raises(LMForgeError, match="^prune.during_pretraining needs whole weights on every process"):
        check_prune_config(on, SimpleNamespace(max_steps=100, parallel="fsdp"))
    off = PruneConfig(during_pretraining=False, end_step=500)
    check_prune_config(off, SimpleNamespace(max_steps=10, parallel="fsdp"))  # nothing to check when off


def _matrices(weights: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """The pruned matrices of a checkpoint (block linears, pooler, token table), keyed without `prefix`."""
    out = {}
    for k, v in weights.items():
        name = k.removeprefix(prefix)
        if name.startswith(("encoder.blocks.", "pooler.", "tok_emb.")) and name.endswith(".weight") and v.dim() == 2:
            out[name] = v
    return out


def test_cli_pretrains_pruned_and_fine_tuning_keeps_every_zero(tmp_path, capsys):
    docs = write_docs(tmp_path / "docs.jsonl", 30)
    run = tmp_path / "pre"
    rc, _, err = run_main(
        capsys, "pretrain", "bert-pruned", f"--run.dir={run}", f"--data.inputs=[{docs}]", "--data.vocab_size=512",
        "--train.max_steps=40", "--prune.begin_step=10", "--prune.end_step=30", "--train.batch_size=8",
        "--train.seq_len=64", "--train.eval_every=40", "--train.save_every=20", "--train.eval_batches=2",
        "--train.warmup_steps=5",
    )  # fmt: skip
    assert rc == 0, err
    at20 = _matrices(read_weights(run / "checkpoints" / "step_20"))
    saved = read_weights(run / "checkpoints" / "step_40")
    final = _matrices(saved)
    assert len(final) == 2 * 4 + 2  # 2 blocks × (qkv, o, up, down), the pooler, the token table
    for name, w in final.items():  # s_40 = s_f; s_20 = 0.4 + (0 − 0.4)(1 − 10/20)³ = 0.35
        assert int((w == 0).sum()) == w.numel() - round(w.numel() * 0.6), name
        assert int((at20[name] == 0).sum()) == w.numel() - round(w.numel() * (1 - zhu_gupta(20, 0, 0.4, 10, 30)))
    assert not (saved["nsp_head.weight"] == 0).any() and not (saved["encoder.pos_emb.emb.weight"] == 0).any()
    ft = tmp_path / "ft"
    rc, _, err = run_main(
        capsys, "finetune", "sst2-bert", "--init", str(run), f"--run.dir={ft}", "--data.max_train=160",
        "--data.max_eval=40", "--train.epochs=1", "--train.batch_size=16", "--task.max_len=48", "--train.lr=1e-3",
    )  # fmt: skip
    assert rc == 0, err
    tuned = _matrices(read_weights(model_checkpoint(ft)), "backbone.")
    assert tuned.keys() == final.keys()
    for name, w in final.items():
        assert bool(((w == 0) <= (tuned[name] == 0)).all()), name  # every pretraining zero is still zero
        assert int((tuned[name] == 0).sum()) == int((w == 0).sum()), name
        assert bool((tuned[name] != w).any()), name  # and the kept weights were fine-tuned
    assert "accuracy" in json.loads((ft / "eval.json").read_text())


def test_cli_refuses_a_schedule_past_the_run(tmp_path, capsys):
    rc, _, err = run_main(
        capsys, "pretrain", "bert-pruned", f"--run.dir={tmp_path / 'r'}", "--train.max_steps=20",
        "--prune.begin_step=0", "--prune.end_step=30",
    )  # fmt: skip
    assert rc != 0
    assert err.strip().splitlines()[-1] == (
        "error: prune.end_step (30) is past train.max_steps (20): the target sparsity would never be reached"
    )
    assert not Path(tmp_path / "r" / "checkpoints").exists()


def test_cli_resumed_pruning_keeps_the_checkpoint_s_mask(tmp_path, capsys):
    docs = write_docs(tmp_path / "docs.jsonl", 30)
    run = tmp_path / "pre"
    common = [
        f"--run.dir={run}",
        f"--data.inputs=[{docs}]",
        "--data.vocab_size=512",
        "--prune.begin_step=5",
        "--prune.end_step=20",
        "--prune.every=5",
        "--train.batch_size=8",
        "--train.seq_len=32",
        "--train.eval_every=100",
        "--train.save_every=25",
        "--train.eval_batches=1",
        "--train.warmup_steps=2",
    ]
    rc, _, err = run_main(capsys, "pretrain", "bert-pruned", "--train.max_steps=25", *common)
    assert rc == 0, err
    rc, _, err = run_main(capsys, "pretrain", "bert-pruned", "--train.max_steps=28", "--resume", *common)
    assert rc == 0, err
    at25 = _matrices(read_weights(run / "checkpoints" / "step_25"))
    at28 = _matrices(read_weights(run / "checkpoints" / "step_28"))
    for name, w in at25.items():  # no mask update at 26-28: the resumed run held step 25's zeros
        assert bool(((w == 0) == (at28[name] == 0)).all()), name
        assert bool((at28[name] != w).any()), name
