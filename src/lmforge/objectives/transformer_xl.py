"""Transformer-XL language modelling (Dai et al. 2019): next-token prediction over consecutive segments of the token
stream, each attending to the cached hidden states of the previous ones (§3.2), with relative positions (§3.3).

Row b of every batch continues row b of the previous batch (data/corpus/stream.py); the memory is carried from step to
step (objectives/recurrent.py) and validation evaluates with memory over consecutive segments."""

from __future__ import annotations

from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.objectives.losses import lm_head_loss
from lmforge.objectives.recurrent import RecurrentObjective
from lmforge.registry import OBJECTIVES


@OBJECTIVES.register("transformer_xl")
class TransformerXL(RecurrentObjective):
    """Inputs x[:, :-1], targets x[:, 1:] of each window; the model attends to its memory of earlier segments."""

    name = "transformer_xl"
    scores_labels = True
    language_model = True

    def build_model(self, model_cfg) -> nn.Module:
        if not model_cfg.is_decoder:
            raise LMForgeError(f"objective 'transformer_xl' needs a decoder (model.arch is '{model_cfg.arch}')")
        return super().build_model(model_cfg)

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        ids, labels = batch["input_ids"], batch["labels"]
        out = model(
            ids, mems=self.memory(model, ids.shape[0]), use_mems=True, mem_len=self.mem_len(model), return_logits=False
        )
        self.keep(model, out.mems)
        return LossOutput(lm_head_loss(model, out.last_hidden_state, labels), labels.numel())
