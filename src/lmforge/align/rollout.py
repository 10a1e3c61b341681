"""PPO's data: responses sampled from the current policy with the KV-cache generator, scored, and turned into
advantages — the rollout — then handed to the one training loop as minibatches, several epochs over each rollout.

`RolloutSource` is the loop's batch source: each loop step is one PPO update on one minibatch. When a rollout's
minibatches are used up, the next call samples a new rollout with the policy as it is then — so the source must
run in the training step (`train.prefetch` 0), never ahead of it. It is resumable: its state holds the prompt
order, the rollout count, the index within the rollout, the KL coefficient and the current rollout itself
(CPU tensors), so a run killed mid-rollout continues with the same minibatches; the next rollout's sampling
noise is seeded by (seed, rank, rollout number)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from lmforge.align.ppo import ROLLOUT_STAT, ActorCritic, AdaptiveKL, action_logprobs, gae, kl_penalized_rewards, whiten
from lmforge.align.train import ShuffledBatches
from lmforge.errors import LMForgeError
from lmforge.train.distributed import DistInfo
from lmforge.train.prefetch import Batch


@dataclass
class Responses:
    """Prompts with their sampled responses, right-padded: the layout the reward model and training read."""

    input_ids: Tensor
    """(N, L) prompt + response (+ padding)."""
    attention_mask: Tensor
    """(N, L) 1 on prompt and response tokens."""
    action_mask: Tensor
    """(N, L − 1) bool, in label positions: position t is true when token t + 1 is a response token."""
    ended: Tensor
    """(N,) bool: the response closes with EOS (it is up to and including its first EOS)."""
    prompt_len: Tensor
    response_len: Tensor


Scorer = Callable[[Responses], Tensor]
"""Scores (N,) of complete responses: a reward model's, or any function of the tokens."""


def left_pad(prompts: list[list[int]], pad_id: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Prompts as the generator takes them: (ids, mask), each (N, P), padded on the left."""
    P = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (P - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def layout(prompt_ids: Tensor, prompt_mask: Tensor, new: Tensor, eos_id: int | None, pad_id: int) -> Responses:
    """Left-padded prompts (N, P) + generated tokens (N, n) → right-padded `Responses`. A response keeps its
    tokens up to and including its first EOS (the generator repeats EOS after it); the rest becomes padding."""
    N, P = prompt_ids.shape
    dev = new.device
    if eos_id is None:
        keep, ended = torch.ones_like(new, dtype=torch.bool), torch.zeros(N, dtype=torch.bool, device=dev)
    else:
        is_eos = (new == eos_id).long()
        keep = (is_eos.cumsum(1) - is_eos) == 0  # no EOS before this position
        ended = (is_eos.bool() & keep).any(1)
    prompt_len, response_len = prompt_mask.sum(1), keep.sum(1)
    total = prompt_len + response_len
    full = torch.cat([prompt_ids, new], dim=1)  # (N, P + n)
    width = full.shape[1]
    cols = torch.arange(width, device=dev)
    shifted = (cols[None, :] + (P - prompt_len)[:, None]).clamp(max=width - 1)  # drop each row's left padding
    L = int(total.max())
    real = cols[None, :L] < total[:, None]
    ids = full.gather(1, shifted)[:, :L].masked_fill(~real, pad_id)
    t = cols[None, : L - 1] + 1  # the token each label position scores
    action = (t >= prompt_len[:, None]) & (t < total[:, None])
    return Responses(ids, real.long(), action, ended, prompt_len, response_len)


@torch.no_grad()
def sample_responses(
    policy: nn.Module, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, eos_id: int | None,
    pad_id: int, generator: torch.Generator | None = None,
) -> Responses:  # fmt: skip
    """Sample one response per prompt (token ids) from the policy with the KV-cache generator."""
    from lmforge.models.generate import generate

    device = next(policy.parameters()).device
    ids, mask = left_pad(prompts, pad_id, device)
    out = generate(policy, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature, eos_id=eos_id,
                   generator=generator)  # fmt: skip
    if out.shape[1] == ids.shape[1]:
        raise LMForgeError("no room to generate: the prompts fill the model's max_seq_len")
    return layout(ids, mask, out[:, ids.shape[1] :], eos_id, pad_id)


def scatter(flat: Tensor, mask: Tensor) -> Tensor:
    """Flat per-action values (n,) back into (N, T) float, 0 off the mask."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=flat.device)
    out[mask] = flat.float()
    return out


@dataclass
class RolloutOptions:
    """What a rollout samples and how it is scored (the `ppo.*` keys of an align recipe, minus the losses)."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    missing_eos_score: float | None = None
    """Reward of a response cut at max_new_tokens without EOS, in place of its (normalised) score (None: none)."""


@dataclass
class Rollout:
    data: dict[str, Tensor]
    """Per-response tensors: input_ids, attention_mask, action_mask, logprobs, values, advantages, returns."""
    stats: dict[str, float]


@torch.no_grad()
def make_rollout(
    actor: ActorCritic, reference: nn.Module, scorer: Scorer, prompts: list[list[int]], opts: RolloutOptions,
    kl_coef: float, eos_id: int | None, pad_id: int, generator: torch.Generator | None = None,
    norm: tuple[float, float] = (0.0, 1.0),
) -> Rollout:  # fmt: skip
    """Sample responses, score them, and compute KL-penalised rewards, values, advantages and returns. The
    reward is the score normalised by `norm` = (mean, std) of the reference policy's scores."""
    res = sample_responses(
        actor.policy, prompts, max_new_tokens=opts.max_new_tokens, temperature=opts.temperature, eos_id=eos_id,
        pad_id=pad_id, generator=generator,
    )  # fmt: skip
    mask = res.action_mask
    logp, values, _ = actor(res.input_ids, res.attention_mask, mask)
    ref_logp, _ = action_logprobs(reference, res.input_ids, res.attention_mask, mask, opts.temperature)
    scores = scorer(res).float()
    reward = (scores - norm[0]) / norm[1]
    if opts.missing_eos_score is not None:
        reward = torch.where(res.ended, reward, torch.full_like(reward, opts.missing_eos_score))
    logp, ref_logp, values = scatter(logp, mask), scatter(ref_logp, mask), scatter(values, mask)
    rewards, kl = kl_penalized_rewards(reward, logp, ref_logp, mask, kl_coef)
    advantages, returns = gae(rewards, values, mask, opts.gamma, opts.lam)
    if opts.whiten_advantages:
        advantages = whiten(advantages, mask)
    data = {
        "input_ids": res.input_ids, "attention_mask": res.attention_mask, "action_mask": mask, "logprobs": logp,
        "values": values, "advantages": advantages, "returns": returns,
    }  # fmt: skip
    stats = torch.stack([scores.mean(), kl.sum(1).mean(), res.response_len.float().mean(), res.ended.float().mean()])
    score, seq_kl, length, eos = stats.tolist()
    return Rollout({k: v.cpu() for k, v in data.items()}, {
        "score": score, "kl": seq_kl, "kl_coef": kl_coef, "response_len": length, "eos_rate": eos,
    })  # fmt: skip


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, np.uint64)[0]) >> 1


