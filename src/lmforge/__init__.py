"""lmforge: pretrain, adapt and evaluate transformer language models of all three families."""

__version__ = "0.1.0"
__all__ = ["RunResult", "evaluate", "finetune", "load", "pretrain"]


def __getattr__(name: str):
    # The API on first use (PEP 562): `import lmforge.cli` does not import torch before the command line is read,
    # so an early Ctrl-C or a typo costs no torch import.
    if name in __all__:
        from lmforge import api

        return getattr(api, name)
    raise AttributeError(f"module 'lmforge' has no attribute {name!r}")
