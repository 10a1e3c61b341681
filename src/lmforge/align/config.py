"""Alignment run configuration (SFT, reward model, DPO, PPO): typed sections loaded from YAML recipes in
`recipes/align/` with dotted CLI overrides, validated by `lmforge.config`'s helpers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lmforge.align.train import AlignTrainConfig
from lmforge.config import all_keys, build_dataclass, recipe_dict, write_yaml
from lmforge.config.sections import InitModel, RunConfig
from lmforge.config.types import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, UnitFraction
from lmforge.errors import LMForgeError

Method = Literal["sft", "reward", "dpo", "ppo"]


@dataclass
class AlignRunConfig(RunConfig):
    dir: str = "runs/align"
    """Run directory: config.yaml, metrics.jsonl, eval.json, checkpoints/step_N."""


@dataclass
class AlignModelConfig(InitModel):
    init: str = "gpt-tiny"
    """The starting model: an lmforge run / checkpoint dir (e.g. an SFT run for DPO and reward models), a Hugging
    Face model dir, or a decoder preset name (random init)."""
    template: Literal["alpaca", "chat"] = "chat"
    """How conversations become tokens (align/templates.py)."""
    role_tokens: bool = True
    """Chat template: add <|system|>, <|user|>, <|assistant|> as special tokens (the embedding table grows)."""
    max_len: int = 256
    """Longest training sequence in tokens; longer prompts are shortened first."""


@dataclass
class AlignDataConfig:
    sources: list[str] = field(default_factory=lambda: ["sentiment"])
    """Built-in sets (align/datasets.py): instruction sources sentiment, debian, continuation (SFT); preference
    sources sentiment, continuation (reward, DPO, and PPO's prompts: the first one)."""
    train: str | None = None
    """A JSON-lines file to train on instead of `sources` (instruction records for SFT, preference pairs for
    reward and DPO; PPO reads the prompts of either)."""
    dev: str | None = None
    """A JSON-lines dev file (None: the sources' dev split, or 10% held out of `train`)."""
    max_train: int | None = 2000
    """Training records per source (None = all)."""
    max_eval: int | None = 200
    negatives: Literal["other_document", "other_author"] = "other_document"
    """continuation pairs: where the rejected continuation comes from."""
    prompts_from: Literal["austen", "shakespeare"] | None = None
    """continuation pairs: keep the prompts of one author only."""
    prompt_words: int = 48
    response_words: int = 16


@dataclass
class SFTOptions:
    pack: bool = False
    """Pack several examples per sequence (document-masked attention, positions restart per example)."""
    pack_len: int = 512
    """Tokens per packed sequence; `train.batch_size` examples are packed into as few rows as fit."""


@dataclass
class DPOOptions:
    beta: float = 0.1
    """DPO's β: strength of the implicit KL constraint to the reference (Rafailov et al. 2023 §4)."""
    label_smoothing: float = 0.0
    """Conservative DPO: the probability that a preference label is flipped (0 = plain DPO)."""
    reference: str | None = None
    """The frozen reference model's run/checkpoint dir (None = a frozen copy of model.init)."""


@dataclass
class PPOOptions:
    """RLHF with PPO (InstructGPT §3.5 step 3, Stiennon et al. 2020 §3.4): each loop step is one update on a
    minibatch (`train.batch_size` responses) of a rollout; `epochs` passes over each rollout. A PPO run sets
    train.prefetch to 0 (a rollout samples the policy of its step) and train.spike_factor to 0 (the surrogate
    loss has no scale to measure spikes against)."""

    reward: str | None = None
    """The reward-model run (`lmforge align reward`) whose score is the reward (`--reward`)."""
    value_init: Literal["reward", "policy"] = "reward"
    """The value network: a copy of the reward model (Stiennon et al.; InstructGPT) or of the SFT policy's decoder
    with a zero-initialised scalar head; either way it shares no parameters with the policy."""
    rollout_batch: PosInt = 64
    """Prompts sampled per rollout (per device); a multiple of train.batch_size × train.grad_accum."""
    epochs: PosInt = 4
    """PPO epochs over each rollout."""
    max_new_tokens: PosInt = 32
    """Longest response; prompts are shortened to model.max_len − max_new_tokens tokens."""
    temperature: PosFloat = 1.0
    """Sampling temperature; the policy's and the reference's log-probabilities use the same one."""
    kl_coef: NonNegFloat = 0.05
    """β of the per-token KL penalty −β·(log π − log π_ref) (the initial β when kl_target is set)."""
    kl_target: PosFloat | None = None
    """Adapt β towards this KL per response, in nats (Ziegler et al. 2019 §2.2); None = fixed β."""
    kl_horizon: PosInt = 10000
    """Responses over which the adaptive controller closes the gap to kl_target."""
    gamma: Fraction = 1.0
    """Discount γ of GAE."""
    lam: Fraction = 0.95
    """λ of GAE."""
    clip_range: UnitFraction = 0.2
    """ε of the clipped surrogate: the ratio π/π_old is clipped to [1 − ε, 1 + ε]."""
    value_clip_range: PosFloat | None = 0.2
    """Clip the value update to ±this around the rollout's values (None = plain squared error)."""
    vf_coef: NonNegFloat = 0.1
    """Weight of the value loss in the summed loss."""
    whiten_advantages: bool = True
    """Normalise the advantages of each rollout to mean 0, std 1 (over its response tokens)."""
    reward_norm_samples: NonNegInt = 256
    """Normalise the reward to mean 0, std 1 over the SFT policy's responses to this many training prompts,
    sampled before the first step (Ziegler et al. 2019 §2); the value network copied from the reward model gets
    the same affine map. 0 = the raw score."""
    missing_eos_score: float | None = None
    """Reward of a response that reaches max_new_tokens without EOS, in place of its normalised score (None: the
    reward model scores it as it is)."""


@dataclass
class AlignConfig:
    method: Method = "sft"
    run: AlignRunConfig = field(default_factory=AlignRunConfig)
    model: AlignModelConfig = field(default_factory=AlignModelConfig)
    data: AlignDataConfig = field(default_factory=AlignDataConfig)
    train: AlignTrainConfig = field(default_factory=AlignTrainConfig)
    sft: SFTOptions = field(default_factory=SFTOptions)
    dpo: DPOOptions = field(default_factory=DPOOptions)
    ppo: PPOOptions = field(default_factory=PPOOptions)


def build_align_config(raw: dict) -> AlignConfig:
    cfg = build_dataclass(AlignConfig, raw, "", all_keys(AlignConfig))
    _validate(cfg)
    return cfg


def _validate(cfg: AlignConfig) -> None:
    if cfg.model.max_len < 8:
        raise LMForgeError(f"model.max_len must be at least 8, got {cfg.model.max_len}")
    if cfg.sft.pack and cfg.sft.pack_len < cfg.model.max_len:
        raise LMForgeError(f"sft.pack_len ({cfg.sft.pack_len}) must be >= model.max_len ({cfg.model.max_len})")
    if cfg.dpo.beta <= 0:
        raise LMForgeError(f"dpo.beta must be positive, got {cfg.dpo.beta}")
    if not 0 <= cfg.dpo.label_smoothing < 0.5:
        raise LMForgeError(f"dpo.label_smoothing must be in [0, 0.5), got {cfg.dpo.label_smoothing}")
    if not cfg.data.sources and cfg.data.train is None:
        raise LMForgeError("data: give data.sources or a data.train file")
    if cfg.method == "ppo":
        if cfg.ppo.max_new_tokens >= cfg.model.max_len:
            raise LMForgeError(
                f"ppo.max_new_tokens ({cfg.ppo.max_new_tokens}) must be below model.max_len ({cfg.model.max_len})"
            )
        minibatch = cfg.train.batch_size * cfg.train.grad_accum
        if cfg.ppo.rollout_batch % minibatch:
            raise LMForgeError(
                f"ppo.rollout_batch ({cfg.ppo.rollout_batch}) must be a multiple of train.batch_size × "
                f"train.grad_accum ({minibatch})"
            )


def load_align_config(
    recipe: str | Path | None = None,
    overrides: list[str] | dict | None = None,
    init: str | None = None,
    reward: str | None = None,
) -> AlignConfig:
    """Recipe (path or bundled name in recipes/align/) + dotted overrides (+ `--init`, `--reward`) → AlignConfig."""
    extra = ({"model": {"init": init}} if init is not None else {}) | ({"ppo": {"reward": reward}} if reward else {})
    cfg = build_align_config(recipe_dict(recipe, "align", overrides, extra or None, schema=AlignConfig))
    if recipe is not None and cfg.run.recipe is None:
        cfg.run.recipe = str(recipe)
    return cfg


def align_to_dict(cfg: AlignConfig) -> dict:
    return dataclasses.asdict(cfg)


def save_align_config(cfg: AlignConfig, path: Path) -> None:
    write_yaml(path, align_to_dict(cfg))
