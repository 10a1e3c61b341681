"""`transformers.Trainer` for lmforge models, saving lmforge checkpoint dirs.

The stock Trainer trains an lmforge `Transformer` as it is (`labels=` gives the loss, outputs index as a
ModelOutput), but it saves any model that is not a `transformers.PreTrainedModel` as its raw state dict through
`safetensors.torch.save_file`, which refuses tensors that share memory: a model with tied embeddings (GPT, BERT,
T5) cannot be saved that way, and the file holds no config to rebuild the model from. This subclass saves through
`Transformer.save_pretrained` instead: tied weights stored once, config.yaml and the tokenizer (an lmforge
`Tokenizer` given as processing_class) beside them, so `Transformer.from_pretrained`, `lmforge.load` and every
lmforge command read its output and its checkpoint-N dirs. `train(resume_from_checkpoint=...)` and
`load_best_model_at_end` read those weights back through lmforge's checkpoint reader (every tensor the model has,
tied ones re-tied, shapes checked); the optimizer, scheduler, RNG and trainer state are the stock Trainer's files.
An lmforge `Tokenizer` given as processing_class also gives the model's generation config its bos / eos / pad ids,
as the stock Trainer aligns a model with a `transformers` tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from lmforge.extras import extra_hint

try:
    from transformers import Trainer as _Trainer
    from transformers.trainer import TRAINING_ARGS_NAME
except ImportError as e:  # transformers is an optional dependency of lmforge
    raise ImportError(extra_hint("hf", "lmforge.hf_trainer")) from e

from lmforge.checkpoint.read import load_weights
from lmforge.models import Transformer
from lmforge.tokenizers import Tokenizer

__all__ = ["Trainer"]


class Trainer(_Trainer):
    """`transformers.Trainer` whose saves of an lmforge model are lmforge checkpoint dirs, read back on resume and
    by load_best_model_at_end (see the module docstring); any other model is saved and loaded as the stock Trainer
    does it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        model = self._lmforge_model()
        if model is not None and isinstance(self.processing_class, Tokenizer):
            model.set_generation_tokens(self.processing_class)

    def _lmforge_model(self, model: torch.nn.Module | None = None) -> Transformer | None:
        """The lmforge model under the Trainer's wrappers (DDP, torch.compile), or None for any other model."""
        plain = self.accelerator.unwrap_model(model if model is not None else self.model, keep_torch_compile=False)
        return plain if isinstance(plain, Transformer) else None

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        model = self._lmforge_model()
        if model is None:
            return super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return None
        tokenizer = self.processing_class if isinstance(self.processing_class, Tokenizer) else None
        model.save_pretrained(output_dir, tokenizer=tokenizer, state_dict=state_dict)
        if self.processing_class is not None and tokenizer is None:
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
        return None

    def _reads_lmforge_weights(self, model: Transformer | None) -> bool:
        # DeepSpeed and FSDP keep their own sharded weight files, which the stock code reads.
        return model is not None and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        plain = self._lmforge_model(model)
        if not self._reads_lmforge_weights(plain):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_weights(Path(resume_from_checkpoint), plain)
        return None

    def _load_best_model(self) -> None:
        plain = self._lmforge_model()
        if not self._reads_lmforge_weights(plain):
            return super()._load_best_model()
        load_weights(Path(self.state.best_model_checkpoint), plain)
        return None
