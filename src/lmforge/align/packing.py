"""Batches of instruction examples: right-padded, or several examples packed into one sequence.

A packed row holds examples back to back; `segment_ids` (B, T) number them 1, 2, ... (0 = padding) and
`position_ids` restart at 0 for each one. Attention must be block-diagonal ("document" masking): a token sees
earlier tokens of its own example only. The model's forward takes a (B, T) key-padding mask, so `packed_hidden`
builds the (B, 1, T, T) mask and runs the decoder stack with it; with that mask and the restarted positions a
packed example's logits equal those of the example run alone."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmforge.align.templates import IGNORE, Encoded
from lmforge.errors import LMForgeError
from lmforge.models.wrappers import unwrap_model


def pad_batch(examples: list[Encoded], pad_id: int) -> dict[str, Tensor]:
    """Right-padded input_ids, attention_mask and labels (-100 on padding), each (B, T)."""
    T = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE, dtype=torch.long)
    mask = torch.zeros(len(examples), T, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pack_groups(lengths: list[int], seq_len: int) -> list[list[int]]:
    """Greedy first-fit packing of example indices into rows of at most seq_len tokens, in order of arrival
    (the first row with room takes the example; a new row opens otherwise)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        if n > seq_len:
            raise LMForgeError(f"example {i} has {n} tokens, more than the packed sequence length {seq_len}")
        j = next((r for r, free in enumerate(room) if free >= n), None)
        if j is None:
            rows.append([i])
            room.append(seq_len - n)
        else:
            rows[j].append(i)
            room[j] -= n
    return rows


def pack_batch(examples: list[Encoded], seq_len: int, pad_id: int) -> dict[str, Tensor]:
    """Pack examples into (N, seq_len) rows: input_ids, labels, segment_ids (1.. per example, 0 = padding) and
    position_ids (restarting at 0 per example). The first label of each example is -100, so the last token of
    one example is never trained to predict the first token of the next."""
    rows = pack_groups([len(e.input_ids) for e in examples], seq_len)
    N = len(rows)
    ids = torch.full((N, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((N, seq_len), IGNORE, dtype=torch.long)
    seg = torch.zeros(N, seq_len, dtype=torch.long)
    for r, members in enumerate(rows):
        row_ids = [t for i in members for t in examples[i].input_ids]
        row_labels = [t for i in members for t in [IGNORE] + examples[i].labels[1:]]
        row_seg = [k + 1 for k, i in enumerate(members) for _ in examples[i].input_ids]
        n = len(row_ids)
        ids[r, :n], labels[r, :n], seg[r, :n] = torch.tensor(row_ids), torch.tensor(row_labels), torch.tensor(row_seg)
    return {"input_ids": ids, "labels": labels, "segment_ids": seg, "position_ids": segment_positions(seg)}


def segment_positions(segment_ids: Tensor) -> Tensor:
    """Positions restarting at 0 at every segment start (B, T), vectorised: index minus its segment's start.
    Padding (segment 0) gets position 0, so a long padded tail never runs past learned positions."""
    T = segment_ids.shape[1]
    idx = torch.arange(T, device=segment_ids.device).expand_as(segment_ids)
    start = torch.ones_like(segment_ids, dtype=torch.bool)
    start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    # Running maximum of the start indices = the start of the current segment.
    starts = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return (idx - starts).masked_fill(segment_ids == 0, 0)


def document_mask(segment_ids: Tensor) -> Tensor:
    """Boolean (B, 1, T, T): query t may attend key s iff s <= t and both belong to the same segment.
    Padding (segment 0) attends to earlier padding only, which keeps its rows finite."""
    T = segment_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, T, T)
    return (same & causal)[:, None]


def packed_hidden(model: nn.Module, input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor) -> Tensor:
    """Final hidden states (B, T, d_model) of a causal decoder over packed rows with document masking.

    Runs the model's decoder stack with the block-diagonal mask added to what the stack itself builds (position
    biases: ALiBi, relative buckets); RoPE and learned positions use the restarted `position_ids`."""
    core = unwrap_model(model)
    cfg = core.config
    if not cfg.is_decoder or cfg.mask != "causal":
        raise LMForgeError(f"packing needs a causal decoder, got arch '{cfg.arch}' with mask '{cfg.mask}'")
    if cfg.max_positions is not None:  # only then: reading the largest position id syncs with the device
        cfg.check_length(int(position_ids.max()) + 1, "a packed example is longer than the model's max_seq_len {limit}")
    stack = core.decoder
    h = stack.embed(core.tok_emb(input_ids), position_ids, None)  # (B, T, d)
    # The stack's own attention inputs (causal mask and any position bias), then the document mask on top.
    inp = stack._self_inputs(h, position_ids, None, None, None)
    neg = torch.finfo(h.dtype).min
    allowed = document_mask(segment_ids)
    doc = torch.zeros(allowed.shape, dtype=h.dtype, device=h.device).masked_fill(~allowed, neg)  # (B, 1, T, T)
    inp.mask = doc if inp.mask is None else (inp.mask + doc).clamp(min=neg)
    inp.is_causal = False
    for i in range(stack.n_layers):
        h = stack.blocks[0 if cfg.share_layers else i](h, inp, i)
    return stack.final_norm(h) if cfg.final_norm else h
