"""lm-evaluation-harness with lmforge models: `python -m lmforge.eval.harness ARGS` is `lm_eval ARGS` with the
model `lmforge` registered, e.g.

    python -m lmforge.eval.harness --model lmforge --model_args pretrained=runs/gpt \\
        --tasks lmforge_mc --include_path tests/fixtures/harness

lm_eval finds model classes only in its own registry (there is no plugin discovery), so its own `lm_eval` command
cannot see `lmforge` unless this module registers it first. From Python: `register()`, then
`lm_eval.simple_evaluate(model="lmforge", model_args="pretrained=RUN", ...)`, or pass
`LMForgeLM(model=model, tokenizer=tokenizer)` as `model`. Needs `pip install 'lmforge[harness]'`."""

from __future__ import annotations

import importlib.util
import sys

from lmforge.errors import LMForgeError

INSTALL_HINT = "lm-eval is not installed: pip install 'lmforge[harness]'"


def register() -> type:
    """Register the `lmforge` model class with lm_eval (idempotent) and return it."""
    if importlib.util.find_spec("lm_eval") is None:
        raise LMForgeError(INSTALL_HINT)
    from lmforge.eval.harness_model import LMForgeLM

    return LMForgeLM


def main(argv: list[str] | None = None) -> int:
    """Run lm_eval's command line (the same arguments) with `lmforge` registered."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        register()
    except LMForgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *argv]  # lm_eval's parser reads sys.argv (and inserts its default `run` command)
    try:
        cli_evaluate()
    except LMForgeError as e:  # the model could not be loaded or scored: one line, as every lmforge command
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
