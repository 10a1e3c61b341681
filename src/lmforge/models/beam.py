"""Beam search for decoder and encoder-decoder models, vectorised over beams (B rows x K beams = B*K model rows).

Follows `transformers`' beam search with `early_stopping=True`: at each step the 2K best continuations over
all beams are ranked; an EOS continuation among the top K becomes a finished hypothesis scored
sum_logprob / generated_len**length_penalty (generated_len counts the EOS, not the prompt or decoder start);
the K best non-EOS continuations stay alive. A row is done once it holds K finished hypotheses; at the token
budget the top K continuations are finished as they are. The best finished hypothesis of each row is returned."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from lmforge.errors import LMForgeError

NEG_INF = float("-inf")


class Steps(Protocol):
    """Incremental decoding state (see `lmforge.models.generate.DecoderSteps` / `Seq2SeqSteps`)."""

    batch_size: int
    device: torch.device

    def max_steps(self, max_new_tokens: int) -> int: ...
    def start(self) -> Tensor: ...
    def step(self, tokens: Tensor) -> Tensor: ...
    def select(self, index: Tensor) -> None: ...


def finite_logits(logits: Tensor) -> Tensor:
    """`logits` of the prompt's last position, checked once (one wait for the device per generation): weights that
    are finite but too large (a diverged run's) give NaN, which sampling would fail on and greedy turn into token 0."""
    bad = logits.isnan().any() | logits.isposinf().any() | logits.isneginf().all(-1).any()  # -inf alone is a ban
    if bool(bad):
        raise LMForgeError(
            "the model's logits for the prompt are not finite (NaN or infinity): its weights are unusable, as those "
            "of a run that diverged are; use an earlier checkpoint"
        )
    return logits


class _Finished:
    """The K best finished hypotheses of each row: tokens (B, K, n), penalised scores (B, K), lengths (B, K).

    An empty slot has score -inf; slots are kept sorted best first."""

    def __init__(self, B: int, K: int, n: int, fill: int, device: torch.device) -> None:
        self.seqs = torch.full((B, K, n), fill, dtype=torch.long, device=device)
        self.scores = torch.full((B, K), NEG_INF, device=device)
        self.lengths = torch.zeros(B, K, dtype=torch.long, device=device)

    @property
    def full(self) -> Tensor:
        """(B,) rows that hold K finished hypotheses."""
        return torch.isfinite(self.scores).all(-1)

    def add(self, seqs: Tensor, scores: Tensor, finishing: Tensor, length: int, length_penalty: float) -> None:
        """Merge candidates seqs (B, C, n) with raw scores (B, C) where `finishing` (B, C) holds."""
        # A full row takes no more hypotheses (early stopping); -inf candidates are impossible continuations.
        finishing = finishing & torch.isfinite(scores) & ~self.full[:, None]
        new = torch.where(finishing, scores / length**length_penalty, NEG_INF)
        merged = torch.cat([self.scores, new], dim=1)  # (B, K + C)
        K = self.scores.shape[1]
        self.scores, idx = merged.topk(K, dim=-1)  # sorted: slot 0 is the best
        self.seqs = torch.cat([self.seqs, seqs], dim=1).gather(1, idx[..., None].expand(-1, -1, seqs.shape[-1]))
        self.lengths = torch.cat([self.lengths, torch.full_like(new, length, dtype=torch.long)], dim=1).gather(1, idx)


@torch.no_grad()
def beam_search(
    steps: Steps,
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_id: int | None = None,
    length_penalty: float = 1.0,
) -> Tensor:
    """Best continuation per row (B, n), n ≤ max_new_tokens; positions after a hypothesis's EOS hold eos_id."""
    B, K = steps.batch_size, num_beams
    n = steps.max_steps(max_new_tokens)
    fill, device = (eos_id if eos_id is not None else 0), steps.device
    if n == 0:
        return torch.zeros(B, 0, dtype=torch.long, device=device)
    logits = finite_logits(steps.start())  # (B, V): every beam starts from the same prefix
    steps.select(torch.arange(B, device=device).repeat_interleave(K))  # B -> B*K rows, beam-major per row
    logits = logits.repeat_interleave(K, dim=0)  # (B*K, V)
    V = logits.shape[-1]
    run_seqs = torch.full((B, K, n), fill, dtype=torch.long, device=device)
    # Only beam 0 is live at first, so the first step does not pick the same token K times.
    run_scores = torch.full((B, K), NEG_INF, device=device)
    run_scores[:, 0] = 0.0
    finished = _Finished(B, K, n, fill, device)
    rank_ok = torch.arange(2 * K, device=device) < K  # (2K,): only the top K continuations may finish
    row_offset = torch.arange(B, device=device)[:, None] * K  # (B, 1)
    for t in range(n):
        logp = torch.log_softmax(logits.float(), dim=-1).view(B, K, V) + run_scores[..., None]
        # 2K candidates guarantee K non-EOS continuations (at most one EOS per beam).
        cand_scores, flat = logp.view(B, K * V).topk(2 * K, dim=-1)  # (B, 2K), best first
        cand_beam, cand_tok = flat // V, flat % V
        cand_seqs = run_seqs.gather(1, cand_beam[..., None].expand(-1, -1, n))  # (B, 2K, n)
        cand_seqs[:, :, t] = cand_tok
        is_eos = cand_tok == eos_id if eos_id is not None else torch.zeros(B, 2 * K, dtype=torch.bool, device=device)
        last = t + 1 == n
        finished.add(cand_seqs, cand_scores, (is_eos | last) & rank_ok, t + 1, length_penalty)
        if last or bool(finished.full.all()):
            break
        run_scores, pick = cand_scores.masked_fill(is_eos, NEG_INF).topk(K, dim=-1)  # (B, K)
        run_seqs = cand_seqs.gather(1, pick[..., None].expand(-1, -1, n))
        source = cand_beam.gather(1, pick)  # (B, K): the beam each survivor extends
        steps.select((row_offset + source).flatten())
        logits = steps.step(run_seqs[:, :, t].flatten())
    best = finished.seqs[:, 0]  # (B, n)
    return best[:, : int(finished.lengths[:, 0].max())]
