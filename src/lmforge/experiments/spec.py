"""The experiment file of `lmforge experiment` (docs/experiments.md): pretraining arms (named arms and/or a grid of
any config keys, seeds, an equal-tokens / equal-FLOPs / equal-steps budget), the fine-tuning every arm then gets,
and the zero/few-shot evaluations of the pretrained arms. Validated here, once, with one-line errors."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError, did_you_mean
from lmforge.experiments.arms import flatten
from lmforge.experiments.budget import Budget, parse_budget
from lmforge.experiments.claims import Claim, parse_claims

KEYS = ("description", "base", "out", "seeds", "budget", "pretrain", "finetune", "eval", "claims")
PRETRAIN_KEYS = ("recipe", "overrides", "arms", "grid", "seeds", "budget")
FINETUNE_KEYS = ("tasks", "overrides", "arms", "grid", "seeds", "select", "ensembles")
ENSEMBLE_KEYS = ("name", "arm", "size", "tfidf")
SELECT_KEYS = ("metric", "held_out", "arms")
TASK_KEYS = ("name", "recipe", "overrides")
EVAL_KEYS = ("name", "task", "overrides", "arms")
ARM_KEYS = ("name", "recipe", "init", "budget")
"""Arm keys besides dotted config keys."""
RESERVED = ("run.dir", "run.seed")
"""Config keys the experiment sets for every run."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")
"""An arm's, task's, evaluation's or ensemble's name: it names a directory of the experiment (OUT/finetune/TASK/
ARM-sSEED), so never '..', a '/' or an empty string."""
ARCHES = ("decoder", "encoder", "encoder-decoder")


@dataclass
class ArmSpec:
    """A named arm: dotted config keys, and optionally its own recipe, budget, or the arm it starts from."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    recipe: str | dict[str, str] | None = None
    init: str | None = None
    """pretrain: an earlier pretraining arm to continue (run.init); finetune: a pretraining arm, another task's
    fine-tuning arm as TASK/ARM (`Experiment.source`), a run or checkpoint dir, a preset, or none (random init of
    model.preset)."""
    budget: Budget | None = None


@dataclass
class FinetuneTask:
    name: str
    recipe: str | dict[str, str]
    """A finetune recipe, or one per architecture of the arm fine-tuned ({decoder: sst2-gpt, encoder: sst2-bert})."""
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class EvalSpec:
    name: str
    task: str
    """A recipes/eval name or path."""
    overrides: dict[str, Any] = field(default_factory=dict)
    arms: list[str] | None = None
    """The pretraining arms evaluated (None: all)."""


@dataclass
class EnsembleSpec:
    """`finetune.ensembles`: fine-tuning arm `arm`'s seeds taken `size` at a time, in order (seeds 0, 1, 2, then 3,
    4, 5, ...), each group one model that predicts the label of highest mean probability over its runs
    (experiments/ensembles.py). Its seed j is the j-th group. With `tfidf`, that mean is averaged with the task's
    tf-idf + LR probabilities, with equal weight (a size of 1 then stacks each fine-tune on the bag of words)."""

    name: str
    arm: str
    size: int
    tfidf: bool = False


@dataclass
class Selection:
    """`finetune.select`: the report's choice of one fine-tuning arm per task by its mean dev `metric` (the grid
    searched on dev only). A `held_out` task takes the arm whose mean dev metric over the other tasks is highest, so
    nothing is chosen on any of its own data."""

    metric: str = "accuracy"
    held_out: list[str] = field(default_factory=list)
    arms: list[str] | None = None
    """The arms chosen among (None: every arm); the others are fine-tuned and reported beside them, chosen never."""


@dataclass
class Experiment:
    path: Path
    description: str
    out: Path
    seeds: list[int]
    """Pretraining seeds."""
    recipe: str
    """The pretraining arms' default recipe."""
    overrides: dict[str, Any]
    """Every pretraining arm's config keys (under each arm's own)."""
    arms: list[ArmSpec]
    """Pretraining arms, grid expanded (empty: no pretraining)."""
    budget: Budget | None
    finetune_seeds: list[int]
    finetune_overrides: dict[str, Any]
    """Every fine-tuning run's config keys (under each task's and each arm's own)."""
    finetune_cli: dict[str, Any]
    """--finetune.KEY=V: over each task's keys, under each arm's own."""
    finetune_arms: list[ArmSpec]
    """Grid expanded; by default one per pretraining arm (× the grid), fine-tuned from it."""
    tasks: list[FinetuneTask]
    evals: list[EvalSpec]
    selection: Selection | None = None
    ensembles: list[EnsembleSpec] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.stem

    def seed_groups(self, ens: EnsembleSpec) -> list[list[int]]:
        """The fine-tuning seeds of each of ensemble `ens`'s groups, in order (its seed j is the j-th)."""
        seeds, size = self.finetune_seeds, ens.size
        return [seeds[i : i + size] for i in range(0, len(seeds), size)]

    def seed_count(self, row: str) -> int:
        """How many seeds fine-tuning row `row` (an arm or an ensemble) has when every run of it has finished."""
        size = next((e.size for e in self.ensembles if e.name == row), 1)
        return len(self.finetune_seeds) // size

    def source(self, arm: ArmSpec) -> tuple[str, str] | None:
        """(task, fine-tuning arm) when fine-tuning arm `arm` has init: TASK/ARM, else None. That is intermediate-task
        training (Phang et al. 2018, "STILTs"): on every other task, seed s starts from the backbone of ARM's seed-s
        run on TASK (its best dev checkpoint) with a new head; on TASK itself the arm does not run."""
        task, _, name = (arm.init or "").partition("/")
        if task in {t.name for t in self.tasks} and name in {a.name for a in self.finetune_arms}:
            return task, name
        return None


