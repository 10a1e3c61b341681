"""Shared pieces of the sequence-to-sequence objectives (BART, T5): vectorised ragged-row helpers, the
teacher-forced batch and its loss.

Rows of a batch change length differently under noising (deletion, infilling, sentinels); every helper here works on
the whole batch at once and returns left-aligned rows padded to the longest, plus the per-row lengths."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.models.lm_head import cross_entropy
from lmforge.objectives.base import LossOutput
from lmforge.objectives.rng import rng

IGNORE = -100
"""Label value cross-entropy skips (padding)."""


def ordinary_ids(tokenizer, vocab_size: int | None = None) -> Tensor:
    """Ids that are not special tokens or sentinels (random replacements draw from these)."""
    n = min(vocab_size or tokenizer.vocab_size, tokenizer.vocab_size)
    special = {tokenizer.token_to_id(t) for t in tokenizer.special_tokens.values()}
    special |= set(tokenizer.sentinel_ids(tokenizer.num_sentinels))
    ok = torch.ones(n, dtype=torch.bool)
    ok[[i for i in special if i is not None and i < n]] = False
    return ok.nonzero().squeeze(1) if ok.any() else torch.arange(n)


def random_tokens(shape: tuple[int, ...], ordinary: Tensor) -> Tensor:
    """Tokens drawn uniformly from `ordinary` (n,) in the given shape."""
    return ordinary[torch.randint(len(ordinary), shape, generator=rng())]


def scatter_rows(values: Tensor, dest: Tensor, keep: Tensor, width: int, fill: int) -> Tensor:
    """out[b, dest[b, i]] = values[b, i] where keep[b, i]; other cells hold `fill`. All inputs (B, L) → (B, width)."""
    B = values.shape[0]
    out = values.new_full((B, width + 1), fill)
    # Dropped entries all land in one spare column that is cut off afterwards.
    out.scatter_(1, torch.where(keep, dest, width), values)
    return out[:, :width]


def compact(values: Tensor, keep: Tensor, fill: int, extra: int = 0) -> tuple[Tensor, Tensor]:
    """Left-align the kept entries of each row: (B, L) → (B, max_len + extra) padded with `fill`, lengths (B,)."""
    lengths = keep.sum(1)
    width = int(lengths.max()) + extra if len(lengths) else extra
    return scatter_rows(values, keep.long().cumsum(1) - 1, keep, width, fill), lengths


def append(rows: Tensor, lengths: Tensor, token: int, fill: int) -> tuple[Tensor, Tensor]:
    """Write `token` after the last real entry of each row (e.g. EOS); the buffer grows when a row is full."""
    need = int(lengths.max()) + 1 if len(lengths) else 1
    if rows.shape[1] < need:
        rows = F.pad(rows, (0, need - rows.shape[1]), value=fill)
    rows = rows.clone()
    rows.scatter_(1, lengths[:, None], token)
    return rows, lengths + 1


def lengths_mask(lengths: Tensor, width: int) -> Tensor:
    """(B, width) bool: True at the first lengths[b] positions of row b."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


def seq2seq_batch(
    src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor, *, start_id: int, pad_id: int
) -> dict[str, Tensor]:
    """Teacher-forced encoder-decoder batch from padded source/target rows and their lengths.

    decoder_input_ids = target shifted right behind `start_id` (T5: pad, BART: </s>); labels = target, -100 on
    padding. The decoder needs no padding mask: padding is at the end of each row, behind the causal mask.
    attention_mask only when a source row is padded: without it, cross-attention runs unmasked (flash attention
    on GPU), which matters for T5's span corruption, whose rows all have one length."""
    src_ok = lengths_mask(src_len, src.shape[1])
    tgt_ok = lengths_mask(tgt_len, tgt.shape[1])
    labels = tgt.masked_fill(~tgt_ok, IGNORE)
    dec_in = torch.cat([tgt.new_full((tgt.shape[0], 1), start_id), tgt[:, :-1]], dim=1)
    dec_in = dec_in.masked_fill(~lengths_mask(tgt_len + 1, tgt.shape[1]), pad_id)
    out = {"input_ids": src.masked_fill(~src_ok, pad_id), "decoder_input_ids": dec_in, "labels": labels}
    return out if bool(src_ok.all()) else {**out, "attention_mask": src_ok.long()}


def seq2seq_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """Mean cross-entropy of the decoder's predictions over the non-padding labels."""
    out = model(batch["input_ids"], batch.get("attention_mask"), decoder_input_ids=batch["decoder_input_ids"])
    labels = batch["labels"]
    loss = cross_entropy(out.logits, labels, IGNORE)
    return LossOutput(loss, (labels != IGNORE).sum())


def check_seq2seq_model(model_cfg, objective: str) -> None:
    """Raise a one-line error when the objective's model is not an encoder-decoder with an LM head."""
    from lmforge.errors import LMForgeError

    if not model_cfg.is_encoder_decoder or not model_cfg.lm_head:
        raise LMForgeError(
            f"objective '{objective}' trains an encoder-decoder with an LM head, got model.arch='{model_cfg.arch}' "
            "(use e.g. --model.preset=bart-tiny or t5-tiny)"
        )
