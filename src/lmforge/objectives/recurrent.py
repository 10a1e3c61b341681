"""Shared machinery of the objectives that train over consecutive segments and carry a model's memory from one
segment to the next (Transformer-XL §3.2, XLNet §2.5): the stream loader, and one memory for training and one for
validation.

The training memory lives as long as the objective: step t + 1 attends to the hidden states step t cached. The
validation memory starts empty with every validation pass (the loader calls `reset_eval_memory` when the pass
begins) and is carried over the pass's consecutive segments, so validation is evaluation with memory. The model's
`training` flag tells which memory a `loss` call uses (the trainer validates with model.eval()).

A resumed run starts with empty memory: one segment scored without context, as at the start of training."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import Objective


@dataclass
class RecurrentOptions:
    """Validation settings of the recurrent objectives (the recipe's `objective.*` keys)."""

    eval_seq_len: int | None = None
    """Segment length of validation (None = train.seq_len). The Transformer-XL paper evaluates its WikiText-103 base
    model on segments of 64 tokens with 640 of memory."""
    eval_mem_len: int | None = None
    """Memory length of validation (None = model.mem_len; 0 = no memory)."""

    def __post_init__(self) -> None:
        if self.eval_seq_len is not None and self.eval_seq_len < 1:
            raise LMForgeError(f"objective.eval_seq_len must be positive or null, got {self.eval_seq_len}")
        if self.eval_mem_len is not None and self.eval_mem_len < 0:
            raise LMForgeError(f"objective.eval_mem_len must be >= 0 or null, got {self.eval_mem_len}")


class RecurrentObjective(Objective):
    """Base class: `make_loader` gives a StreamLoader; `memory` / `keep` read and write the memory that the model's
    mode selects."""

    Options = RecurrentOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        self._mems: dict[bool, list[Tensor] | None] = {True: None, False: None}  # by model.training

    def check_model(self, model_cfg) -> None:
        """LMForgeError unless the model has Transformer-XL relative attention."""
        if not model_cfg.position_scheme.recurrent:
            raise LMForgeError(
                f"objective '{self.name}' needs a model with model.position='xl' (e.g. --model.preset="
                f"{'xlnet' if self.name == 'xlnet' else 'transformer-xl'}-tiny), got position '{model_cfg.position}'"
            )

    def build_model(self, model_cfg) -> nn.Module:
        self.check_model(model_cfg)
        return super().build_model(model_cfg)

    def make_loader(self, data_dir, split: str, *, rank: int = 0, world_size: int = 1):
        from lmforge.data.corpus.stream import StreamLoader

        t = self.cfg.train
        train = split == "train"
        return StreamLoader(
            data_dir, split, seq_len=t.seq_len if train else (self.options.eval_seq_len or t.seq_len),
            batch_size=t.batch_size, rank=rank, world_size=world_size, seed=self.cfg.run.seed,
            on_eval_start=None if train else self.reset_eval_memory,
        )  # fmt: skip

    def reset_eval_memory(self) -> None:
        """Forget the validation memory (a validation pass begins)."""
        self._mems[False] = None

    def memory(self, model: nn.Module, batch_size: int) -> list[Tensor] | None:
        """The memory for the model's mode, None when there is none (or it was cached for another batch size)."""
        mems = self._mems[model.training]
        if mems is None or mems[0].shape[0] != batch_size:
            return None
        return mems

    def keep(self, model: nn.Module, mems: list[Tensor] | None) -> None:
        self._mems[model.training] = mems

    def mem_len(self, model: nn.Module) -> int | None:
        """Memory length to cache: the model's while training, objective.eval_mem_len (if set) in validation."""
        return None if model.training else self.options.eval_mem_len
