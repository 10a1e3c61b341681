"""Per-example self-attention kinds: one stack trained with several masks at once (UniLM, Dong et al. 2019 §2.3,
Figure 1). Each row of a batch names its kind; the stack builds that row's mask."""

from __future__ import annotations

import torch
from torch import Tensor

ATTENTION_KINDS = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")
"""Kind codes (the index) of `attn_kind`: bidirectional = every token sees every token; left_to_right = token i sees
j <= i; right_to_left = j >= i; seq2seq = source tokens (i < prefix_len) see the source only, target tokens see the
source and the target up to themselves."""
BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = range(len(ATTENTION_KINDS))


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
    kind = attn_kind.to(device)[:, None, None]  # (B, 1, 1)
    src = torch.zeros_like(kind) if prefix_len is None else prefix_len.to(device)[:, None, None]
    causal = j <= i
    ok = (
        (kind == BIDIRECTIONAL)
        | ((kind == LEFT_TO_RIGHT) & causal)
        | ((kind == RIGHT_TO_LEFT) & (j >= i))
        # seq2seq = a prefix LM: a source query (i < src) sees j < src, as j <= i adds nothing; a target query
        # sees j <= i, which holds the whole source.
        | ((kind == SEQ2SEQ) & (causal | (j < src)))
    )  # (B, Tq, Tk)
    if key_padding is not None:
        ok = ok & key_padding.to(device).bool()[:, None, :]
    return ok[:, None]
