"""XLNet permutation language modelling (Yang et al. 2019 §2.2-2.5).

For each sequence a factorisation order z is sampled uniformly; position z_t is predicted from the tokens at
z_1 .. z_{t-1}, whatever their place in the text, so the model learns from bidirectional context while staying
autoregressive. Partial prediction (§2.3): only the last 1/K of each order is predicted (K = 6 in the paper), the
rest is context. The order is realised by attention masks (the text is never shuffled): with rank[i] the step of
position i in z, the content stream of i sees j iff rank[j] <= rank[i], the query stream (which makes the
prediction and knows its position but not its token) iff rank[j] < rank[i]. The model runs the query stream only at
the targets.

Segments follow one another in the token stream and the model carries its memory over them (Transformer-XL
recurrence, §2.5); with `segments`, each sequence is also cut at a random point into two segments (token types 0
and 1) so the relative segment encoding is trained, as pretraining on segment pairs does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.objectives.losses import lm_head_loss
from lmforge.objectives.recurrent import RecurrentObjective, RecurrentOptions
from lmforge.objectives.rng import rng, with_fixed_noise
from lmforge.registry import OBJECTIVES


@dataclass
class XLNetOptions(RecurrentOptions):
    """Options of permutation language modelling (the recipe's `objective.*` keys)."""

    k: int = 6
    """Partial prediction constant K: predict the last 1/K of every factorisation order (§2.3; 6 in the paper)."""
    segments: bool = True
    """Cut each sequence at a uniform random point into two segments (token types 0, 1) for the segment encoding."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k < 1:
            raise LMForgeError(f"objective.k must be >= 1, got {self.k}")


def sample_order(batch: int, seq_len: int) -> Tensor:
    """rank (B, T): the step at which each position comes in a uniformly random factorisation order."""
    # order[b, t] = z_t, the position predicted at step t
    order = torch.rand(batch, seq_len, generator=rng()).argsort(dim=-1)
    return order.argsort(dim=-1)


def permutation_mask(rank: Tensor) -> Tensor:
    """(B, T, T) bool perm_mask, True where position i may NOT see position j: j does not come before i in the order.

    This is the query stream's mask; the content stream also sees its own position (the model adds that)."""
    return rank[:, None, :] >= rank[:, :, None]


def num_predict(seq_len: int, k: int) -> int:
    """Targets per sequence: the last 1/K of the order (512 // 6 = 85, the released pretraining's num_predict)."""
    return max(1, seq_len // k)


@OBJECTIVES.register("xlnet")
class XLNet(RecurrentObjective):
    """Permutation LM with two-stream attention and partial prediction; loss on the query stream at the targets."""

    name = "xlnet"
    Options = XLNetOptions

    def build_model(self, model_cfg) -> nn.Module:
        if not model_cfg.is_encoder or not model_cfg.two_stream or not model_cfg.lm_head:
            raise LMForgeError(
                "objective 'xlnet' needs an encoder with two-stream attention and an LM head (e.g. "
                "--model.preset=xlnet-tiny)"
            )
        return super().build_model(model_cfg)

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        # Windows share their last token with the next one: drop it, so consecutive segments tile the stream.
        ids = tokens[:, :-1]
        B, T = ids.shape
        rank = sample_order(B, T)
        n = num_predict(T, self.options.k)
        targets = rank.argsort(dim=-1)[:, T - n :]  # (B, n): the last n positions of each order, in order
        batch = {"input_ids": ids, "rank": rank, "target_positions": targets, "labels": ids.gather(1, targets)}
        # Without segments every token is in segment 0: the segment term is then constant over keys (no effect),
        # but its parameters stay in the graph, as distributed data parallel requires.
        cut = torch.randint(1, T, (B, 1), generator=rng()) if self.options.segments and T > 1 else torch.full((B, 1), T)
        batch["token_type_ids"] = (torch.arange(T)[None, :] >= cut).long()
        return batch

    def eval_transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """The same order and cut for a window at every validation."""
        return with_fixed_noise(self.transform, tokens)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        ids, labels = batch["input_ids"], batch["labels"]
        out = model(
            ids,
            token_type_ids=batch["token_type_ids"],
            perm_mask=permutation_mask(batch["rank"]),
            query_positions=batch["target_positions"],
            mems=self.memory(model, ids.shape[0]),
            use_mems=True,
            mem_len=self.mem_len(model),
            return_logits=False,
        )
        self.keep(model, out.mems)
        return LossOutput(lm_head_loss(model, out.query_hidden_state, labels), labels.numel())
