"""Alignment runs from an AlignConfig: SFT, reward model, DPO or PPO → RUN/config.yaml, metrics.jsonl, eval.json
and checkpoints/step_N (an SFT, DPO or PPO policy loads with `lmforge.load(RUN)`, a reward model with
`load_reward_model(RUN)`)."""

from __future__ import annotations

import dataclasses
import json
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from lmforge.align.config import AlignConfig, align_to_dict, save_align_config
from lmforge.align.data import PreferencePair, read_instructions, read_preferences, read_prompts
from lmforge.align.datasets import instruction_set, preference_set
from lmforge.align.dpo import DPO, dpo_metrics, frozen_copy
from lmforge.align.packing import pack_batch, pad_batch
from lmforge.align.ppo import ActorCritic, AdaptiveKL, PPOLoss, normalize_head, value_network
from lmforge.align.reward import RewardModel, pair_batch, reward_accuracy, reward_loss
from lmforge.align.rollout import RolloutOptions, RolloutSource, sample_metrics, score_samples
from lmforge.align.sft import choice_accuracy, encode_all, response_loss, sft_loss
from lmforge.align.templates import Conversation, add_role_tokens, get_template
from lmforge.align.train import ShuffledBatches, initial_model
from lmforge.checkpoint.layout import CONFIG_FILE
from lmforge.checkpoint.read import load_weights, read_config
from lmforge.checkpoint.verify import model_checkpoint
from lmforge.errors import LMForgeError
from lmforge.files import write_atomic
from lmforge.progress import status
from lmforge.train.device import autocast_for
from lmforge.train.loop_spec import LoopSpec, Saved
from lmforge.train.prefetch import BatchSource
from lmforge.train.session import RunSession


