"""Hugging Face habits on lmforge models: `transformers.Trainer` resuming from a checkpoint and restoring the best one,
`resize_token_embeddings`, activation (gradient) checkpointing, `generation_config`, and a LoRA run's peft export
that still loads once copied elsewhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from lm_objective_testing import tokenizer
from model_testing import V, padded_batch, tiny

from lmforge.errors import LMForgeError
from lmforge.hf_trainer import Trainer
from lmforge.models import Transformer


def _rows(n: int, T: int = 16) -> list[dict]:
    ids = torch.randint(4, V, (n, T), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


def _args(out, **kw) -> transformers.TrainingArguments:
    options = dict(
        output_dir=str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2, report_to="none",
        use_cpu=True, logging_steps=1, save_strategy="steps", save_steps=2, disable_tqdm=True, seed=7,
    )  # fmt: skip
    return transformers.TrainingArguments(**{**options, **kw})


def _model() -> Transformer:
    return tiny("gpt-tiny", dropout=0.1).train()


def _reseeded(seed: int) -> Transformer:
    """The same architecture from another random init."""
    torch.manual_seed(seed)
    return Transformer(_model().config).train()


class _StopAt(transformers.TrainerCallback):
    """Stops training after step `step` (its checkpoint is saved first), as a preempted run would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _assert_same_state(a: Trainer, b: Trainer) -> None:
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=0, msg=name)
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and len(sa) > 0
    for k in sa:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sb[k][field], sa[k][field], rtol=0, atol=0)


# ----------------------------------------------------------------------------- Trainer: resume, best model
def test_resume_from_checkpoint_continues_as_the_uninterrupted_run(tmp_path) -> None:
    whole = Trainer(model=_model(), args=_args(tmp_path / "whole"), train_dataset=_rows(8))
    whole.train()
    cut = Trainer(model=_model(), args=_args(tmp_path / "cut"), train_dataset=_rows(8), callbacks=[_StopAt(2)])
    cut.train()
    assert cut.state.global_step == 2 and sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["checkpoint-2"]
    # Another init: only weights read from checkpoint-2 can end equal to the uninterrupted run's.
    resumed = Trainer(model=_reseeded(3), args=_args(tmp_path / "cut"), train_dataset=_rows(8))
    resumed.train(resume_from_checkpoint=True)
    steps = [h["step"] for h in resumed.state.log_history if "loss" in h]
    assert steps[-2:] == [3, 4] and resumed.state.global_step == 4
    _assert_same_state(whole, resumed)
    assert resumed.model.lm_head.weight is resumed.model.tok_emb.weight
    assert resumed.model._keys_to_ignore_on_save == ["lm_head.weight"]


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path) -> None:
    Trainer(model=_model(), args=_args(tmp_path, max_steps=2), train_dataset=_rows(8)).train()
    other = Transformer(tiny("gpt-tiny", d_model=32).config)
    with pytest.raises(LMForgeError, match=r"^checkpoint does not match the model: key 'tok_emb.weight' has shape"):
        Trainer(model=other, args=_args(tmp_path), train_dataset=_rows(8)).train(resume_from_checkpoint=True)


def test_load_best_model_at_end_restores_the_best_checkpoint(tmp_path) -> None:
    # greater_is_better on the loss: the first evaluation (step 2, the higher loss) is the best one here.
    args = _args(tmp_path, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True,
                 metric_for_best_model="eval_loss", greater_is_better=True)  # fmt: skip
    trainer = Trainer(model=_model(), args=args, train_dataset=_rows(8), eval_dataset=_rows(4))
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert len(losses) == 2 and losses[0] > losses[1]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    best, last = (Transformer.from_pretrained(tmp_path / f"checkpoint-{n}") for n in (2, 4))
    model = trainer.model
    assert torch.equal(model.tok_emb.weight, best.tok_emb.weight) and model.lm_head.weight is model.tok_emb.weight
    assert not torch.equal(model.tok_emb.weight, last.tok_emb.weight)
    torch.testing.assert_close(model.state_dict(), best.state_dict(), rtol=0, atol=0)


def test_the_stock_trainer_checkpoints_the_transformers_twin_that_lmforge_reads(tmp_path) -> None:
    """The stock Trainer cannot save an lmforge model's tied weights (README); the `to_hf_model` twin it trains and
    checkpoints is read back into lmforge with the same weights."""
    from lmforge.models.hf import to_hf_model

    twin = to_hf_model(tiny("gpt-tiny")).train()
    trainer = transformers.Trainer(model=twin, args=_args(tmp_path), train_dataset=_rows(8))
    trainer.train()
    back = Transformer.from_pretrained(tmp_path / "checkpoint-4")
    torch.testing.assert_close(back.tok_emb.weight, twin.transformer.wte.weight.detach(), rtol=0, atol=0)
    ids, mask = padded_batch(0)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, twin.eval()(ids).logits, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- resize_token_embeddings