def load_experiment(path: str | Path, cli: list[str] | None = None, out: str | None = None) -> Experiment:
    """Read and validate an experiment file (a path or a bundled name in recipes/experiments/), with command-line
    overrides: --seeds=0,1 and --budget.KIND=N replace the file's, --pretrain.seeds and --finetune.seeds a stage's
    own; --finetune.KEY=V goes to every fine-tuning run, --eval.KEY=V to every evaluation, any other --KEY=V to every
    pretraining arm (under the arm's own keys)."""
    from lmforge.config import parse_overrides, resolve_recipe

    p = resolve_recipe(str(path), kind="experiments")
    raw = _with_base(p, set())
    user = parse_overrides(cli or [])
    cli_seeds = "seeds" in user
    for k in ("seeds", "budget"):
        if k in user:
            raw[k] = user.pop(k)
    _section_seeds(raw, user, cli_seeds)
    if "budget" in raw and cli and any(a.startswith("--budget") for a in cli):
        _section(raw.get("pretrain"), "pretrain").pop("budget", None)  # the command line's budget is every arm's
    ft_cli, eval_cli = flatten(_section(user.pop("finetune", {}), "--finetune")), user.pop("eval", {})
    pt, ft = _section(raw.get("pretrain"), "pretrain"), raw.get("finetune")
    _check_keys(pt, PRETRAIN_KEYS, "pretrain.")
    top = raw.get("seeds", [0])
    seeds = _seeds(pt.get("seeds", top), "pretrain.seeds" if "seeds" in pt else "seeds")
    overrides = _overrides(pt.get("overrides"), "pretrain.overrides") | flatten(user)
    if user and not pt:
        raise LMForgeError(f"--{next(iter(flatten(user)))}: this experiment has no pretraining arms to apply it to")
    where = "pretrain.budget" if "budget" in pt else "budget"
    budget = parse_budget(pt["budget"] if "budget" in pt else raw.get("budget"), where)
    arms = _arms(pt, "pretrain", default=default_name(str(pt.get("recipe", "gpt")))) if pt else []
    for arm in arms:
        if isinstance(arm.recipe, dict):
            raise LMForgeError(f"pretrain.arms: {arm.name}: recipe: expected a pretrain recipe name or path")
    tasks: list[FinetuneTask] = []
    ft_arms: list[ArmSpec] = []
    ft_over: dict[str, Any] = {}
    ft_seeds = seeds
    selection = None
    ensembles: list[EnsembleSpec] = []
    if ft is not None:
        ft = _section(ft, "finetune")
        _check_keys(ft, FINETUNE_KEYS, "finetune.")
        tasks = _tasks(ft.get("tasks"))
        ft_over = _overrides(ft.get("overrides"), "finetune.overrides")
        ft_seeds = _seeds(ft.get("seeds", top), "finetune.seeds" if "seeds" in ft else "seeds")
        ft_arms = _arms(ft, "finetune", default="", base=[ArmSpec(a.name, init=a.name) for a in arms])
        ensembles = _ensembles(ft.get("ensembles"), [a.name for a in ft_arms], ft_seeds)
        selection = _selection(ft.get("select"), [t.name for t in tasks], [a.name for a in ft_arms + ensembles])
    elif ft_cli:
        raise LMForgeError("--finetune.*: this experiment has no fine-tuning")
    evals = _evals(raw.get("eval"), flatten(_section(eval_cli, "--eval")))
    if not arms and evals:
        raise LMForgeError(f"{p}: eval: evaluates the pretraining arms, and this experiment has none")
    orphans = [a.name for a in ft_arms if a.init is None]
    if orphans:
        raise LMForgeError(
            f"{p}: finetune arm '{orphans[0]}' has no init: (a pretraining arm, a run dir, a preset or none)"
        )
    exp = Experiment(
        p, str(raw.get("description", "")).strip(), Path(out or raw.get("out") or f"runs/experiments/{p.stem}"),
        seeds, str(pt.get("recipe", "gpt")), overrides, arms, budget, ft_seeds, ft_over, ft_cli, ft_arms, tasks,
        evals, selection, ensembles, parse_claims(raw.get("claims"), {a.name for a in arms + ft_arms + ensembles}, p),
    )  # fmt: skip
    _check_sources(exp)
    return exp


