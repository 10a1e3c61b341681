"""Supervised instruction tuning: next-token loss on response tokens only, padded or packed batches.

InstructGPT §3.5 step 1 / Alpaca: fine-tune a pretrained decoder on (instruction, response) demonstrations; the
prompt is context, so only the response (and its closing EOS) is scored."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.align.packing import packed_hidden, pad_batch
from lmforge.align.templates import Conversation, Encoded, Message, Template
from lmforge.errors import LMForgeError
from lmforge.models.wrappers import unwrap_model
from lmforge.objectives.base import LossOutput
from lmforge.objectives.losses import lm_head_loss


def hidden_states(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """(B, T, d_model) of a padded batch (input_ids, attention_mask) or a packed one (segment_ids, position_ids)."""
    if "segment_ids" in batch:
        return packed_hidden(model, batch["input_ids"], batch["segment_ids"], batch["position_ids"])
    return model(batch["input_ids"], batch.get("attention_mask"), return_logits=False).last_hidden_state


def sft_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """Mean next-token cross-entropy (nats) over response tokens: position t predicts labels[t + 1]."""
    h = hidden_states(model, batch)
    labels = batch["labels"][:, 1:]
    n = int((labels != -100).sum())
    if n == 0:
        raise LMForgeError("a batch has no response tokens to train on (raise model.max_len?)")
    return LossOutput(lm_head_loss(model, h[:, :-1], labels), n)


def token_logprobs(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Log-probability of each label token given its prefix (B, T - 1), 0 where labels are -100."""
    core = unwrap_model(model)
    h = hidden_states(model, batch)[:, :-1]
    labels = batch["labels"][:, 1:]
    logits = core.logits(h).float()  # (B, T-1, V)
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return -nll


def sequence_logprobs(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """Sum of response-token log-probabilities per row (B,) (packed batches: per row, i.e. per pack)."""
    return token_logprobs(model, batch).sum(-1)


def encode_all(template: Template, convs: list[Conversation], max_len: int) -> list[Encoded]:
    """Encoded examples; those whose response is truncated away entirely are dropped."""
    out = [template.encode(c, max_len) for c in convs]
    return [e for e in out if any(x != -100 for x in e.labels)]


@torch.no_grad()
def response_loss(model: nn.Module, examples: list[Encoded], pad_id: int, batch_size: int = 32) -> float:
    """Mean response-token NLL (nats/token) over examples."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    for i in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in pad_batch(examples[i : i + batch_size], pad_id).items()}
        lp = token_logprobs(model, batch)
        total -= float(lp.sum())
        n += int((batch["labels"][:, 1:] != -100).sum())
    return total / max(n, 1)


@torch.no_grad()
def choice_accuracy(
    model: nn.Module,
    template: Template,
    convs: list[Conversation],
    choices: list[str],
    pad_id: int,
    max_len: int | None = None,
) -> float:
    """Fraction of conversations whose reference response has the highest summed log-probability among
    `choices` (e.g. the label words of a classification instruction)."""
    if not convs:
        return float("nan")
    device = next(model.parameters()).device
    variants = []
    for c in convs:
        p = c.prompt()
        variants += [
            template.encode(Conversation(p.messages + [Message("assistant", ch)], p.input), max_len) for ch in choices
        ]
    scores = []
    for i in range(0, len(variants), 64):
        batch = {k: v.to(device) for k, v in pad_batch(variants[i : i + 64], pad_id).items()}
        scores.append(sequence_logprobs(model, batch))
    best = torch.cat(scores).view(len(convs), len(choices)).argmax(-1).tolist()
    return sum(choices[b] == c.response for b, c in zip(best, convs)) / len(convs)
