"""Optional dependencies: each feature beyond pretraining and fine-tuning imports its library here, at its use site,
and a missing one is one line naming the package and the lmforge extra that installs it.

The extras and what they hold are pyproject.toml's `[project.optional-dependencies]`; `PACKAGES` below mirrors
them (a test holds the two together). A whole extra installs as `pip install 'lmforge[NAME]'` (from a wheel or an
index); running from a source checkout, as `pip install -e 'CHECKOUT[NAME]'` (`install_extra`)."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from lmforge.errors import LMForgeError

PACKAGES: dict[str, tuple[str, str]] = {
    # top-level module: (the distribution that installs it, with its version floor; the lmforge extra)
    "sklearn": ("scikit-learn>=1.3", "eval"),
    "scipy": ("scipy>=1.10", "eval"),
    "rouge_score": ("rouge-score>=0.1.2", "eval"),
    "sacrebleu": ("sacrebleu>=2.3", "eval"),
    "threadpoolctl": ("threadpoolctl>=3", "eval"),
    "pyarrow": ("pyarrow>=14", "data"),
    "rdata": ("rdata>=0.11", "data"),
    "datasets": ("datasets>=2.14", "data"),
    "matplotlib": ("matplotlib>=3.7", "plot"),
    "lm_eval": ("lm-eval>=0.4.13", "harness"),
    "transformers": ("transformers>=4.40", "hf"),
    "accelerate": ("accelerate>=0.26", "hf"),
    "tensorboard": ("tensorboard>=2.14", "tensorboard"),
    "wandb": ("wandb>=0.17", "wandb"),
    "mlflow": ("mlflow-skinny>=2.14", "mlflow"),
    "torchao": ("torchao>=0.10", "float8"),
}


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def available(module: str) -> bool:
    """Whether `module` (e.g. "sklearn.metrics") can be imported, without importing it."""
    try:
        return importlib.util.find_spec(_top(module)) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def hint(module: str, what: str) -> str:
    """The one line for a missing module: "F1 needs scikit-learn (lmforge's `eval` extra): pip install …"."""
    spec, extra = PACKAGES[_top(module)]
    name = spec.split(">")[0].split("=")[0]
    return f"{what} needs {name}, which is not installed (lmforge's `{extra}` extra): pip install '{spec}'"


def source_checkout() -> Path | None:
    """The source checkout lmforge runs from (the folder of pyproject.toml above src/lmforge), or None when lmforge
    is installed (it lives in a site-packages or dist-packages folder, as a wheel puts it)."""
    here = Path(__file__).resolve().parent
    if any(p.name in ("site-packages", "dist-packages") for p in here.parents):
        return None
    root = here.parent.parent
    return root if (root / "pyproject.toml").is_file() and here.parent.name == "src" else None


def install_extra(extra: str) -> str:
    """The command that installs lmforge's `extra`: `pip install 'lmforge[harness]'`, or from a source checkout
    (an editable install) `pip install -e '/path/to/lmforge[harness]'`."""
    root = source_checkout()
    return f"pip install -e '{root}[{extra}]'" if root is not None else f"pip install 'lmforge[{extra}]'"


def extra_hint(extra: str, what: str) -> str:
    """The one line for a feature that needs a whole extra: "lmforge eval --harness needs lmforge's `harness` extra
    (lm-eval), which is not installed: pip install 'lmforge[harness]'"."""
    names = ", ".join(spec.split(">")[0].split("=")[0] for spec, e in PACKAGES.values() if e == extra)
    return f"{what} needs lmforge's `{extra}` extra ({names}), which is not installed: {install_extra(extra)}"


def check(what: str, *modules: str) -> None:
    """Raise LMForgeError with `hint` for the first of `modules` not installed, importing none of them: a command
    calls this before its work, for what it will need at the end."""
    for module in modules:
        if not available(module):
            raise LMForgeError(hint(module, what))


def require(module: str, what: str) -> ModuleType:
    """Import and return `module`, or raise LMForgeError with `hint` when its package is not installed.

    `what` names the feature for the message: "metric 'f1'", "train.log_to=wandb", "reading Parquet files"."""
    if _top(module) not in PACKAGES:
        raise KeyError(f"{module!r} is not an optional dependency of lmforge (extras.PACKAGES)")
    if not available(module):
        raise LMForgeError(hint(module, what))
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:  # the package is there but one of its own dependencies is not
        raise LMForgeError(f"{what}: {_top(module)} is installed but cannot be imported ({e})") from None