def test_resize_keeps_old_rows_and_ties() -> None:
    model = tiny("gpt-tiny")
    old = model.tok_emb.weight.detach().clone()
    emb = model.resize_token_embeddings(V + 3, pad_to_multiple_of=8)
    n = -(-(V + 3) // 8) * 8
    assert emb is model.tok_emb and emb.weight.shape == (n, old.shape[1]) and model.config.vocab_size == n
    assert model.lm_head.weight is model.tok_emb.weight and model.lm_head.out_features == n
    assert torch.equal(emb.weight[:V], old)
    torch.testing.assert_close(emb.weight[V:], old.mean(0).expand(n - V, -1))  # mean resizing
    ids = torch.tensor([[5, n - 1]])
    assert model(ids).logits.shape == (1, 2, n)
    model.resize_token_embeddings(V - 10)
    assert torch.equal(model.tok_emb.weight, old[: V - 10]) and model.lm_head.weight is model.tok_emb.weight


def test_resize_grows_an_untied_head_and_its_bias() -> None:
    llama = tiny("llama-tiny")
    head = llama.lm_head.weight.detach().clone()
    llama.resize_token_embeddings(V + 4, mean_resizing=False)
    assert llama.lm_head.weight is not llama.tok_emb.weight and torch.equal(llama.lm_head.weight[:V], head)
    assert llama.lm_head.weight.shape[0] == V + 4 and llama.tok_emb.weight[V:].abs().sum() > 0
    bert = tiny("bert-tiny")
    bias = bert.lm_head.bias.detach().clone()
    bert.resize_token_embeddings(V + 2)
    assert torch.equal(bert.lm_head.bias[:V], bias) and torch.allclose(bert.lm_head.bias[V:], bias.mean())
    assert bert.lm_head.weight is bert.tok_emb.weight


def test_resize_errors_are_one_line() -> None:
    model = tiny("t5-tiny")
    with pytest.raises(LMForgeError, match=r"^resize_token_embeddings: 0 rows would drop the model's special id"):
        model.resize_token_embeddings(0)
    with pytest.raises(LMForgeError, match=r"^pad_to_multiple_of must be >= 1, got 0$"):
        model.resize_token_embeddings(V, pad_to_multiple_of=0)


# ----------------------------------------------------------------------------- activation checkpointing
def _grads(model: Transformer, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    torch.manual_seed(5)  # the same dropout masks: checkpointing replays the RNG state in the recompute
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("preset", ["gpt-tiny", "t5-tiny"])
def test_gradient_checkpointing_gives_the_same_gradients(preset: str) -> None:
    model = tiny(preset, dropout=0.1).train()
    ids, _ = padded_batch(0, T=12)
    calls = []
    model.decoder.blocks[0].mlp.register_forward_hook(lambda *a: calls.append(1))
    plain = _grads(model, ids)
    assert len(calls) == 1 and not model.is_gradient_checkpointing
    model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing
    calls.clear()
    checkpointed = _grads(model, ids)
    assert len(calls) == 2  # the block's forward ran again in backward
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=0)
    with torch.no_grad():
        calls.clear()
        model(ids, labels=ids)
        assert len(calls) == 1  # no recompute without gradients
    model.gradient_checkpointing_disable()
    calls.clear()
    _grads(model, ids)
    assert len(calls) == 1 and not model.is_activation_checkpointing


def test_trainer_turns_activation_checkpointing_on_and_trains_the_same(tmp_path) -> None:
    runs = []
    for on in (False, True):
        args = _args(tmp_path / str(on), max_steps=2, activation_checkpointing=on, save_strategy="no")
        runs.append(Trainer(model=_model(), args=args, train_dataset=_rows(8)))
        runs[-1].train()
    assert runs[1].model.is_activation_checkpointing and not runs[0].model.is_activation_checkpointing
    _assert_same_state(runs[0], runs[1])
    model = runs[1].model
    model.activation_checkpointing_enable(every_n_layers=2)
    assert ["_hf_plain_forward" in b.__dict__ for b in model.decoder.blocks] == [True, False]
    with pytest.raises(LMForgeError, match=r"^activation checkpointing is non-reentrant here: use_reentrant=True"):
        model.gradient_checkpointing_enable({"use_reentrant": True})


# ----------------------------------------------------------------------------- generation_config
def test_generation_config_carries_the_tokenizer_ids(tmp_path) -> None:
    tok = tokenizer("bart", "bpe", 400)  # <s> 0, <pad> 1, </s> 2: each id differs from the model's pad 0
    model = Transformer(tiny("llama-tiny", vocab_size=tok.vocab_size).config)
    assert model.generation_config.eos_token_id is None and model.generation_config.pad_token_id is None
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    back = Transformer.from_pretrained(tmp_path / "m")
    gc = back.generation_config
    assert (gc.bos_token_id, gc.eos_token_id, gc.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    trainer = Trainer(model=model, args=_args(tmp_path / "t"), processing_class=tok)
    assert trainer.model.generation_config.eos_token_id == tok.eos_id
    model.generation_config.num_beams = 2
    model.save_pretrained(tmp_path / "m")
    assert Transformer.from_pretrained(tmp_path / "m").generation_config.num_beams == 2


def test_generate_honours_the_generation_config() -> None:
    model = tiny("gpt-tiny")
    ids, mask = padded_batch(0, T=9)
    ids, mask = ids.flip(1), mask.flip(1)
    free = model.generate(ids, mask, max_new_tokens=6)
    eos = int(free[0, 9])
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.max_new_tokens = eos, 1, 6
    out = model.generate(ids, mask)
    assert out.shape == free.shape and out[0, 9] == eos and (out[0, 10:] == 1).all()
    assert torch.equal(out[1:], torch.where(_after_eos(free[1:], eos), 1, free[1:]))
    assert model.generate(ids, mask, max_new_tokens=2).shape[1] == 11  # a passed value wins
    gc.num_beams = 3
    assert torch.equal(model.generate(ids, mask), model.generate(ids, mask, num_beams=3))
    gc.repetition_penalty = 1.3
    with pytest.warns(UserWarning, match=r"generate\(\) does not apply these generation_config fields: repetition"):
        model.generate(ids, mask, max_new_tokens=1)
    override = transformers.GenerationConfig(max_new_tokens=2)
    assert model.generate(ids, mask, generation_config=override).shape[1] == 11


def _after_eos(out: torch.Tensor, eos: int) -> torch.Tensor:
    new = out[:, 9:] == eos
    after = new.int().cumsum(1) - new.int() > 0
    return torch.cat([torch.zeros_like(out[:, :9], dtype=torch.bool), after], dim=1)


# ----------------------------------------------------------------------------- peft export, copied
def test_a_copied_lora_export_loads_without_its_original(tmp_path, monkeypatch) -> None:
    peft = pytest.importorskip("peft")
    import lmforge
    from lmforge.cli import main

    run, export = tmp_path / "run", tmp_path / "export"
    texts = ["a truly wonderful and delightful film", "dull, tedious and awful", "it was fine"]
    lmforge.finetune("sst2-gpt", init="none", model={"preset": "gpt-tiny", "vocab_size": 300},
                     train={"max_steps": 3, "lr": 3e-2}, run={"dir": str(run)},
                     data={"max_train": 32, "max_eval": 8}, peft={"method": "lora", "rank": 4})  # fmt: skip
    assert main(["convert", str(run), "--to", "hf", "--out", str(export)]) == 0
    assert json.loads((export / "adapter_config.json").read_text())["base_model_name_or_path"] == "base"
    auto_cls = transformers.AutoModelForSequenceClassification
    enc = transformers.AutoTokenizer.from_pretrained(export)(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        base = auto_cls.from_pretrained(export / "base").eval()
        plain = base(**enc).logits
        tuned = peft.PeftModel.from_pretrained(base, export).eval()(**enc).logits
    assert not torch.allclose(plain, tuned)  # the adapter changes the logits
    copy = Path(shutil.copytree(export, tmp_path / "elsewhere" / "adapter"))
    shutil.rmtree(export)  # nothing may point back at the original
    monkeypatch.chdir(copy)  # peft resolves the base against the working directory
    with torch.no_grad():
        auto = peft.AutoPeftModelForSequenceClassification.from_pretrained(".").eval()
        torch.testing.assert_close(auto(**enc).logits, tuned)
        monkeypatch.chdir(tmp_path)  # anywhere else: the base named by its path
        again = peft.PeftModel.from_pretrained(auto_cls.from_pretrained(copy / "base"), copy).eval()
        torch.testing.assert_close(again(**enc).logits, tuned)
