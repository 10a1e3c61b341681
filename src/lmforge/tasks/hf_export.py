"""A fine-tuned run as the matching `transformers` task model: backbone tensors under the family's base prefix plus
the head under HF's names, `id2label`, and a tokenizer whose post-processor frames inputs as the task did.

Exported only where HF's head computes what ours does (eval mode):
- sequence heads (classification, pair classification, regression): GPT-2 / GPT-1 `*ForSequenceClassification`
  read the last non-pad token through a bias-free `score` layer; our linear layer's bias is folded into the final
  LayerNorm's bias (W (h + s) = W h + b for s = W⁺ b, exact while W has full row rank), which the score layer alone
  reads. BERT/ALBERT: pooler (dense + tanh on [CLS]) → classifier; RoBERTa: classifier.dense → tanh → out_proj.
- token heads (tagging): `*ForTokenClassification` (GPT-2, Llama, BERT family, T5's encoder).
- span heads (span QA): `*ForQuestionAnswering` (GPT-2, Llama, BERT family).
- no head (seq2seq, text-to-text): the LM itself plus generation_config.json with the run's decoding settings.
Everything else is refused in one line saying what differs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lmforge.errors import LMForgeError
from lmforge.models.hf.base import StateDict
from lmforge.tasks.heads import SequenceHead, SpanHead, TokenHead
from lmforge.tasks.model import TaskModel
from lmforge.tasks.prompt import VerbalizerHead

FAMILY = {"gpt2": "GPT2", "openai-gpt": "OpenAIGPT", "llama": "Llama", "bert": "Bert", "roberta": "Roberta",
          "albert": "Albert", "electra": "Electra", "t5": "T5", "bart": "Bart"}  # fmt: skip
BASE_PREFIX = {"gpt2": "transformer.", "openai-gpt": "transformer.", "llama": "model.", "bert": "bert.",
               "roberta": "roberta.", "albert": "albert.", "electra": "electra."}  # fmt: skip
# Which (family, head kind) pairs transformers has with our head's math; the reason where it has none.
REFUSED = {
    ("llama", "sequence"): "its score layer has no bias and Llama's final RMSNorm none to fold ours into",
    ("electra", "sequence"): "its classification head applies GELU where ours applies tanh",
    ("openai-gpt", "token"): "transformers has no OpenAIGPTForTokenClassification",
    ("openai-gpt", "span"): "transformers has no OpenAIGPTForQuestionAnswering",
    ("t5", "sequence"): "T5ForSequenceClassification reads the decoder's EOS state, not the encoder",
    ("t5", "span"): "T5ForQuestionAnswering runs the decoder, the fine-tuned head read the encoder",
    ("bart", "sequence"): "BartForSequenceClassification's decoder does not read the final EOS it pools",
}


@dataclass
class HFTaskModel:
    """What `export_task_hf` writes: HF tensors, config.json, the Auto class and generation_config.json."""

    state: StateDict
    config: dict
    auto_class: str
    generation: dict | None = None


def head_kind(model: TaskModel) -> str:
    """sequence, token, span or lm (no head: the backbone's LM head does the task)."""
    head = model.head
    if head is None:
        return "lm"
    if isinstance(head, SequenceHead):
        if head.combine != "none":
            what = "summed orderings (GPT-1 similarity)" if head.combine == "sum" else "multiple-choice scores"
            raise LMForgeError(f"cannot export to Hugging Face: transformers has no head computing {what}")
        return "sequence"
    if isinstance(head, TokenHead):
        return "token"
    if isinstance(head, SpanHead):
        return "span"
    if isinstance(head, VerbalizerHead):
        raise LMForgeError(
            "cannot export to Hugging Face: a prompt-format classifier reads label words from the LM head at its "
            "template's mask, and transformers has no such head"
        )
    raise LMForgeError(f"cannot export to Hugging Face: no transformers head matches {type(head).__name__}")


def _linear(sd: StateDict, name: str, layer: torch.nn.Linear, bias: bool = True) -> None:
    sd[f"{name}.weight"] = layer.weight.detach()
    if bias:
        sd[f"{name}.bias"] = layer.bias.detach()


def _fold_bias(hf_sd: StateDict, norm_bias: str, out: torch.nn.Linear) -> None:
    """Move `out`'s bias b into the LayerNorm bias that produces its input: shift it by s = W⁺ b (W s = b)."""
    w, b = out.weight.detach().double(), out.bias.detach().double()
    shift = torch.linalg.pinv(w) @ b  # (d,)
    if (w @ shift - b).abs().max() > 1e-6 * max(1.0, float(b.abs().max())):
        raise LMForgeError("cannot export to Hugging Face: the head's bias is not in the span of its weight rows")
    old = hf_sd[norm_bias]
    hf_sd[norm_bias] = (old.double() + shift).to(old.dtype)


def _base(hf_sd: StateDict, model_type: str, keep_pooler: bool, pooler: str | None) -> StateDict:
    """The base model's tensors of an LM export (its LM/NSP heads dropped; the pooler when HF's class has none)."""
    if model_type == "t5":  # T5ForTokenClassification wraps a T5EncoderModel as `transformer`
        return {f"transformer.{k}": v for k, v in hf_sd.items() if k.startswith(("shared.", "encoder."))}
    prefix = BASE_PREFIX[model_type]
    out = {k: v for k, v in hf_sd.items() if k.startswith(prefix)}
    if pooler and not keep_pooler:
        out = {k: v for k, v in out.items() if not k.startswith(f"{pooler}.")}
    return out


def _sequence_head(conv, model: TaskModel, sd: StateDict) -> None:
    """The classifier tensors of a sequence head (and its pooler), added to `sd`."""
    cfg, head, mt = model.config, model.head, conv.model_type
    if cfg.is_decoder:
        if model.fmt != "gpt":
            raise LMForgeError(f"cannot export to Hugging Face: format '{model.fmt}' does not pool the last token")
        norm = "transformer.ln_f" if cfg.final_norm else f"transformer.h.{cfg.n_layers - 1}.ln_2"
        if f"{norm}.bias" not in sd:
            raise LMForgeError(f"cannot export to Hugging Face {mt}: no LayerNorm bias to fold the head's bias into")
        _fold_bias(sd, f"{norm}.bias", head.out)
        _linear(sd, "score", head.out, bias=False)
        return
    if model.fmt != "bert":
        raise LMForgeError(
            f"cannot export to Hugging Face: {FAMILY[mt]}ForSequenceClassification reads the first token, the run "
            f"pooled with format '{model.fmt}'"
        )
    if mt == "roberta":
        if head.dense is None:
            raise LMForgeError("cannot export to Hugging Face: RobertaForSequenceClassification ignores the pooler")
        _linear(sd, "classifier.dense", head.dense)
        _linear(sd, "classifier.out_proj", head.out)
        return
    if head.dense is not None:  # no pooler in the backbone: our dense + tanh is exactly BERT's pooler
        _linear(sd, conv.pooler_name, head.dense)
    _linear(sd, "classifier", head.out)


def _token_head(conv, model: TaskModel, sd: StateDict) -> None:
    _linear(sd, "score" if conv.model_type == "llama" else "classifier", model.head.out)


def _span_head(conv, model: TaskModel, sd: StateDict) -> None:
    _linear(sd, "qa_outputs", model.head.out)


@dataclass(frozen=True)
class HeadKind:
    """What the export of one head kind writes."""

    suffix: str
    """The transformers class's name after the family's (GPT2 + ForSequenceClassification)."""
    auto_class: str
    add_head: Callable[[Any, TaskModel, StateDict], None]
    """(converter, model, sd): adds the head's tensors to sd under the class's names."""
    keeps_pooler: bool = False
    """The class has the backbone's pooler (RobertaForSequenceClassification excepted)."""
    labelled: bool = True
    """config.json names the labels (num_labels, id2label, label2id)."""
    problem_type: str | None = None
    """config.json's problem_type (a regression task's is "regression")."""


HEAD_KINDS = {
    "sequence": HeadKind("ForSequenceClassification", "AutoModelForSequenceClassification", _sequence_head,
                         keeps_pooler=True, problem_type="single_label_classification"),
    "token": HeadKind("ForTokenClassification", "AutoModelForTokenClassification", _token_head),
    "span": HeadKind("ForQuestionAnswering", "AutoModelForQuestionAnswering", _span_head, labelled=False),
}  # fmt: skip
"""Head kind (`head_kind`, "lm" aside) → what its export writes."""


def _check_supported(model: TaskModel, model_type: str, kind: str) -> None:
    why = REFUSED.get((model_type, kind))
    if why is None and model.config.is_encoder_decoder and (model_type != "t5" or model.fmt == "bart"):
        why = f"the fine-tuned head reads the {'decoder' if model.fmt == 'bart' else 'encoder'} of {model_type}"
    if why is None and model_type not in FAMILY:
        why = f"lmforge exports no {model_type} task heads"
    if why is not None:
        raise LMForgeError(f"cannot export this {kind} head to Hugging Face {model_type}: {why}")


def task_to_hf(task, model: TaskModel) -> HFTaskModel:
    """The HF tensors and config of a fine-tuned `TaskModel` (LoRA merged or absent)."""
    from lmforge.models.hf.io import hf_state_and_config

    kind = head_kind(model)
    conv, hf_sd, hf_cfg = hf_state_and_config(model.backbone)
    for role in ("bos", "eos"):
        tid = getattr(task.tokenizer, f"{role}_id")
        hf_cfg[f"{role}_token_id"] = tid  # not the family's defaults (GPT-2's 50256), which this vocabulary lacks
    if model.head is None:  # kind "lm": the LM itself
        return HFTaskModel(hf_sd, {**hf_cfg, **lm_task_fields(task)}, conv.auto_class(model.config),
                           generation_config(task, model.config))  # fmt: skip
    _check_supported(model, conv.model_type, kind)
    spec = HEAD_KINDS[kind]
    pooler = getattr(conv, "pooler_name", None)
    keep_pooler = spec.keeps_pooler and model.config.pooler and conv.model_type != "roberta"
    sd = _base(hf_sd, conv.model_type, keep_pooler, pooler)
    spec.add_head(conv, model, sd)
    hf_cfg = {**hf_cfg, "architectures": [FAMILY[conv.model_type] + spec.suffix], **label_fields(task, kind)}
    if model.config.is_decoder:
        hf_cfg["pad_token_id"] = task.pad_id  # GPT2ForSequenceClassification pools the last token that is not pad
    if conv.model_type == "t5":
        hf_cfg["is_encoder_decoder"] = False
    hf_cfg["lmforge_task"] = {"type": task.name, "format": model.fmt}
    return HFTaskModel(sd, hf_cfg, spec.auto_class)


def label_fields(task, kind: str) -> dict:
    """num_labels, id2label, label2id and problem_type of the head."""
    spec = HEAD_KINDS[kind]
    if not spec.labelled:
        return {}
    if task.name == "regression":
        return {"num_labels": 1, "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
                "problem_type": "regression"}  # fmt: skip
    labels = list(task.labels or [])
    fields = {"num_labels": len(labels), "id2label": {str(i): n for i, n in enumerate(labels)},
              "label2id": {n: i for i, n in enumerate(labels)}}  # fmt: skip
    if spec.problem_type is not None:
        fields["problem_type"] = spec.problem_type
    return fields


def lm_task_fields(task) -> dict:
    """What a generating task adds to config.json: its template's literal prefix (read by transformers' pipelines
    as `prefix`) and, for text-to-text classification, the label names and the words written for them."""
    o = task.options
    out: dict = {"lmforge_task": {"type": task.name, "template": o.template}}
    head, field, tail = o.template.partition("{text}")
    if field and "{" not in head and "{" not in tail and not tail:
        out["prefix"] = head
    if getattr(task, "labels", None):
        out["id2label"] = {str(i): n for i, n in enumerate(task.labels)}
        out["label2id"] = {n: i for i, n in enumerate(task.labels)}
        out["lmforge_task"]["label_words"] = task.words
    return out


def generation_config(task, cfg) -> dict:
    """generation_config.json: the run's beam search settings (HF `generate` decodes as `lmforge predict`)."""
    o, tok = task.options, task.tokenizer
    gen = {"num_beams": o.num_beams, "max_new_tokens": o.max_new_tokens, "length_penalty": o.length_penalty,
           "do_sample": False, "eos_token_id": tok.eos_id, "pad_token_id": task.pad_id}  # fmt: skip
    if cfg.is_encoder_decoder:
        gen["decoder_start_token_id"] = cfg.decoder_start_id
    if tok.bos_id is not None:
        gen["bos_token_id"] = tok.bos_id
    return gen


def framed_backend(task, model: TaskModel):
    """A copy of the run's `tokenizers.Tokenizer` whose post-processor frames one text (or a pair) as the task's
    inputs are framed, so that HF `tokenizer(text)` gives the ids the fine-tuned model read."""
    import tokenizers
    from tokenizers import processors

    backend = tokenizers.Tokenizer.from_str(task.tokenizer.backend.to_str())
    if model.head is None:  # generating tasks: the source as Seq2Seq frames it (decoder-only: bare text)
        bos = [task.tokenizer.bos_id] if model.config.is_encoder_decoder and task.tokenizer.bos_id else []
        eos = [task.tokenizer.eos_id] if model.config.is_encoder_decoder and task.tokenizer.eos_id else []
        start, mid, end, segments = bos, eos, eos, False
    else:
        f = task.framer
        start, mid, end, segments = f.start, f.mid, f.end, f.segments
    name = task.tokenizer.id_to_token

    def part(ids: list[int], seg: int) -> list[str]:
        return [f"{name(i)}:{seg}" for i in ids]

    single = [*part(start, 0), "$A:0", *part(end, 0)]
    second = 1 if segments else 0
    pair = [*part(start, 0), "$A:0", *part(mid, 0), f"$B:{second}", *part(end, second)]
    specials = sorted({(name(i), i) for i in [*start, *mid, *end]})
    steps = []
    if '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("post_processor")):
        steps.append(processors.ByteLevel(add_prefix_space=False, trim_offsets=False))
    steps.append(processors.TemplateProcessing(single=" ".join(single), pair=" ".join(pair), special_tokens=specials))
    backend.post_processor = steps[0] if len(steps) == 1 else processors.Sequence(steps)
    return backend


def write_task_tokenizer(task, model: TaskModel, out: Path) -> None:
    """tokenizer.json (framing post-processor) + tokenizer_config.json with a pad token for batches."""
    from lmforge.models.hf.tokenizer import TOKENIZER_CONFIG, write_hf_tokenizer

    write_hf_tokenizer(task.tokenizer, out, model.config)
    framed_backend(task, model).save(str(out / "tokenizer.json"))
    path = out / TOKENIZER_CONFIG
    tok_cfg = json.loads(path.read_text(encoding="utf-8"))
    if "pad_token" not in tok_cfg:
        tok_cfg["pad_token"] = task.tokenizer.id_to_token(task.pad_id)
    if model.config.is_decoder and model.head is None:
        tok_cfg["padding_side"] = "left"  # decoder-only generation continues the prompt's last token
    path.write_text(json.dumps(tok_cfg, indent=2) + "\n", encoding="utf-8")


def save_hf_dir(exported: HFTaskModel, out: Path) -> None:
    """config.json, model.safetensors and generation_config.json of an export."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: _plain(v) for k, v in exported.state.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", exported.config)
    if exported.generation is not None:
        _write_json(out / "generation_config.json", exported.generation)


def _plain(t: Tensor) -> Tensor:
    # safetensors refuses tensors sharing memory (our fused qkv is split into views): a copy of each.
    return t.detach().to("cpu").contiguous().clone()


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
