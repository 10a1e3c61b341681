"""The Hugging Face-shaped surface: model.generate, save_pretrained / from_pretrained, labels= losses, outputs
indexed as ModelOutputs, and transformers.Trainer training and saving an lmforge model."""

from __future__ import annotations

import pytest
import torch
import transformers
from lm_objective_testing import TINY_DECODER, objective, tokenizer, windows
from model_testing import padded_batch, tiny

import lmforge
from lmforge.errors import LMForgeError
from lmforge.models import Transformer
from lmforge.models.generate import generate
from lmforge.models.hf_training import shift_right
from lmforge.objectives.mlm import mlm_loss
from lmforge.objectives.seq2seq import seq2seq_loss


def left_padded(pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = padded_batch(pad, T=9)
    return ids.flip(1), mask.flip(1)  # row 1's padding moves to the left, as decoder prompts need


# ----------------------------------------------------------------------------- generate
def test_generate_greedy_equals_lmforge_generate() -> None:
    model = tiny("gpt-tiny")
    ids, mask = left_padded(0)
    ours = model.generate(ids, mask, max_new_tokens=6)
    assert torch.equal(ours, generate(model, ids, mask, max_new_tokens=6, temperature=0))
    assert ours.shape == (3, 15)
    assert torch.equal(model.generate(**{"input_ids": ids, "attention_mask": mask}, max_length=12), ours[:, :12])


def test_generate_sampling_and_beams_follow_lmforge() -> None:
    model = tiny("gpt-tiny")
    ids, mask = left_padded(0)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    sampled = model.generate(ids, mask, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=5, generator=g1)
    expect = generate(model, ids, mask, temperature=0.8, top_k=20, max_new_tokens=5, generator=g2)
    assert torch.equal(sampled, expect)
    beams = model.generate(ids, mask, num_beams=3, max_new_tokens=5)
    assert torch.equal(beams, generate(model, ids, mask, num_beams=3, max_new_tokens=5))
    many = model.generate(ids, mask, do_sample=True, num_return_sequences=2, max_new_tokens=3)
    assert many.shape == (6, 12) and torch.equal(many[::2, :9], ids)


def test_generate_pads_after_eos_and_runs_seq2seq() -> None:
    model = tiny("gpt-tiny")
    ids, mask = left_padded(0)
    free = model.generate(ids, mask, max_new_tokens=6)
    eos = int(free[0, 9])  # row 0's first new token becomes its EOS
    out = model.generate(ids, mask, max_new_tokens=6, eos_token_id=[eos], pad_token_id=1)
    assert out[0, 9] == eos and out.shape[1] > 10 and (out[0, 10:] == 1).all()
    assert torch.equal(
        generate(model, ids, mask, max_new_tokens=6, temperature=0, eos_id=eos)[0, 10:], out[0, 10:] * 0 + eos
    )
    t5 = tiny("t5-tiny")
    src, src_mask = padded_batch(0, T=7)
    assert torch.equal(
        t5.generate(src, src_mask, max_new_tokens=4), generate(t5, src, src_mask, max_new_tokens=4, temperature=0)
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"repetition_penalty": 1.2}, "generate() does not support repetition_penalty (it takes: input_ids,"),
        ({"do_sample": True, "num_beams": 2}, "do_sample=True with num_beams > 1 (beam sampling) is not supported"),
        ({"num_return_sequences": 2}, "num_return_sequences=2 needs do_sample=True"),
        ({"eos_token_id": [1, 2]}, "generate stops on one eos_token_id, got 2: [1, 2]"),
        ({"do_sample": True, "temperature": 0.0}, "do_sample=True needs temperature > 0, got 0.0"),
    ],
)
def test_generate_refuses_what_does_not_map(kwargs: dict, message: str) -> None:
    ids, mask = left_padded(0)
    with pytest.raises(LMForgeError) as e:
        tiny("gpt-tiny").generate(ids, mask, max_new_tokens=2, **kwargs)
    assert str(e.value).startswith(message)


