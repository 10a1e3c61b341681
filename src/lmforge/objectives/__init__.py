"""Pretraining objectives: one file each, registered in OBJECTIVES."""

from lmforge.objectives import bart, causal_lm, electra, mlm, mtp, nsp, prefix_lm, spanbert, t5, unilm  # noqa: F401
from lmforge.objectives.base import LossOutput, Objective
from lmforge.registry import OBJECTIVES

__all__ = ["OBJECTIVES", "LossOutput", "Objective"]
