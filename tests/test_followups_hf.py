"""Follow-ups on the Hugging Face surface and the command line: transformers' Trainer with a `transformers` tokenizer
as processing_class, the generation config `lmforge.load` fills from the tokenizer, task tokens grown through
resize_token_embeddings, the hf_trainer install hint, preset names suggested by prefix, lmforge eval's Transformer-XL
flags, an experiment's BLiMP eval checked at plan time, and the Hugging Face export of a multi-token-prediction
decoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from lm_objective_testing import tokenizer
from model_testing import V, tiny

import lmforge
from lmforge.experiments.spec import load_experiment
from lmforge.hf_trainer import Trainer
from lmforge.models import Transformer

FIXTURE = Path(__file__).parent / "fixtures" / "blimp"


def _rows(n: int, vocab: int, T: int = 16) -> list[dict]:
    ids = torch.randint(4, vocab, (n, T), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


# ----------------------------------------------------------------------------- Trainer + a transformers tokenizer
def test_trainer_trains_with_a_transformers_tokenizer_as_processing_class(tmp_path) -> None:
    tok = tokenizer("bart", "bpe", 400)  # <s> 0, <pad> 1, </s> 2
    model = Transformer(tiny("gpt-tiny", vocab_size=tok.vocab_size).config)
    assert model.config.get_text_config() is model.config
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2, report_to="none",
        use_cpu=True, save_strategy="no", disable_tqdm=True, seed=7,
    )  # fmt: skip
    before = model.tok_emb.weight.detach().clone()
    trainer = Trainer(model=model, args=args, train_dataset=_rows(8, tok.vocab_size),
                      processing_class=tok.to_transformers())  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 2 and not torch.equal(model.tok_emb.weight, before)
    gc = model.generation_config  # the Trainer aligned it with the tokenizer's special ids
    assert tok.eos_id in gc.eos_token_id and (gc.bos_token_id, gc.pad_token_id) == (tok.bos_id, tok.pad_id)


# ----------------------------------------------------------------------------- lmforge.load: generation config
def test_load_gives_the_model_the_tokenizers_generation_ids(tmp_path) -> None:
    tok = tokenizer("bart", "bpe", 400)
    model = Transformer(tiny("llama-tiny", vocab_size=tok.vocab_size).config)
    model.save_pretrained(tmp_path / "m", tokenizer=tok)
    assert not (tmp_path / "m" / "generation_config.json").exists()
    loaded, loaded_tok = lmforge.load(tmp_path / "m")
    gc = loaded.generation_config
    assert (gc.bos_token_id, gc.eos_token_id, gc.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    # A saved generation_config.json's values win over the tokenizer's; the ids it leaves unset come from it.
    model.generation_config.eos_token_id, model.generation_config.num_beams = 7, 3
    model.save_pretrained(tmp_path / "g", tokenizer=tok)
    gc = lmforge.load(tmp_path / "g")[0].generation_config
    assert (gc.eos_token_id, gc.num_beams, gc.pad_token_id) == (7, 3, tok.pad_id)


# ----------------------------------------------------------------------------- task tokens grow through the model
def test_resize_embeddings_grows_through_the_models_resize_token_embeddings(monkeypatch) -> None:
    from lmforge.tasks.inputs import resize_embeddings

    model = tiny("llama-tiny")  # an untied head
    calls = []
    plain = Transformer.resize_token_embeddings

    def recorded(self, *args, **kwargs):
        calls.append((args, kwargs))
        return plain(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "resize_token_embeddings", recorded)
    head = model.lm_head.weight.detach().clone()
    resize_embeddings(model, V - 5)  # never shrinks
    assert calls == [] and model.config.vocab_size == V
    resize_embeddings(model, V + 3, reinit=[7])
    assert calls == [((V + 3,), {"mean_resizing": False})]
    assert model.tok_emb.weight.shape[0] == model.lm_head.weight.shape[0] == V + 3
    assert torch.equal(model.lm_head.weight[:7], head[:7]) and not torch.equal(model.lm_head.weight[7], head[7])


# ----------------------------------------------------------------------------- hf_trainer without the hf extra
def test_hf_trainer_without_transformers_names_the_extra_a_wheel_user_installs(monkeypatch) -> None:
    import importlib
    import sys

    from lmforge import extras

    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    monkeypatch.delitem(sys.modules, "lmforge.hf_trainer")
    monkeypatch.setattr(extras, "source_checkout", lambda: None)  # installed from a wheel
    with pytest.raises(ImportError) as caught:
        importlib.import_module("lmforge.hf_trainer")
    assert str(caught.value) == (
        "lmforge.hf_trainer needs lmforge's `hf` extra (transformers, accelerate), which is not installed: "
        "pip install 'lmforge[hf]'"
    )


# ----------------------------------------------------------------------------- preset names: prefix first
_GPT2 = "error: unknown model preset 'gpt2' — did you mean 'gpt2-124m'? (or gpt2-350m, gpt2-774m, gpt2-1.5b)\n"


def test_a_recipes_unknown_preset_and_model_info_suggest_the_presets_it_starts(tmp_path, capsys) -> None:
    from training_testing import run_main

    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  preset: gpt2\n", encoding="utf-8")
    rc, out, err = run_main(capsys, "pretrain", str(recipe), "--print-config")
    assert rc != 0 and out == "" and err == _GPT2
    rc, out, err = run_main(capsys, "model", "info", "gpt2")
    assert rc != 0 and out == "" and err == _GPT2
    rc, _, err = run_main(capsys, "model", "info", "electra-smal")  # a prefix of three: the smallest name first
    assert err == (
        "error: unknown model preset 'electra-smal' — did you mean 'electra-small'? "
        "(or electra-small-generator, electra-small-rope)\n"
    )
    rc, _, err = run_main(capsys, "model", "info", "gtp2")  # nothing close: every preset
    assert rc != 0 and err.count("\n") == 1
    assert err.startswith("error: unknown model preset 'gtp2' (known: albert-base, albert-tiny, bart-base, ")


# ----------------------------------------------------------------------------- lmforge eval --segment / --mem-len
def test_eval_declares_the_transformer_xl_memory_flags(tmp_path, capsys, monkeypatch) -> None:
    from training_testing import run_main

    import lmforge.eval.text

    rc, out, _ = run_main(capsys, "eval", "--help")
    assert rc == 0 and "[--segment N]" in out and "[--mem-len N]" in out
    assert "--segment N           --text on a Transformer-XL run: tokens per segment" in out
    calls = []
    monkeypatch.setattr(lmforge.eval.text, "cmd_text", lambda *a, **kw: calls.append(kw))
    rc, _, err = run_main(capsys, "eval", "RUN", "--text", "t.txt", "--segment", "4", "--mem-len=0")
    assert rc == 0 and err == ""
    assert (calls[0]["segment"], calls[0]["mem_len"], calls[0]["extra"]) == (4, 0, [])  # parsed once, by the CLI
    rc, _, err = run_main(capsys, "eval", "RUN", "--text", "t.txt", "--segment=x")
    assert rc == 2 and err == "error: --segment must be an integer >= 1, got 'x'\n"
    rc, _, err = run_main(capsys, "eval", str(tmp_path), "--task", "blimp", "--mem-len", "8")
    assert rc == 2 and err == (
        "error: --mem-len sets the segment-recurrent scoring of --text FILE by a Transformer-XL run; give --text\n"
    )


# ----------------------------------------------------------------------------- an experiment's BLiMP eval data
_PRETRAIN = {"recipe": "gpt", "seeds": [0], "arms": ["gpt"],
             "overrides": {"model.preset": "gpt-tiny", "train.batch_size": 8, "train.seq_len": 32}}  # fmt: skip


def _blimp_experiment(tmp_path, overrides: dict) -> Path:
    import yaml

    grammar = {"name": "grammar", "task": "blimp", "overrides": overrides}
    data = {"out": str(tmp_path / "out"), "budget": {"tokens": 2560}, "pretrain": _PRETRAIN, "eval": [grammar]}
    path = tmp_path / "grammar.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_an_experiments_blimp_eval_without_its_data_is_refused_before_pretraining(tmp_path, capsys, monkeypatch):
    from training_testing import run_main

    from lmforge.experiments import plan

    missing = tmp_path / "no-blimp"
    for overrides, error in [
        ({}, "data.source=blimp needs data.dir, the directory of BLiMP's <paradigm>.jsonl files (BLiMP is not "
             "bundled): --eval.data.dir=DIR"),
        ({"data.dir": str(missing)}, f"minimal-pair directory not found: {missing}"),
    ]:  # fmt: skip
        rc, _, err = run_main(capsys, "experiment", str(_blimp_experiment(tmp_path, overrides)))
        assert rc == 2 and err == f"error: eval: grammar: {error}\n"
        assert not (tmp_path / "out" / "pretrain").exists() and not (tmp_path / "out" / "shared").exists()
    # The dir given on the experiment's command line, or a good one: planning goes on to the pretraining data.
    reached = []
    monkeypatch.setattr(plan, "_pretraining", lambda exp, make_data: reached.append(make_data) or ({}, {}, set()))
    plan.plan_experiment(load_experiment(_blimp_experiment(tmp_path, {"data.dir": str(FIXTURE)})))
    exp = load_experiment(_blimp_experiment(tmp_path, {}), [f"--eval.data.dir={FIXTURE}"])
    plan.plan_experiment(exp)
    assert reached == [True, True]
    plan.plan_experiment(load_experiment(_blimp_experiment(tmp_path, {})), make_data=False)  # a dry run lists it


# ----------------------------------------------------------------------------- export of a multi-token predictor
@pytest.mark.parametrize("preset,family", [("gpt-mtp-tiny", "gpt2"), ("llama-mtp-tiny", "llama")])
def test_a_multi_token_prediction_decoder_exports_as_its_next_token_model(preset, family, tmp_path, capsys) -> None:
    from model_testing import assert_parity
    from safetensors import safe_open

    from lmforge.models.hf import export_hf

    model = tiny(preset)  # gpt: parallel heads (Gloeckle et al. 2024); llama: sequential (DeepSeek-V3)
    n = model.config.mtp_heads
    assert n and any(k.startswith("mtp.") for k in model.state_dict())
    export_hf(model, tmp_path / "hf")
    assert capsys.readouterr().err == (
        f"note: the export leaves out the model's {n} multi-token prediction head(s) (they train only; Hugging Face "
        f"{family} has none): the exported model predicts the next token as the lmforge model does\n"
    )
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        assert not [k for k in f.keys() if "mtp" in k]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.model_type == family
    assert_parity(model, hf)  # the same hidden states and next-token logits on every real position
    ids = torch.randint(4, V, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-4, rtol=0)
        assert len(model(ids, mtp=True).mtp_logits) == n  # the lmforge model keeps its heads
