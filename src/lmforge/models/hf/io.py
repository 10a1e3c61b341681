"""Hugging Face model directories in and out: config.json + model.safetensors (+ tokenizer files)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import fields, replace
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from lmforge.errors import LMForgeError
from lmforge.files import load_torch_file, loads_json
from lmforge.models.config import ModelConfig
from lmforge.models.hf.base import Converter, StateDict, converter_for, converter_of
from lmforge.models.model import TransformerCore
from lmforge.progress import status

HF_CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
PT_BIN = "pytorch_model.bin"


def is_hf_dir(path: Path) -> bool:
    """A directory holding a `transformers` config.json (with a model_type) rather than an lmforge checkpoint."""
    path = Path(path)
    if not (path / HF_CONFIG).is_file():
        return False
    try:
        return "model_type" in loads_json((path / HF_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def read_hf_config(hf_dir: Path) -> dict:
    path = Path(hf_dir) / HF_CONFIG
    if not Path(hf_dir).is_dir():
        raise LMForgeError(f"Hugging Face model dir not found: {hf_dir}")
    try:
        hf = loads_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise LMForgeError(f"no {HF_CONFIG} in {hf_dir}") from e
    except (OSError, ValueError) as e:
        raise LMForgeError(f"could not read {path}: {e}") from e
    if not isinstance(hf, dict) or "model_type" not in hf:
        raise LMForgeError(f"{path} has no model_type")
    return hf


def _load_bin(path: Path) -> StateDict:
    sd = load_torch_file(path, holds="tensors")
    if not isinstance(sd, dict):
        raise LMForgeError(f"{path} does not hold a state dict")
    return sd


def _load_one(path: Path) -> StateDict:
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as e:
            raise LMForgeError(f"could not read {path}: {e}") from e
    return _load_bin(path)


def read_hf_weights(hf_dir: Path) -> StateDict:
    """All tensors of an HF dir: model.safetensors, pytorch_model.bin, or their sharded *.index.json forms."""
    hf_dir = Path(hf_dir)
    for name in (SAFETENSORS, PT_BIN):
        if (hf_dir / name).is_file():
            return _load_one(hf_dir / name)
        index = hf_dir / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(loads_json(index.read_text(encoding="utf-8"))["weight_map"].values()), key=str)
            except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
                raise LMForgeError(f"could not read {index}: {e}") from e
            sd: StateDict = {}
            for shard in shards:
                # A shard is a file of the model dir: an index naming "../x" or an absolute path is refused.
                if not isinstance(shard, str) or (hf_dir / shard).resolve().parent != hf_dir.resolve():
                    raise LMForgeError(f"{index} names shard {shard!r}, which is not a file of {hf_dir}")
                if not (hf_dir / shard).is_file():
                    raise LMForgeError(f"{index} names shard {shard}, which is missing")
                sd.update(_load_one(hf_dir / shard))
            return sd
    raise LMForgeError(f"no model weights in {hf_dir} (expected {SAFETENSORS} or {PT_BIN})")


def load_converted(model: nn.Module, sd: StateDict) -> None:
    """Copy converted tensors into `model`, one line of error for a missing, extra or misshaped tensor."""
    own = model.state_dict()
    for name, t in own.items():
        if name not in sd:
            raise LMForgeError(f"converted checkpoint is missing tensor '{name}'")
        if sd[name].shape != t.shape:
            got, want = tuple(sd[name].shape), tuple(t.shape)
            raise LMForgeError(f"tensor '{name}' has shape {got} in the checkpoint, the model expects {want}")
    extra = sorted(set(sd) - set(own))
    if extra:
        raise LMForgeError(f"converted checkpoint has unexpected tensor '{extra[0]}'")
    model.load_state_dict(sd)


def import_hf(hf_dir: str | Path, model_class: type[TransformerCore] = TransformerCore) -> TransformerCore:
    """A `model_class` (float32, eval mode) with the weights of a Hugging Face model dir: `Transformer.from_pretrained`
    and `lmforge.load` pass `lmforge.models.Transformer` (this module stands below it); the network alone by
    default."""
    hf_dir = Path(hf_dir)
    hf = read_hf_config(hf_dir)
    conv = converter_for(hf["model_type"])
    sd = conv.normalize(read_hf_weights(hf_dir))
    try:
        cfg = conv.config_from_hf(hf, sd)
    except KeyError as e:
        raise LMForgeError(f"{hf_dir / HF_CONFIG} lacks the field {e} that {conv.model_type} needs") from e
    cfg = replace(cfg, name=hf_dir.resolve().name or cfg.name)
    model = model_class(cfg)
    ours = {k: v.float() if v.is_floating_point() else v for k, v in conv.state_from_hf(sd, cfg).items()}
    # Tied and shared tensors appear under every name in our state dict.
    for name, alias in _aliases(model).items():
        ours.setdefault(name, ours.get(alias))  # type: ignore[arg-type]
    load_converted(model, {k: v for k, v in ours.items() if v is not None})
    return model.eval()


def _aliases(model: nn.Module) -> dict[str, str]:
    """State-dict names that share a tensor with an earlier name: {alias: first name}."""
    first: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = id(t)
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out


_MTP_DEFAULTS = {f.name: f.default for f in fields(ModelConfig) if f.name.startswith("mtp_")}
MTP_PREFIX = "mtp."
"""State-dict names of a decoder's multi-token prediction heads (models/mtp.py)."""


