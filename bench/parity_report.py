"""`bench/train_parity.py --report DIR`: every <family>-<impl>-seed<seed>.json of DIR merged into DIR/report.md (per
family: each impl's final validation loss, mean over seeds and per seed, lmforge − reference, PASS when lmforge ≤
reference + 0.01 nats) and one PNG of validation curves per family (DIR/parity-<family>.png)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from lmforge.errors import LMForgeError

TOLERANCE = 0.01
"""lmforge passes when its final validation loss is at most the reference's + this many nats (mean over seeds)."""


def load_results(directory: Path) -> dict[str, dict[str, dict[int, dict]]]:
    """{family: {impl: {seed: result}}} of the run JSONs in `directory`."""
    if not directory.is_dir():
        raise LMForgeError(f"--report: {directory} is not a directory")
    out: dict = defaultdict(lambda: defaultdict(dict))
    for path in sorted(directory.glob("*-seed*.json")):
        try:
            r = json.loads(path.read_text(encoding="utf-8"))
            out[r["family"]][r["impl"]][int(r["seed"])] = r
        except (ValueError, KeyError) as e:
            raise LMForgeError(f"--report: {path} is not a train_parity result ({e})") from None
    if not out:
        raise LMForgeError(f"--report: no <family>-<impl>-seed<N>.json results in {directory}")
    return out


def final_val(r: dict) -> float:
    return r["val"][-1][1]


def batches_agree(runs: dict[str, dict[int, dict]], seed: int) -> str:
    """'yes' when every impl of `seed` consumed the same batches and validated on the same ones, else which not."""
    with_seed = {impl: rs[seed] for impl, rs in runs.items() if seed in rs}
    train = {tuple(r["batch_hash"]) for r in with_seed.values()}
    val = {r.get("val_hash") for r in with_seed.values()}
    if len(train) == 1 and len(val) == 1:
        return "yes"
    return "NO (train batches differ)" if len(train) > 1 else "NO (val batches differ)"


def family_table(family: str, runs: dict[str, dict[int, dict]]) -> list[str]:
    """Markdown lines of one family: a row per impl, a verdict per reference."""
    seeds = sorted({s for rs in runs.values() for s in rs})
    impls = sorted(runs, key=lambda i: (i != "lmforge", i))
    lines = [f"### {family}", "", "| impl | model | params | final val (mean) | "
             + " | ".join(f"seed {s}" for s in seeds) + " | tokens/s | steps |",
             "|---|---|---:|---:|" + "---:|" * len(seeds) + "---:|---:|"]  # fmt: skip
    means = {}
    for impl in impls:
        rs = runs[impl]
        means[impl] = statistics.mean(final_val(r) for r in rs.values())
        per_seed = " | ".join(f"{final_val(rs[s]):.4f}" if s in rs else "—" for s in seeds)
        tps = [r["tokens_per_s"] for r in rs.values() if r.get("tokens_per_s")]
        any_r = next(iter(rs.values()))
        lines.append(f"| {impl} | {any_r['model_class']} | {any_r['n_params'] / 1e6:.2f}M | {means[impl]:.4f} | "
                     f"{per_seed} | {statistics.mean(tps):,.0f} | {any_r['val'][-1][0]} |" if tps else
                     f"| {impl} | {any_r['model_class']} | {any_r['n_params'] / 1e6:.2f}M | {means[impl]:.4f} | "
                     f"{per_seed} | — | {any_r['val'][-1][0]} |")  # fmt: skip
    lines.append("")
    if "lmforge" in means:
        for ref in (i for i in impls if i != "lmforge"):
            diff = means["lmforge"] - means[ref]
            verdict = "PASS" if diff <= TOLERANCE else "FAIL"
            lines.append(f"- lmforge − {ref}: {diff:+.4f} nats → **{verdict}** (lmforge ≤ {ref} + {TOLERANCE})")
    lines.append("- same batches on every impl: " + ", ".join(f"seed {s}: {batches_agree(runs, s)}" for s in seeds))
    skipped = {impl: sum(r["skipped_steps"] for r in rs.values()) for impl, rs in runs.items()}
    if any(skipped.values()):
        lines.append("- non-finite steps skipped: " + ", ".join(f"{i} {n}" for i, n in skipped.items()))
    env = next(iter(next(iter(runs.values())).values()))["env"]
    lines += [f"- {env['device_name']}, torch {env['torch']}, transformers {env['transformers']}", ""]
    return lines


def plot_family(family: str, runs: dict[str, dict[int, dict]], path: Path) -> None:
    """Validation curves (solid) and smoothed train loss (faint) of every impl and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for k, impl in enumerate(sorted(runs, key=lambda i: (i != "lmforge", i))):
        color = colors[k % len(colors)]
        for j, (seed, r) in enumerate(sorted(runs[impl].items())):
            steps, losses = zip(*r["val"])
            ax.plot(steps, losses, styles[j % len(styles)], color=color, label=f"{impl} seed {seed} (val)")
            tl = r["train_loss"]
            w = max(1, len(tl) // 50)
            smooth = [sum(tl[i : i + w]) / len(tl[i : i + w]) for i in range(0, len(tl), w)]
            ax.plot([i + w for i in range(0, len(tl), w)], smooth, styles[j % len(styles)], color=color, alpha=0.25)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.set_title(f"{family}: lmforge vs reference (val solid, train faint)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(directory: Path) -> str:
    """Write DIR/report.md and DIR/parity-<family>.png; returns the markdown."""
    results = load_results(directory)
    lines = ["# Training-curve parity", "", f"Final validation loss (nats/token); PASS: lmforge ≤ reference + "
             f"{TOLERANCE} (mean over seeds).", ""]  # fmt: skip
    for family in sorted(results):
        runs = results[family]
        lines += family_table(family, runs)
        png = directory / f"parity-{family}.png"
        plot_family(family, runs, png)
        lines += [f"![{family}]({png.name})", ""]
    text = "\n".join(lines)
    (directory / "report.md").write_text(text + "\n", encoding="utf-8")
    return text
