"""`lmforge convert FT_RUN --to hf`: a fine-tuned run as a `transformers` task model, its LoRA as a peft adapter.

A full fine-tune (or top-k layers) is one HF model dir. A LoRA run is, by default, a peft adapter dir
(adapter_config.json + adapter_model.safetensors, loadable by `peft.PeftModel.from_pretrained`) with the frozen
model it applies to in `base/` (the pretrained weights, the task tokens' rows and the trained head); `merge=True`
folds the LoRA into the weights and writes one plain model dir instead.

The adapter names its base by the relative path "base", so the export dir can be copied or moved whole: peft's
`AutoPeftModelFor*.from_pretrained` resolves that name against the working directory (not the adapter dir), so it
loads from inside the export dir; from anywhere, `PeftModel.from_pretrained(AutoModelFor*.from_pretrained(
f"{dir}/base"), dir)` does. An absolute path would tie the adapter to the machine and place it was written on.

Our LoRA on a fused projection (qkv, cross-attention kv) is one rank-r pair; where HF keeps separate q/k/v layers
it becomes one LoRA per layer sharing A, with B cut into the layers' rows: B_q A, B_k A, B_v A are the rows of B A,
so the update is the same."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from lmforge.adapt.inject import replace_modules
from lmforge.adapt.lora import LoRALinear, lora_layers, merge_and_unload
from lmforge.errors import LMForgeError
from lmforge.models.hf.base import StateDict
from lmforge.tasks.hf_export import HFTaskModel, head_kind, save_hf_dir, task_to_hf, write_task_tokenizer
from lmforge.tasks.model import TaskModel

PEFT_TASK_TYPE = {"sequence": "SEQ_CLS", "token": "TOKEN_CLS", "span": "QUESTION_ANS"}
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_DIR = "base"


def export_finetuned(run: Path, out: Path, merge: bool = False) -> str:
    """Write the fine-tuned run `run` to `out` as HF files; returns a one-line summary of what was written."""
    from lmforge.loading import load_finetuned

    task, model, _, cfg = load_finetuned(run)
    method = cfg.peft.method
    if model.head is not None and lora_layers(model.head):  # the head is saved whole either way
        merge_and_unload(model.head)
    if method == "lora" and not merge:
        return _export_peft(task, model, out)
    if method == "lora":
        merge_and_unload(model)
    elif method not in ("none", "topk"):
        raise LMForgeError(
            f"cannot export a {method} run to Hugging Face: its modules live inside the network and neither "
            "transformers nor peft computes them (LoRA runs export as peft adapters)"
        )
    exported = task_to_hf(task, model)
    _write(exported, task, model, out)
    return _summary(exported, out)


def _write(exported: HFTaskModel, task, model: TaskModel, out: Path) -> None:
    save_hf_dir(exported, out)
    write_task_tokenizer(task, model, out)


def _summary(exported: HFTaskModel, out: Path) -> str:
    cls = exported.config["architectures"][0]
    labels = exported.config.get("id2label")
    named = ""
    if labels and exported.config.get("problem_type") != "regression":
        named = f"; labels {', '.join(labels.values())}"
    return f"wrote Hugging Face {cls} to {out} (transformers.{exported.auto_class}{named})"


def unloaded(model: TaskModel) -> TaskModel:
    """A copy of `model` with every LoRA wrapper replaced by its (unmerged) base layer."""
    plain = copy.deepcopy(model)
    layers = lora_layers(plain)
    for m in layers:
        m.unmerge()
    replace_modules(plain, [("", m) for m in layers], lambda m: m.base_layer)
    return plain


def _export_peft(task, model: TaskModel, out: Path) -> str:
    base = unloaded(model)
    exported = task_to_hf(task, base)
    _write(exported, task, base, out / BASE_DIR)
    adapter, weights = peft_adapter(model, base, exported, Path(BASE_DIR))
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in weights.items()}, str(out / ADAPTER_WEIGHTS),
              metadata={"format": "pt"})  # fmt: skip
    (out / ADAPTER_CONFIG).write_text(json.dumps(adapter, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_task_tokenizer(task, base, out)
    cls = exported.config["architectures"][0]
    return (
        f"wrote a peft LoRA adapter ({len(adapter['target_modules'])} modules, r={adapter['r']}) to {out} and its "
        f"base {cls} to {out / BASE_DIR} (peft.PeftModel.from_pretrained(transformers.{exported.auto_class}"
        f".from_pretrained('{out / BASE_DIR}'), '{out}'))"
    )


def _hf_module_name(model: TaskModel, name: str, exported: HFTaskModel) -> str | None:
    """The HF name the task model gives the tensor an LM export calls `name` (None: the task model lacks it)."""
    t5_encoder = exported.config.get("model_type") == "t5" and exported.config.get("is_encoder_decoder") is False
    full = f"transformer.{name}" if t5_encoder else name
    return full if full in exported.state else None


def _lora_pairs(model: TaskModel, base: TaskModel, exported: HFTaskModel) -> tuple[StateDict, list[str], set[bool]]:
    """peft's LoRA tensors, the target module names and the fan_in_fan_out flags they need."""
    from lmforge.models.hf.base import converter_of

    backbone = model.backbone
    conv = converter_of(backbone.config, base.backbone.state_dict())
    pairs = {p.ours: p for p in conv.pairs(backbone.config)}
    weights: StateDict = {}
    targets: list[str] = []
    flags: set[bool] = set()
    for name, m in backbone.named_modules():
        if not isinstance(m, LoRALinear):
            continue
        pair = pairs.get(f"{name}.weight")
        if pair is None:
            raise LMForgeError(f"LoRA on '{name}' has no counterpart in Hugging Face {conv.model_type}")
        parts = m.lora_B.split(list(pair.split), dim=0) if len(pair.theirs) > 1 else (m.lora_B,)
        for theirs, b in zip(pair.theirs, parts):
            hf = _hf_module_name(model, theirs, exported)
            if hf is None:  # e.g. the LM head or T5's decoder, which the task model does not have
                continue
            module = hf.removesuffix(".weight")
            weights[f"base_model.model.{module}.lora_A.weight"] = m.lora_A.detach()
            weights[f"base_model.model.{module}.lora_B.weight"] = b.detach()
            targets.append(module)
            flags.add(pair.transpose)
    return weights, targets, flags


