"""What the model returns: hidden states and logits (and, given labels, the loss models/transformer.py adds), read by
attribute, by key or by position as `transformers` reads its outputs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lmforge.models.layers import KVCache


@dataclass
class ModelOutput:
    """What a forward returns, read as `transformers` reads its ModelOutput: by key (`out["loss"]`), by position over
    the fields that are set (`out[0]` is the loss when labels were given, else the logits), or as `to_tuple()`.

    The positional view is Hugging Face's: loss, then logits, then the other set tensors in field order. The last
    hidden state is left out of it when there are logits (as a `...ForCausalLM` output has none), and the KV cache
    is never in it (it is not a tensor); both stay attributes."""

    last_hidden_state: Tensor
    """(B, T, d_model): the decoder's for decoder and encoder-decoder models, else the encoder's."""
    logits: Tensor | None = None
    """(B, T, vocab_size) when the model has an LM head and logits were requested."""
    cache: KVCache | None = None
    encoder_last_hidden_state: Tensor | None = None
    pooled: Tensor | None = None
    """(B, d_model) BERT pooler output over the first token."""
    rtd_logits: Tensor | None = None
    """(B, T) ELECTRA discriminator logits: > 0 means "this token was replaced"."""
    nsp_logits: Tensor | None = None
    """(B, 2) BERT next-sentence / ALBERT sentence-order logits over the pooled output (class 0 = in order)."""
    mtp_logits: list[Tensor] | None = None
    """Multi-token prediction (forward(..., mtp=True)): per extra head k = 1..mtp_heads, (B, T - k, V) logits of
    token t + k + 1 at position t (`logits` are the next-token head's)."""
    hidden_states: tuple[Tensor, ...] | None = None
    """output_hidden_states=True: the embedding output and every block's output, n_layers + 1 tensors (B, T, d_model),
    the last one after the final norm (as Hugging Face returns them); the decoder's for encoder-decoders."""
    encoder_hidden_states: tuple[Tensor, ...] | None = None
    """output_hidden_states=True on an encoder-decoder: the encoder's n_layers + 1 hidden states."""
    mems: list[Tensor] | None = None
    """use_mems=True (model.position='xl'): per layer (B, <= mem_len, d_model), the memory for the next segment."""
    query_hidden_state: Tensor | None = None
    """XLNet query stream (forward(..., query_positions=...)): (B, P, d_model) at the target positions."""
    query_logits: Tensor | None = None
    """(B, P, vocab_size) LM-head logits of the query stream, when logits were requested."""
    loss: Tensor | None = None
    """forward(..., labels=...) only: the LM head's cross-entropy against the labels (models/transformer.py)."""

    def _hf_fields(self) -> list[tuple[str, Any]]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        order = ["loss", "logits"] + [k for k in values if k not in ("loss", "logits")]
        skip = {"cache"} | ({"last_hidden_state"} if values.get("logits") is not None else set())
        return [(k, values[k]) for k in order if k not in skip and values[k] is not None]

    def keys(self) -> list[str]:
        return [k for k, _ in self._hf_fields()]

    def values(self) -> list[Any]:
        return [v for _, v in self._hf_fields()]

    def items(self) -> list[tuple[str, Any]]:
        return self._hf_fields()

    def to_tuple(self) -> tuple:
        return tuple(self.values())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self):
        return iter(self.keys())  # as a ModelOutput (an OrderedDict) iterates its keys

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            fields = dict(self._hf_fields())
            if key not in fields:
                raise KeyError(f"{key!r} is not set in this output (set: {', '.join(fields) or 'none'})")
            return fields[key]
        return self.to_tuple()[key]


# A pytree node, as `transformers` registers its ModelOutput: torch 2.11's FSDP2 finds a unit's output tensors with
# tree_flatten to hook their backward; as a leaf this dataclass hid them, and a model sharded as one unit never
# reduced its gradients (torch 2.13's FSDP2 looks into dataclasses).
torch.utils._pytree.register_dataclass(ModelOutput)
