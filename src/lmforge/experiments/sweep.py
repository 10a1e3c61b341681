"""`lmforge scaling SWEEP.yaml`: pretrain a grid of model sizes × token budgets, then fit scaling laws.

A sweep file (recipes/scaling/*.yaml; docs/scaling.md) names the pretraining recipe, overrides every arm shares,
the sizes (presets, presets with model fields, or a width/depth rule), the token budgets and the fit options.
Every arm trains on one tokenizer and one prepared corpus (built once in OUT/shared unless data.tokenizer and
data.prepared are given), as an ordinary run dir OUT/arms/<size>-D<tokens>/, with its learning-rate schedule
ending at its own token budget, as Hoffmann et al. 2022 train theirs."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LMForgeError, did_you_mean
from lmforge.experiments.arms import Arm, flatten, resolve_config
from lmforge.experiments.spec import check_name
from lmforge.progress import status

RESERVED = ("run.dir", "train.max_steps")
"""Keys the sweep sets per arm."""


@dataclass
class ShapeRule:
    """Model sizes from a width/depth rule: d_model = aspect_ratio · n_layers (Kaplan et al. 2020 §3.1 vary the
    shape at fixed aspect ratio d_model / n_layers), n_heads = d_model / head_dim, d_ff = ff_ratio · d_model."""

    n_layers: list[int] = field(default_factory=list)
    aspect_ratio: int = 64
    head_dim: int = 64
    ff_ratio: float = 4.0
    preset: str | None = None
    """Preset whose other fields (norms, positions, activation) every size keeps; None: the recipe's model."""


@dataclass
class FitOptions:
    params: Literal["non_embedding", "total"] = "non_embedding"
    """N of the fits: parameters without the token and position embeddings (Kaplan et al. 2020), or all."""
    compute: Literal["6ND", "formula"] = "6ND"
    """C of the L(C) fit: 6·N·D, or the family's FLOP formula per token (models/flops.py) times D."""
    bootstrap: int = 200
    """Resamples of the runs for the intervals (0: none)."""
    level: float = 0.95
    budgets: list[float] = field(default_factory=list)
    """Compute budgets (FLOPs) to give N_opt and D_opt for; default: the sweep's largest C, ×10, ×100."""
    top_k: int | None = 64
    """L-BFGS starts: the best top_k of Chinchilla's 4,500 grid initialisations (null: all of them)."""
    seed: int = 0


@dataclass
class Sweep:
    path: Path
    recipe: str
    out: Path
    overrides: dict[str, Any]
    sizes: list[tuple[str, dict[str, Any]]]
    """(name, overrides) per size: model fields by name (d_model), other keys dotted (train.lr)."""
    tokens: list[int]
    vocab_size: int | None
    fit: FitOptions


KEYS = ("recipe", "out", "overrides", "sizes", "shape", "tokens", "vocab_size", "fit")


def load_sweep(path: str | Path, cli_overrides: list[str] | None = None, out: str | None = None) -> Sweep:
    """Read and validate a sweep file (a path or a bundled name in recipes/scaling/)."""
    from lmforge.config import all_keys, build_dataclass, parse_overrides, read_yaml, resolve_recipe

    p = resolve_recipe(str(path), kind="scaling")
    raw = read_yaml(p)
    for k in raw:
        if k not in KEYS:
            raise LMForgeError(f"{p}: unknown key '{k}'{did_you_mean(k, KEYS)}")
    overrides = flatten(raw.get("overrides") or {}) | flatten(parse_overrides(cli_overrides or []))
    for k in RESERVED:
        if k in overrides:
            raise LMForgeError(f"{k} is set by the sweep for each arm; set out: or tokens: instead")
    tokens = raw.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, (int, float)) and t > 0 for t in tokens):
        raise LMForgeError(f"{p}: tokens: expected a list of positive token budgets, got {tokens!r}")
    fit = build_dataclass(FitOptions, raw.get("fit") or {}, "fit.", [f"fit.{k}" for k in all_keys(FitOptions)])
    vocab = raw.get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or vocab < 2):
        raise LMForgeError(f"{p}: vocab_size: expected an integer >= 2, got {vocab!r}")
    return Sweep(
        p, str(raw.get("recipe", "gpt")), Path(out or raw.get("out") or f"runs/scaling-{p.stem}"), overrides,
        _sizes(p, raw.get("sizes"), raw.get("shape")), sorted({int(t) for t in tokens}), vocab, fit,
    )  # fmt: skip


