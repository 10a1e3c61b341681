"""`lmforge experiment`: pretrain a grid of arms at one budget, fine-tune and evaluate each, tabulate
(experiments/experiment.py)."""

from __future__ import annotations

import argparse

from lmforge.cli.args import devices_of, listing_help, named, training_overrides


def add_parser(sub, name: str) -> None:
    ex = sub.add_parser(name, help="pretrain a grid of arms at one budget, fine-tune/evaluate each, tabulate",
                        epilog_fn=listing_help("experiments", "experiment"))  # fmt: skip
    ex.add_argument("--config", dest="config_file", metavar="FILE", help="the experiment file (as EXPERIMENT)")
    ex.add_argument(
        "experiment", nargs="?", help="experiment file or bundled name in recipes/experiments (e.g. "
        "roberta-masking-tiny); --a.b=value: every pretraining arm, --finetune.a.b=value: every fine-tuning run, "
        "--eval.a.b=value: every evaluation, --seeds=0,1 and --budget.tokens|flops|steps=N: the file's, "
        "--pretrain.seeds=0,1 / --finetune.seeds=0,1: a stage's own",
    )  # fmt: skip
    ex.add_argument("--out", help="experiment dir (default: the file's out:)")
    ex.add_argument("--jobs", type=int, default=1, help="runs at once (on one GPU, or round robin over --devices)")
    ex.add_argument("--devices", help="GPUs for the job slots, round robin, e.g. 0,1,2,3")
    ex.add_argument("--pretrain-procs", type=int, default=1, metavar="N",
                    help="train each pretraining run on N processes (torch.distributed.run; the first N --devices), "
                    "one at a time; train.batch_size stays the global batch")  # fmt: skip
    ex.add_argument("--dry-run", action="store_true", help="list the runs and a command line of each kind; run nothing")
    ex.add_argument("--only", action="append", help="run only the runs matching this glob (repeatable), e.g. "
                    "'finetune/sentiment/*', and the runs they need")  # fmt: skip
    ex.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    return training_overrides("experiment", argv, extra)


def run(args: argparse.Namespace) -> None:
    from lmforge.experiments.experiment import cmd_experiment

    cmd_experiment(named(args, "experiment"), args.overrides, out=args.out, jobs=args.jobs, devices=devices_of(args),
                   dry_run=args.dry_run, only=args.only, pretrain_procs=args.pretrain_procs)  # fmt: skip
