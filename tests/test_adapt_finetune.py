"""The fine-tuning glue: the `peft` recipe section, and adapter-only checkpoints of a real task model (GPT task
tokens included) written and read by lmforge/checkpoint/."""

from __future__ import annotations

import pytest
import tasks_testing as T
import torch
from safetensors import safe_open

from lmforge.adapt.finetune import AdapterWeights, apply_peft_section, build_peft_section, peft_section_to_dict
from lmforge.adapt.lora import LoRAOptions
from lmforge.checkpoint.layout import WEIGHTS_FILE
from lmforge.checkpoint.read import load_weights
from lmforge.checkpoint.write import save_checkpoint
from lmforge.config import parse_overrides
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.inputs import GPT_TOKENS, collate


def test_peft_section_from_cli_overrides_and_back():
    raw = parse_overrides(["--peft.method=lora", "--peft.rank=8", "--peft.targets=[qkv, o]"])["peft"]
    section = build_peft_section(raw)
    assert section.method == "lora" and section.options == LoRAOptions(rank=8, targets=["qkv", "o"])
    assert build_peft_section(peft_section_to_dict(section)) == section
    assert build_peft_section(None).method == "none" and peft_section_to_dict(build_peft_section({})) == {
        "method": "none"
    }
    with pytest.raises(LMForgeError, match=r"^peft.rank is set but peft.method is none$"):
        build_peft_section({"rank": 8})
    with pytest.raises(LMForgeError, match=r"^unknown config key 'peft.bottleneck'$"):
        build_peft_section({"method": "lora", "bottleneck": 8})
    with pytest.raises(LMForgeError, match=r"^unknown adapter 'lorra' — did you mean 'lora'\?$"):
        build_peft_section({"method": "lorra"})


def _task_model(seed: int):
    """A GPT-format classification model on a tiny pretrained-like backbone (same weights for every seed); `seed`
    only drives the initialisation of what fine-tuning adds (task-token rows, head)."""
    tok = T.tokenizer("gpt")
    backbone = T.model("gpt-tiny", tok, seed=0).eval()
    cls = TASKS.get("classification")
    task = cls(cls.Options(head_dropout=0.0), tok, ["negative", "positive"])
    torch.manual_seed(seed)
    model = task.build(backbone).eval()
    rows = [tok.token_to_id(t) for t in GPT_TOKENS]
    return task, model, rows


def test_adapter_only_checkpoint_of_a_task_model_reloads_exactly(tmp_path):
    task, model, rows = _task_model(seed=1)
    info = apply_peft_section(model, build_peft_section({"method": "lora", "rank": 4}))
    assert info is not None and info.trainable == 2 * (4 * (64 + 192) + 4 * (64 + 64)) + 2 * 64 + 2
    batch = collate(task.features(T.sentiment(8, seed=2), train=True), task.pad_id)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(3):
        task.loss(model, batch).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        expected = model(batch).logits
    path = save_checkpoint(tmp_path, 3, AdapterWeights(model, rows), config={"peft": {"method": "lora"}})
    with safe_open(str(path / WEIGHTS_FILE), "pt") as f:
        keys = set(f.keys())
    lora = {f"{s}.lora_{x}" for s in info.sites for x in "AB"}
    assert keys == lora | {"head.out.weight", "head.out.bias", "backbone.tok_emb.weight.rows"}

    _, fresh, _ = _task_model(seed=7)  # other task-token rows and head until the checkpoint is loaded
    apply_peft_section(fresh, build_peft_section({"method": "lora", "rank": 4}))
    assert not torch.equal(fresh.backbone.tok_emb.weight[rows], model.backbone.tok_emb.weight[rows])
    load_weights(path, AdapterWeights(fresh, rows))
    with torch.no_grad():
        assert torch.equal(fresh(batch).logits, expected)
    with pytest.raises(LMForgeError, match=r"unexpected key 'backbone.tok_emb.weight.rows'"):
        load_weights(path, AdapterWeights(fresh))  # the rows are part of the adapter


def test_full_fine_tuning_section_leaves_the_model_alone():
    _, model, _ = _task_model(seed=1)
    assert apply_peft_section(model, build_peft_section({"method": "none"})) is None
    assert all(p.requires_grad for p in model.parameters()) and getattr(model, "peft_config", None) is None