def _sizes(p: Path, sizes: Any, shape: Any) -> list[tuple[str, dict[str, Any]]]:
    from lmforge.config import all_keys, build_dataclass

    if (sizes is None) == (shape is None):
        raise LMForgeError(f"{p}: give the model sizes as either sizes: (a list) or shape: (a width/depth rule)")
    if shape is not None:
        rule = build_dataclass(ShapeRule, shape, "shape.", [f"shape.{k}" for k in all_keys(ShapeRule)])
        return shape_sizes(rule)
    if not isinstance(sizes, list) or not sizes:
        raise LMForgeError(
            f"{p}: sizes: expected a list of presets or {{name, preset, model fields, dotted overrides}} mappings"
        )
    out = []
    for s in sizes:
        if isinstance(s, str):
            out.append((s, {"preset": s}))
        elif isinstance(s, dict) and isinstance(s.get("name"), str):
            if any(k in RESERVED for k in s):
                raise LMForgeError(f"{p}: sizes: {', '.join(RESERVED)} are set by the sweep for each arm")
            out.append((s["name"], {k: v for k, v in s.items() if k != "name"}))
        else:
            raise LMForgeError(f"{p}: sizes: each size is a preset name or a mapping with a name, got {s!r}")
    for name, _ in out:  # each names a dir OUT/arms/NAME-D<tokens>
        check_name(name, f"{p}: sizes: name")
    if len({n for n, _ in out}) != len(out):
        raise LMForgeError(f"{p}: sizes: names must be unique")
    return out