def _split(items: list, dev: list | None) -> tuple[list, list]:
    if dev is not None:
        return items, dev
    cut = len(items) - max(1, len(items) // 10)  # no dev file: hold out the last 10%
    return items[:cut], items[cut:]


def instruction_data(cfg: AlignConfig) -> tuple[list[Conversation], list[Conversation]]:
    d = cfg.data
    if d.train:
        train = read_instructions(d.train)[: d.max_train]
        return _split(train, read_instructions(d.dev)[: d.max_eval] if d.dev else None)
    kw = _continuation_options(cfg)
    return instruction_set(d.sources, "train", d.max_train, **kw), instruction_set(d.sources, "dev", d.max_eval, **kw)


def _continuation_options(cfg: AlignConfig) -> dict:
    d = cfg.data
    if "continuation" not in d.sources:
        return {}
    return dict(
        prompt_words=d.prompt_words, response_words=d.response_words, negatives=d.negatives,
        prompts_from=d.prompts_from, seed=cfg.run.seed,
    )  # fmt: skip


def preference_data(cfg: AlignConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    d = cfg.data
    if d.train:
        train = read_preferences(d.train)[: d.max_train]
        return _split(train, read_preferences(d.dev)[: d.max_eval] if d.dev else None)
    kw = _continuation_options(cfg) if d.sources[0] == "continuation" else {}
    return preference_set(d.sources[0], "train", d.max_train, **kw), preference_set(
        d.sources[0], "dev", d.max_eval, **kw
    )


def _texts(items: list) -> list[str]:
    out = []
    for x in items:
        conv = x.conversation("chosen") if isinstance(x, PreferencePair) else x
        out += [m.content for m in conv.messages] + ([conv.input] if conv.input else [])
        out += [x.rejected] if isinstance(x, PreferencePair) else []
    return out


def _policy(cfg: AlignConfig, train_items: list, device: torch.device):
    """(model on the device, tokenizer, template, pad id). model.max_len is capped at the model's max_seq_len
    when its positions are learned (they end there)."""
    m = cfg.model
    model, tok = initial_model(m.init, lambda: _texts(train_items), m.tokenizer, m.vocab_size)
    if model.config.max_positions is not None and m.max_len > model.config.max_positions:
        m.max_len = model.config.max_positions
    if m.template == "chat" and m.role_tokens:
        add_role_tokens(model, tok)
    pad = tok.pad_id if tok.pad_id is not None else tok.eos_id
    return model.to(device), tok, get_template(m.template, tok), pad


class Run:
    """The frame of an alignment run around the one loop: the locked run dir, the config, the metrics log, the
    resumable checkpoints (the last one is the run's model: `lmforge.load(RUN)`) and eval.json."""

    def __init__(self, cfg: AlignConfig, resume: bool = False) -> None:
        self.cfg, self.dir, self.resume = cfg, Path(cfg.run.dir), resume
        self.session = RunSession(self.dir, cfg.train, seed=cfg.run.seed)
        self.dist, self.device = self.session.dist, self.session.device
        with self.session.closed_on_error():
            self.resume_from = self.session.find_resume(
                align_to_dict(cfg), resume, frozen_sections(cfg.method), saved_as="align"
            )

    def released_on_error(self) -> AbstractContextManager[None]:
        """Release the run dir (and the process group) when setting the run up fails."""
        return self.session.closed_on_error()

    def shuffled(self, items: list, make) -> ShuffledBatches:
        """Shuffled batches of `items` (`make` turns a chunk into tensors), this rank's share."""
        return ShuffledBatches(items, self.cfg.train.batch_size, self.cfg.run.seed, make, self.dist)

    def train(
        self, model, tok, loss_fn, batches: BatchSource, evaluate, extra: dict | None = None, eval_first: bool = False
    ) -> dict[str, float]:
        """Train `model` with `loss_fn` on `batches` and `evaluate()` every eval_every steps (and, with
        `eval_first`, before the first step of a new run); write eval.json. Returns the final dev metrics."""
        cfg, d = self.cfg, self.dist
        with self.session.closing():
            saved = {"model": dataclasses.asdict(model.config), "align": align_to_dict(cfg), **(extra or {})}
            spec = LoopSpec(
                saved=lambda: Saved(model, saved, tok),
                # A sharded model's forward needs every rank: under fsdp each evaluates (rank 0's result is used).
                evaluate=lambda step: evaluate() if d.is_main or cfg.train.parallel == "fsdp" else {},
                eval_prefix="dev_",
                resume_hint=f"lmforge align {cfg.method} --run.dir={self.dir} --resume",
            )
            loop = self.session.start(
                model, loss_fn, batches, spec, config=align_to_dict(cfg),
                save_config=lambda: save_align_config(cfg, self.dir / CONFIG_FILE),
            )  # fmt: skip
            if eval_first and loop.step == 0 and d.is_main:
                model.eval()
                with torch.no_grad(), loop.autocast:
                    self.session.log.log(0, **{f"dev_{k}": v for k, v in evaluate().items()})
            metrics = loop.run()
            model.eval()
            if d.is_main:
                write_atomic(self.dir / "eval.json", json.dumps(metrics, indent=2) + "\n")
            return metrics


def _batch_maker(fn, *args):
    return lambda chunk: fn(chunk, *args)


def run_sft(cfg: AlignConfig, resume: bool = False) -> dict[str, float]:
    """Instruction tuning; dev metrics: response NLL and, for closed questions, choice accuracy."""
    run = Run(cfg, resume)
    train, dev = instruction_data(cfg)
    model, tok, template, pad = _policy(cfg, train, run.device)
    examples = encode_all(template, train, cfg.model.max_len)
    dev_examples = encode_all(template, dev, cfg.model.max_len)
    closed = [c for c in dev if "choices" in c.meta]
    pack_len = cfg.sft.pack_len if cfg.sft.pack else None

    def evaluate() -> dict[str, float]:
        out = {"response_loss": response_loss(model, dev_examples, pad)}
        if closed:
            choices = closed[0].meta["choices"]
            out["choice_accuracy"] = choice_accuracy(model, template, closed, choices, pad, cfg.model.max_len)
        return out

    make = (lambda chunk: pack_batch(chunk, pack_len, pad)) if pack_len else (lambda chunk: pad_batch(chunk, pad))
    return run.train(model, tok, sft_loss, run.shuffled(examples, make), evaluate)


def run_reward(cfg: AlignConfig, resume: bool = False) -> dict[str, float]:
    """Reward model on preference pairs; dev metrics: pairwise accuracy and mean reward margin."""
    run = Run(cfg, resume)
    train, dev = preference_data(cfg)
    backbone, tok, template, pad = _policy(cfg, train, run.device)
    model = RewardModel(backbone).to(run.device)
    make = _batch_maker(pair_batch, template, pad, cfg.model.max_len)
    evaluate = lambda: reward_accuracy(model, dev, template, pad, cfg.model.max_len)  # noqa: E731
    return run.train(model, tok, reward_loss, run.shuffled(train, make), evaluate, {"reward_model": True})


def run_dpo(cfg: AlignConfig, resume: bool = False) -> dict[str, float]:
    """DPO against a frozen reference; dev metrics: implicit-reward margin/accuracy and log-prob margin."""
    run = Run(cfg, resume)
    train, dev = preference_data(cfg)
    policy, tok, template, pad = _policy(cfg, train, run.device)
    if cfg.dpo.reference:
        from lmforge.loading import load

        reference = frozen_copy(load(cfg.dpo.reference)[0]).to(run.device)
        if reference.config.vocab_size != policy.config.vocab_size:
            raise LMForgeError(
                f"dpo.reference has vocab_size {reference.config.vocab_size}, the policy {policy.config.vocab_size}"
            )
    else:
        reference = frozen_copy(policy)
    dpo = DPO(reference, cfg.dpo.beta, cfg.dpo.label_smoothing)
    L = cfg.model.max_len
    make = _batch_maker(pair_batch, template, pad, L)
    evaluate = lambda: dpo_metrics(policy, reference, dev, template, pad, L, cfg.dpo.beta)  # noqa: E731
    return run.train(policy, tok, dpo.loss, run.shuffled(train, make), evaluate)


def prompt_data(
    cfg: AlignConfig, split: str = "dev", held_out: int | None = -1
) -> tuple[list[Conversation], list[Conversation]]:
    """(training prompts, held-out prompts): those of the data file(s) (held out: the dev file, or the last 10%),
    or of the first source's preference pairs in `split` (the continuation source's dev and test prompts come from
    unseen documents). `held_out` caps the held-out prompts (-1: data.max_eval, None: all)."""
    d = cfg.data
    cap = d.max_eval if held_out == -1 else held_out
    if d.train:
        train = read_prompts(d.train)[: d.max_train]
        return _split(train, read_prompts(d.dev)[:cap] if d.dev else None)
    kw = _continuation_options(cfg) if d.sources[0] == "continuation" else {}
    pairs = (preference_set(d.sources[0], s, n, **kw) for s, n in (("train", d.max_train), (split, cap)))
    return tuple([p.prompt for p in ps] for ps in pairs)  # type: ignore[return-value]


def _same_tokenizer(tok, other, probe: str) -> None:
    if tok.vocab_size != other.vocab_size or tok.encode(probe) != other.encode(probe):
        raise LMForgeError("the policy (model.init) and the reward model (ppo.reward) use different tokenizers")


def run_ppo(cfg: AlignConfig, resume: bool = False) -> dict[str, float]:
    """RLHF with PPO against a reward-model run; dev metrics on held-out prompts: the reward model's mean score
    (reward), the KL to the reference per response, response length and EOS rate."""
    p = cfg.ppo
    if p.reward is None:
        raise LMForgeError("ppo needs a reward model: pass --reward RUN (a run of `lmforge align reward`)")
    if not Path(cfg.model.init).exists():
        raise LMForgeError(f"ppo starts from an SFT run (--init), and '{cfg.model.init}' is not a directory")
    cfg.train.prefetch = 0  # rollouts sample the policy as it is at the step: never built ahead of it
    cfg.train.spike_factor = 0.0  # the surrogate loss has no scale a spike could be measured against
    run = Run(cfg, resume)
    with run.released_on_error():
        train, dev = prompt_data(cfg)
        policy, tok, template, pad = _policy(cfg, train, run.device)
        rm, rm_tok = load_reward_model(p.reward, run.device)
        _same_tokenizer(tok, rm_tok, train[0].messages[-1].content)
        rm.requires_grad_(False)
        reference = frozen_copy(policy)
        actor = ActorCritic(policy, value_network(p.value_init, policy, rm), p.temperature).to(run.device)
        room = cfg.model.max_len - p.max_new_tokens
        if room < 8:
            raise LMForgeError(f"model.max_len ({cfg.model.max_len}) leaves {room} prompt tokens for ppo")
        prompts, dev_prompts = ([template.prompt_ids(c, room) for c in x] for x in (train, dev))
        opts = RolloutOptions(p.max_new_tokens, p.temperature, p.gamma, p.lam, p.whiten_advantages,
                              p.missing_eos_score)  # fmt: skip
        scorer = reward_scorer(rm)
        source = RolloutSource(
            actor, reference, scorer, prompts, opts, rollout_batch=p.rollout_batch,
            minibatch=cfg.train.batch_size, epochs=p.epochs,
            kl=AdaptiveKL(p.kl_coef, p.kl_target, p.kl_horizon), seed=cfg.run.seed, eos_id=template.eos,
            pad_id=pad, dist=run.dist, device=run.device, autocast=autocast_for(run.device, cfg.train.precision),
        )  # fmt: skip
        sample = dict(max_new_tokens=p.max_new_tokens, temperature=p.temperature, eos_id=template.eos, pad_id=pad)
        if p.reward_norm_samples and run.resume_from is None:  # a resumed run has them in its checkpoint
            source.norm = _reward_scale(run, reference, scorer, prompts[: p.reward_norm_samples], sample)
            if p.value_init == "reward":
                normalize_head(actor.value, *source.norm)

    def evaluate() -> dict[str, float]:
        return sample_metrics(score_samples(policy, reference, scorer, dev_prompts, seed=cfg.run.seed, **sample))

    loss = PPOLoss(p.clip_range, p.value_clip_range, p.vf_coef)
    extra = {"export_module": "policy", "value_model": dataclasses.asdict(actor.value.config)}
    return run.train(actor, tok, loss, source, evaluate, extra, eval_first=True)


def _reward_scale(run: Run, reference, scorer, prompts: list[list[int]], sample: dict) -> tuple[float, float]:
    """(mean, std) of the reward model's scores of the SFT policy's responses to `prompts` (Ziegler et al. §2)."""
    desc = "reward scale" if run.dist.is_main else ""
    ref = score_samples(reference, reference, scorer, prompts, seed=run.cfg.run.seed + 1, desc=desc, **sample)
    mean, std = float(ref.scores.mean()), max(float(ref.scores.std(correction=0)), 1e-6)
    if run.dist.is_main:
        status(f"reward model on the SFT policy's responses: mean {mean:.4g}, std {std:.4g}")
    return mean, std


def reward_scorer(rm: RewardModel):
    """The reward model as a PPO scorer: its score of each right-padded prompt + response."""
    return lambda res: rm(res.input_ids, res.attention_mask)


RUNNERS = {"sft": run_sft, "reward": run_reward, "dpo": run_dpo, "ppo": run_ppo}
FROZEN = ("method", "model", "data", "sft", "dpo")
"""Sections a resumed alignment run may not change."""


def frozen_sections(method: str) -> tuple[str, ...]:
    """FROZEN, and a PPO run's own section (other runs' checkpoints may predate it)."""
    return FROZEN + (("ppo",) if method == "ppo" else ())


def run_align(cfg: AlignConfig, resume: bool = False) -> dict[str, float]:
    """Run the configured method; returns the final dev metrics (also in RUN/eval.json)."""
    return RUNNERS[cfg.method](cfg, resume)


def load_reward_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[RewardModel, object]:
    """(reward model in eval mode, tokenizer) of a reward-model run or checkpoint dir."""
    from lmforge.models import Transformer
    from lmforge.models.presets import model_config_from_dict
    from lmforge.tokenizers import Tokenizer

    c = model_checkpoint(Path(path))
    raw = read_config(c)
    if not raw.get("reward_model"):
        raise LMForgeError(f"{c} is not a reward-model checkpoint")
    model = RewardModel(Transformer(model_config_from_dict(raw["model"])))
    load_weights(c, model)
    return model.to(device).eval(), Tokenizer.load(c)
