"""RLHF with PPO (Ziegler et al. 2019 §2.2; Stiennon et al. 2020 §3.4; InstructGPT §3.5 step 3): the math of one
update on sampled responses.

A response is an episode whose actions are its tokens. The reward of action t is −β·(log π_old(a_t|s_t) −
log π_ref(a_t|s_t)) — a per-token KL penalty against the frozen SFT policy — plus, at the last token only, the
reward model's score of the whole response. GAE(γ, λ) (Schulman et al. 2016) turns rewards and the value
function's estimates into advantages, whitened over the rollout; the policy minimises PPO's clipped surrogate
(Schulman et al. 2017, eq. 7) and the value function a clipped squared error.

Per-token tensors are (N, T) in *label positions*: position t scores token t + 1 given tokens ≤ t (as
`align.sft.token_logprobs`), and `mask` marks the response tokens (the actions)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lmforge.align.reward import RewardModel
from lmforge.models.wrappers import unwrap_model
from lmforge.objectives.base import LossOutput

ROLLOUT_STAT = "rollout_"
"""Prefix of the rollout-level statistics a PPO batch carries as 0-d tensors (logged beside the losses)."""


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the positions where mask is true (0 when there are none)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x − mean) / std over the masked positions (population variance); 0 off the mask."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return ((x - mean) * torch.rsqrt(var + eps)) * mask.to(x.dtype)


def last_action(mask: Tensor) -> Tensor:
    """Index (N,) of each row's last masked position (the response's final token)."""
    T = mask.shape[1]
    return T - 1 - mask.flip(1).to(torch.int8).argmax(1)


def kl_penalized_rewards(
    scores: Tensor, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kl_coef: float
) -> tuple[Tensor, Tensor]:
    """(rewards, kl), each (N, T): kl_t = log π(a_t) − log π_ref(a_t) on the actions, rewards_t = −β·kl_t, and
    each row's score (N,) added at its last action (Ziegler et al. 2019 eq. 2, applied per token)."""
    kl = (logprobs - ref_logprobs) * mask.to(logprobs.dtype)
    rewards = -kl_coef * kl
    rows = torch.arange(len(scores), device=scores.device)
    rewards[rows, last_action(mask)] += scores.to(rewards.dtype)
    return rewards, kl