# ----------------------------------------------------------------------------- labels= and outputs
def test_causal_labels_loss_is_the_causal_lm_objective_loss() -> None:
    tok = tokenizer("gpt")
    obj = objective("causal_lm", tok, model=TINY_DECODER, seq_len=16)
    torch.manual_seed(0)
    model = obj.build_model(obj.cfg.model)
    tokens = windows(tok, 2, 16)  # (2, 17)
    expect = obj.loss(model, obj.transform(tokens)).loss
    out = model(tokens, labels=tokens)
    torch.testing.assert_close(out.loss, expect)
    assert out[0] is out.loss and out["loss"] is out.loss and torch.equal(out[1], out.logits)
    assert list(out.keys()) == ["loss", "logits"] and out.to_tuple()[1] is out.logits
    with pytest.raises(KeyError, match="'pooled' is not set in this output"):
        out["pooled"]
    labels = tokens.clone()
    labels[:, :5] = -100  # ignored positions take no part
    n = int((labels[:, 1:] != -100).sum())
    part = model(tokens, labels=labels)
    torch.testing.assert_close(model(tokens, labels=labels, num_items_in_batch=4 * n).loss, part.loss / 4)
    torch.testing.assert_close(model(tokens, labels=labels, return_logits=False).loss, part.loss)


def test_mlm_and_seq2seq_labels_losses_are_the_objectives() -> None:
    bert = tiny("bert-tiny")
    ids, mask = padded_batch(0, T=12)
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    labels[0, 7] = ids[0, 7]
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    torch.testing.assert_close(bert(ids, mask, labels=labels).loss, mlm_loss(bert, batch)[0])
    t5 = tiny("t5-tiny")
    dec_labels, _ = padded_batch(0, T=6, seed=2)
    dec_labels[1, 4:] = -100
    dec_in = shift_right(dec_labels, t5.config.decoder_start_id, t5.config.pad_id)
    batch = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec_in, "labels": dec_labels}
    torch.testing.assert_close(t5(ids, mask, labels=dec_labels).loss, seq2seq_loss(t5, batch).loss)


def test_labels_errors_are_one_line() -> None:
    model = tiny("gpt-tiny")
    ids, _ = padded_batch(0, T=8)
    with pytest.raises(LMForgeError, match=r"^labels have shape \(3, 5\), the model's output positions are \(3, 8\)$"):
        model(ids, labels=ids[:, :5])
    headless = Transformer(tiny("bert-tiny").config.__class__(**{**vars(tiny("bert-tiny").config), "lm_head": False}))
    with pytest.raises(LMForgeError, match="^labels= needs a model with an LM head"):
        headless(ids, labels=ids)


# ----------------------------------------------------------------------------- save / load
def test_save_pretrained_round_trip_keeps_ties_and_other_files(tmp_path) -> None:
    model = tiny("gpt-tiny")
    tok = tokenizer("gpt", "bpe", 300)
    (tmp_path / "notes.txt").write_text("kept")
    model.save_pretrained(tmp_path, tokenizer=tok)
    back = Transformer.from_pretrained(tmp_path)
    ids, mask = padded_batch(0)
    with torch.no_grad():
        torch.testing.assert_close(back(ids, mask).logits, model(ids, mask).logits, rtol=0, atol=0)
    assert back.lm_head.weight is back.tok_emb.weight and not back.training
    assert (tmp_path / "notes.txt").read_text() == "kept"
    loaded, loaded_tok = lmforge.load(tmp_path)  # every lmforge command reads it
    assert loaded_tok.vocab_size == tok.vocab_size
    half = Transformer.from_pretrained(tmp_path, torch_dtype="bfloat16")
    assert half.dtype == torch.bfloat16


