"""`bench/train_parity.py --report DIR`: every <family>-<impl>-seed<seed>.json of DIR merged into DIR/report.md (per
family: each impl's final validation loss, mean over seeds and per seed, lmforge − reference, PASS when lmforge ≤
reference + 0.01 nats, with the 95% confidence interval of the seed-paired difference; for a loss of named parts,
ELECTRA's generator and discriminator, each part's difference and interval too) and one PNG of validation
curves per family (DIR/parity-<family>.png). Parity counts only between models that learned: each side's language
model loss (ELECTRA's: its generator's masked LM) must end below the run's unigram plateau (`plateau` in the JSON,
lmforge.eval.plateau), else the verdict says the comparison does not count."""

from __future__ import annotations

import functools
import json
import statistics
from collections import defaultdict
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.eval.plateau import LEARNT

TOLERANCE = 0.01
"""lmforge passes when its final validation loss is at most the reference's + this many nats (mean over seeds)."""
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
"""Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond)."""


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


def lm_loss(r: dict) -> float:
    """Final validation loss of the run's language model: the whole loss, or ELECTRA's generator MLM part."""
    return r["val_metrics"][-1][1].get("mlm_loss", final_val(r)) if r.get("val_metrics") else final_val(r)


def loss_parts(r: dict) -> dict[str, float]:
    """The named parts of a run's final validation loss (ELECTRA's generator `mlm_loss` and discriminator
    `disc_loss`); empty for a loss of one part."""
    last = r["val_metrics"][-1][1] if r.get("val_metrics") else {}
    return {k: v for k, v in last.items() if k.endswith("_loss")}


def part_lines(ours: dict[int, dict], ref: dict[int, dict]) -> list[str]:
    """Where a difference of a loss of several parts comes from: each part's lmforge − reference with its own
    paired interval (nothing for a loss of one part)."""
    out = []
    for part in sorted(set.intersection(*(set(loss_parts(r)) for r in [*ours.values(), *ref.values()]))):
        value = functools.partial(part_loss, part)
        d = statistics.mean(map(value, ours.values())) - statistics.mean(map(value, ref.values()))
        out.append(f"  - of which {part}: {d:+.4f} nats ({paired_ci(ours, ref, value)})")
    return out


def part_loss(part: str, r: dict) -> float:
    return loss_parts(r)[part]


def paired_ci(a: dict[int, dict], b: dict[int, dict], value=final_val) -> str:
    """'± h' of the 95% interval of mean(a − b) over the seeds both ran (same batches, so paired)."""
    d = [value(a[s]) - value(b[s]) for s in sorted(a.keys() & b.keys())]
    if len(d) < 2:
        return "no interval (one seed)"
    h = T95.get(len(d) - 1, 1.96) * statistics.stdev(d) / len(d) ** 0.5
    return f"95% CI ± {h:.4f} over {len(d)} paired seeds"


def below_plateau(rs: dict[int, dict]) -> float | None:
    """How far the mean LM loss of one impl's seeds ends below the plateau (None when no run recorded one)."""
    floors = [r["plateau"] for r in rs.values() if r.get("plateau") is not None]
    return statistics.mean(floors) - statistics.mean(lm_loss(r) for r in rs.values()) if floors else None


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
            below = {i: below_plateau(runs[i]) for i in ("lmforge", ref)}
            if any(v is not None and v < LEARNT for v in below.values()):
                verdict += ", does not count: a side ends at the unigram plateau"
            lines.append(f"- lmforge − {ref}: {diff:+.4f} nats ({paired_ci(runs['lmforge'], runs[ref])}) → "
                         f"**{verdict}** (lmforge ≤ {ref} + {TOLERANCE})")  # fmt: skip
            lines += part_lines(runs["lmforge"], runs[ref])
        if all(below_plateau(runs[i]) is not None for i in impls):
            floor = statistics.mean(r["plateau"] for rs in runs.values() for r in rs.values())
            lines.append(
                f"- unigram plateau of these targets {floor:.4f}; LM loss below it: "
                + ", ".join(f"{i} {below_plateau(runs[i]):.3f}" for i in impls)
            )
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
