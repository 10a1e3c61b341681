"""Sequence-to-sequence generation (summarisation, translation): source text → target text, trained with the
model's own LM head (teacher forcing), evaluated by beam search and ROUGE / BLEU.

Encoder-decoders (BART, T5) encode `[BOS] source [EOS]` (as their tokenizers frame it) and decode
`start target` → `target EOS`. Decoder-only models read `source target EOS` and are trained on the target tokens
only; a GPT-2-style prompt in `template` (e.g. "{text}\\nTL;DR:", Radford et al. 2019 §3.6) ends the source.
`Example.text` is the source, `target` the reference."""

from __future__ import annotations

import string
from dataclasses import dataclass

import torch
from torch import Tensor

from lmforge.adapt.adamix import symmetric_kl
from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.registry import TASKS
from lmforge.tasks.base import Task, TaskOptions
from lmforge.tasks.model import TaskModel


@dataclass
class Seq2SeqOptions(TaskOptions):
    max_len: int = 512
    """Longest source (decoder-only: source + target) in tokens."""
    template: str = "{text}"
    """Source text built from the example's fields: {text}, {text_pair}, {context}."""
    target_prefix: str = " "
    """Decoder-only models: text put before the target so it tokenizes as a continuation (byte-level BPE)."""
    max_target_len: int = 128
    num_beams: int = 4
    length_penalty: float = 1.0
    max_new_tokens: int = 128


def render(template: str, ex: Example) -> str:
    """The template with {text}, {text_pair}, {context} filled from an example."""
    fields = {"text": ex.text, "text_pair": ex.text_pair or "", "context": ex.context or ""}
    try:
        return template.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise LMForgeError(f"task.template {template!r}: {e} (fields: {', '.join(fields)})") from None


def template_tail(template: str) -> str:
    """The literal text after the template's last field (a prompt like "\\nTL;DR:" that truncation must keep)."""
    parts = list(string.Formatter().parse(template))
    return parts[-1][0] if parts and parts[-1][1] is None else ""


def fit(ids: list[int], budget: int, keep_end: int) -> list[int]:
    """Cut ids to budget tokens, dropping from the middle so the last keep_end tokens (the prompt) survive."""
    if len(ids) <= budget:
        return ids
    keep_end = min(keep_end, budget)
    return ids[: budget - keep_end] + (ids[len(ids) - keep_end :] if keep_end else [])