def _check_sources(exp: Experiment) -> None:
    """An init: TASK/ARM names a task and a fine-tuning arm of this experiment, and that arm starts from pretraining
    (one intermediate task, not a chain)."""
    tasks = {t.name for t in exp.tasks}
    arms = {a.name: a for a in exp.finetune_arms}
    for arm in exp.finetune_arms:
        task, slash, name = (arm.init or "").partition("/")
        if not slash or task not in tasks:
            continue
        if name not in arms:
            raise LMForgeError(
                f"{exp.path}: finetune arm '{arm.name}': init: '{arm.init}': '{name}' is not a fine-tuning arm "
                f"({', '.join(arms)})"
            )
        if exp.source(arms[name]) is not None:
            raise LMForgeError(
                f"{exp.path}: finetune arm '{arm.name}': init: '{arm.init}' starts from another task's fine-tune "
                "itself; an arm's intermediate task must start from pretraining"
            )


def _section_seeds(raw: dict, user: dict, cli_seeds: bool) -> None:
    """--pretrain.seeds=L and --finetune.seeds=L replace that section's seeds in `raw`; --seeds=L, which replaces
    the top-level list, is an error when every section sets its own (it would change nothing)."""
    pt = user.pop("pretrain", None)
    if pt is not None and (not isinstance(pt, dict) or set(pt) != {"seeds"}):
        raise LMForgeError("--pretrain.*: only --pretrain.seeds=0,1 is a setting of the experiment (--KEY=VALUE "
                           "goes to every pretraining arm)")  # fmt: skip
    ft = user.get("finetune")
    for name, given in (("pretrain", pt), ("finetune", ft)):
        if isinstance(given, dict) and "seeds" in given:
            if not isinstance(raw.get(name), dict):
                raise LMForgeError(f"--{name}.seeds: this experiment has no {name} section")
            raw[name] = {**raw[name], "seeds": given.pop("seeds")}
    if isinstance(ft, dict) and not ft:
        user.pop("finetune")
    sections = [n for n in ("pretrain", "finetune") if raw.get(n) is not None]
    if cli_seeds and sections and all("seeds" in _section(raw[n], n) for n in sections):
        own, flags = " and ".join(f"{n}.seeds" for n in sections), " or ".join(f"--{n}.seeds=0,1" for n in sections)
        raise LMForgeError(f"--seeds: this file sets {own}, which the top-level seeds do not reach; use {flags}")


