"""`lmforge probe`: the position probe, regressing absolute position from a model's position representations."""

from __future__ import annotations

import argparse


def add_parser(sub, name: str) -> None:
    pr = sub.add_parser(name, help="position probe: regress absolute position from position representations")
    pr.add_argument("target", help="run dir, checkpoint dir or preset name")
    pr.add_argument("--n-positions", type=int, default=None)
    pr.set_defaults(fn=run)


def run(args: argparse.Namespace) -> None:
    from lmforge.eval.position_probe import cmd_probe

    cmd_probe(args.target, args.n_positions)
