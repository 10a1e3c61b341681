"""lm-evaluation-harness with lmforge models: `lmforge eval --harness ARGS` (or `python -m lmforge.eval.harness
ARGS`) is `lm_eval ARGS` with the model `lmforge` registered and lmforge's example tasks (lmforge_mc, lmforge_gen,
lmforge_ppl, shipped in lmforge/eval/harness_tasks/) on the task path, e.g.

    lmforge eval runs/gpt --harness --tasks lmforge_mc
    lmforge eval --harness --model lmforge --model_args pretrained=runs/gpt --tasks hellaswag

lm_eval's own command finds `lmforge` through the entry point lmforge declares in the group `lm_eval.models`
(pyproject.toml), in the lm-eval releases that discover model plugins by entry point; lm-eval 0.4.13 and earlier
load no plugins, so there `lm_eval --model lmforge ARGS` is `lmforge eval --harness --model lmforge ARGS`.
From Python: `register()`, then `lm_eval.simple_evaluate(model="lmforge", model_args="pretrained=RUN", ...)`, or
pass `LMForgeLM(model=model, tokenizer=tokenizer)` as `model`. Needs lmforge's `harness` extra
(`pip install 'lmforge[harness]'`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.extras import extra_hint

TASKS_DIR = Path(__file__).resolve().parent / "harness_tasks"
"""lmforge's example lm-eval tasks (YAML + their JSONL data), on lm_eval's task path unless --include_path is given."""


def register() -> type:
    """Register the `lmforge` model class with lm_eval (idempotent) and return it."""
    if importlib.util.find_spec("lm_eval") is None:
        raise LMForgeError(extra_hint("harness", "lmforge eval --harness"))
    from lmforge.eval.harness_model import LMForgeLM

    return LMForgeLM


def harness_argv(args: list[str], model: str | None = None) -> list[str]:
    """lm_eval's arguments for `lmforge eval [MODEL] --harness ARGS`: MODEL (a run, checkpoint or HF dir) as the
    `lmforge` model, and the shipped tasks' dir as --include_path unless ARGS name one."""
    given = {a.split("=", 1)[0] for a in args}
    if model is not None:
        if given & {"--model", "--model_args"}:
            raise LMForgeError(f"give the model once: {model} or --model/--model_args, not both")
        args = ["--model", "lmforge", "--model_args", f"pretrained={model}", *args]
    if "--include_path" not in given:
        args = [*args, "--include_path", str(TASKS_DIR)]
    return args


def main(argv: list[str] | None = None, model: str | None = None) -> int:
    """Run lm_eval's command line (the same arguments) with `lmforge` registered; `model`: a run to evaluate."""
    argv = list(sys.argv[1:] if argv is None else argv)
    saved = sys.argv
    try:
        register()
        argv = harness_argv(argv, model)
        from lm_eval.__main__ import cli_evaluate

        sys.argv = ["lm_eval", *argv]  # lm_eval's parser reads sys.argv (and inserts its default `run` command)
        cli_evaluate()
    except LMForgeError as e:  # not installed, or the model could not be loaded or scored: one line
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
