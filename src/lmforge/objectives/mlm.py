"""Masked language modelling (Devlin et al. 2019 §3.1, App. A.1): predict 15% of the tokens from their context,
with 80% of them replaced by [MASK], 10% by a random token and 10% left unchanged."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.lm_head import cross_entropy
from lmforge.models.wrappers import unwrap_model
from lmforge.objectives import masking as M
from lmforge.objectives.base import LossOutput, Objective
from lmforge.registry import OBJECTIVES

EVAL_SALT = 0x5EED_E7A1  # validation masks are static, keyed apart from static training masks


@dataclass
class MLMOptions:
    """Options of the masked-LM objectives (the recipe's `objective.*` keys)."""

    mask_rate: float = 0.15
    """Fraction of the (non-special) tokens selected for prediction."""
    mask_frac: float = 0.8
    """Of the selected tokens, the fraction replaced by [MASK]."""
    random_frac: float = 0.1
    """Of the selected tokens, the fraction replaced by a random (non-special) token; the rest stay unchanged."""
    eval_mask_rate: float | None = None
    """Selection rate of the (static) validation masks; None = mask_rate. A run trained at a higher rate (30-40%:
    Wettig et al. 2023) is then scored on the same predictions as one trained at BERT's 15%."""
    static: bool = False
    """Static masks (RoBERTa §4.1's "static" arm): each example is masked in dupe_factor fixed ways, chosen in
    advance as BERT's create_pretraining_data did, instead of anew every time it is seen."""
    dupe_factor: int | None = None
    """With static: the number of masked copies of each example (BERT's create_pretraining_data --dupe_factor);
    epoch e uses copy e mod dupe_factor, so over 40 epochs each of 10 copies is seen 4 times, as in RoBERTa §4.1.
    None = 10 (BERT's and RoBERTa's); 1 = one mask for the whole run."""
    whole_word: bool = False
    """Select whole words: all sub-word tokens of a word are predicted together."""
    ngram: int = 0
    """ALBERT's n-gram masking (Lan et al. §4.1; 3 there): select runs of 1..ngram whole words, P(n) ∝ 1/n, with
    the 80/10/10 replacement per token; 0 = single tokens (or words, with whole_word)."""

    def __post_init__(self) -> None:
        check_rates(self)
        if self.ngram < 0:
            raise LMForgeError(f"objective.ngram must be >= 0, got {self.ngram}")
        if self.dupe_factor is not None:
            if self.dupe_factor < 1:
                raise LMForgeError(f"objective.dupe_factor must be >= 1, got {self.dupe_factor}")
            if not self.static:
                raise LMForgeError(
                    "objective.dupe_factor counts the copies of static masks: set objective.static=true with it"
                )


BERT_DUPE_FACTOR = 10
"""create_pretraining_data.py's default --dupe_factor, the copies behind RoBERTa §4.1's static masks."""


def static_copies(o) -> int:
    """How many masked copies of each example a run's static masks have: 0 for dynamic masks."""
    if not getattr(o, "static", False):
        return 0
    if not hasattr(o, "dupe_factor"):  # objectives whose options have no dupe_factor: one mask per example
        return 1
    return BERT_DUPE_FACTOR if o.dupe_factor is None else o.dupe_factor


def check_rates(o) -> None:
    """LMForgeError for rates outside [0, 1]."""
    for name in ("mask_rate", "eval_mask_rate"):
        rate = getattr(o, name, None)
        if rate is not None and not 0.0 < rate < 1.0:
            raise LMForgeError(f"objective.{name} must be between 0 and 1 (exclusive), got {rate}")
    for name in ("mask_frac", "random_frac"):
        if not 0.0 <= getattr(o, name) <= 1.0:
            raise LMForgeError(f"objective.{name} must be between 0 and 1, got {getattr(o, name)}")
    if o.mask_frac + o.random_frac > 1.0 + 1e-9:
        raise LMForgeError(
            f"objective.mask_frac + objective.random_frac must be at most 1, got {o.mask_frac} + {o.random_frac}"
        )


class MaskedObjective(Objective):
    """Shared machinery of the encoder objectives: vocabulary tables, [CLS] ... [SEP] framing, token selection
    (overridden by SpanBERT), the 80/10/10 corruption and the MLM loss with the LM head run only on the
    selected positions."""

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        if tokenizer.mask_id is None:
            raise LMForgeError(
                f"objective '{cfg.objective.name}' needs a tokenizer with a mask token "
                "(data.tokenizer_family: bert or bart)"
            )
        self.mask_id = tokenizer.mask_id
        self.cls_id = tokenizer.cls_id if tokenizer.cls_id is not None else tokenizer.bos_id
        self.sep_id = tokenizer.sep_id if tokenizer.sep_id is not None else tokenizer.eos_id
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id not in (tokenizer.eos_id, None) else None
        special = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        special[torch.tensor(M.special_ids(tokenizer), dtype=torch.long)] = True
        self.special = special  # (V,) never selected, never drawn
        self.random_ids = torch.nonzero(~special).flatten()  # (V',) ids a random replacement is drawn from
        self.word_table = M.word_start_table(tokenizer) if self._needs_words() else None
        self.seed = cfg.run.seed
        self.copies = static_copies(self.options)
        self.epochs: M.EpochNoting | None = None  # the training loader, where the copy follows its epoch
        if self.copies > 1:
            self.make_loader = self._noting_epochs(self.make_loader)

    def _noting_epochs(self, make):
        """`make_loader` whose training loader notes each batch's epoch for `transform` (static copies)."""

        def make_loader(data_dir, split: str, **kw):
            loader = make(data_dir, split, **kw)
            if split != "train":
                return loader
            self.epochs = M.EpochNoting(loader)
            return self.epochs

        return make_loader

    def _needs_words(self) -> bool:
        return bool(getattr(self.options, "whole_word", False) or getattr(self.options, "ngram", 0))

    # --- data path ------------------------------------------------------------------------------------------

    def inputs(self, tokens) -> dict[str, Tensor]:
        """Model inputs before masking: packed windows are framed; loaders that build examples (sentence pairs)
        yield ready dicts."""
        if isinstance(tokens, dict):
            return dict(tokens)
        return M.frame(tokens, self.cls_id, self.sep_id, self.pad_id)

    def transform(self, tokens) -> dict[str, Tensor]:
        batch = self.inputs(tokens)
        if not self.copies:
            return self.mask(batch, M.Draws())
        # BERT's duplicated data: each epoch the next copy; batches made outside a training loader use copy 0.
        copy = (self.epochs.epoch_out if self.epochs is not None else 0) % self.copies
        return self.mask(batch, M.Draws.static(batch["input_ids"], self.seed, copy))

    def eval_transform(self, tokens) -> dict[str, Tensor]:
        """Validation batches get static masks, so every evaluation scores the same predictions (at
        eval_mask_rate where it is set)."""
        batch = self.inputs(tokens)
        rate, trained = getattr(self.options, "eval_mask_rate", None), self.options
        if rate is not None:
            self.options = dataclasses.replace(trained, mask_rate=rate)
        try:
            return self.mask(batch, M.Draws.static(batch["input_ids"], self.seed ^ EVAL_SALT))
        finally:
            self.options = trained

    def candidates(self, batch: dict[str, Tensor]) -> Tensor:
        """(B, L) bool: real, non-special tokens."""
        ids = batch["input_ids"]
        ok = ~self.special[ids]
        if "attention_mask" in batch:
            ok &= batch["attention_mask"].bool()
        return ok

    def select(self, batch: dict[str, Tensor], cand: Tensor, draws: M.Draws) -> tuple[Tensor, Tensor | None]:
        """(selected (B, L) bool, span ids or None): BERT's token-level or whole-word selection, or ALBERT's
        n-grams of whole words."""
        starts = M.word_starts(batch["input_ids"], cand, self.word_table)
        n = getattr(self.options, "ngram", 0)
        if n:
            selected, _ = M.select_spans(cand, starts, self.options.mask_rate, M.ngram_length_probs(n), draws)
            return selected, None  # 80/10/10 decided per token, as for single tokens
        return M.select_words(cand, starts, self.options.mask_rate, draws), None

    def mask(self, batch: dict[str, Tensor], draws: M.Draws) -> dict[str, Tensor]:
        """Select and corrupt: input_ids become the corrupted tokens, labels the originals (IGNORE elsewhere)."""
        cand = self.candidates(batch)
        selected, groups = self.select(batch, cand, draws)
        o = self.options
        batch["input_ids"], batch["labels"] = M.corrupt(
            batch["input_ids"], selected, mask_id=self.mask_id, random_ids=self.random_ids,
            mask_frac=o.mask_frac, random_frac=o.random_frac, draws=draws, groups=groups,
        )  # fmt: skip
        batch["mlm_index"] = M.labelled_index(batch["labels"])
        return self.span_targets(batch, groups)

    def span_targets(self, batch: dict[str, Tensor], groups: Tensor | None) -> dict[str, Tensor]:
        """Extra targets from the selected spans (SpanBERT's boundary objective); none here."""
        return batch

    # --- loss -----------------------------------------------------------------------------------------------

    @classmethod
    def window_flops(cls, cfg) -> float:
        """The encoder on every token, the LM head only on the mask_rate share it predicts (`mlm_loss`)."""
        from lmforge.models.flops import lm_head_weights

        unscored = 1.0 - cfg.objective.options.mask_rate
        return super().window_flops(cfg) - 6.0 * lm_head_weights(cfg.model) * cfg.train.seq_len * unscored

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mlm, n, acc, out = mlm_loss(model, batch)
        # Heads this loss does not use (a BERT preset's pooler, say) still join the graph with a zero weight: DDP
        # (find_unused_parameters=False) expects a gradient for every parameter.
        for extra in (out.pooled, out.nsp_logits, out.rtd_logits):
            if extra is not None:
                mlm = mlm + 0.0 * extra.sum()
        return LossOutput(mlm, n, {"mlm_acc": acc})


def mlm_loss(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, object]:
    """(mean cross-entropy over the labelled positions, their count, accuracy (tensors on the device), model output).

    The model runs without its LM head; the head then sees only the selected positions (≈15% of the tokens),
    which saves most of the vocabulary projection. The positions come as `mlm_index` from the transform when it
    made the batch (no device sync), else from the labels."""
    out = model(
        batch["input_ids"], batch.get("attention_mask"), token_type_ids=batch.get("token_type_ids"),
        return_logits=False,
    )  # fmt: skip
    labels = batch["labels"]
    index = M.labelled_index(labels, batch)
    h = out.last_hidden_state.flatten(0, 1).index_select(0, index)  # (N, d_model)
    logits = unwrap_model(model).logits(h)  # (N, V)
    target = labels.flatten().index_select(0, index)
    if index.numel() == 0:  # nothing selected (e.g. rows of special tokens only): a zero loss that keeps the graph
        zero = logits.sum() * 0.0
        return zero, zero.detach(), zero.detach(), out
    loss = cross_entropy(logits, target)
    acc = (logits.argmax(-1) == target).float().mean()
    return loss, torch.tensor(index.numel()), acc, out


@OBJECTIVES.register("mlm")
class MaskedLM(MaskedObjective):
    """BERT's masked LM alone (no NSP) on [CLS] ... [SEP]-framed packed windows."""

    name = "mlm"
    scores_labels = True
    Options = MLMOptions
