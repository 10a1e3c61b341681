"""`lmforge.load` (and so `lmforge generate`, `convert`, `compress quantize`, `model info`) on a fine-tuned run: its
fine-tuned backbone as a plain Transformer, LoRA folded in; adapters that have no place in one are refused."""

from __future__ import annotations

import pytest
import tasks_testing as T
import torch

import lmforge
from lmforge.adapt.lora import LoRALinear
from lmforge.cli import main
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.loading import load_finetuned
from lmforge.models import Transformer

SMALL = {"max_train": 64, "max_eval": 32}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, prepared_docs) -> str:
    run = tmp_path_factory.mktemp("pre") / "run"
    tok, data = prepared_docs(12)  # prepared once per session, not the whole bundled corpus again
    over = {"model.preset": "gpt-tiny", "model.vocab_size": 512, "train.max_steps": 4}
    lmforge.pretrain("gpt", over, data={"tokenizer": str(tok), "prepared": str(data)}, run={"dir": str(run)})
    return str(run)


def _finetuned(pretrained: str, tmp_path, **peft) -> str:
    run = tmp_path / "ft"
    lmforge.finetune("sst2-gpt", init=pretrained, train={"max_steps": 3}, data=SMALL, run={"dir": str(run)},
                     peft=peft or {"method": "none"})  # fmt: skip
    return str(run)


@pytest.fixture(scope="module")
def finetuned(pretrained, tmp_path_factory) -> str:
    return _finetuned(pretrained, tmp_path_factory.mktemp("ft"))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_a_fine_tuned_run_loads_as_its_fine_tuned_backbone(pretrained, finetuned, capsys):
    run = finetuned
    model, tok = lmforge.load(run)
    _, tuned, tuned_tok, _ = load_finetuned(run)
    assert isinstance(model, Transformer) and tok.vocab_size == tuned_tok.vocab_size == model.config.vocab_size
    assert model.labels == ["negative", "positive"]  # it also predicts with the run's head
    ids = torch.tensor([tok.encode("It is a truth universally acknowledged")])
    assert torch.equal(_logits(model, ids), _logits(tuned.backbone, ids))
    before, _ = lmforge.load(pretrained)
    assert not torch.equal(model.tok_emb.weight[: before.config.vocab_size], before.tok_emb.weight)  # fine-tuned
    assert main(["model", "info", run]) == 0 and f"vocab_size={tok.vocab_size}" in capsys.readouterr().out
    assert main(["generate", run, "--prompt", "It is", "--max-new-tokens", "4", "--temperature", "0"]) == 0


def test_from_pretrained_refuses_a_fine_tuned_run_and_names_lmforge_load(finetuned):
    with pytest.raises(LMForgeError, match=r"is a fine-tuned run: read it with lmforge\.load\(path\)") as e:
        Transformer.from_pretrained(finetuned)
    assert "\n" not in str(e.value)


def test_lora_is_folded_in_and_adapters_are_refused(pretrained, tmp_path):
    run = _finetuned(pretrained, tmp_path / "lora", method="lora", rank=4)
    model, tok = lmforge.load(run)
    _, tuned, _, _ = load_finetuned(run)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert any(isinstance(m, LoRALinear) for m in tuned.modules())
    ids = torch.tensor([tok.encode("It is a truth universally acknowledged")])
    torch.testing.assert_close(_logits(model, ids), _logits(tuned.backbone, ids), rtol=1e-4, atol=1e-4)
    run = _finetuned(pretrained, tmp_path / "houlsby", method="houlsby")
    with pytest.raises(LMForgeError, match=r"its houlsby modules live inside the fine-tuned network"):
        lmforge.load(run)


def test_a_fine_tune_from_another_fine_tune_keeps_its_backbone_and_gets_a_head_of_its_own_labels(finetuned, tmp_path):
    """Intermediate-task training (an experiment's `init: TASK/ARM`): `--init` a fine-tuned run of another task."""
    labels = ["low", "mid", "high"]
    rows = [Example(text=f"{T.TEXTS[i % len(T.TEXTS)]} {labels[i % 3]}", label=labels[i % 3]) for i in range(48)]
    data = T.write_labelled_dir(tmp_path / "three", {"train": Dataset(rows[:32], labels),
                                                     "dev": Dataset(rows[32:], labels)})  # fmt: skip
    run = tmp_path / "next"
    lmforge.finetune("sst2-gpt", init=finetuned, train={"max_steps": 1, "lr": 1e-9}, run={"dir": str(run)},
                     data={"source": "dir", "dir": str(data), "max_train": 32, "max_eval": 16})  # fmt: skip
    _, first, _, _ = load_finetuned(finetuned)
    task, second, _, cfg = load_finetuned(str(run))
    assert task.labels == labels and cfg.model.init == finetuned
    assert [p.shape[0] for p in second.head.parameters()][-1] == 3  # a new head: one output per label
    one, two = first.backbone.state_dict(), second.backbone.state_dict()
    assert one.keys() == two.keys() and all(torch.allclose(one[k], two[k], atol=1e-6) for k in one)
