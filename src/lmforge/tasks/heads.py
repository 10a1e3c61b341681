"""Task heads: small modules over a backbone's hidden states. They return logits; tasks compute losses."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

Combine = Literal["none", "sum", "choices"]


class SequenceHead(nn.Module):
    """A linear layer over pooled sequence representations.

    pooled: (B, N, d_model), N sequences per example. combine:
    - "none": N = 1 → (B, n_out) (classification, regression);
    - "sum": add the N representations element-wise first → (B, n_out) (GPT-1 §3.3 similarity: both orderings);
    - "choices": one score per sequence → (B, N) (multiple choice: softmax across answers; n_out = 1).
    `transform` puts dense + tanh before the output layer (BERT's pooler / RoBERTa's and BART's heads)."""

    def __init__(
        self, d_model: int, n_out: int, dropout: float = 0.1, combine: Combine = "none", transform: bool = False
    ) -> None:
        super().__init__()
        self.combine = combine
        self.dense = nn.Linear(d_model, d_model) if transform else None
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, 1 if combine == "choices" else n_out)
        for lin in (self.dense, self.out):
            if lin is not None:
                nn.init.normal_(lin.weight, std=0.02)
                nn.init.zeros_(lin.bias)

    def forward(self, pooled: Tensor, n_seqs: Tensor | None = None) -> Tensor:
        if self.combine == "sum":
            x = pooled.sum(1)  # (B, d)
        elif self.combine == "none":
            x = pooled[:, 0]  # (B, d)
        else:
            x = pooled  # (B, N, d)
        if self.dense is not None:
            x = torch.tanh(self.dense(self.dropout(x)))
        out = self.out(self.dropout(x))
        if self.combine != "choices":
            return out  # (B, n_out)
        scores = out.squeeze(-1)  # (B, N)
        if n_seqs is not None:  # padded choices of examples with fewer answers never win
            absent = torch.arange(scores.shape[1], device=scores.device)[None, :] >= n_seqs[:, None].to(scores.device)
            scores = scores.masked_fill(absent, torch.finfo(scores.dtype).min)
        return scores


class TokenHead(nn.Module):
    """Per-token classifier (B, T, d_model) → (B, T, n_out) (BERT §4.3 NER)."""

    def __init__(self, d_model: int, n_out: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, n_out)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.out(self.dropout(hidden))


class SpanHead(nn.Module):
    """Start and end logits per token (BERT §4.2 SQuAD: S·T_i and E·T_i) → ((B, T), (B, T))."""

    def __init__(self, d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(d_model, 2)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self.out(self.dropout(hidden)).unbind(-1)
        return start, end