class RolloutSource:
    """The loop's batch source for PPO: `epochs` shuffled passes over each rollout of `rollout_batch` prompts
    (per rank), `minibatch` responses per batch (the loop's micro-batch: with gradient accumulation an update
    takes several, all from one epoch when rollout_batch is a multiple of them all); a new rollout when the last
    one is used up."""

    def __init__(
        self, actor: ActorCritic, reference: nn.Module, scorer: Scorer, prompts: list[list[int]],
        opts: RolloutOptions, *, rollout_batch: int, minibatch: int, epochs: int, kl: AdaptiveKL, seed: int,
        eos_id: int | None, pad_id: int, dist: DistInfo | None = None, device: torch.device | None = None,
        autocast: AbstractContextManager | None = None,
    ) -> None:  # fmt: skip
        if rollout_batch % minibatch:
            raise LMForgeError(f"ppo.rollout_batch ({rollout_batch}) must be a multiple of the minibatch ({minibatch})")
        self.actor, self.reference, self.scorer, self.opts = actor, reference, scorer, opts
        self.prompts = prompts
        self.dist = dist or DistInfo()
        if len(prompts) < rollout_batch * self.dist.world_size:
            raise LMForgeError(
                f"{len(prompts)} training prompts are fewer than one rollout (ppo.rollout_batch {rollout_batch}"
                f" × {self.dist.world_size} devices)"
            )
        self.order = ShuffledBatches(list(range(len(prompts))), rollout_batch, seed, lambda c: {"index": c}, self.dist)
        self.minibatch, self.epochs, self.kl, self.seed = minibatch, epochs, kl, seed
        self.per_epoch = rollout_batch // minibatch
        self.eos_id, self.pad_id = eos_id, pad_id
        self.device = device or torch.device("cpu")
        self.autocast = autocast or nullcontext()
        self.norm = (0.0, 1.0)  # (mean, std) of the reference policy's scores: rewards are normalised by them
        self.count = 0  # rollouts made
        self.pos = self.per_epoch * epochs  # minibatches of the current rollout handed out (all: make a new one)
        self.rollout: Rollout | None = None

    def __iter__(self) -> RolloutSource:
        return self

    def _new_rollout(self) -> None:
        chunk = next(self.order).data["index"]
        gen = torch.Generator(device=self.device).manual_seed(_seed(self.seed, self.dist.rank, self.count))
        with self.autocast:
            self.rollout = make_rollout(
                self.actor, self.reference, self.scorer, [self.prompts[i] for i in chunk], self.opts,
                self.kl.value, self.eos_id, self.pad_id, gen, self.norm,
            )  # fmt: skip
        kl = self.rollout.stats["kl"]
        if self.dist.enabled:  # one β on every rank
            t = torch.tensor(kl, device=self.device)
            torch.distributed.all_reduce(t)
            kl = float(t) / self.dist.world_size
        self.kl.update(kl, len(chunk) * self.dist.world_size)
        self.count += 1
        self.pos = 0

    def __next__(self) -> Batch:
        if self.rollout is None or self.pos == self.per_epoch * self.epochs:
            self._new_rollout()
        epoch, i = divmod(self.pos, self.per_epoch)
        order = np.random.default_rng([self.seed, self.dist.rank, self.count, epoch]).permutation(
            self.per_epoch * self.minibatch
        )
        rows = torch.from_numpy(order[i * self.minibatch : (i + 1) * self.minibatch])
        self.pos += 1
        data = {k: v[rows] for k, v in self.rollout.data.items()}
        width = int(data["attention_mask"].sum(1).max())  # drop the columns no row of this minibatch uses
        data = {k: v[:, : width - 1] if k in _LABEL_KEYS else v[:, :width] for k, v in data.items()}
        data |= {ROLLOUT_STAT + k: torch.tensor(v) for k, v in self.rollout.stats.items()}
        return Batch(data, examples=len(rows))

    def state_dict(self) -> dict:
        return {
            "order": self.order.state_dict(), "count": self.count, "pos": self.pos, "kl_coef": self.kl.value,
            "norm": list(self.norm),
            "rollout": None if self.rollout is None else {"data": self.rollout.data, "stats": self.rollout.stats},
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state["order"])
        self.count, self.pos, self.kl.value = int(state["count"]), int(state["pos"]), float(state["kl_coef"])
        self.norm = (float(state["norm"][0]), float(state["norm"][1]))
        r = state["rollout"]
        self.rollout = None if r is None else Rollout(dict(r["data"]), dict(r["stats"]))
        if self.rollout is not None and len(self.rollout.data["input_ids"]) != self.per_epoch * self.minibatch:
            raise LMForgeError("cannot resume the rollout: ppo.rollout_batch changed since the checkpoint")


