"""`TaskModel(backbone, head)`: a loaded transformer with a task head, run in one input format."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.tasks.heads import SequenceHead
from lmforge.tasks.inputs import POOL_BY_FORMAT
from lmforge.tasks.prompt import VerbalizerHead


@dataclass
class TaskOutput:
    hidden: Tensor
    """(B·N, T, d_model): hidden states of every sequence (the decoder's for "bart" and seq2seq)."""
    mask: Tensor
    """(B·N, T): 1 on real tokens of `hidden`."""
    logits: Tensor | tuple[Tensor, Tensor] | None = None
    """The head's output, or None for a model without head (text-to-text)."""


torch.utils._pytree.register_dataclass(TaskOutput)  # its tensors visible to FSDP's hooks (as models.ModelOutput)


def pool(hidden: Tensor, mask: Tensor, how: str, pooled: Tensor | None = None) -> Tensor:
    """One vector per sequence (B, d) from hidden (B, T, d) and mask (B, T) (right-padded): "last" real token,
    "first" token (BERT's pooler output when the model has one), or "mean" over real tokens."""
    if how == "last":
        last = mask.sum(-1).clamp(min=1) - 1  # (B,)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if how == "first":
        return pooled if pooled is not None else hidden[:, 0]
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


class TaskModel(nn.Module):
    """Backbone + head. `forward(batch)` runs the backbone as the format says and the head on its output:
    sequence heads see one pooled vector per sequence (B, N, d), token and span heads the hidden states."""

    def __init__(self, backbone: nn.Module, head: nn.Module | None, fmt: str) -> None:
        super().__init__()
        self.backbone, self.head, self.fmt = backbone, head, fmt
        self.pool_how = POOL_BY_FORMAT.get(fmt, "last")

    @property
    def config(self):
        return self.backbone.config

    def encode(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor | None]:
        """(hidden (B·N, T, d), mask (B·N, T), BERT pooler output or None); (B, N, T) inputs are flattened."""
        cfg = self.backbone.config
        ids, mask = batch["input_ids"], batch["attention_mask"]
        types = batch.get("token_type_ids")
        if ids.dim() == 3:
            ids, mask = ids.flatten(0, 1), mask.flatten(0, 1)
            types = types.flatten(0, 1) if types is not None else None
        types = types if cfg.type_vocab_size else None
        if cfg.is_encoder_decoder and self.fmt in ("bert", "encoder_mean"):
            return self.backbone.encode(ids, mask, types), mask, None
        if cfg.is_encoder_decoder:
            dec, dec_mask = batch.get("decoder_input_ids"), batch.get("decoder_attention_mask")
            if dec is None:  # BART §3.1: the decoder reads the same sequence after its start token
                start = torch.full_like(ids[:, :1], cfg.decoder_start_id)
                dec, dec_mask = torch.cat([start, ids], 1), torch.cat([torch.ones_like(mask[:, :1]), mask], 1)
            out = self.backbone(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask, return_logits=False)
            return out.last_hidden_state, dec_mask, None
        prefix = 0 if cfg.is_decoder and cfg.mask == "prefix" else None
        out = self.backbone(ids, mask, token_type_ids=types, prefix_len=prefix, return_logits=False)
        return out.last_hidden_state, mask, out.pooled

    def forward(self, batch: dict[str, Tensor]) -> TaskOutput:
        hidden, mask, pooled = self.encode(batch)
        if self.head is None:
            return TaskOutput(hidden, mask)
        if isinstance(self.head, SequenceHead):
            vec = pool(hidden, mask, self.pool_how, pooled)  # (B·N, d)
            B = batch["input_ids"].shape[0]
            logits = self.head(vec.view(B, -1, vec.shape[-1]), batch.get("n_seqs"))
        elif isinstance(self.head, VerbalizerHead):
            logits = self.head(hidden, batch["mask_pos"], self.backbone)
        else:
            logits = self.head(hidden)
        return TaskOutput(hidden, mask, logits)


def set_dropout(model: nn.Module, p: float) -> None:
    """Set every dropout rate of a backbone (residual, embedding and attention) to p."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        if hasattr(m, "attn_dropout") and isinstance(m.attn_dropout, float):
            m.attn_dropout = p
    model.config.dropout = model.config.attn_dropout = p
