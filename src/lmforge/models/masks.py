"""Self-attention mask kinds, as tables: a stack's own kind (model.mask), and per-example kinds, which train one stack
with several masks at once (UniLM, Dong et al. 2019 §2.3, Figure 1): each row of a batch names its kind; the stack
builds that row's mask."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lmforge.models.config import MaskKind


class MaskRule(NamedTuple):
    """The keys a stack's mask kind shows a query besides the keys up to itself."""

    future: bool
    """Every key after the query too (a bidirectional stack)."""
    prefix: bool
    """The keys before prefix_len, to every query (a prefix LM)."""


MASK_RULES: dict[MaskKind, MaskRule] = {
    "causal": MaskRule(future=False, prefix=False),
    "bidirectional": MaskRule(future=True, prefix=False),
    "prefix": MaskRule(future=False, prefix=True),
}
"""The rule of each model.mask kind."""

ATTENTION_KINDS = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")
"""Kind codes (the index) of `attn_kind`: bidirectional = every token sees every token; left_to_right = token i sees
j <= i; right_to_left = j >= i; seq2seq = source tokens (i < prefix_len) see the source only, target tokens see the
source and the target up to themselves."""
BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = range(len(ATTENTION_KINDS))

KIND_SEES = torch.tensor(
    [
        # every key, j <= i, j >= i, j < prefix_len
        [True, False, False, False],  # bidirectional
        [False, True, False, False],  # left_to_right
        [False, False, True, False],  # right_to_left
        # a prefix LM: a source query (i < prefix_len) sees the source, as j <= i adds nothing; a target query sees
        # j <= i, which holds the whole source
        [False, True, False, True],  # seq2seq
    ]
)
"""The key sets a query of each kind (row, by code) may attend to: the union of those marked."""


_ON_DEVICE: dict[tuple[int, torch.device], Tensor] = {}
"""Each table's copy on each device it was used on, made once: a copy from pageable host memory in every step
would wait for the device."""


def by_kind(table: Tensor, attn_kind: Tensor) -> Tensor:
    """table[attn_kind]: the rows of a (module-level) table indexed by kind code, on attn_kind's device."""
    key = (id(table), attn_kind.device)
    if key not in _ON_DEVICE:
        _ON_DEVICE[key] = table.to(attn_kind.device)
    return _ON_DEVICE[key][attn_kind]


def kind_allowed(
    attn_kind: Tensor,
    prefix_len: Tensor | None,
    q_len: int,
    k_len: int,
    q_offset: int,
    key_padding: Tensor | None,
    device: torch.device,
) -> Tensor:
    """Boolean (B, 1, Tq, Tk) mask of the keys each query may attend to, per row kind `attn_kind` (B,).

    prefix_len (B,): the source length of seq2seq rows (None: 0, which makes a seq2seq row left-to-right); query i
    sits at position q_offset + i (decoding with a cache)."""
    i = (torch.arange(q_len, device=device) + q_offset)[None, :, None]  # (1, Tq, 1)
    j = torch.arange(k_len, device=device)[None, None, :]  # (1, 1, Tk)
    every, causal, anticausal, source = by_kind(KIND_SEES, attn_kind.to(device))[:, None, None].unbind(-1)  # (B, 1, 1)
    src = 0 if prefix_len is None else prefix_len.to(device)[:, None, None]
    ok = every | (causal & (j <= i)) | (anticausal & (j >= i)) | (source & (j < src))  # (B, Tq, Tk)
    if key_padding is not None:
        ok = ok & key_padding.to(device).bool()[:, None, :]
    return ok[:, None]
