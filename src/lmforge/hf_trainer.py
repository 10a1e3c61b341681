"""`transformers.Trainer` for lmforge models, saving lmforge checkpoint dirs.

The stock Trainer trains an lmforge `Transformer` as it is (`labels=` gives the loss, outputs index as a
ModelOutput), but it saves any model that is not a `transformers.PreTrainedModel` as its raw state dict through
safetensors, which refuses tensors that share memory: a model with tied embeddings (GPT, BERT, T5) cannot be saved
that way, and the file holds no config to rebuild the model from. This subclass saves through
`Transformer.save_pretrained` instead: tied weights stored once, config.yaml and the tokenizer (an lmforge
`Tokenizer` given as processing_class) beside them, so `Transformer.from_pretrained`, `lmforge.load` and every
lmforge command read its output and its checkpoint-N dirs. Resuming and load_best_model_at_end read those files
with the stock code (the tied names are restored by the tie itself)."""

from __future__ import annotations

import os

import torch

try:
    from transformers import Trainer as _Trainer
    from transformers.trainer import TRAINING_ARGS_NAME
except ImportError as e:  # transformers is an optional dependency of lmforge
    raise ImportError("lmforge.hf_trainer needs transformers and accelerate: pip install -e '.[hf]'") from e

from lmforge.models import Transformer
from lmforge.tokenizers import Tokenizer

__all__ = ["Trainer"]


class Trainer(_Trainer):
    """`transformers.Trainer` whose saves of an lmforge model are lmforge checkpoint dirs (see the module
    docstring); any other model is saved as the stock Trainer saves it."""

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if not isinstance(model, Transformer):
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
