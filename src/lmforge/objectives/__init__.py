"""Pretraining objectives: one file each, registered in OBJECTIVES."""

from lmforge.objectives import (  # noqa: F401  (registers)
    bart,
    causal_lm,
    electra,
    mae_lm,
    mlm,
    mtp,
    nsp,
    prefix_lm,
    spanbert,
    t5,
    transformer_xl,
    unilm,
    xlnet,
)
from lmforge.objectives.base import LossOutput, Objective
from lmforge.registry import OBJECTIVES

__all__ = ["OBJECTIVES", "LossOutput", "Objective"]
