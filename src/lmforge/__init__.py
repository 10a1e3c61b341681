"""lmforge: pretrain, adapt and evaluate transformer language models of all three families."""

from lmforge.api import load

__version__ = "0.1.0"
__all__ = ["load"]