def peft_adapter(model: TaskModel, base: TaskModel, exported: HFTaskModel, base_dir: Path) -> tuple[dict, StateDict]:
    """adapter_config.json and the adapter tensors (LoRA pairs + the head as modules_to_save) in peft's format;
    `base` is `model` without its LoRA, `exported` the HF export of `base`, `base_dir` the path the adapter names
    its base by (relative to the adapter dir: see the module docstring)."""
    weights, targets, flags = _lora_pairs(model, base, exported)
    if not targets:
        raise LMForgeError("the run's LoRA adapts no layer of the exported model: export it with --merge")
    if len(flags) > 1:
        raise LMForgeError("peft cannot hold LoRA on both Conv1D and Linear layers in one adapter: use --merge")
    layers = [m for m in model.backbone.modules() if isinstance(m, LoRALinear)]
    ranks, alphas = {m.rank for m in layers}, {m.alpha for m in layers}
    if len(ranks) > 1 or len(alphas) > 1:
        raise LMForgeError("the run's LoRA layers differ in rank or alpha, which one peft config cannot say")
    kind = head_kind(model)
    base = set(_base_names(exported))
    saved = sorted({k.rsplit(".", 1)[0] for k in exported.state if k not in base})  # head (+ folded norm)
    for name in saved:
        for k, v in exported.state.items():
            if k.rsplit(".", 1)[0] == name:
                weights[f"base_model.model.{k}"] = v
    config = {
        "peft_type": "LORA", "task_type": PEFT_TASK_TYPE.get(kind, _lm_task_type(model)),
        "base_model_name_or_path": base_dir.as_posix(), "r": ranks.pop(), "lora_alpha": alphas.pop(),
        "lora_dropout": 0.0, "target_modules": targets, "fan_in_fan_out": flags.pop(), "bias": "none",
        "modules_to_save": saved or None, "inference_mode": True, "init_lora_weights": True,
        "use_rslora": False, "use_dora": False,
    }  # fmt: skip
    return config, weights


def _lm_task_type(model: TaskModel) -> str:
    return "SEQ_2_SEQ_LM" if model.config.is_encoder_decoder else "CAUSAL_LM"


def _base_names(exported: HFTaskModel) -> list[str]:
    """Tensors of the base model proper: a head's modules (score, classifier, qa_outputs) and the LayerNorm the
    head's bias was folded into are the ones it trained and are left out."""
    folded = _folded_norm(exported)
    return [k for k in exported.state if _is_base(k) and not (folded and k.startswith(folded))]


def _is_base(name: str) -> bool:
    return not name.startswith(("score.", "classifier.", "qa_outputs.")) and ".pooler." not in f".{name}"


def _folded_norm(exported: HFTaskModel) -> str | None:
    if exported.config.get("problem_type") is None or "score.weight" not in exported.state:
        return None
    n = exported.config.get("n_layer")
    return "transformer.ln_f." if "transformer.ln_f.bias" in exported.state else f"transformer.h.{n - 1}.ln_2."
