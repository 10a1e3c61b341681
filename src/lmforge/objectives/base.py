"""The objective interface: a batch transform in the data path plus a loss over model outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass
class LossOutput:
    loss: Tensor
    """Scalar mean loss over the predicted tokens of the batch."""
    n_tokens: int | Tensor
    """Number of predicted tokens the mean is over (a tensor where counting it on the host would wait for the
    device)."""
    metrics: dict[str, float | Tensor] = field(default_factory=dict)
    """The objective's own numbers (accuracies, loss terms), logged with the step; tensors stay on the device until
    the loop reads them on a log step."""


@dataclass
class NoOptions:
    """An objective without options."""


class Objective:
    """Base class. `transform` turns a packed token window batch into model inputs + targets (vectorised, run on
    the fly so masking is dynamic); `loss` runs the model and scores it.

    Subclasses set `Options` (a dataclass: the recipe's `objective.*` keys, validated by the config loader) and may
    override `build_model` (e.g. ELECTRA's generator + discriminator pair) and `make_loader` (e.g. sentence-pair
    sampling for NSP); the defaults are one `Transformer` and the packed-window `TokenLoader`."""

    name: str = ""
    Options: type = NoOptions
    language_model: bool = False
    """Scores every next token of the text, so validation also reports perplexity and bits per byte."""
    scores_labels: bool = False
    """The loss is the mean cross-entropy of the batch's `labels` (those not -100) and nothing else, so it compares
    with their unigram plateau (lmforge.eval.plateau; pretraining logs it as `val_plateau`)."""
    val_loss_fixed: bool = True
    """The validation loss scores the model against targets that stay put while it trains, so a rise of it means
    memorising or diverging (`Pretraining._note_rise` warns); False where the targets move with training."""

    def __init__(self, cfg, tokenizer) -> None:
        self.cfg = cfg
        self.options = cfg.objective.options
        self.tokenizer = tokenizer

    def build_model(self, model_cfg) -> nn.Module:
        from lmforge.models import Transformer

        return Transformer(model_cfg)

    def make_loader(self, data_dir, split: str, *, rank: int = 0, world_size: int = 1):
        """An iterable of this rank's (B, T + 1) token windows with state_dict()/load_state_dict(), and for
        validation eval_global(n): global batches (the same on every rank) with the slice of rows that is the
        rank's, so that validation does not depend on the number of processes."""
        from lmforge.data.corpus.loader import TokenLoader

        t = self.cfg.train
        return TokenLoader(
            data_dir, split, seq_len=t.seq_len, batch_size=t.batch_size, rank=rank, world_size=world_size,
            seed=self.cfg.run.seed,
        )  # fmt: skip

    @classmethod
    def packed_windows(cls, options) -> bool:
        """Whether training batches are the default loader's packed, independent windows (what
        train.seq_len_schedule cuts into shorter ones): objectives with their own loader (sentence pairs, document
        chunks, segments with memory) are not, unless they say so for their options."""
        return cls.make_loader is Objective.make_loader

    @classmethod
    def lengths(cls, options, seq_len: int) -> tuple[int, int | None]:
        """(input tokens, decoder target tokens or None) the model sees per train.seq_len-token window (expected
        values where they vary); encoder-decoder objectives whose inputs and targets differ in length override it."""
        return seq_len, None

    @classmethod
    def window_flops(cls, cfg) -> float:
        """Training FLOPs (forward + backward, `models/flops.py`) of one train.seq_len-token window of a pretraining
        Config as this objective feeds it to its model(s): the count behind MFU and equal-compute experiments.
        Objectives that run extra networks (ELECTRA's generator) or heads on part of the tokens override it."""
        from lmforge.models.flops import training_flops

        return training_flops(cfg.model, *cls.lengths(cfg.objective.options, cfg.train.seq_len))

    def transform(self, tokens: Tensor) -> dict[str, Tensor]:
        """tokens: (B, T + 1) packed token windows → a batch dict of tensors."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        raise NotImplementedError