def next_token_model(cfg: ModelConfig, sd: StateDict) -> tuple[ModelConfig, StateDict]:
    """The config and tensors a Hugging Face twin holds. A decoder with multi-token prediction heads drops them: they
    run only in training (`forward(..., mtp=True)`), and without them the model is a plain decoder of the same
    next-token logits (models/mtp.py: the next-token head is the stack's last block). Other models: as they are."""
    if not cfg.mtp_heads:
        return cfg, sd
    return replace(cfg, **_MTP_DEFAULTS), {k: v for k, v in sd.items() if not k.startswith(MTP_PREFIX)}


def hf_state_and_config(model: nn.Module) -> tuple[Converter, StateDict, dict]:
    """The converter, HF-named tensors and HF config of an lmforge model (a multi-token prediction decoder's without
    its extra heads, `next_token_model`); LMForgeError if it has no HF twin."""
    model = getattr(model, "_orig_mod", model)
    cfg, sd = next_token_model(model.config, model.state_dict())
    conv = converter_of(cfg, sd)
    hf_sd = conv.state_to_hf(sd, cfg)
    covered = {p.ours for p in conv.pairs(cfg)} | set(_aliases(model))
    left = [k for k in sd if k not in covered]
    if left:
        raise LMForgeError(f"model tensor '{left[0]}' has no counterpart in Hugging Face {conv.model_type}")
    hf_cfg = conv.config_to_hf(cfg)
    dtype = next(iter(sd.values())).dtype
    hf_cfg["dtype"] = str(dtype).removeprefix("torch.")
    return conv, hf_sd, hf_cfg


def export_hf(model: nn.Module, out_dir: str | Path, tokenizer=None) -> Path:
    """Write `out_dir` as a Hugging Face model dir (config.json, model.safetensors, tokenizer files)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise LMForgeError(f"cannot export to {out}: it is a file")
    conv, hf_sd, hf_cfg = hf_state_and_config(model)
    n_mtp = getattr(model, "_orig_mod", model).config.mtp_heads
    if n_mtp:
        status(
            f"note: the export leaves out the model's {n_mtp} multi-token prediction head(s) (they train only; Hugging "
            f"Face {conv.model_type} has none): the exported model predicts the next token as the lmforge model does"
        )
    if tokenizer is not None:
        for role in ("bos", "eos"):
            tid = getattr(tokenizer, f"{role}_id")
            if tid is not None:
                hf_cfg[f"{role}_token_id"] = tid
    out.mkdir(parents=True, exist_ok=True)
    # safetensors refuses tensors that share memory (our fused qkv is split into views): copy each.
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in hf_sd.items()}
    save_file(tensors, str(out / SAFETENSORS), metadata={"format": "pt"})
    (out / HF_CONFIG).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if tokenizer is not None:
        from lmforge.models.hf.tokenizer import write_hf_tokenizer

        write_hf_tokenizer(tokenizer, out, model.config)
    return out


def to_hf_model(model: nn.Module):
    """The equivalent `transformers` model with identical weights, loaded through an exported dir (eval mode)."""
    from lmforge.extras import require

    transformers = require("transformers", "to_hf_model")

    conv, _, _ = hf_state_and_config(model)
    auto = getattr(transformers, conv.auto_class(model.config))
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(model, tmp)
        hf_model = auto.from_pretrained(tmp)
    return hf_model.eval()
