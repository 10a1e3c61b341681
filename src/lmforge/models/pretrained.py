"""Reading a pretrained model back from a run dir, a checkpoint dir (config.yaml + weights) or a Hugging Face model
dir, with what models/ and the ground floor know: `Transformer.from_pretrained` is this, and `lmforge.load`
(loading.py) is this plus the tokenizer and fine-tuned runs, whose task heads live floors above."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from lmforge.checkpoint.layout import CONFIG_FILE
from lmforge.checkpoint.read import export_module, load_weights, read_config
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.errors import LMForgeError
from lmforge.models.hf import import_hf, is_hf_dir
from lmforge.models.model import TransformerCore
from lmforge.models.presets import model_config_from_dict


def is_hf_only(path: Path) -> bool:
    """A Hugging Face model dir that is not also an lmforge checkpoint."""
    return is_hf_dir(path) and not (path / CONFIG_FILE).exists()


def find_pretrained(path: Path) -> tuple[Path, dict | None]:
    """(the directory a model is read from, its config): a Hugging Face model dir and None, else the checkpoint
    of a run or checkpoint dir (`model_checkpoint`: RUN/best when the run selects one) and its config.yaml."""
    if is_hf_only(path):
        return path, None
    c = model_checkpoint(path)
    return c, read_config(c)


def read_pretrained(c: Path, cfg: dict | None, model_class: type[TransformerCore]) -> TransformerCore:
    """The model `find_pretrained` found in `c` (a pretrained run's: a fine-tuned run's config describes its
    backbone and task instead), a `model_class` built from the config's model section or, by `import_hf`, from a
    Hugging Face dir (cfg None); the callers pass `lmforge.models.Transformer`, which stands above this module. A
    run that trains several networks (ELECTRA's generator and discriminator, PPO's policy and value function) gives
    the one its config's model section describes (`export_module`); the other networks' weights stay in the
    checkpoint."""
    if cfg is None:
        return import_hf(c, model_class)
    if "model" not in cfg:
        raise LMForgeError(f"{c}/config.yaml has no model section")
    model = model_class(model_config_from_dict(cfg["model"]))
    prefix = export_module(cfg)
    if not prefix:
        load_weights(c, model)
        return model
    holder = nn.Module()
    holder.add_module(prefix, model)
    missing, _ = load_weights(c, holder, strict=False)
    if missing:
        raise LMForgeError(f"checkpoint does not match the model: key '{missing[0]}' is missing from the checkpoint")
    return model