@dataclass
class Samples:
    """Responses of a policy to held-out prompts with their scores and KL to the reference."""

    scores: Tensor
    """(N,) the scorer's (reward model's) scores."""
    kl: Tensor
    """(N,) Σ_t log π(y_t) − log π_ref(y_t) over each response: a Monte Carlo estimate of KL(π‖π_ref)."""
    response_len: Tensor
    ended: Tensor
    responses: list[list[int]]
    """Response token ids (through the first EOS)."""


@torch.no_grad()
def score_samples(
    policy: nn.Module, reference: nn.Module, scorer: Scorer, prompts: list[list[int]], *, max_new_tokens: int,
    temperature: float = 1.0, eos_id: int | None, pad_id: int, seed: int = 0, batch_size: int = 64, desc: str = "",
) -> Samples:  # fmt: skip
    """Sample a response per prompt (the same noise for the same seed), score it and measure its KL (`desc`: show
    a progress bar with this label)."""
    from lmforge.progress import progress

    gen = torch.Generator(device=next(policy.parameters()).device).manual_seed(_seed(seed, 0x5EED))
    parts: list[tuple] = []
    responses: list[list[int]] = []
    starts = range(0, len(prompts), batch_size)
    for i in progress(starts, desc=desc, unit="batch") if desc else starts:
        res = sample_responses(policy, prompts[i : i + batch_size], max_new_tokens=max_new_tokens,
                               temperature=temperature, eos_id=eos_id, pad_id=pad_id, generator=gen)  # fmt: skip
        m = res.action_mask
        lp, _ = action_logprobs(policy, res.input_ids, res.attention_mask, m, temperature)
        ref, _ = action_logprobs(reference, res.input_ids, res.attention_mask, m, temperature)
        kl = scatter(lp - ref, m).sum(1)
        parts.append((scorer(res).float().cpu(), kl.cpu(), res.response_len.cpu(), res.ended.cpu()))
        for row, p, n in zip(res.input_ids.tolist(), res.prompt_len.tolist(), res.response_len.tolist()):
            responses.append(row[p : p + n])
    cat = [torch.cat(x) for x in zip(*parts)]
    return Samples(*cat, responses)


def sample_metrics(s: Samples) -> dict[str, float]:
    """Means over the samples: reward (the score), kl, response_len, eos_rate."""
    return {
        "reward": float(s.scores.mean()), "kl": float(s.kl.mean()),
        "response_len": float(s.response_len.float().mean()), "eos_rate": float(s.ended.float().mean()),
    }  # fmt: skip


_LABEL_KEYS = ("action_mask", "logprobs", "values", "advantages", "returns")
"""Rollout tensors in label positions (one column fewer than the tokens)."""
