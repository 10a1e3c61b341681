"""BART machine translation (Lewis et al. 2020 §3.4): a new source encoder in front of BART's encoder; step 1 trains
only "the randomly initialized source encoder, the BART positional embeddings, and the self-attention input
projection matrix of BART's encoder first layer", step 2 every parameter. Checked on the optimizer the fine-tuning
loop uses (AdamW with weight decay): which parameters get gradients and which change in each step; the step count
saved with the weights; `lmforge finetune bart-mt` end to end from a tiny pretrained BART run, reporting BLEU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.parallel_text import read_parallel
from lmforge.errors import LMForgeError
from lmforge.tasks.bart_mt import BartMT, BartMTOptions
from lmforge.tasks.config import FtTrainConfig
from lmforge.tasks.inputs import collate
from lmforge.train.optim import build_optimizer

FIX = Path(__file__).parent / "fixtures"
PAIRS = FIX / "parallel" / "en-fr.tsv"
TESTS = Path(__file__).parent

# The paper's step-1 set, by name: the new encoder (the task model's head), the positional table of BART's encoder,
# and the fused q/k/v input projection of its first block's self-attention.
STAGE1 = ("head.", "backbone.encoder.pos_emb.", "backbone.encoder.blocks.0.attn.qkv.")


def build(stage1_steps: int = 2, source_tokenizer: str = "bytes"):
    tok = T.tokenizer("bart")
    backbone = T.model("bart-tiny", tok, seed=1)
    opts = BartMTOptions(stage1_steps=stage1_steps, source_layers=1, max_len=64, source_tokenizer=source_tokenizer)
    task = BartMT(opts, tok)
    model = task.build(backbone)
    data = read_parallel(PAIRS, 1, 0)  # French -> English
    feats = task.features(data, train=True)
    return task, model, feats


def train_step(task, model, opt, batch) -> dict[str, torch.Tensor]:
    """One step as the loop takes it; returns the weights before it."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = task.loss(model, batch)
    out.loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    opt.step()
    opt.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    return {"grads": grads, "changed": changed, "stage": out.metrics["stage"]}


def test_step_one_trains_only_the_papers_parameters_and_step_two_trains_all():
    torch.manual_seed(0)
    task, model, feats = build(stage1_steps=2)
    model.train()
    names = [n for n, _ in model.named_parameters()]
    stage1 = {n for n in names if n.startswith(STAGE1)}
    assert {"backbone.encoder.blocks.0.attn.qkv.weight", "backbone.encoder.blocks.0.attn.qkv.bias",
            "backbone.encoder.pos_emb.emb.weight"} < stage1  # fmt: skip
    assert not any(n.startswith("backbone.decoder.") or n == "backbone.tok_emb.weight" for n in stage1)
    # The loop's optimizer is built over every trainable parameter before the first step, weight decay included.
    opt = build_optimizer(model, FtTrainConfig(lr=1e-2, weight_decay=0.1), torch.device("cpu"))
    batch = collate(feats[:8], task.pad_id)
    for _ in range(2):
        step = train_step(task, model, opt, batch)
        assert step["stage"] == 1.0
        assert step["grads"] == stage1 and step["changed"] == stage1  # frozen weights not even decayed
    step = train_step(task, model, opt, batch)
    assert step["stage"] == 2.0
    assert step["grads"] == step["changed"] == set(names)  # BART's decoder, embeddings and LM head too


def test_the_step_count_is_saved_with_the_weights_and_a_reload_resumes_in_its_step():
    task, model, feats = build(stage1_steps=1)
    model.train()
    opt = build_optimizer(model, FtTrainConfig(lr=1e-3), torch.device("cpu"))
    train_step(task, model, opt, collate(feats[:4], task.pad_id))
    state = model.state_dict()
    assert int(state["head.batches_seen"]) == 1
    task2, model2, _ = build(stage1_steps=1)
    model2.load_state_dict(state)
    assert task2.stage(model2) == 2 and task.stage(model) == 2


def test_the_source_encoder_has_its_own_vocabulary():
    task, model, feats = build()
    assert model.head.net.tok_emb.num_embeddings == 259  # UTF-8 bytes + pad, BOS, EOS
    assert feats[2]["input_ids"] == [1, *[b + 3 for b in "Où est la gare ?".encode()], 2]
    assert feats[2]["labels"][-1] == task.tokenizer.eos_id  # the target is English, in BART's vocabulary


def test_a_trained_source_tokenizer_by_path(tmp_path):
    from lmforge.tokenizers import train_tokenizer

    fr = [line.split("\t")[1] for line in PAIRS.read_text(encoding="utf-8").splitlines()]
    train_tokenizer(fr * 4, "bpe", 300, family="bart", min_frequency=1).save(tmp_path / "fr")
    task, model, feats = build(source_tokenizer=str(tmp_path / "fr"))
    assert model.head.net.tok_emb.num_embeddings == task.source.vocab_size == 300
    assert feats[0]["input_ids"][0] == task.source.bos_id and feats[0]["input_ids"][-1] == task.source.eos_id


def test_a_decoder_backbone_is_refused_in_one_line():
    tok = T.tokenizer("gpt")
    with pytest.raises(LMForgeError) as err:
        BartMT(BartMTOptions(), tok).build(T.model("gpt-tiny", tok))
    assert str(err.value) == "task 'bart_mt' needs an encoder-decoder (BART) with an LM head, got 'decoder'"


# --- end to end ---------------------------------------------------------------------------------------------------


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent / "src")},
    )  # fmt: skip


@pytest.fixture(scope="module")
def bart_run(tmp_path_factory) -> Path:
    """A tiny BART pretrained (text infilling) for 20 steps on public-domain English."""
    return T.pretrain_tiny(tmp_path_factory.mktemp("bart"), "bart", "bart-tiny", 20)


def test_lmforge_finetune_bart_mt_trains_both_steps_and_reports_bleu(bart_run, tmp_path):
    from lmforge.api import load
    from lmforge.loading import load_finetuned

    run = tmp_path / "mt"
    res = cli("finetune", "bart-mt", "--init", str(bart_run), f"--data.train={PAIRS}", f"--run.dir={run}",
              "--task.stage1_steps=3", "--task.source_layers=1", "--task.num_beams=2", "--task.max_new_tokens=12",
              "--train.max_steps=5", "--train.batch_size=8", "--train.log_every=1", "--train.lr=1e-3",
              cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    scores = json.loads((run / "eval.json").read_text())
    assert list(scores) == ["bleu"] and 0.0 <= scores["bleu"] <= 1.0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stages = [r["stage"] for r in logged if "stage" in r]
    assert stages == [1.0, 1.0, 1.0, 2.0, 2.0]
    # Step 2 trained BART's decoder; step 1 alone would have left it as pretrained.
    pre, _ = load(bart_run)
    _, ft, _, _ = load_finetuned(run)
    assert int(ft.head.batches_seen) == 5
    w = "decoder.blocks.0.mlp.up.weight"
    assert not torch.equal(pre.state_dict()[w], ft.backbone.state_dict()[w])
    # `lmforge eval` on the fine-tuned run scores its dev split again: the same BLEU.
    out = tmp_path / "again.json"
    res = cli("eval", str(run), "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(json.loads(out.read_text()).values()) == [pytest.approx(scores)]
