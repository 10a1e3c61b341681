"""Alignment runs from an AlignConfig: SFT, reward model or DPO → RUN/config.yaml, metrics.jsonl, eval.json and
checkpoints/step_N (an SFT or DPO policy loads with `lmforge.load(RUN)`, a reward model with
`load_reward_model(RUN)`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from lmforge.align.config import AlignConfig, align_to_dict, save_align_config
from lmforge.align.data import PreferencePair, read_instructions, read_preferences
from lmforge.align.datasets import instruction_set, preference_set
from lmforge.align.dpo import DPO, dpo_metrics, frozen_copy
from lmforge.align.reward import RewardModel, pair_batch, reward_accuracy, reward_loss
from lmforge.align.sft import choice_accuracy, encode_all, response_loss, sft_batches, sft_loss
from lmforge.align.templates import Conversation, add_role_tokens, get_template
from lmforge.align.train import cycle, initial_model, pick_device, save_run, seed_everything, train_loop
from lmforge.errors import LMForgeError
from lmforge.train import checkpoint as ckpt
from lmforge.train.metrics import MetricsLogger


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
    return instruction_set(d.sources, "train", d.max_train), instruction_set(d.sources, "dev", d.max_eval)


def preference_data(cfg: AlignConfig) -> tuple[list[PreferencePair], list[PreferencePair]]:
    d = cfg.data
    if d.train:
        train = read_preferences(d.train)[: d.max_train]
        return _split(train, read_preferences(d.dev)[: d.max_eval] if d.dev else None)
    kw = {}
    if d.sources[0] == "continuation":
        kw = dict(
            prompt_words=d.prompt_words, response_words=d.response_words, negatives=d.negatives,
            prompts_from=d.prompts_from, seed=cfg.run.seed,
        )  # fmt: skip
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


def _policy(cfg: AlignConfig, train_items: list):
    """(model on the device, tokenizer, template, pad id). model.max_len is capped at the model's max_seq_len
    when its positions are learned (they end there)."""
    m = cfg.model
    model, tok = initial_model(m.init, lambda: _texts(train_items), m.tokenizer, m.vocab_size)
    if model.config.position == "learned" and m.max_len > model.config.max_seq_len:
        m.max_len = model.config.max_seq_len
    if m.template == "chat" and m.role_tokens:
        add_role_tokens(model, tok)
    pad = tok.pad_id if tok.pad_id is not None else tok.eos_id
    return model.to(pick_device(cfg.train.device)), tok, get_template(m.template, tok), pad


class Run:
    """The shared frame of an alignment run: run dir checks, config, metrics log, final checkpoint."""

    def __init__(self, cfg: AlignConfig) -> None:
        self.cfg, self.dir = cfg, Path(cfg.run.dir)
        if (self.dir / ckpt.CHECKPOINTS_DIR).is_dir() and any((self.dir / ckpt.CHECKPOINTS_DIR).iterdir()):
            raise LMForgeError(f"run dir {self.dir} already has checkpoints: choose another --run.dir")
        seed_everything(cfg.run.seed)

    def start(self) -> MetricsLogger:
        save_align_config(self.cfg, self.dir / ckpt.CONFIG_FILE)
        return MetricsLogger(self.dir, resume_step=0)

    def finish(self, model, tok, metrics: dict[str, float], extra: dict | None = None) -> dict[str, float]:
        config = {"model": dataclasses.asdict(_core(model).config), "align": align_to_dict(self.cfg), **(extra or {})}
        save_run(self.dir, self.cfg.train.max_steps, model, config, tok)
        (self.dir / "eval.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        return metrics


def _core(model):
    return model.backbone if isinstance(model, RewardModel) else model


def run_sft(cfg: AlignConfig) -> dict[str, float]:
    """Instruction tuning; dev metrics: response NLL and, for closed questions, choice accuracy."""
    run = Run(cfg)
    train, dev = instruction_data(cfg)
    model, tok, template, pad = _policy(cfg, train)
    device = next(model.parameters()).device
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

    batches = (
        {k: v.to(device) for k, v in b.items()}
        for b in sft_batches(examples, cfg.train.batch_size, pad, cfg.run.seed, pack_len)
    )
    log = run.start()
    try:
        metrics = train_loop(model, lambda b: sft_loss(model, b), batches, cfg.train, evaluate=evaluate, log=log)
    finally:
        log.close()
    return run.finish(model, tok, metrics)


def _pair_batches(pairs, template, pad, cfg: AlignConfig, device):
    for chunk in cycle(pairs, cfg.train.batch_size, cfg.run.seed):
        yield {k: v.to(device) for k, v in pair_batch(chunk, template, pad, cfg.model.max_len).items()}


def run_reward(cfg: AlignConfig) -> dict[str, float]:
    """Reward model on preference pairs; dev metrics: pairwise accuracy and mean reward margin."""
    run = Run(cfg)
    train, dev = preference_data(cfg)
    backbone, tok, template, pad = _policy(cfg, train)
    device = next(backbone.parameters()).device
    model = RewardModel(backbone).to(device)
    log = run.start()
    try:
        metrics = train_loop(
            model, lambda b: reward_loss(model, b), _pair_batches(train, template, pad, cfg, device), cfg.train,
            evaluate=lambda: reward_accuracy(model, dev, template, pad, cfg.model.max_len), log=log,
        )  # fmt: skip
    finally:
        log.close()
    return run.finish(model, tok, metrics, {"reward_model": True})


def run_dpo(cfg: AlignConfig) -> dict[str, float]:
    """DPO against a frozen reference; dev metrics: implicit-reward margin/accuracy and log-prob margin."""
    run = Run(cfg)
    train, dev = preference_data(cfg)
    policy, tok, template, pad = _policy(cfg, train)
    device = next(policy.parameters()).device
    if cfg.dpo.reference:
        from lmforge.api import load

        reference = frozen_copy(load(cfg.dpo.reference)[0]).to(device)
        if reference.config.vocab_size != policy.config.vocab_size:
            raise LMForgeError(
                f"dpo.reference has vocab_size {reference.config.vocab_size}, the policy {policy.config.vocab_size}"
            )
    else:
        reference = frozen_copy(policy)
    dpo = DPO(reference, cfg.dpo.beta, cfg.dpo.label_smoothing)
    L = cfg.model.max_len
    log = run.start()
    try:
        metrics = train_loop(
            policy, lambda b: dpo.loss(policy, b), _pair_batches(train, template, pad, cfg, device), cfg.train,
            evaluate=lambda: dpo_metrics(policy, reference, dev, template, pad, L, cfg.dpo.beta), log=log,
        )  # fmt: skip
    finally:
        log.close()
    return run.finish(policy, tok, metrics)


RUNNERS = {"sft": run_sft, "reward": run_reward, "dpo": run_dpo}


def run_align(cfg: AlignConfig) -> dict[str, float]:
    """Run the configured method; returns the final dev metrics (also in RUN/eval.json)."""
    return RUNNERS[cfg.method](cfg)


def load_reward_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[RewardModel, object]:
    """(reward model in eval mode, tokenizer) of a reward-model run or checkpoint dir."""
    from lmforge.api import model_config_from_dict
    from lmforge.models import Transformer
    from lmforge.tokenizers import Tokenizer

    c = ckpt.latest_checkpoint(Path(path))
    raw = ckpt.read_config(c)
    if not raw.get("reward_model"):
        raise LMForgeError(f"{c} is not a reward-model checkpoint")
    model = RewardModel(Transformer(model_config_from_dict(raw["model"])))
    ckpt.load_weights(c, model)
    return model.to(device).eval(), Tokenizer.load(c)