def test_save_pretrained_hf_format_loads_in_transformers_and_back(tmp_path) -> None:
    model = tiny("gpt-tiny")
    model.save_pretrained(tmp_path, format="hf")
    ids, mask = padded_batch(0)
    with torch.no_grad():
        ours = model(ids, mask).logits
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)(input_ids=ids, attention_mask=mask).logits
        back = Transformer.from_pretrained(tmp_path)(ids, mask).logits
    real = mask.bool()
    torch.testing.assert_close(theirs[real], ours[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(back, ours, atol=1e-5, rtol=0)


def test_save_and_load_errors(tmp_path) -> None:
    model = tiny("gpt-tiny")
    with pytest.raises(LMForgeError, match=r"^save_pretrained\(\) does not support max_shard_size \(it takes:"):
        model.save_pretrained(tmp_path, max_shard_size="1GB")
    with pytest.raises(LMForgeError, match=r"^cannot save a tokenizer of 400 tokens with a model of vocab_size 300$"):
        model.save_pretrained(tmp_path, tokenizer=tokenizer("gpt"))
    with pytest.raises(LMForgeError, match=r"^save_pretrained\(\) writes safetensors only"):
        model.save_pretrained(tmp_path, safe_serialization=False)
    with pytest.raises(LMForgeError, match=r"does not exist \(from_pretrained reads local lmforge and Hugging Face"):
        Transformer.from_pretrained(tmp_path / "gpt2")
    with pytest.raises(LMForgeError, match=r"^from_pretrained\(\) does not support device_map"):
        Transformer.from_pretrained(tmp_path, device_map="auto")


# ----------------------------------------------------------------------------- transformers.Trainer
def _lm_rows(n: int, T: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 300, (n, T), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _args(out, **kw) -> transformers.TrainingArguments:
    options = dict(
        output_dir=str(out), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2, report_to="none",
        use_cpu=True, logging_steps=1, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    return transformers.TrainingArguments(**{**options, **kw})


def test_transformers_trainer_trains_and_saves_an_lmforge_model(tmp_path) -> None:
    from lmforge.hf_trainer import Trainer

    model = tiny("gpt-tiny").train()
    before = model.tok_emb.weight.detach().clone()
    trainer = Trainer(
        model=model, args=_args(tmp_path), train_dataset=_lm_rows(8, 16), processing_class=tokenizer("gpt", "bpe", 300)
    )
    assert isinstance(trainer, transformers.Trainer)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(model.tok_emb.weight, before)
    trainer.save_model(tmp_path / "final")
    back = Transformer.from_pretrained(tmp_path / "final")
    assert torch.equal(back.tok_emb.weight, model.tok_emb.weight) and back.lm_head.weight is back.tok_emb.weight
    _, tok = lmforge.load(tmp_path / "final")
    assert tok is not None and (tmp_path / "final" / "training_args.bin").is_file()


def test_stock_trainer_trains_an_lmforge_model_on_its_labels_loss(tmp_path) -> None:
    model = tiny("gpt-tiny").train()
    rows = _lm_rows(4, 16)
    batch = torch.stack([r["input_ids"] for r in rows])
    with torch.no_grad():
        start = model(batch, labels=batch).loss.item()
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, max_steps=6), train_dataset=rows)
    trainer.train()
    first = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    # The Trainer's loss is the model's labels= loss: it counts a decoder's scored tokens as the shifted labels.
    assert first == pytest.approx(start, abs=1e-4)
    with torch.no_grad():
        assert model(batch, labels=batch).loss.item() < start - 0.5


def test_the_readme_hf_snippet_runs(tmp_path) -> None:
    import re
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "lmforge.hf_trainer" in b]
    (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
    res = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    decoded = res.stdout.strip().splitlines()[-1]  # the prompt and its continuation (the Trainer prints its summary)
    assert decoded[2:].startswith("It is a truth") and len(decoded) > len("['It is a truth']")
    assert (tmp_path / "runs/hf-tiny/manifest.json").is_file()