def _with_base(path: Path, seen: set[Path]) -> dict:
    """The file's mapping deep-merged over the experiment it names as `base:` (a path relative to the file, or a
    bundled name)."""
    from lmforge.config import merge_dicts, read_yaml, resolve_recipe

    raw = read_yaml(path)
    _check_keys(raw, KEYS, "", where=str(path))
    base = raw.pop("base", None)
    if base is None:
        return raw
    near = path.parent / str(base)
    bp = near if near.is_file() else resolve_recipe(str(base), kind="experiments")
    if bp.resolve() in seen or len(seen) > 8:
        raise LMForgeError(f"{path}: base: '{base}' includes itself")
    return merge_dicts(_with_base(bp, seen | {path.resolve()}), raw)


def check_name(name: str, what: str) -> None:
    """Refuse a name that is not a plain directory name (`NAME`): one with a '/' or '..' would put a run's files
    outside the experiment dir."""
    if not NAME.fullmatch(name):
        raise LMForgeError(f"{what} '{name}' must be letters, digits, '.', '_', '+', '=' or '-'")


def default_name(recipe: str) -> str:
    """The name of an arm or evaluation named after its recipe or task: the name itself, or a path's file stem."""
    return recipe if NAME.fullmatch(recipe) else _slug(Path(recipe).stem)


def _check_keys(raw: dict, keys: tuple[str, ...], prefix: str, where: str = "") -> None:
    for k in raw:
        if k not in keys:
            tip = did_you_mean(str(k), keys, f"expected: {', '.join(keys)}", prefix)
            raise LMForgeError(f"{where + ': ' if where else ''}unknown key '{prefix}{k}'{tip}")


def _section(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LMForgeError(f"{where}: expected a mapping, got {value!r}")
    return value


def _overrides(value: Any, where: str) -> dict[str, Any]:
    out = flatten(_section(value, where))
    bad = [k for k in out if k in RESERVED]
    if bad:
        raise LMForgeError(f"{where}: {bad[0]} is set by the experiment for each run (seeds: sets run.seed)")
    return out


def _seeds(value: Any, where: str) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str) and re.fullmatch(r"\d+(,\d+)*", value.replace(" ", "")):
        value = [int(x) for x in value.replace(" ", "").split(",")]  # --seeds=0,1,2
    ok = isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) for s in value)
    if not ok or len(set(value)) != len(value):
        raise LMForgeError(f"{where}: expected a list of distinct integer seeds, got {value!r}")
    return list(value)


def _selection(value: Any, tasks: list[str], arms: list[str]) -> Selection | None:
    if value is None:
        return None
    raw = _section(value, "finetune.select")
    _check_keys(raw, SELECT_KEYS, "finetune.select.")
    held = raw.get("held_out", [])
    held = [held] if isinstance(held, str) else held
    if not isinstance(held, list) or any(t not in tasks for t in held):
        raise LMForgeError(f"finetune.select.held_out: expected names of this experiment's tasks ({', '.join(tasks)}), "
                           f"got {raw.get('held_out')!r}")  # fmt: skip
    if held and len(set(held)) == len(tasks):
        raise LMForgeError("finetune.select.held_out: every task is held out, so none is left to choose on")
    metric = raw.get("metric", Selection.metric)
    if not isinstance(metric, str) or not metric:
        raise LMForgeError(f"finetune.select.metric: expected a dev metric's name, got {metric!r}")
    among = raw.get("arms")
    among = [among] if isinstance(among, str) else among
    if among is not None and (not isinstance(among, list) or not among or any(a not in arms for a in among)):
        raise LMForgeError(f"finetune.select.arms: expected names of this experiment's fine-tuning arms "
                           f"({', '.join(arms)}), got {raw.get('arms')!r}")  # fmt: skip
    return Selection(metric, list(held), among)


