"""`lmforge finetune`: fine-tune a model on a labelled task, then print the best checkpoint's scores beside the
baselines."""

from __future__ import annotations

import argparse

from lmforge.cli.args import add_recipe_args, recipe_help, recipe_of, training_overrides


def add_parser(sub, name: str) -> None:
    ft = sub.add_parser(name, help="fine-tune a model on a labelled task", epilog_fn=recipe_help("finetune"))
    add_recipe_args(ft, "finetune", "recipe path or bundled name in recipes/finetune (default sst2-gpt)")
    ft.add_argument("--init", help="pretrained run/checkpoint/HF dir, fine-tuned run, preset, or none")
    ft.add_argument("--resume", action="store_true", help="continue the run in --run.dir from its latest checkpoint")
    ft.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    return training_overrides("finetune", argv, extra)


def run(args: argparse.Namespace) -> None:
    cmd_finetune(recipe_of(args), args.init, args.overrides, resume=args.resume)


def cmd_finetune(recipe: str | None, init: str | None, overrides: list[str], resume: bool = False) -> dict[str, float]:
    """Fine-tune `init` (a run/checkpoint/HF dir, a preset, or none) on the recipe's task; print and return the
    best checkpoint's dev metrics (also in RUN/eval.json)."""
    from lmforge.run_kinds import config, run
    from lmforge.tasks.data import data_label
    from lmforge.tasks.multi_task import MultiTask

    def announce(tuner) -> None:
        if not tuner.dist.is_main:
            return
        cfg = tuner.cfg
        n = {k: len(v.examples) for k, v in tuner.splits.items()}
        data = ", ".join(tuner.task.subtasks) if isinstance(tuner.task, MultiTask) else None  # its tasks' data
        data = data or f"{cfg.data.source} {data_label(cfg.data)}"
        print(f"fine-tuning {cfg.model.init} on {cfg.task.type} ({data}): "
              + ", ".join(f"{k} {v}" for k, v in n.items()) + f"; {tuner.total_steps} steps")  # fmt: skip

    done = run("finetune", config("finetune", recipe, overrides, init=init, resume=resume), resume, announce)
    tuner, final = done.job, done.metrics
    if not done.is_main:  # rank 0 reports
        return final
    print(f"dev (best checkpoint): {_scores_line(tuner, 'dev', final)}")
    if tuner.tested is not None:  # a labelled test split
        print(f"test (best checkpoint): {_scores_line(tuner, 'test', tuner.tested)}")
    print(f"run saved in {tuner.run_dir}")
    return final


def _scores_line(tuner, split: str, scores: dict[str, float]) -> str:
    """`scores` of `split`, with the baselines of that split beside them."""
    from lmforge.eval.finetuned import majority_baseline
    from lmforge.tasks.multi_task import MultiTask

    line = ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    pooled = not isinstance(tuner.task, MultiTask)  # a multi-task run gives each task's majority class (baselines)
    baseline = majority_baseline(tuner.splits["train"], tuner.splits[split]) if pooled else None
    if baseline is not None:
        line += f" (majority-class baseline: accuracy {baseline:.4f})"
    for name, base in tuner.task.baselines(tuner.splits[split]).items():
        line += f" ({name} baseline: " + ", ".join(f"{k} {v:.4f}" for k, v in base.items()) + ")"
    return line
