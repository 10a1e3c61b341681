"""Hugging Face dirs in and out: exact round trips, Auto-class loading, tokenizers, weight formats, `convert`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import transformers
from model_testing import V, save_hf, tiny
from safetensors.torch import load_file, save_file
from tokenizer_corpus import AUSTEN, GETTYSBURG

from lmforge.api import load
from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli.convert import cmd_convert
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.models.hf import export_hf, import_hf
from lmforge.tokenizers import train_tokenizer

EXPORTABLE = {
    "gpt-tiny": "AutoModelForCausalLM",
    "gpt1-tiny": "AutoModelForCausalLM",
    "llama-tiny": "AutoModelForCausalLM",
    "bert-tiny": "AutoModelForMaskedLM",
    "roberta-tiny": "AutoModelForMaskedLM",
    "albert-tiny": "AutoModelForMaskedLM",
    "electra-tiny-generator": "AutoModelForMaskedLM",
    "electra-tiny": "AutoModelForPreTraining",
    "bart-tiny": "AutoModelForSeq2SeqLM",
    "t5-tiny": "AutoModelForSeq2SeqLM",
    "t5-v1_1-tiny": "AutoModelForSeq2SeqLM",
}


@pytest.mark.parametrize("preset", sorted(EXPORTABLE))
def test_round_trip_lmforge_hf_lmforge_is_exact(preset, tmp_path):
    model = tiny(preset)
    export_hf(model, tmp_path)
    back = import_hf(tmp_path)
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert dataclasses.replace(back.config, name=preset) == model.config  # every field survives
    # The exported dir loads with the transformers Auto class for its head.
    hf = getattr(transformers, EXPORTABLE[preset]).from_pretrained(tmp_path)
    assert (
        hf.num_parameters() > 0
        and hf.config.model_type == json.loads((tmp_path / "config.json").read_text())["model_type"]
    )


def test_token_ids_travel_through_export(tmp_path):
    model = tiny("bart-tiny", pad_id=1, decoder_start_id=2)
    export_hf(model, tmp_path)
    hf_cfg = json.loads((tmp_path / "config.json").read_text())
    assert (hf_cfg["pad_token_id"], hf_cfg["decoder_start_token_id"]) == (1, 2)
    t5 = tiny("t5-tiny", decoder_start_id=0, pad_id=0)
    export_hf(t5, tmp_path / "t5")
    back = import_hf(tmp_path / "t5").config
    assert (back.pad_id, back.decoder_start_id) == (0, 0)


@pytest.mark.parametrize(
    "kind,family,preset",
    [("bpe", "gpt", "gpt-tiny"), ("wordpiece", "bert", "bert-tiny"), ("unigram", "t5", "t5-tiny"),
     ("bpe", "bart", "bart-tiny"), ("bpe", "llama", "llama-tiny")],
)  # fmt: skip
def test_exported_tokenizer_loads_with_auto_tokenizer(kind, family, preset, tmp_path):
    tok = train_tokenizer([GETTYSBURG, AUSTEN], kind, 400 if kind == "bpe" else 250, family=family)
    model = Transformer(get_preset(preset, vocab_size=tok.vocab_size))
    export_hf(model, tmp_path, tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Four score and seven years ago, a truth universally acknowledged"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    for role, text in tok.special_tokens.items():
        assert getattr(hf_tok, f"{role}_token") == text
    assert hf_tok.model_max_length == 128
    assert ("token_type_ids" in hf_tok(text)) == (family == "bert")
    # lmforge.load reads the HF dir back with its tokenizer.
    _, again = load(tmp_path)
    assert again.encode(text) == tok.encode(text) and again.special_tokens == tok.special_tokens


def _hf_gpt2(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    save_hf(hf, tmp_path)
    return hf.eval()


def _same_logits(model, hf) -> None:
    x = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, hf(input_ids=x).logits, atol=1e-4, rtol=0)


def test_pytorch_model_bin_with_legacy_names_and_no_prefix(tmp_path):
    """An old-style dir: pytorch_model.bin, keys without the task prefix, TF-era LayerNorm gamma/beta."""
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64))  # fmt: skip
    save_hf(hf, tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
              for k, v in sd.items()}  # fmt: skip
    assert not any(k.startswith("bert.") for k in legacy) and any(k.endswith("gamma") for k in legacy)
    (tmp_path / "model.safetensors").unlink()
    torch.save(legacy, tmp_path / "pytorch_model.bin")
    ours = import_hf(tmp_path)
    x = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(x).last_hidden_state, hf.eval()(input_ids=x).last_hidden_state, atol=1e-4, rtol=0
        )


def test_sharded_safetensors(tmp_path):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    )
    save_hf(hf, tmp_path / "one")  # perturbs the weights
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    _same_logits(import_hf(tmp_path / "sharded"), hf.eval())


def test_a_shard_index_pointing_outside_the_model_dir_is_refused(tmp_path):
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4))
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    outside = tmp_path / "outside.safetensors"
    first = next(iter(data["weight_map"]))
    (tmp_path / "sharded" / data["weight_map"][first]).rename(outside)  # a real shard, but not in the model dir
    data["weight_map"][first] = "../outside.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(LMForgeError) as e:
        import_hf(tmp_path / "sharded")
    expected = f"{index} names shard '../outside.safetensors', which is not a file of {tmp_path / 'sharded'}"
    assert str(e.value) == expected


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_pickle_with_code_is_refused(tmp_path, capsys):
    _hf_gpt2(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"transformer.wte.weight": torch.zeros(2), "x": _Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(
        LMForgeError, match="^refusing to load .*pytorch_model.bin: it holds objects other than tensors$"
    ):
        import_hf(tmp_path)
    assert "unpickled code ran" not in capsys.readouterr().out


def test_a_legacy_format_pytorch_model_bin_loads_and_one_with_code_is_refused(tmp_path, capsys):
    hf = _hf_gpt2(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    torch.save(sd, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)  # torch < 1.6's format
    _same_logits(import_hf(tmp_path), hf)
    torch.save({**sd, "x": _Evil()}, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(LMForgeError, match="^refusing to load .*pytorch_model.bin: it holds objects other than"):
        import_hf(tmp_path)
    assert "unpickled code ran" not in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- errors


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    with pytest.raises(LMForgeError, match=r"^no converter for Hugging Face model_type 'mamba' \(supported: albert, "):
        import_hf(tmp_path)


def test_missing_config_and_missing_weights(tmp_path):
    with pytest.raises(LMForgeError, match=f"^no config.json in {tmp_path}$"):
        import_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": V}))
    with pytest.raises(
        LMForgeError, match=r"^no model weights in .* \(expected model.safetensors or pytorch_model.bin\)$"
    ):
        import_hf(tmp_path)


def test_missing_tensor(tmp_path):
    _hf_gpt2(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    del sd["transformer.h.1.ln_2.weight"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(LMForgeError) as err:
        import_hf(tmp_path)
    assert str(err.value) == "Hugging Face gpt2 checkpoint is missing tensor 'transformer.h.1.ln_2.weight'"


def test_shape_mismatch(tmp_path):
    _hf_gpt2(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["n_positions"] = 80  # the weights hold 64 positions
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LMForgeError) as err:
        import_hf(tmp_path)
    assert str(err.value) == (
        "tensor 'decoder.pos_emb.emb.weight' has shape (64, 32) in the checkpoint, the model expects (80, 32)"
    )


@pytest.mark.parametrize(
    "preset,overrides",
    [("prefix-lm-tiny", {}), ("t5-tiny", {"share_encoder_decoder": True}), ("gpt-tiny", {"position": "alibi"}),
     ("bert-tiny", {"norm_position": "pre"})],
)  # fmt: skip
def test_export_without_hf_equivalent_is_an_error(preset, overrides, tmp_path):
    model = Transformer(get_preset(preset, **overrides))
    with pytest.raises(LMForgeError, match=r"^model '.*' \(.*\) has no Hugging Face equivalent: its architecture"):
        export_hf(model, tmp_path)
    assert not (tmp_path / "config.json").exists()


# --------------------------------------------------------------------------------------------- convert, load


def test_convert_checkpoint_to_hf_and_back(tmp_path, capsys):
    tok = train_tokenizer([GETTYSBURG, AUSTEN], "wordpiece", 250, family="bert")
    model = tiny("bert-tiny", vocab_size=250)
    save_checkpoint(tmp_path / "run", 7, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
    cmd_convert(tmp_path / "run", tmp_path / "hf", "hf")
    assert "wrote Hugging Face bert model to" in capsys.readouterr().out
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    x = torch.randint(5, 250, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=x).logits, model(x).logits, atol=1e-4, rtol=0)
    cmd_convert(tmp_path / "hf", tmp_path / "ckpt", "lmforge")
    assert {"manifest.json", "config.yaml", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in (tmp_path / "ckpt").iterdir()
    }
    back, back_tok = load(tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
    assert back_tok.encode("four score") == tok.encode("four score")


def test_load_hf_dir_without_tokenizer(tmp_path):
    hf = _hf_gpt2(tmp_path)
    model, tok = load(tmp_path)
    assert tok is None and not model.training
    _same_logits(model, hf)


def test_convert_refuses_a_non_empty_unrelated_output_dir(tmp_path):
    _hf_gpt2(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep me")
    with pytest.raises(LMForgeError, match="^output directory .*out is not empty$"):
        cmd_convert(tmp_path / "src", tmp_path / "out", "lmforge")
    with pytest.raises(LMForgeError, match=r"^unknown conversion target 'onnx' \(choose hf or lmforge\)$"):
        cmd_convert(tmp_path / "src", tmp_path / "x", "onnx")  # type: ignore[arg-type]
    assert (tmp_path / "out" / "notes.txt").read_text() == "keep me"