def _ensembles(value: Any, arms: list[str], seeds: list[int]) -> list[EnsembleSpec]:
    if value is None:
        return []
    if not isinstance(value, list) or not value:
        raise LMForgeError("finetune.ensembles: expected a list of ensembles ({name: ..., arm: ..., size: N})")
    out: list[EnsembleSpec] = []
    for e in value:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise LMForgeError(f"finetune.ensembles: each ensemble is a mapping with a name, got {e!r}")
        name = e["name"]
        _check_keys(e, ENSEMBLE_KEYS, "", where=f"finetune.ensembles: {name}")
        check_name(name, "finetune.ensembles: name")
        if name in arms or name in {x.name for x in out}:
            raise LMForgeError(f"finetune.ensembles: {name}: the name is taken by another arm or ensemble")
        if e.get("arm") not in arms:
            raise LMForgeError(f"finetune.ensembles: {name}: arm: expected one of this experiment's fine-tuning arms "
                               f"({', '.join(arms)}), got {e.get('arm')!r}")  # fmt: skip
        tfidf = e.get("tfidf", False)
        if not isinstance(tfidf, bool):
            raise LMForgeError(f"finetune.ensembles: {name}: tfidf: expected true or false, got {tfidf!r}")
        size, least = e.get("size"), 1 if tfidf else 2
        if isinstance(size, bool) or not isinstance(size, int) or size < least or len(seeds) % size:
            raise LMForgeError(f"finetune.ensembles: {name}: size: expected an integer ≥ {least} that divides the "
                               f"{len(seeds)} fine-tuning seeds into groups, got {size!r}")  # fmt: skip
        out.append(EnsembleSpec(name, e["arm"], size, tfidf))
    return out


