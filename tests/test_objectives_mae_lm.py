"""MAE-LM: masked tokens removed from the encoder input (never a [MASK] there), positions kept, a shallow decoder
predicting exactly the masked positions; the CLI recipe trains, `load` returns the encoder, fine-tuning starts
from it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tasks_testing as TT
import torch
from encoder_testing import docs, objective, one_thread, overfit, tokenizer, windows  # noqa: F401

from lmforge.api import load
from lmforge.checkpoint.read import read_weights
from lmforge.checkpoint.verify import latest_checkpoint
from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FineTuner
from lmforge.models import Transformer, get_preset
from lmforge.objectives import masking as M
from lmforge.objectives.mae_lm import MAELMModel
from lmforge.tasks.config import load_finetune_config

T = 64


@pytest.fixture(scope="module")
def tok():
    return tokenizer("bpe", "bart")


def build(tok, *overrides: str, **model_kw):
    obj = objective("mae-lm", tok, *overrides)
    torch.manual_seed(0)
    cfg = get_preset("mae-lm-tiny", vocab_size=tok.vocab_size, dropout=0.0, attn_dropout=0.0, **model_kw)
    return obj, obj.build_model(cfg)


def framed(obj, raw: torch.Tensor) -> torch.Tensor:
    return obj.inputs(raw)["input_ids"]


def test_removal_rate_order_and_reconstruction(tok):
    obj = objective("mae-lm", tok)
    raw = windows(tok, 128, 60_000)
    torch.manual_seed(0)
    b = obj.transform(raw)
    full = framed(obj, raw)  # (B, T) "<s> text </s>"
    sel = b["labels"] != M.IGNORE
    cand = ~obj.special[full]
    assert int(cand.sum()) > 40_000
    assert abs(sel[cand].double().mean() - 0.15) < 0.005  # 15% of the real tokens, on ~46k samples
    assert not (sel & ~cand).any()
    keep, pos = b["attention_mask"].bool(), b["position_ids"]
    assert torch.equal(keep.sum(1), (~sel).sum(1))  # the encoder gets every other token ...
    assert (pos[:, 1:][keep[:, 1:]] > pos[:, :-1][keep[:, 1:]]).all()  # ... in order ...
    rebuilt = torch.full_like(full, -1)
    rows = torch.arange(len(full))[:, None].expand_as(pos)
    rebuilt[rows[keep], pos[keep]] = b["input_ids"][keep]  # ... at its own position
    rebuilt = torch.where(sel, b["labels"], rebuilt)
    assert torch.equal(rebuilt, full)  # encoder tokens + targets reconstruct the input exactly
    assert not (b["input_ids"] == tok.mask_id).any()


def test_encoder_input_never_holds_a_mask_token(tok, one_thread):  # noqa: F811
    obj, model = build(tok, "--objective.decoder_layers=1")
    seen = {"batches": 0, "tokens": 0, "masks": 0}

    def hook(module, args, kwargs):
        ids = args[0]
        real = args[1].bool()
        seen["batches"] += 1
        seen["tokens"] += int(real.sum())
        seen["masks"] += int((ids == tok.mask_id).sum())

    handle = model.encoder.register_forward_pre_hook(hook, with_kwargs=True)
    raw = windows(tok, 32, 60_000)
    torch.manual_seed(1)
    with torch.no_grad():
        for i in range(2000):
            start = (4 * i) % (len(raw) - 4)
            obj.loss(model, obj.transform(raw[start : start + 4]))
    handle.remove()
    assert seen["batches"] == 2000 and seen["tokens"] > 200_000
    assert seen["masks"] == 0


def test_decoder_gets_mask_embeddings_and_predicts_exactly_the_masked_positions(tok):
    obj, model = build(tok)
    raw = windows(tok, T, 4000)[:8]
    torch.manual_seed(2)
    b = obj.transform(raw)
    sel = b["labels"] != M.IGNORE
    got = {}
    model.decoder.encoder.register_forward_pre_hook(lambda m, args: got.update(x=args[0]))
    with torch.no_grad():
        logits = model(b["input_ids"], b["attention_mask"], b["position_ids"], b["labels"])
        enc = model.encoder(b["input_ids"], b["attention_mask"], position_ids=b["position_ids"]).last_hidden_state
    x = got["x"]
    assert logits.shape == (int(sel.sum()), tok.vocab_size)
    assert torch.equal(x[sel], model.encoder.tok_emb.weight[tok.mask_id].expand(int(sel.sum()), -1))
    keep = b["attention_mask"].bool()
    rows = torch.arange(len(raw))[:, None].expand_as(keep)
    torch.testing.assert_close(x[rows[keep], b["position_ids"][keep]], enc[keep], rtol=0, atol=0)
    # Nothing of a masked token reaches the model: other tokens at the masked positions, same predictions.
    torch.manual_seed(2)
    other = raw.clone()
    full = framed(obj, raw)
    swap = torch.zeros_like(raw, dtype=torch.bool)
    swap[:, 1 : T - 1] = sel[:, 1 : T - 1]  # framed position p holds raw token p - 1
    swap = swap.roll(-1, 1)
    other[swap] = torch.where(other[swap] == full[sel][0], full[sel][1], full[sel][0])
    b2 = obj.transform(other)
    assert torch.equal(b2["labels"] != M.IGNORE, sel) and not torch.equal(b2["labels"], b["labels"])
    with torch.no_grad():
        logits2 = model(b2["input_ids"], b2["attention_mask"], b2["position_ids"], b2["labels"])
    assert torch.equal(logits, logits2)


def test_shortened_encoder_equals_full_encoder_with_the_masked_keys_hidden(tok):
    """Kept tokens keep their positions: the encoder over the shortened input equals the encoder over the whole
    input with the masked positions left out of attention (learned absolute and rotary positions)."""
    for kw in ({}, {"position": "rope", "norm_position": "pre", "final_norm": True}):
        obj, model = build(tok, **kw)
        torch.manual_seed(3)
        b = obj.transform(windows(tok, T, 4000)[:6])
        full = framed(obj, windows(tok, T, 4000)[:6])
        keep = b["labels"] == M.IGNORE
        enc = model.encoder.eval()
        with torch.no_grad():
            short = enc(b["input_ids"], b["attention_mask"], position_ids=b["position_ids"]).last_hidden_state
            whole = enc(full, keep.long()).last_hidden_state
        m = b["attention_mask"].bool()
        torch.testing.assert_close(short[m], whole[keep], rtol=0, atol=1e-5)


def test_model_shares_embeddings_and_the_decoder_is_shallow(tok):
    _, model = build(tok)
    assert isinstance(model, MAELMModel)
    e, d = model.encoder, model.decoder
    assert d.tok_emb is e.tok_emb and d.lm_head.weight is e.tok_emb.weight
    assert len(d.encoder.blocks) == 4 and len(e.encoder.blocks) == 2
    assert not e.config.lm_head and d.config.lm_head_transform and d.config.dropout == 0.0
    assert d.config.type_vocab_size == 0
    assert model.num_params() == sum({id(p): p.numel() for p in model.parameters()}.values())
    _, shallow = build(tok, "--objective.decoder_layers=1")
    assert len(shallow.decoder.encoder.blocks) == 1


def test_bad_models_and_options(tok):
    obj = objective("mae-lm", tok)
    with pytest.raises(LMForgeError, match=r"encoder takes no heads: turn off model.lm_head \(e.g. --model.preset"):
        obj.build_model(get_preset("roberta-tiny", vocab_size=tok.vocab_size))
    with pytest.raises(LMForgeError, match="model.position must be one of learned, sinusoidal, rope, none, not 't5"):
        obj.build_model(get_preset("mae-lm-tiny", vocab_size=tok.vocab_size, position="t5_bias"))
    with pytest.raises(LMForgeError, match="needs model.embedding_dim equal to model.d_model"):
        obj.build_model(get_preset("mae-lm-tiny", vocab_size=tok.vocab_size, embedding_dim=32))
    with pytest.raises(LMForgeError, match="pretrains an encoder, not arch 'decoder'"):
        obj.build_model(get_preset("gpt-tiny", vocab_size=tok.vocab_size))
    with pytest.raises(LMForgeError, match="objective.decoder_layers must be at least 1"):
        objective("mae-lm", tok, "--objective.decoder_layers=0")
    with pytest.raises(LMForgeError, match="objective 'mae-lm' needs a tokenizer with a mask token"):
        objective("mae-lm", tokenizer("bpe", "gpt"))


def test_overfits_one_batch(tok, one_thread):  # noqa: F811
    obj, model = build(tok)
    torch.manual_seed(4)
    batch = obj.transform(windows(tok, T, 4000)[:8])
    losses = overfit(model, obj, batch, steps=40, lr=3e-3)
    assert losses[-1] < 0.3 * losses[0]
    out = obj.loss(model, batch)
    assert out.n_tokens == int((batch["labels"] != M.IGNORE).sum()) and out.metrics["mlm_acc"] > 0.5


def test_validation_masks_are_static(tok):
    obj = objective("mae-lm", tok)
    raw = windows(tok, T, 4000)[:8]
    a, b = obj.eval_transform(raw), obj.eval_transform(raw)
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(5)
    c = obj.transform(raw)
    assert not torch.equal(a["labels"], c["labels"])


# --- end to end: the recipe, `load`, fine-tuning ------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mae")
    corpus = root / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(12)), encoding="utf-8")
    args = [
        "pretrain", "mae-lm", "--model.preset=mae-lm-tiny", f"--run.dir={root / 'run'}", f"--data.inputs=[{corpus}]",
        "--data.vocab_size=512", "--data.val_fraction=0.2", "--train.batch_size=16", "--train.seq_len=64",
        "--train.warmup_steps=3", "--train.lr=5e-3", "--train.log_every=1", "--train.eval_batches=4",
        "--train.max_steps=40", "--train.eval_every=20", "--objective.decoder_layers=2",
    ]  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-m", "lmforge.cli", *args], cwd=root, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "run"


def test_recipe_loss_falls_on_the_bundled_corpus(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    loss = [r["loss"] for r in rows if "loss" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(loss) == 40 and len(val) == 2
    start = sum(loss[:3]) / 3  # ≈ ln(512) = 6.24
    assert sum(loss[-5:]) / 5 < start - 0.5, loss
    assert val[-1] < start - 0.5
    assert "mlm_acc" in [r for r in rows if "loss" in r][-1]


def test_load_returns_the_encoder(run):
    model, tok = load(run)
    assert isinstance(model, Transformer) and model.config.arch == "encoder" and not model.config.lm_head
    saved = read_weights(latest_checkpoint(run))
    assert any(k.startswith("decoder.encoder.blocks.1.") for k in saved)  # the decoder stays in the checkpoint
    assert torch.equal(model.encoder.blocks[1].mlp.up.weight, saved["encoder.encoder.blocks.1.mlp.up.weight"])
    assert torch.equal(model.tok_emb.weight, saved["encoder.tok_emb.weight"])
    ids = torch.tensor([tok.encode("It is a truth universally acknowledged.")])
    assert model(ids).last_hidden_state.shape == (1, ids.shape[1], 64)


def test_finetuning_starts_from_the_encoder(run, tmp_path, one_thread):  # noqa: F811
    full = TT.sentiment(400, seed=1)
    splits = {"train": Dataset(full.examples[:320], full.labels), "dev": Dataset(full.examples[320:], full.labels)}
    data = TT.write_labelled_dir(tmp_path / "sentiment", splits)
    over = [f"--run.dir={tmp_path / 'ft'}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16",
            "--train.lr=2e-3", "--train.warmup_ratio=0.1", "--task.max_len=48", "--train.epochs=8",
            "--train.log_every=1"]  # fmt: skip
    tuner = FineTuner(load_finetune_config("sst2-bert", over, init=str(run)))
    saved = read_weights(latest_checkpoint(run))
    backbone = tuner.model.backbone
    assert torch.equal(backbone.encoder.blocks[0].attn.qkv.weight, saved["encoder.encoder.blocks.0.attn.qkv.weight"])
    dev = tuner.fit()
    rows = [json.loads(x) for x in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["task_loss"] for r in rows if "task_loss" in r]
    # 8 epochs: this 40-step encoder leaves the ln 2 plateau within 80 fine-tuning steps for only some seeds (5 of 8
    # with GPT-2's init, 2 of 8 with RoBERTa's), within 160 for every seed tried (last ten losses ~0.1).
    assert len(losses) == 160 and sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.05
    assert dev["accuracy"] > 0.6
