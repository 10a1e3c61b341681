"""`lmforge scaling`: pretrain a grid of sizes × token budgets, fit scaling laws and report (experiments/sweep.py)."""

from __future__ import annotations

import argparse

from lmforge.cli.args import devices_of, listing_help, named, training_overrides


def add_parser(sub, name: str) -> None:
    sc = sub.add_parser(name, help="pretrain a grid of sizes × token budgets, fit scaling laws, report",
                        epilog_fn=listing_help("scaling", "sweep"))  # fmt: skip
    sc.add_argument("sweep", nargs="?", help="sweep file or bundled name in recipes/scaling (e.g. tiny); "
                    "--a.b=value: every arm")  # fmt: skip
    sc.add_argument("--config", dest="config_file", metavar="FILE", help="the sweep file (the same as SWEEP)")
    sc.add_argument("--out", help="sweep dir (default: the file's out:)")
    sc.add_argument("--jobs", type=int, default=1, help="arms run at once")
    sc.add_argument("--devices", help="GPUs for the job slots, round robin, e.g. 0,1,2,3")
    sc.add_argument("--dry-run", action="store_true", help="list the arms and a command line; run nothing")
    sc.set_defaults(fn=run)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    return training_overrides("scaling", argv, extra)


def run(args: argparse.Namespace) -> None:
    from lmforge.experiments.sweep import cmd_scaling

    cmd_scaling(
        named(args, "sweep"), args.overrides, out=args.out, jobs=args.jobs, devices=devices_of(args),
        dry_run=args.dry_run,
    )  # fmt: skip
