"""Averages fine-tuning runs over seeds: one markdown row per run name (less its seed), training size and flag
set, with mean dev and test accuracy (and F1 where the runs have it) and the test accuracy of each seed. Reads the
JSON lines of scripts/adapt_study.sh (`pre-nfull-s1-v0`) and scripts/finetune_study.sh (`gpt-paraphrase-scratch-s1`;
no -s suffix is seed 0).

    python scripts/seed_table.py runs/adapt/adapt.jsonl [more.jsonl ...]
"""

import argparse
import json
import re
from collections import defaultdict
from statistics import mean

RUN = re.compile(r"(?P<name>.+?)(?:-n(?P<size>\w+))?(?:-s(?P<seed>\d+))?(?:-v\d+)?$")


def rows(paths: list[str]) -> list[str]:
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for path in paths:
        for line in open(path, encoding="utf-8"):
            r = json.loads(line)
            m = RUN.match(r["run"])
            key = (m["name"], m["size"] or "full", r.get("flags", ""))
            groups[key].append((int(m["seed"] or 0), r["dev"], r["test"]))
    out = ["| run | N | flags | seeds | dev | test | test F1 | test by seed |", "|---|---|---|---:|---:|---:|---:|---|"]
    order = sorted(groups, key=lambda k: (k[1] != "full", int(k[1]) if k[1].isdigit() else 0, k[0], k[2]))
    for name, size, flags in order:
        runs = sorted(groups[(name, size, flags)], key=lambda run: run[0])
        dev = f"{100 * mean(d['accuracy'] for _, d, _ in runs):.1f}"
        tests = [t for _, _, t in runs if t is not None]  # a split without labels has no test metrics
        test = f"{100 * mean(t['accuracy'] for t in tests):.1f}" if tests else "—"
        f1 = f"{100 * mean(t['f1'] for t in tests):.1f}" if tests and all("f1" in t for t in tests) else "—"
        by_seed = " / ".join(f"{100 * t['accuracy']:.1f}" for t in tests) or "—"
        out.append(f"| {name} | {size} | {flags or '—'} | {len(runs)} | {dev} | {test} | {f1} | {by_seed} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="JSON-lines files of scripts/adapt_study.sh or finetune_study.sh")
    print("\n".join(rows(parser.parse_args().files)))


if __name__ == "__main__":
    main()
