"""Direct Preference Optimization (Rafailov et al. 2023, eq. 7):

    L = −log σ(β [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))])

with a frozen reference model π_ref (the SFT model) and sequence log-probabilities summed over response tokens
only. β(log π − log π_ref) is the implicit reward (§5); its chosen − rejected difference is the reported margin."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.align.data import PreferencePair
from lmforge.align.reward import pair_batch
from lmforge.align.sft import sequence_logprobs
from lmforge.align.templates import Template
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput


@dataclass
class DPOOutput:
    loss: Tensor
    """Mean DPO loss over pairs (scalar)."""
    chosen_rewards: Tensor
    """β(log π(y_w|x) − log π_ref(y_w|x)) per pair (B,), detached."""
    rejected_rewards: Tensor


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> DPOOutput:
    """DPO loss from sequence log-probs (B,) of the policy and the reference. label_smoothing ε > 0 is the
    conservative variant (cDPO: preferences flipped with probability ε)."""
    if beta <= 0:
        raise LMForgeError(f"DPO needs beta > 0, got {beta}")
    logits = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))  # (B,)
    loss = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return DPOOutput(
        loss.mean(),
        (beta * (policy_chosen - ref_chosen)).detach(),
        (beta * (policy_rejected - ref_rejected)).detach(),
    )


def frozen_copy(model: nn.Module) -> nn.Module:
    """A reference model: a deep copy in eval mode with gradients off."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class DPO:
    """Scores pair batches (chosen rows then rejected rows) with the policy and the frozen reference."""

    def __init__(self, reference: nn.Module, beta: float = 0.1, label_smoothing: float = 0.0) -> None:
        self.reference, self.beta, self.label_smoothing = reference, beta, label_smoothing

    def loss(self, policy: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        B = batch["input_ids"].shape[0] // 2
        logp = sequence_logprobs(policy, batch)  # (2B,)
        with torch.no_grad():
            ref = sequence_logprobs(self.reference, batch)
        out = dpo_loss(logp[:B], logp[B:], ref[:B], ref[B:], self.beta, self.label_smoothing)
        margin = out.chosen_rewards - out.rejected_rewards
        metrics = {"reward_margin": float(margin.mean()), "reward_accuracy": float((margin > 0).float().mean())}
        return LossOutput(out.loss, B, metrics)


@torch.no_grad()
def preference_margins(
    model: nn.Module, pairs: list[PreferencePair], template: Template, pad_id: int, max_len: int, batch_size: int = 32
) -> Tensor:
    """log π(y_w|x) − log π(y_l|x) per pair (N,): the model's own chosen-vs-rejected log-prob margin."""
    device = next(model.parameters()).device
    out = []
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        batch = {k: v.to(device) for k, v in pair_batch(chunk, template, pad_id, max_len).items()}
        lp = sequence_logprobs(model, batch)
        out.append(lp[: len(chunk)] - lp[len(chunk) :])
    return torch.cat(out) if out else torch.zeros(0)


def dpo_metrics(
    policy: nn.Module, reference: nn.Module, pairs: list[PreferencePair], template: Template, pad_id: int,
    max_len: int, beta: float,
) -> dict[str, float]:  # fmt: skip
    """Held-out implicit-reward margin β(Δ_policy − Δ_ref), its accuracy (> 0), and the policy's own margin."""
    pol = preference_margins(policy, pairs, template, pad_id, max_len)
    ref = preference_margins(reference, pairs, template, pad_id, max_len)
    implicit = beta * (pol - ref)
    return {
        "reward_margin": float(implicit.mean()),
        "reward_accuracy": float((implicit > 0).float().mean()),
        "logp_margin": float(pol.mean()),
        "logp_accuracy": float((pol > 0).float().mean()),
    }