@TASKS.register("seq2seq")
class Seq2Seq(Task):
    name = "seq2seq"
    Options = Seq2SeqOptions
    default_metrics = ("rouge1", "rouge2", "rougeL")

    def build(self, backbone) -> TaskModel:
        cfg = backbone.config
        if not cfg.has_decoder or not cfg.lm_head:
            raise LMForgeError(f"task '{self.name}' needs a decoder or encoder-decoder model with an LM head")
        self.fmt, self.arch, self.max_len = "text", cfg.arch, self.options.max_len
        self.decoder_only = cfg.is_decoder
        if cfg.max_positions is not None:
            self.max_len = min(self.max_len, cfg.max_positions)
        self.start_id = cfg.decoder_start_id
        self._tail = len(self.encode(template_tail(self.options.template)))
        return TaskModel(backbone, None, "text")

    def make_head(self, cfg) -> None:
        return None

    @property
    def eos(self) -> list[int]:
        return [self.tokenizer.eos_id] if self.tokenizer.eos_id is not None else []

    def source_ids(self, ex: Example, budget: int, where: str | None = None) -> list[int]:
        ids = self.encode(render(self.options.template, ex))
        if self.decoder_only:
            self.n_truncated += self.check_length(len(ids), budget, where or f"example {ex.id}")
            return fit(ids, budget, self._tail)
        bos = [self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else []
        budget -= len(bos) + len(self.eos)
        self.n_truncated += self.check_length(len(ids), budget, where or f"example {ex.id}")
        return bos + fit(ids, budget, self._tail) + self.eos

    def target_text(self, ex: Example, where: str) -> str:
        if ex.target is None:
            raise LMForgeError(f"{where}: example has no target text")
        return ex.target

    def target_ids(self, text: str) -> list[int]:
        prefix = self.options.target_prefix if self.decoder_only else ""
        return self.encode(prefix + text)[: self.options.max_target_len - len(self.eos)] + self.eos

    def pair_feature(self, src: list[int], tgt: list[int]) -> dict:
        """Teacher-forcing inputs for a source and a target ending in EOS: `labels` hold the target at the
        positions the LM head predicts it from (decoder-only: shifted inside `token_logprobs`)."""
        if self.decoder_only:
            return {"input_ids": src + tgt, "labels": [-100] * len(src) + tgt}
        return {"input_ids": src, "decoder_input_ids": [self.start_id] + tgt[:-1], "labels": tgt}

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        feats = []
        for i, ex in enumerate(dataset.examples):
            where = f"{dataset.source or 'data'} example {ex.id or i}"
            tgt = self.target_ids(self.target_text(ex, where)) if (train or ex.target is not None) else self.eos
            budget = self.max_len - (len(tgt) if self.decoder_only else 0)
            src = self.source_ids(ex, budget, where)
            feats.append({**self.pair_feature(src, tgt), "_prompt": src})
        return feats

    def prompt_features(self, dataset: Dataset, target_len: int) -> list[dict]:
        """Features of the sources alone, for scoring or generation (decoder-only sources leave room for
        `target_len` target tokens)."""
        where = dataset.source or "data"
        budget = self.max_len - (target_len if self.decoder_only else 0)
        return [{"input_ids": (src := self.source_ids(ex, budget, f"{where} example {ex.id or i}")), "_prompt": src}
                for i, ex in enumerate(dataset.examples)]  # fmt: skip

    def target_logprobs(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(log-softmax over the vocabulary where each label token is predicted (B, T', V), labels (B, T'))."""
        out = model(batch)
        labels = batch["labels"]
        hidden = out.hidden
        if self.decoder_only:  # position t predicts token t + 1
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        return model.backbone.logits(hidden).float().log_softmax(-1), labels

    def token_logprobs(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(log P of each label token, mask of label tokens), both (B, T')."""
        logp, labels = self.target_logprobs(model, batch)
        mask = labels != -100
        picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return picked * mask, mask

    def scored(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[LossOutput, tuple[Tensor, Tensor]]:
        logp, labels = self.target_logprobs(model, batch)
        mask = labels != -100
        n = mask.sum()  # a tensor: counting on the host would wait for the device at every step
        picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
        loss = -picked.sum() / n.clamp(min=1)
        return LossOutput(loss, n, {"task_loss": loss.detach()}), (logp, mask)

    def outputs(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """One more pass's (next-token log-probabilities (B, T', V), label-token mask (B, T'))."""
        logp, labels = self.target_logprobs(model, batch)
        return logp, labels != -100

    def divergence(self, a: tuple[Tensor, Tensor], b: tuple[Tensor, Tensor], batch: dict[str, Tensor]) -> Tensor:
        """AdaMix §3.2 for generation: the symmetric KL of two passes' next-token distributions at the label
        tokens."""
        mask = a[1]
        return symmetric_kl(a[0][mask], b[0][mask])

    def generate_batch(self, model: TaskModel, feats: list[dict], num_beams: int, max_new: int) -> list[str]:
        """Decoded continuations of the features' prompts (beam search when num_beams > 1)."""
        from lmforge.models.generate import generate

        device = next(model.parameters()).device
        prompts = [f["_prompt"] for f in feats]
        T, pad = max(len(p) for p in prompts), self.pad_id
        left = self.decoder_only  # decoder prompts are left-padded, encoder sources right-padded
        ids = [[pad] * (T - len(p)) + p if left else p + [pad] * (T - len(p)) for p in prompts]
        mask = [[0] * (T - len(p)) + [1] * len(p) if left else [1] * len(p) + [0] * (T - len(p)) for p in prompts]
        out = generate(
            model.backbone, torch.tensor(ids, device=device), torch.tensor(mask, device=device),
            max_new_tokens=max_new, temperature=0.0, eos_id=self.tokenizer.eos_id, num_beams=num_beams,
            length_penalty=self.options.length_penalty,
        )  # fmt: skip
        new = out[:, T:] if left else out[:, 1:]
        texts = []
        for row in new.tolist():
            if self.tokenizer.eos_id in row:
                row = row[: row.index(self.tokenizer.eos_id)]
            texts.append(self.tokenizer.decode(row).strip())
        return texts

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        o = self.options
        return self.generate_batch(model, feats, o.num_beams, o.max_new_tokens)

    def gold(self, dataset: Dataset) -> list:
        return [ex.target or "" for ex in dataset.examples]

    def baselines(self, dataset: Dataset) -> dict[str, dict[str, float]]:
        """copy-the-input: the source text as the prediction, the floor a summariser or translator must clear (for
        translation it credits the names and numbers a translation keeps as they are)."""
        return {"copy-the-input": copy_baseline(dataset, self.metric_names)}


def copy_baseline(dataset: Dataset, metric_names: list[str]) -> dict[str, float]:
    """The metrics of predicting each example's source text (`Example.text`) unchanged."""
    from lmforge.tasks.scoring import score

    return score(metric_names, [ex.text for ex in dataset.examples], [ex.target or "" for ex in dataset.examples])