def _arms(section: dict, stage: str, default: str, base: list[ArmSpec] | None = None) -> list[ArmSpec]:
    """Named arms (default: `base`, else one) × the grid (every combination of its values), each arm's dotted keys
    over the grid's."""
    arms = section.get("arms")
    if isinstance(arms, dict):  # {name: {keys}}: lets a `base:` file's arm be changed key by key
        arms = [{"name": k, **(v or {})} if isinstance(v, dict) or v is None else v for k, v in arms.items()]
    if arms is not None and (not isinstance(arms, list) or not arms):
        raise LMForgeError(f"{stage}.arms: expected a list of arms ({{name: ..., dotted.key: value, ...}})")
    specs = [_arm(a, stage) for a in arms] if arms is not None else (base or [ArmSpec("")])
    grid = _grid(section.get("grid"), f"{stage}.grid")
    out = []
    for spec in specs:
        for point in grid:
            name = "-".join(x for x in [spec.name, *(_slug(v) for v in point.values())] if x) or default
            over = point | spec.overrides
            out.append(ArmSpec(name, over, spec.recipe, spec.init, spec.budget))
    names = [a.name for a in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LMForgeError(f"{stage}.arms: two arms are named '{dupes[0]}' (arm names must be unique)")
    return out


def _arm(a: Any, stage: str) -> ArmSpec:
    if isinstance(a, str):
        a = {"name": a}
    if not isinstance(a, dict) or not isinstance(a.get("name", None), str):
        raise LMForgeError(f"{stage}.arms: each arm is a mapping with a name, got {a!r}")
    name = a["name"]
    if name:
        check_name(name, f"{stage}.arms: arm name")
    plain = {k: v for k, v in a.items() if "." not in str(k)}
    _check_keys(plain, ARM_KEYS, "", where=f"{stage}.arms: {name or 'arm'}")
    dotted = _overrides({k: v for k, v in a.items() if "." in str(k)}, f"{stage}.arms: {name}")
    recipe = a.get("recipe")
    if recipe is not None and not isinstance(recipe, (str, dict)):
        raise LMForgeError(f"{stage}.arms: {name}: recipe: expected a recipe name or path, got {recipe!r}")
    init = a.get("init")
    budget = parse_budget(a.get("budget"), f"{stage}.arms: {name}: budget")
    return ArmSpec(name, dotted, recipe, None if init is None else str(init), budget)


def _grid(value: Any, where: str) -> list[dict[str, Any]]:
    """Every combination of the grid's values, as {dotted key: value} points ([{}]: no grid)."""
    grid = flatten(_section(value, where))
    for k, v in grid.items():
        if k in RESERVED:
            raise LMForgeError(f"{where}: {k} is set by the experiment for each run (seeds: sets run.seed)")
        if not isinstance(v, list) or not v:
            raise LMForgeError(f"{where}.{k}: expected a non-empty list of values, got {v!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def _slug(value: Any) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return re.sub(r"[^A-Za-z0-9._+=-]+", "_", text).strip("_") or "x"


def _tasks(value: Any) -> list[FinetuneTask]:
    if not isinstance(value, list) or not value:
        raise LMForgeError("finetune.tasks: expected a list of tasks ({name: ..., recipe: ..., overrides: ...})")
    out = []
    for t in value:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or "recipe" not in t:
            raise LMForgeError(f"finetune.tasks: each task is a mapping with a name and a recipe, got {t!r}")
        _check_keys(t, TASK_KEYS, "", where=f"finetune.tasks: {t['name']}")
        check_name(t["name"], "finetune.tasks: task name")
        recipe = t["recipe"]
        if isinstance(recipe, dict):
            bad = [k for k in recipe if k not in ARCHES]
            if bad or not recipe:
                raise LMForgeError(
                    f"finetune.tasks: {t['name']}: recipe: a recipe name, or one per architecture "
                    f"({', '.join(ARCHES)}), got {recipe!r}"
                )
        elif not isinstance(recipe, str):
            raise LMForgeError(f"finetune.tasks: {t['name']}: recipe: expected a recipe name, got {recipe!r}")
        out.append(FinetuneTask(t["name"], recipe, _overrides(t.get("overrides"), f"finetune.tasks: {t['name']}")))
    if len({t.name for t in out}) != len(out):
        raise LMForgeError("finetune.tasks: task names must be unique")
    return out


def _evals(value: Any, cli: dict[str, Any]) -> list[EvalSpec]:
    if value is None:
        if cli:
            raise LMForgeError("--eval.*: this experiment has no evaluations")
        return []
    if not isinstance(value, list):
        raise LMForgeError("eval: expected a list of evaluations ({name: ..., task: ..., overrides: ..., arms: ...})")
    out = []
    for e in value:
        if isinstance(e, str):
            e = {"name": e, "task": e}
        if not isinstance(e, dict) or not isinstance(e.get("task"), str):
            raise LMForgeError(f"eval: each evaluation is a mapping with a task (a recipes/eval name), got {e!r}")
        _check_keys(e, EVAL_KEYS, "", where=f"eval: {e['task']}")
        arms = e.get("arms")
        if arms is not None and (not isinstance(arms, list) or not all(isinstance(a, str) for a in arms)):
            raise LMForgeError(f"eval: {e['task']}: arms: expected a list of pretraining arm names, got {arms!r}")
        over = _overrides(e.get("overrides"), f"eval: {e['task']}") | cli
        name = str(e["name"]) if "name" in e else default_name(e["task"])
        check_name(name, "eval: name")
        out.append(EvalSpec(name, e["task"], over, arms))
    if len({e.name for e in out}) != len(out):
        raise LMForgeError("eval: evaluation names must be unique (give each a name:)")
    return out
