"""Decoding steps over a static KV cache, compiled: `generate(..., compile=True)` and `lmforge generate --compile`.

`StaticSteps` wraps a decoding state (`DecoderSteps`, `Seq2SeqSteps`): the prompt's forward (prefill) and any row
selection before the first new token run as they do eagerly; the first step turns the filled cache into a
`StaticKVCache` sized for the whole generation, and every step after that is one call of a `torch.compile`d
function whose inputs keep their shapes and addresses (mode reduce-overhead on GPU: a CUDA-graph replay per token).
Sampling, EOS handling and beam search stay outside the graph and see the same logits, so outputs equal eager
decoding's."""

from __future__ import annotations

import sys
import weakref

import torch
from torch import Tensor, nn

from lmforge.models.stack import Stack
from lmforge.models.static_cache import StaticKVCache

SLOT_MULTIPLE = 64
"""Cache capacities are rounded up to a multiple of this: prompts of nearby lengths share one compiled graph (and its
buffers), and the attention mask's last dimension stays aligned for the fused attention kernels."""

_COMPILED: dict[str, object] = {}
_NOTIFIED: weakref.WeakSet = weakref.WeakSet()


def static_unsupported(model: nn.Module) -> str | None:
    """Why `model` cannot decode with a static cache (the reason as a short phrase), or None when it can."""
    cfg = model.config
    if cfg.position_scheme.recurrent:
        return "Transformer-XL / XLNet relative attention (model.position='xl')"
    if cfg.attn_pattern != "dense":
        return f"sparse attention layers (model.attn_pattern='{cfg.attn_pattern}')"
    if type(getattr(model, "decoder", None)) is not Stack or model._forward_pre_hooks:
        return "a wrapped decoder stack (prompt tuning)"
    return None


def compile_mode(device: torch.device) -> str:
    """torch.compile mode of the decoding step: CUDA graphs on GPU, plain Inductor elsewhere."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def decode_step(model: nn.Module, tokens: Tensor, cache: StaticKVCache) -> Tensor:
    """Feed one token per row (N,) at the cache's slot; return next-token logits (N, V)."""
    positions = cache.positions()  # (N, 1)
    if model.config.is_encoder_decoder:
        memory, enc_mask = (cache.extra + [None])[:2]
        out = model(
            tokens[:, None],  # the source ids are not read: the encoder output is given
            enc_mask,
            decoder_input_ids=tokens[:, None],
            encoder_hidden_states=memory,
            position_ids=positions,
            cache=cache,
            return_logits=False,
        )
    else:
        out = model(tokens[:, None], position_ids=positions, cache=cache, return_logits=False)
    return model.logits(out.last_hidden_state[:, -1])


def compiled_step(mode: str):
    """`decode_step` compiled in `mode` (one compiled function per mode, shared by every model)."""
    if mode not in _COMPILED:
        _COMPILED[mode] = torch.compile(decode_step, mode=mode, fullgraph=True)
    return _COMPILED[mode]


def can_compile(model: nn.Module) -> bool:
    """True when `model` can decode compiled; else say once per model on stderr why it decodes eagerly."""
    reason = static_unsupported(model)
    if reason is None:
        return True
    if model not in _NOTIFIED:
        _NOTIFIED.add(model)
        print(f"note: compiled generation does not support {reason}; generating eagerly", file=sys.stderr)
    return False


class StaticSteps:
    """A decoding state whose steps after the first run over a static cache, compiled (`mode`) or eagerly (None)."""

    def __init__(self, inner, max_new_tokens: int, mode: str | None) -> None:
        self.inner = inner
        self.batch_size, self.device = inner.batch_size, inner.device
        n = inner.max_steps(max_new_tokens)
        fed = inner.input_ids.shape[1] if inner.model.config.is_decoder else 1  # prompt or start token
        self.capacity = -(-(fed + n) // SLOT_MULTIPLE) * SLOT_MULTIPLE
        self.step_fn = decode_step if mode is None else compiled_step(mode)
        self.cache: StaticKVCache | None = None

    def max_steps(self, max_new_tokens: int) -> int:
        return self.inner.max_steps(max_new_tokens)

    def start(self) -> Tensor:
        return self.inner.start()

    def _build(self) -> StaticKVCache:
        inner = self.inner
        if inner.model.config.is_decoder:
            return StaticKVCache.build(inner.model, inner.cache, inner.mask, self.capacity)
        extra = (inner.memory,) if inner.enc_mask is None else (inner.memory, inner.enc_mask)
        return StaticKVCache.build(inner.model, inner.cache, None, self.capacity, extra)

    def step(self, tokens: Tensor) -> Tensor:
        """Feed tokens (N,) and return next-token logits (N, V)."""
        if self.cache is None:
            self.cache = self._build()
            self.inner.cache = None  # the dynamic cache's memory is free from here on
        torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs have been read
        # Contiguous: beam search feeds a strided view, and a new stride would be a new graph.
        logits = self.step_fn(self.inner.model, tokens.contiguous(), self.cache)
        self.cache.advance()
        return logits

    def select(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`: before the first step in the wrapped state, then in place."""
        if self.cache is None:
            self.inner.select(index)
        else:
            self.cache.reorder(index)

    def output(self, new_tokens: Tensor) -> Tensor:
        return self.inner.output(new_tokens)
