"""`lmforge config show` and every training command's `--print-config`: print the resolved config a command would
run (config_show.py builds it)."""

from __future__ import annotations

import argparse

from lmforge.cli.args import check_overrides, recipe_of
from lmforge.run_kinds import RUN_KINDS


def add_parser(sub, name: str) -> None:
    cf = sub.add_parser(name, help="show the resolved config a command would run").add_subparsers(
        dest="sub", required=True
    )
    cs = cf.add_parser("show", help="print the resolved YAML of a recipe with overrides (as the run would save it)")
    cs.add_argument("recipe", nargs="?", help="recipe name or path (default: the pretraining demo)")
    cs.add_argument("--config", dest="config_file", metavar="FILE", help="the recipe file (the same as RECIPE)")
    cs.add_argument("--kind", choices=list(RUN_KINDS), help="default: from the recipe")
    cs.add_argument("--init", help="finetune/align: the model to start from")
    cs.add_argument("--resume", action="store_true", help="the config a resumed run in --run.dir continues with")
    cs.set_defaults(fn=show)


def overrides(args: argparse.Namespace, argv: list[str], extra: list[str]) -> list[str]:
    """The overrides of the recipe's kind (--kind, else the kind of the recipe's folder)."""
    from lmforge.cli.config_show import recipe_kind

    return check_overrides(args.kind or recipe_kind(recipe_of(args)), extra)


def show(args: argparse.Namespace) -> None:
    """Print the resolved YAML of the command line's recipe (`config show`, or a training command's own kind)."""
    from lmforge.cli.config_show import show_config

    teacher = getattr(args, "teacher", None)  # `config show --kind`, or a training command's own kind
    print(show_config(recipe_of(args), args.kind, args.overrides, init=getattr(args, "init", None),
                      resume=args.resume, method=getattr(args, "method", None), teacher=teacher), end="")  # fmt: skip
