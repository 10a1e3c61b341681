"""`lmforge probe`: the position probes, regressing absolute position from a model's position representations and
classifying the relative order of two tokens from their representations."""

from __future__ import annotations

import argparse


def add_parser(sub, name: str) -> None:
    pr = sub.add_parser(name, help="position probes: absolute position and relative order of token pairs")
    pr.add_argument("target", help="run dir, checkpoint dir or preset name")
    pr.add_argument("--n-positions", type=int, default=None)
    pr.add_argument("--pair-features", choices=["concat", "diff"], default="concat",
                    help="relative-order probe: the pair as [h_i; h_j] (concat) or h_i - h_j (diff)")  # fmt: skip
    pr.set_defaults(fn=run)


def run(args: argparse.Namespace) -> None:
    from lmforge.eval.position_probe import cmd_probe

    cmd_probe(args.target, args.n_positions, args.pair_features)
