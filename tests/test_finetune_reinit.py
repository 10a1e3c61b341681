"""`model.reinit_top`: the backbone's top blocks drawn afresh before fine-tuning (Zhang et al. 2021), as the model's
own init scheme draws them, with everything below them kept as pretrained."""

import dataclasses

import pytest
import tasks_testing as T
import torch

from lmforge.checkpoint.write import write_checkpoint_dir
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FineTuner
from lmforge.models import Transformer, get_preset
from lmforge.models.init import reinit_top_blocks
from lmforge.tasks.config import load_finetune_config


def trained(preset: str, **kw) -> Transformer:
    """A model whose every parameter is far from any init (as a pretrained one's are): N(3, 1)."""
    torch.manual_seed(0)
    model = Transformer(get_preset(preset, **kw))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(3.0, 1.0)
    return model


def moved(before: dict, model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.state_dict().items() if not torch.equal(p, before[n])}


def test_the_top_blocks_of_an_encoder_and_its_pooler_are_drawn_as_at_init():
    model = trained("bert-tiny", n_layers=4)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    names = reinit_top_blocks(model, 2)
    top = {n for n in before if n.startswith(("encoder.blocks.2.", "encoder.blocks.3.", "pooler."))}
    assert set(names) == top and moved(before, model) == top  # the rest (embeddings, blocks 0-1, MLM head) as was
    std = model.config.init_std
    for name, p in model.named_parameters():
        if name not in top:
            continue
        if name.endswith("bias"):
            assert torch.all(p == 0), name
        elif "norm" in name:
            assert torch.all(p == 1), name
        else:  # BERT's N(0, 0.02)
            assert p.mean().abs() < 0.2 * std and abs(p.std().item() - std) < 0.1 * std, name


def test_a_decoder_gets_its_scheme_rules_and_final_norm():
    model = trained("gpt-tiny", n_layers=4)
    before = {n: p.clone() for n, p in model.state_dict().items()}
    names = reinit_top_blocks(model, 1)
    assert set(names) == moved(before, model) - {"lm_head.weight"}  # the head is tied to the (kept) embedding
    assert {n.split(".")[1] for n in names} == {"blocks", "final_norm"} and all(".3." in n for n in names[:-2])
    assert torch.all(model.decoder.final_norm.weight == 1)
    std = model.config.init_std / (2 * 4) ** 0.5  # GPT-2 §2.3: residual projections scaled by 1/sqrt(2 L)
    o = model.decoder.blocks[3].attn.o.weight
    assert abs(o.std().item() - std) < 0.1 * std
    assert torch.equal(model.decoder.blocks[2].attn.o.weight, before["decoder.blocks.2.attn.o.weight"])


def test_refused_where_it_cannot_mean_the_top_blocks():
    with pytest.raises(LMForgeError, match="shares one block across its layers"):
        reinit_top_blocks(trained("albert-tiny"), 1)
    with pytest.raises(LMForgeError, match=r"model.reinit_top=3: the encoder has 2 blocks"):
        reinit_top_blocks(trained("bert-tiny"), 3)
    with pytest.raises(LMForgeError, match="model.reinit_top: peft.method=lora keeps the backbone's blocks frozen"):
        load_finetune_config("sst2-bert", ["--model.reinit_top=1", "--peft.method=lora"])
    with pytest.raises(LMForgeError, match="model.reinit_top must be >= 0"):
        load_finetune_config("sst2-bert", ["--model.reinit_top=-1"])


def test_a_fine_tune_from_a_pretrained_dir_keeps_all_but_the_top(tmp_path):
    tok = T.tokenizer("bart")
    model = trained("roberta-tiny", vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    pre = write_checkpoint_dir(tmp_path / "pre", model, config={"model": dataclasses.asdict(model.config)},
                               tokenizer=tok)  # fmt: skip
    data = T.write_labelled_dir(tmp_path / "set", {"train": T.sentiment(16), "dev": T.sentiment(8, seed=1)})

    def backbone(run: str, *extra: str) -> dict[str, torch.Tensor]:
        over = [f"--run.dir={tmp_path / run}", "--data.source=dir", f"--data.dir={data}", *extra]
        tuner = FineTuner(load_finetune_config("sst2-bert", over, init=str(pre)))
        state = tuner.model.backbone.state_dict()
        tuner.session.close()
        return state

    kept, top = backbone("a"), backbone("b", "--model.reinit_top=1")
    changed = {n for n in kept if not torch.equal(kept[n], top[n])}
    assert changed and all(n.startswith("encoder.blocks.1.") for n in changed)
    assert torch.equal(top["encoder.blocks.1.attn.o.weight"], backbone("c", "--model.reinit_top=1")[
        "encoder.blocks.1.attn.o.weight"])  # fmt: skip  # the run's seed draws them
    assert not torch.equal(top["encoder.blocks.1.attn.o.weight"], backbone("d", "--model.reinit_top=1",
        "--run.seed=1")["encoder.blocks.1.attn.o.weight"])  # fmt: skip