def shape_sizes(rule: ShapeRule) -> list[tuple[str, dict[str, Any]]]:
    """(name, model fields) for each depth of the rule."""
    if not rule.n_layers or min(rule.n_layers) < 1:
        raise LMForgeError("shape.n_layers: expected a list of depths >= 1")
    out = []
    for n in sorted(set(rule.n_layers)):
        d = rule.aspect_ratio * n
        if d % rule.head_dim:
            raise LMForgeError(f"shape: d_model {d} (= {rule.aspect_ratio} × {n}) is not a multiple of head_dim")
        model = {"n_layers": n, "d_model": d, "n_heads": d // rule.head_dim, "d_ff": int(rule.ff_ratio * d)}
        out.append((f"L{n}-d{d}", ({"preset": rule.preset} if rule.preset else {}) | model))
    return out


# --- the shared tokenizer and corpus --------------------------------------------------------------------------


def shared_data(sweep: Sweep) -> dict[str, Any]:
    """Overrides that point every arm at one tokenizer and one prepared corpus (made in OUT/shared if needed).
    `train_tokens` in the result is the corpus's training-split size, not an override."""
    from lmforge.experiments.data import shared_data as make_shared

    return make_shared(resolve_config(sweep.recipe, sweep.overrides), sweep.out / "shared", sweep.vocab_size)


# --- arms -------------------------------------------------------------------------------------------------------


def plan_arms(sweep: Sweep, shared: dict[str, Any]) -> list[Arm]:
    """One arm per size × token budget, with its parameter counts, tokens and FLOPs in `Arm.info`."""
    import torch

    from lmforge.models import Transformer
    from lmforge.models.flops import model_flops_per_token

    shared = dict(shared)
    train_tokens = shared.pop("train_tokens", None)
    arms = []
    for size, model in sweep.sizes:
        over = sweep.overrides | shared | {k if "." in k else f"model.{k}": v for k, v in model.items()}
        cfg = resolve_config(sweep.recipe, over)
        t = cfg.train
        per_step = t.batch_size * t.seq_len * t.grad_accum
        with torch.device("meta"):  # shapes only: no memory, no init time
            net = Transformer(cfg.model)
        n_emb, n_all = net.num_params(non_embedding=True), net.num_params()
        flops_tok = model_flops_per_token(cfg.model, t.seq_len)
        for budget in sweep.tokens:
            steps = max(1, round(budget / per_step))
            D = steps * per_step
            if t.warmup_steps >= steps:
                raise LMForgeError(
                    f"arm {size} at {budget} tokens has {steps} steps, not more than train.warmup_steps="
                    f"{t.warmup_steps}: lower the warmup or raise the smallest token budget"
                )
            info = {"size": size, "N_non_embedding": n_emb, "N_total": n_all, "D": D, "steps": steps,
                    "flops_per_token": flops_tok, "seq_len": t.seq_len,
                    "epochs": D / train_tokens if train_tokens else None}  # fmt: skip
            name = f"{size}-D{D}"
            arms.append(Arm(name, sweep.out / "arms" / name, sweep.recipe, over, steps, info))
    return arms


# --- the command ------------------------------------------------------------------------------------------------


def cmd_scaling(
    path: str,
    overrides: list[str] | None = None,
    out: str | None = None,
    jobs: int = 1,
    devices: list[str] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Run (or, dry_run, list) a sweep's unfinished arms, fit, and write OUT/scaling.md, scaling.json and
    plots/scaling.png. Returns the analysis."""
    from lmforge.checkpoint.rundir import RunLock
    from lmforge.experiments.arms import arm_command
    from lmforge.experiments.tables import markdown_table, si
    from lmforge.extras import check

    sweep = load_sweep(path, overrides, out)
    if dry_run:  # nothing written: arms as they would run, before the shared tokenizer exists
        arms = plan_arms(sweep, {})
        rows = [[a.name, si(a.info["N_non_embedding"]), si(a.info["D"]), a.max_steps] for a in arms]
        print(markdown_table(["arm", "N", "D", "steps"], rows) + "\n" + shlex.join(arm_command(arms[-1])))
        return {}
    check("a scaling sweep's fit and figure", "scipy", "threadpoolctl", "matplotlib")  # now, not after the arms
    lock = RunLock(sweep.out, "sweep dir", "--out")  # one runner per sweep dir
    lock.acquire()
    try:
        return _run_sweep(sweep, jobs, devices)
    finally:
        lock.release()


def _run_sweep(sweep: Sweep, jobs: int, devices: list[str] | None) -> dict[str, Any]:
    """The arms not finished yet, then the fit and the report."""
    from lmforge.experiments.report import analyse, points, write_report
    from lmforge.experiments.runner import check_all_finished, run_arms

    arms = plan_arms(sweep, shared_data(sweep))
    repeated = [a for a in arms if (a.info["epochs"] or 0) > 1]
    if repeated:  # repeated tokens are worth less than fresh ones (Muennighoff et al. 2023): the law bends
        worst = max(repeated, key=lambda a: a.info["epochs"])
        status(
            f"warning: {len(repeated)} arms see their training data more than once ({worst.name}: "
            f"{worst.info['epochs']:.1f} epochs); give a larger corpus with --data.prepared and --data.tokenizer"
        )
    # The costliest arms first: with --jobs, the sweep then ends on short arms instead of waiting on one long one.
    by_cost = sorted(arms, key=lambda a: -a.info["flops_per_token"] * a.info["D"])
    done = {r.arm.name: r for r in run_arms(by_cost, jobs=jobs, devices=devices)}
    results = [done[a.name] for a in arms]  # the report in the sweep's order
    check_all_finished(results)
    pts = points(results, sweep.fit.params, sweep.fit.compute)
    analysis = analyse(pts, sweep.fit)
    meta = {
        "sweep": str(sweep.path), "recipe": sweep.recipe, "params": sweep.fit.params, "compute": sweep.fit.compute,
        "overrides": sweep.overrides,
        "description": f"Recipe `{sweep.recipe}`, {len(arms)} arms ({len(sweep.sizes)} sizes × "
        f"{len(sweep.tokens)} token budgets); N = {sweep.fit.params.replace('_', '-')} parameters, "
        f"C = {'6ND' if sweep.fit.compute == '6ND' else 'the FLOP formula of models/flops.py × D'}.",
    }  # fmt: skip
    paths = write_report(sweep.out, f"Scaling sweep {sweep.path.stem}", meta, pts, analysis)
    print(paths[0].read_text(encoding="utf-8").replace("\n![scaling](plots/scaling.png)\n", ""))
    print("report: " + ", ".join(str(p) for p in paths))
    return analysis
