"""Reward model (InstructGPT §3.5 step 2): a decoder backbone with a scalar head on the last token, trained on
preference pairs with the pairwise ranking loss −log σ(r(x, y_w) − r(x, y_l)); best-of-n sampling against it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.align.data import PreferencePair
from lmforge.align.packing import pad_batch
from lmforge.align.templates import Conversation, Message, Template
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput


class RewardModel(nn.Module):
    """r(x, y): the backbone's final hidden state at the last real token → one scalar (the LM head is unused)."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        cfg = backbone.config
        if not cfg.is_decoder:
            raise LMForgeError(f"a reward model needs a decoder backbone, got arch '{cfg.arch}'")
        self.backbone = backbone
        self.head = nn.Linear(cfg.d_model, 1)
        nn.init.normal_(self.head.weight, std=1 / (cfg.d_model + 1) ** 0.5)
        nn.init.zeros_(self.head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Rewards (B,) of right-padded sequences (B, T)."""
        h = self.backbone(input_ids, attention_mask, return_logits=False).last_hidden_state  # (B, T, d)
        last = attention_mask.sum(-1).clamp(min=1) - 1  # (B,) index of the last real token
        return self.head(h[torch.arange(h.shape[0], device=h.device), last]).squeeze(-1)

    def token_scores(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The head on every position (B, T): a scalar per prefix (PPO's value function, Stiennon et al. 2020 §3.4:
        a network of its own initialised from the reward model)."""
        h = self.backbone(input_ids, attention_mask, return_logits=False).last_hidden_state  # (B, T, d)
        return self.head(h).squeeze(-1)


def pairwise_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Mean −log σ(r_w − r_l) over pairs (InstructGPT eq. 1, without the 1/C(K,2) grouping)."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def pair_batch(pairs: list[PreferencePair], template: Template, pad_id: int, max_len: int) -> dict[str, Tensor]:
    """Chosen rows then rejected rows (2B, T), right-padded, labels on the responses (for DPO's log-probs).

    Truncation keeps the first max_len tokens, so a response cut short is compared as cut."""
    encoded = [template.encode(p.conversation("chosen"), max_len) for p in pairs]
    encoded += [template.encode(p.conversation("rejected"), max_len) for p in pairs]
    return pad_batch(encoded, pad_id)


def reward_loss(model: RewardModel, batch: dict[str, Tensor]) -> LossOutput:
    """Pairwise ranking loss of a pair batch; accuracy = share of pairs with r_w > r_l."""
    r = model(batch["input_ids"], batch["attention_mask"])
    B = r.shape[0] // 2
    rw, rl = r[:B], r[B:]
    loss = pairwise_loss(rw, rl)
    acc = (rw > rl).float().mean()  # the parts stay on the device until the loop logs them
    return LossOutput(loss, B, {"accuracy": acc, "margin": (rw - rl).mean().detach()})


@torch.no_grad()
def reward_accuracy(
    model: RewardModel, pairs: list[PreferencePair], template: Template, pad_id: int, max_len: int, batch_size: int = 32
) -> dict[str, float]:
    """Share of pairs the model ranks correctly (ties count as wrong) and the mean reward margin."""
    device = next(model.parameters()).device
    correct, margin = 0, 0.0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        batch = {k: v.to(device) for k, v in pair_batch(chunk, template, pad_id, max_len).items()}
        r = model(batch["input_ids"], batch["attention_mask"])
        rw, rl = r[: len(chunk)], r[len(chunk) :]
        correct += int((rw > rl).sum())
        margin += float((rw - rl).sum())
    n = max(len(pairs), 1)
    return {"accuracy": correct / n, "margin": margin / n}


@torch.no_grad()
def score(model: RewardModel, template: Template, convs: list[Conversation], pad_id: int, max_len: int) -> Tensor:
    """Rewards (N,) of complete conversations (each ending with an assistant response)."""
    device = next(model.parameters()).device
    batch = pad_batch([template.encode(c, max_len) for c in convs], pad_id)
    return model(batch["input_ids"].to(device), batch["attention_mask"].to(device))


@dataclass
class BestOfN:
    best: str
    """The sampled response with the highest reward."""
    reward: float
    candidates: list[str]
    rewards: list[float]


@torch.no_grad()
def best_of_n(
    policy: nn.Module,
    reward_model: RewardModel,
    template: Template,
    prompt: Conversation,
    n: int = 4,
    *,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    top_p: float | None = None,
    max_len: int = 512,
    generator: torch.Generator | None = None,
) -> BestOfN:
    """Sample n responses to `prompt` from the policy, score each with the reward model, return the argmax."""
    from lmforge.models.generate import generate

    if n < 1:
        raise LMForgeError(f"best-of-n needs n >= 1, got {n}")
    tok = template.tokenizer
    device = next(policy.parameters()).device
    ids = torch.tensor([template.prompt_ids(prompt)] * n, device=device)  # (n, T): same prompt, n samples
    out = generate(
        policy, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, eos_id=template.eos,
        generator=generator,
    )  # fmt: skip
    texts = [tok.decode(row[ids.shape[1] :].tolist()) for row in out]
    convs = [Conversation(prompt.prompt().messages + [Message("assistant", t)], prompt.input) for t in texts]
    rewards = score(reward_model, template, convs, tok.pad_id if tok.pad_id is not None else template.eos, max_len)
    i = int(rewards.argmax())
    return BestOfN(texts[i], float(rewards[i]), texts, rewards.tolist())
