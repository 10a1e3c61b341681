"""Averages the fine-tuning runs of scripts/adapt_study.sh over seeds: one markdown row per model, training size
and flag set, with mean dev and test accuracy and the test accuracy of each seed.

    python scripts/adapt_table.py runs/adapt/adapt.jsonl [more.jsonl ...]
"""

import argparse
import json
import re
from collections import defaultdict
from statistics import mean

RUN = re.compile(r"(?P<init>.+?)(?:-n(?P<size>\w+))?-s(?P<seed>\d+)(?:-v\d+)?$")  # older runs: no -n, no -v


def rows(paths: list[str]) -> list[str]:
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for path in paths:
        for line in open(path, encoding="utf-8"):
            r = json.loads(line)
            m = RUN.match(r["run"])
            key = (m["init"], m["size"] or "full", r.get("flags", ""))
            groups[key].append((int(m["seed"]), r["dev"]["accuracy"], r["test"]["accuracy"]))
    out = ["| init | N | flags | seeds | dev | test | test by seed |", "|---|---|---|---:|---:|---:|---|"]
    order = sorted(groups, key=lambda k: (k[1] != "full", int(k[1]) if k[1].isdigit() else 0, k[0], k[2]))
    for init, size, flags in order:
        runs = groups[(init, size, flags)]
        runs.sort()
        by_seed = " / ".join(f"{100 * t:.1f}" for _, _, t in runs)
        dev, test = 100 * mean(d for _, d, _ in runs), 100 * mean(t for _, _, t in runs)
        out.append(f"| {init} | {size} | {flags or '—'} | {len(runs)} | {dev:.1f} | {test:.1f} | {by_seed} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="adapt.jsonl files written by scripts/adapt_study.sh")
    print("\n".join(rows(parser.parse_args().files)))


if __name__ == "__main__":
    main()
