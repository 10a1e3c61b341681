"""The task interface: reader output (`Dataset`) → input transformation (`features`) → head (`make_head`) →
`loss` → `evaluate` (metrics). One file per task type, one `TASKS` registration each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.adapt.adamix import symmetric_kl
from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.tasks.inputs import Format, add_task_tokens, collate, eval_batches, make_framer, resolve_format
from lmforge.tasks.model import TaskModel, TaskOutput
from lmforge.tasks.scoring import require_metric_packages, score


@dataclass
class TaskOptions:
    """Options every task type has (the `task.*` keys of a fine-tuning recipe)."""

    format: Format = "auto"
    """Input transformation: gpt, bert, encoder_mean, bart, prompt (classification), or auto (by the model's arch;
    see tasks/inputs.py)."""
    max_len: int = 128
    """Longest model input in tokens; longer texts are truncated (longest first)."""
    overlong: Literal["error", "truncate"] = "truncate"
    """An input longer than max_len: cut it (the run warns how many training examples were cut) or stop with an
    error naming the example. (Span QA cuts long contexts into overlapping windows instead.)"""
    head_dropout: float = 0.1
    lm_coef: float = 0.5
    """GPT-1 §3.3 auxiliary LM objective: L3 = L2 + lm_coef·L1 over the task inputs ("gpt" format only;
    0 = the "w/o aux LM" ablation)."""
    metrics: list[str] | None = None
    """Metrics to report (None = the task type's defaults; see tasks/scoring.py)."""


class Task:
    """Base class of the task types. Subclasses set `Options`, `default_metrics` and implement `make_head`,
    `features`, `loss` and `predict` (or override `evaluate`)."""

    name: str = ""
    Options: type = TaskOptions
    default_metrics: tuple[str, ...] = ("accuracy",)
    needs_labels: bool = False
    """Whether the task classifies into a label set (taken from the train split, saved with the run)."""
    prompt_format: bool = False
    """Whether the task runs in format "prompt" (label words scored by the LM head at a template's mask)."""

    def __init__(self, options: Any, tokenizer, labels: list[str] | None = None) -> None:
        self.options, self.tokenizer = options, tokenizer
        self.labels = labels
        require_metric_packages(self.metric_names)  # now, not after training
        self.n_truncated = 0
        """Examples whose input was cut to max_len so far (task.overlong=truncate)."""
        if self.needs_labels and not labels:
            raise LMForgeError(f"task '{self.name}' needs a label set, but the data has none")
        self.fmt: str | None = None

    # --- construction ---------------------------------------------------------------------------------------

    @classmethod
    def label_set(cls, train: Dataset) -> list[str] | None:
        """The label names of a training split (its own list, else the sorted distinct labels)."""
        if not cls.needs_labels:
            return None
        if train.labels:
            return [str(x) for x in train.labels]
        found = {str(e.label) for e in train.examples if e.label is not None}
        if not found:
            raise LMForgeError(f"{train.source or 'training data'}: no labelled examples")
        return sorted(found)

    @property
    def metric_names(self) -> list[str]:
        return list(self.options.metrics or self.default_metrics)

    @property
    def main_metric(self) -> str:
        return self.metric_names[0]

    def build(self, backbone: nn.Module) -> TaskModel:
        """Resolve the format against the backbone, add the GPT task tokens if needed, attach the head."""
        cfg = backbone.config
        self.fmt = resolve_format(self.options.format, cfg.arch, self.tokenizer)
        if self.fmt == "prompt" and not self.prompt_format:
            raise LMForgeError(f"task.format=prompt: task type '{self.name}' has no prompt form (classification has)")
        if self.fmt == "gpt":
            add_task_tokens(backbone, self.tokenizer)
        self.framer = make_framer(self.fmt, self.tokenizer, cfg.type_vocab_size)
        self.max_len = self.options.max_len
        if cfg.max_positions is not None:  # learned positions end at max_seq_len (bart: the decoder start takes one)
            self.max_len = min(self.max_len, cfg.max_positions - (1 if self.fmt == "bart" else 0))
        self.arch = cfg.arch
        return TaskModel(backbone, self.make_head(cfg), self.fmt)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return next((i for i in (tok.pad_id, tok.eos_id) if i is not None), 0)

    def make_head(self, cfg) -> nn.Module | None:
        """The head for a backbone of ModelConfig `cfg` (None: the backbone's own LM head does the task)."""
        raise NotImplementedError

    # --- data ---------------------------------------------------------------------------------------------

    def features(self, dataset: Dataset, train: bool = False) -> list[dict]:
        """Input transformation: one feature dict per example (span QA: per context window)."""
        raise NotImplementedError

    def label_index(self, label: Any, where: str) -> int:
        key = str(label)
        if key not in self._label_ids:
            raise LMForgeError(f"{where}: label {label!r} is not in the label set {self.labels}")
        return self._label_ids[key]

    @property
    def _label_ids(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.labels or [])}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def check_length(self, n_tokens: int, budget: int, where: str) -> bool:
        """Whether an input whose texts have n_tokens must be cut to fit budget (task.overlong=truncate; the caller
        cuts it and counts the example in n_truncated); with task.overlong=error such an input is refused."""
        if n_tokens <= budget:
            return False
        if getattr(self.options, "overlong", "truncate") == "error":
            raise LMForgeError(
                f"{where}: its text has {n_tokens} tokens, more than the {budget} that task.max_len={self.max_len} "
                "leaves (raise task.max_len, or set task.overlong=truncate to cut it)"
            )
        return True

    # --- training and evaluation ----------------------------------------------------------------------------

    def loss(self, model: TaskModel, batch: dict[str, Tensor]) -> LossOutput:
        """The training loss of a batch (what the fine-tuning loop minimises)."""
        return self.scored(model, batch)[0]

    def scored(self, model: TaskModel, batch: dict[str, Tensor]) -> tuple[LossOutput, Any]:
        """(the loss, this pass's outputs as `divergence` compares them)."""
        raise NotImplementedError

    def predict(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list:
        """Predictions of one batch (label indices, floats, ...); `feats` are its feature dicts."""
        raise NotImplementedError

    def gold(self, dataset: Dataset) -> list:
        """The references `predict`'s outputs are scored against."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model: TaskModel, dataset: Dataset, batch_size: int = 64) -> dict[str, float]:
        """The task's metrics on a labelled split."""
        preds = self.predict_all(model, dataset, batch_size)
        return score(self.metric_names, preds, self.gold(dataset))

    def baselines(self, dataset: Dataset) -> dict[str, dict[str, float]]:
        """Trivial systems scored with the task's metrics on `dataset` (name → metrics), printed beside the
        fine-tuned model's scores; none by default."""
        return {}

    def probabilities(self, model: TaskModel, batch: dict[str, Tensor], feats: list[dict]) -> list[list[float]]:
        """Each example's probability of each label (in `labels`' order), for the tasks that choose a label
        (`chooses_label`)."""
        raise NotImplementedError

    chooses_label: bool = False
    """Whether `probabilities` gives a distribution over `labels` (what an ensemble of runs averages)."""

    @torch.no_grad()
    def predict_all(self, model: TaskModel, dataset: Dataset, batch_size: int = 64, fn=None) -> list:
        """`predict` (or `fn`, with its arguments) over the dataset's examples in batches, in eval mode."""
        fn = fn or self.predict
        training = model.training
        model.eval()
        device = next(model.parameters()).device
        from lmforge.progress import progress

        feats = self.features(dataset)
        preds: list = [None] * len(feats)
        try:
            with progress(total=len(feats), desc="evaluating", unit="ex") as bar:
                for idx, chunk in eval_batches(feats, batch_size):  # longest first; back in order by position
                    batch = {k: v.to(device) for k, v in collate(chunk, self.pad_id).items()}
                    for i, p in zip(idx, fn(model, batch, chunk), strict=True):
                        preds[i] = p
                    bar.update(len(chunk))
        finally:
            model.train(training)
        return preds

    def aux_lm_loss(self, model: TaskModel, out: TaskOutput, batch: dict[str, Tensor]) -> Tensor | None:
        """GPT-1 L1 over the task inputs (next-token NLL on real tokens), or None when it does not apply."""
        if self.fmt != "gpt" or self.options.lm_coef == 0 or not model.config.lm_head:
            return None
        ids = batch["input_ids"].flatten(0, -2) if batch["input_ids"].dim() == 3 else batch["input_ids"]
        logits = model.backbone.logits(out.hidden[:, :-1])  # (B·N, T-1, V)
        targets = ids[:, 1:].masked_fill(out.mask[:, 1:] == 0, -100)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)

    def with_aux(self, task_loss: Tensor, model: TaskModel, out: TaskOutput, batch: dict[str, Tensor]) -> LossOutput:
        """L3 = L2 + λ·L1 (GPT-1 §3.3); the parts are reported as metrics, left on the device (the loop reads them on
        its log steps: reading them every step would make the host wait for the device at each one)."""
        n = batch["input_ids"].shape[0]
        total, metrics = task_loss, {"task_loss": task_loss.detach()}
        lm = self.aux_lm_loss(model, out, batch)
        if lm is not None:
            total = total + self.options.lm_coef * lm
            metrics["lm_loss"] = lm.detach()
        return LossOutput(total, n, metrics)

    # --- two passes compared (AdaMix consistency, Wang et al. 2022 §3.2: adapt.adamix.with_consistency) ---------

    def outputs(self, model: TaskModel, batch: dict[str, Tensor]) -> TaskOutput:
        """One more pass's outputs, as `scored` returns them."""
        return model(batch)

    def divergence(self, a: TaskOutput, b: TaskOutput, batch: dict[str, Tensor]) -> Tensor:
        """How far two passes' head outputs are apart: the symmetric KL of their distributions over the last axis
        (classes, choices), averaged over rows; a one-unit output (regression) is a Gaussian mean, whose symmetric
        KL at unit variance is half the squared difference."""
        la, lb = a.logits, b.logits
        if la.shape[-1] == 1:
            return 0.5 * (la.float() - lb.float()).pow(2).mean()
        return symmetric_kl(la.flatten(0, -2), lb.flatten(0, -2))
