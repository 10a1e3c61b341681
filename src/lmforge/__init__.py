"""lmforge: pretrain, adapt and evaluate transformer language models of all three families."""

from lmforge.api import RunResult, evaluate, finetune, load, pretrain

__version__ = "0.1.0"
__all__ = ["RunResult", "evaluate", "finetune", "load", "pretrain"]
