"""A key/value cache of fixed shape, for decoding steps that compile to one graph (CUDA graphs on GPU).

The dynamic `KVCache` grows by one key per step (a `cat`, so every step has new shapes). `StaticKVCache` holds
per layer (N, KV heads, capacity, head_dim) buffers allocated once; a step writes its key and value at the slot
`slot` (a (1,) tensor) in place and attends over all `capacity` slots, with the slots that hold no key yet (and the
prompt's padding) masked out. Shapes and buffer addresses never change between steps, so the step traces once and
replays as a CUDA graph; beam search reorders rows in place.

The buffers are built from the dynamic cache that the prompt's forward (prefill) filled, and reused by the next
generation of the same model and shape (`StaticKVCache.build`): stable addresses spare CUDA-graph re-recording."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from lmforge.models.layers import AttnInputs, KVCache

_POOL: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, list[Tensor]]] = weakref.WeakKeyDictionary()
"""Per model: the shapes and buffers of its last static cache, reused when the next one has the same shapes."""


def _mark_static(t: Tensor) -> Tensor:
    # A fixed address across calls: CUDA graphs read and write the buffer itself instead of copying it in.
    torch._dynamo.mark_static_address(t, guard=False)
    return t


class StaticKVCache:
    """Fixed-shape self-attention keys/values (N, KV, capacity, hd) per layer, cross-attention keys/values, the
    keys' padding (N, capacity) and the slot the next token writes (1,)."""

    def __init__(
        self, k: list[Tensor], v: list[Tensor], cross_kv: list, key_ok: Tensor, slot: Tensor, extra: list[Tensor]
    ) -> None:
        self.k, self.v, self.cross_kv = k, v, cross_kv
        self.key_ok = key_ok
        """(N, capacity) bool: False at padding slots of the prompt; slots after `slot` are masked separately."""
        self.slot = slot
        self.extra = extra
        """Other per-row tensors the steps read (an encoder-decoder's encoder output and padding), kept with the
        cache: reordered with it, at fixed addresses."""

    @property
    def capacity(self) -> int:
        return self.key_ok.shape[1]

    @property
    def rows(self) -> int:
        return self.key_ok.shape[0]

    @classmethod
    def build(
        cls,
        model: nn.Module,
        cache: KVCache,
        key_padding: Tensor | None,
        capacity: int,
        extra: tuple[Tensor, ...] = (),
        pool: bool = True,
    ) -> StaticKVCache:
        """The static form of a filled dynamic `cache` (T keys per row) with room for `capacity` keys.

        key_padding (N, T): 1 for real prompt keys (None: all real). extra: per-row tensors to keep alongside.
        pool: reuse the model's last buffers of the same shapes (their stale contents sit in masked slots)."""
        k0 = cache.self_kv[0][0]
        N, _, T, _ = k0.shape
        dev = k0.device
        kv = [t for pair in cache.self_kv for t in pair]
        cross = [t for pair in cache.cross_kv if pair is not None for t in pair]
        key = (capacity, k0.dtype, dev, *((t.shape, t.dtype) for t in kv + cross + list(extra)))
        held = _POOL.get(model) if pool else None
        if held is not None and held[0] == key:
            bufs = held[1]
        else:
            # Zeros, not empty: a masked slot must hold finite values (0 x NaN would still be NaN).
            bufs = [torch.zeros(*t.shape[:2], capacity, t.shape[3], dtype=t.dtype, device=dev) for t in kv]
            bufs += [torch.empty_like(t) for t in cross + list(extra)]
            bufs += [
                torch.ones(N, capacity, dtype=torch.bool, device=dev),
                torch.zeros(1, dtype=torch.long, device=dev),
            ]
            for b in bufs:
                _mark_static(b)
            if pool:
                _POOL[model] = (key, bufs)
        n_kv, n_cross = len(kv), len(cross)
        for buf, t in zip(bufs[:n_kv], kv):
            buf[:, :, :T].copy_(t)
        for buf, t in zip(bufs[n_kv:-2], cross + list(extra)):
            buf.copy_(t)
        key_ok, slot = bufs[-2], bufs[-1]
        key_ok.fill_(True)
        if key_padding is not None:
            key_ok[:, :T].copy_(key_padding.bool())
        slot.fill_(T)
        it = iter(bufs[n_kv : n_kv + n_cross])
        cross_kv = [None if pair is None else (next(it), next(it)) for pair in cache.cross_kv]
        return cls(bufs[:n_kv:2], bufs[1:n_kv:2], cross_kv, key_ok, slot, bufs[n_kv + n_cross : -2])

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the step's keys/values (N, KV, 1, hd) at the slot; return the layer's whole buffers."""
        self.k[layer].index_copy_(2, self.slot, k)
        self.v[layer].index_copy_(2, self.slot, v)
        return self.k[layer], self.v[layer]

    def advance(self) -> None:
        """Move the slot to the next position (after a step)."""
        self.slot.add_(1)

    def reorder(self, index: Tensor) -> None:
        """Select rows `index` (N,) in place (beam search); the number of rows stays N."""
        if len(index) != self.rows:
            raise ValueError(f"a static cache of {self.rows} rows cannot take {len(index)} rows")
        for t in self.tensors():
            t.copy_(t.index_select(0, index))

    def tensors(self) -> list[Tensor]:
        """Every per-row tensor: keys, values, cross-attention keys/values, key padding, extras."""
        cross = [t for kv in self.cross_kv if kv is not None for t in kv]
        return [*self.k, *self.v, *cross, self.key_ok, *self.extra]

    def positions(self) -> Tensor:
        """(N, 1) position of the token fed at the slot: the real (non-padding) keys before it."""
        before = torch.arange(self.capacity, device=self.slot.device) < self.slot  # (L,)
        return (self.key_ok & before).sum(-1, keepdim=True)

    def step_inputs(self, stack: nn.Module, x: Tensor, positions: Tensor) -> AttnInputs:
        """Self-attention inputs of one new token per row (`Stack._self_inputs` for a static cache): an additive
        mask (N, 1, 1, capacity) over the written, non-padding slots, with ALiBi or T5 position biases in it."""
        key_index = torch.arange(self.capacity, device=x.device)  # (L,)
        query_index = self.slot  # (1,): the new token's slot
        ok = self.key_ok & (key_index <= self.slot)  # (N, L)
        # The dtype attention runs in (stack.attention_dtype): autocast's inside autocast, else x's.
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        neg = torch.finfo(dtype).min
        mask = torch.zeros(ok.shape, dtype=dtype, device=x.device).masked_fill(~ok, neg)[:, None, None, :]
        bias = stack.pos.step_bias(self.slot, key_index)  # (1, H, 1, L): ALiBi or T5 biases, else None
        if bias is not None:
            mask = (mask + bias.to(dtype)).clamp(min=neg)
        return AttnInputs(mask, False, positions, query_index, key_index, self)
