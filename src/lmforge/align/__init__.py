"""Alignment: instruction tuning (templates, response-only loss, packing), reward models, DPO, PPO, best-of-n."""

from lmforge.align.data import PreferencePair, read_instructions, read_preferences
from lmforge.align.dpo import DPO, dpo_loss, frozen_copy
from lmforge.align.packing import document_mask, pack_batch, packed_hidden, pad_batch
from lmforge.align.ppo import ActorCritic, PPOLoss, gae, kl_penalized_rewards
from lmforge.align.reward import RewardModel, best_of_n, pairwise_loss
from lmforge.align.rollout import RolloutSource, sample_responses, score_samples
from lmforge.align.sft import sequence_logprobs, sft_loss
from lmforge.align.templates import Conversation, Message, add_role_tokens, get_template

__all__ = [
    "DPO",
    "ActorCritic",
    "PPOLoss",
    "RolloutSource",
    "Conversation",
    "Message",
    "PreferencePair",
    "RewardModel",
    "add_role_tokens",
    "best_of_n",
    "document_mask",
    "dpo_loss",
    "frozen_copy",
    "gae",
    "get_template",
    "kl_penalized_rewards",
    "pack_batch",
    "packed_hidden",
    "pad_batch",
    "pairwise_loss",
    "read_instructions",
    "read_preferences",
    "sample_responses",
    "score_samples",
    "sequence_logprobs",
    "sft_loss",
]