def discount_matrix(T: int, coef: float, device: torch.device | None = None) -> Tensor:
    """D (T, T) with D[k, t] = coef^(k − t) for k ≥ t, else 0: x @ D is the discounted sum of x from t on."""
    i = torch.arange(T, device=device)
    power = (i[:, None] - i[None, :]).to(torch.float64)  # k − t
    d = torch.where(power >= 0, torch.tensor(coef, dtype=torch.float64, device=device) ** power.clamp(min=0), 0.0)
    return d.float()


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016 eq. 16) → (advantages, returns), each (N, T).

    δ_t = r_t + γ·V(s_{t+1}) − V(s_t) on the actions, with V = 0 after a response's last token (the episode
    ends there); Â_t = Σ_l (γλ)^l δ_{t+l}, computed for every t at once as δ @ D; returns = Â + V (the value
    targets). The actions of a row are contiguous, so off-mask positions contribute nothing."""
    m = mask.to(values.dtype)
    v = values * m
    next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
    delta = (rewards + gamma * next_v - v) * m
    adv = (delta @ discount_matrix(delta.shape[1], gamma * lam, delta.device).to(delta.dtype)) * m
    return adv, (adv + v) * m


def policy_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, clip: float) -> dict[str, Tensor]:
    """PPO's clipped surrogate over action tokens (flat tensors): mean of max(−Â·ρ, −Â·clip(ρ, 1 − ε, 1 + ε)),
    ρ = π/π_old. Also the share of tokens where the clipped term is the larger one, and ½·mean((log ρ)²) (an
    estimate of KL(π_old‖π))."""
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip, 1 + clip)
    return {
        "loss": torch.maximum(unclipped, clipped).mean(),
        "clipfrac": (clipped > unclipped).float().mean().detach(),
        "approx_kl": (0.5 * log_ratio.detach() ** 2).mean(),
    }


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float | None) -> dict[str, Tensor]:
    """½·mean(max((V − R)², (V_clip − R)²)) with V_clip = V_old + clip(V − V_old, −c, c) (PPO2's value clipping;
    clip None: plain squared error). Also the share of tokens where the clipped error is the larger one."""
    err = (values - returns) ** 2
    if clip is None:
        return {"loss": 0.5 * err.mean(), "clipfrac": torch.zeros((), device=values.device)}
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    err_clipped = (clipped - returns) ** 2
    return {
        "loss": 0.5 * torch.maximum(err, err_clipped).mean(),
        "clipfrac": (err_clipped > err).float().mean().detach(),
    }


class AdaptiveKL:
    """The KL coefficient β: fixed, or adapted towards a target KL per response (Ziegler et al. 2019 §2.2):
    e = clip(KL / target − 1, −0.2, 0.2), β ← β·(1 + e·n / horizon) after each rollout of n responses."""

    def __init__(self, value: float, target: float | None = None, horizon: int = 10000) -> None:
        self.value, self.target, self.horizon = float(value), target, horizon

    def update(self, kl: float, n: int) -> None:
        if self.target is None:
            return
        error = min(max(kl / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n / self.horizon


def action_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, action_mask: Tensor,
                    temperature: float = 1.0) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(log-probabilities, entropies) of the action tokens, flat (n,) in row-major order of `action_mask`
    (N, T − 1). The LM head runs on the action positions only; logits are divided by the sampling temperature,
    so the probabilities are those the tokens were sampled with."""
    h = model(input_ids, attention_mask, return_logits=False).last_hidden_state[:, :-1]  # (N, T-1, d)
    logits = unwrap_model(model).logits(h[action_mask]).float() / temperature  # (n, V)
    logp = logits.log_softmax(-1)
    taken = logp.gather(-1, input_ids[:, 1:][action_mask][:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return taken, entropy


class ActorCritic(nn.Module):
    """The two trained networks of PPO: the policy (a decoder) and the value function (a `RewardModel`-shaped
    network: its scalar head on every position). They share no parameters (Stiennon et al. 2020 §3.4: updates of
    the value function would otherwise disturb the pretrained policy early in training).

    Dropout stays off in both (`train()` keeps them in eval mode): the log-probabilities of the rollout and of
    the first update would otherwise differ, and the ratio ρ would not start at 1."""

    def __init__(self, policy: nn.Module, value: RewardModel, temperature: float = 1.0) -> None:
        super().__init__()
        self.policy, self.value, self.temperature = policy, value, temperature

    @property
    def config(self):
        """The policy's model config (what the run saves and `lmforge.load` rebuilds)."""
        return self.policy.config

    def train(self, mode: bool = True) -> ActorCritic:
        super().train(mode)
        self.policy.eval()
        self.value.eval()
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor, action_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(log-probs, values, entropies) of the action tokens, each flat (n,): V(s_t) is read at position t, the
        prefix that token t + 1 continues."""
        logp, entropy = action_logprobs(self.policy, input_ids, attention_mask, action_mask, self.temperature)
        values = self.value.token_scores(input_ids, attention_mask)[:, :-1][action_mask].float()
        return logp, values, entropy


def value_network(init: Literal["reward", "policy"], policy: nn.Module, reward_model: RewardModel) -> RewardModel:
    """The value function's network: a trainable copy of the reward model (Stiennon et al. 2020; InstructGPT), or
    of the policy's decoder with a zero-initialised scalar head. The copy's LM head is frozen when it is a matrix
    of its own (unused: only the hidden states feed the value head)."""
    if init == "reward":
        value = copy.deepcopy(unwrap_model(reward_model))
    else:
        value = RewardModel(copy.deepcopy(unwrap_model(policy)))
        nn.init.zeros_(value.head.weight)
        nn.init.zeros_(value.head.bias)
    value.train()
    for p in value.parameters():
        p.requires_grad_(True)
    core = value.backbone
    if getattr(core, "lm_head", None) is not None:
        for p in core.lm_head.parameters():
            if p is not core.tok_emb.weight:
                p.requires_grad_(False)
    return value


@torch.no_grad()
def normalize_head(model: RewardModel, mean: float, std: float) -> None:
    """Make the scalar head output (r − mean) / std: a value network copied from the reward model then starts on
    the scale of the normalised reward (Ziegler et al. 2019 §2: mean 0, std 1 under the initial policy)."""
    model.head.weight.div_(std)
    model.head.bias.sub_(mean).div_(std)


@dataclass
class PPOLoss:
    """The loss of one minibatch of a rollout: clipped surrogate + vf_coef × clipped value loss."""

    clip: float = 0.2
    value_clip: float | None = 0.2
    vf_coef: float = 0.1

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mask = batch["action_mask"]
        logp, values, entropy = model(batch["input_ids"], batch["attention_mask"], mask)
        pg = policy_loss(logp, batch["logprobs"][mask], batch["advantages"][mask], self.clip)
        vf = value_loss(values, batch["values"][mask], batch["returns"][mask], self.value_clip)
        metrics = {
            "policy_loss": pg["loss"].detach(), "value_loss": vf["loss"].detach(), "clipfrac": pg["clipfrac"],
            "value_clipfrac": vf["clipfrac"], "approx_kl": pg["approx_kl"], "entropy": entropy.detach().mean(),
        }  # fmt: skip
        metrics |= {k[len(ROLLOUT_STAT) :]: v for k, v in batch.items() if k.startswith(ROLLOUT_STAT)}
        return LossOutput(pg["loss"] + self.vf_coef * vf["loss"], int(logp.numel()), metrics)
