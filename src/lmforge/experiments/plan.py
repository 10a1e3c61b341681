"""The runs of an experiment (experiments/spec.py), each an ordinary run dir under OUT:

- OUT/pretrain/<arm>-s<seed>: `lmforge pretrain`, its steps from the budget: equal tokens (batch × seq_len ×
  grad_accum a step), equal FLOPs (the objective's `window_flops`, models/flops.py, × batch × grad_accum a step)
  or equal steps. Arms that do not continue another share one tokenizer and prepared corpus (OUT/shared/<data>).
- OUT/finetune/<task>/<arm>-s<seed>: `lmforge finetune RECIPE --init ARM_RUN` (or a preset / none: random init; or,
  for init: TASK/ARM, the same seed's fine-tune of ARM on TASK).
- OUT/eval/<eval>/<arm>-s<seed>: `lmforge eval ARM_RUN --task TASK`, zero/few-shot.

A later stage's seed s uses the pretraining run of seed s, or the only one when the arm was pretrained once."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import Arm, cli_args
from lmforge.experiments.budget import Budget
from lmforge.experiments.spec import ArmSpec, Experiment, FinetuneTask


@dataclass
class Plan:
    arms: list[Arm]
    pretrain: dict[str, dict[int, Arm]] = field(default_factory=dict)
    """Pretraining arm name → its run per seed."""
    tokenizer: str | None = None
    """The one tokenizer every fresh pretraining arm shares, if they share one."""


def plan_experiment(exp: Experiment, make_data: bool = True) -> Plan:
    """Every run of the experiment, validated (bad keys and values fail here, before anything runs). With
    `make_data`, the evaluations' data dirs are checked and the shared tokenizers and corpora are trained and
    prepared first (a dry run plans without them)."""
    if make_data:
        _check_eval_data(exp)
    pre, cfgs, tokenizers = _pretraining(exp, make_data)
    plan = Plan([a for runs in pre.values() for a in runs.values()], pre)
    plan.tokenizer = tokenizers.pop() if len(tokenizers) == 1 else None
    plan.arms += _finetuning(exp, plan, cfgs)
    plan.arms += _evaluations(exp, pre)
    return plan


def _resolve(recipe: str, overrides: dict[str, Any], what: str):
    from lmforge.experiments.arms import resolve_config

    try:
        return resolve_config(recipe, overrides)
    except LMForgeError as e:
        raise LMForgeError(f"{what}: {e}") from None


def paired(runs: dict[int, Arm], seed: int, arm: str, what: str) -> Arm:
    """The run of pretraining arm `arm` that stage run `what` of `seed` starts from."""
    if seed in runs:
        return runs[seed]
    if len(runs) == 1:
        return next(iter(runs.values()))
    raise LMForgeError(
        f"{what}: arm '{arm}' was pretrained with seeds {sorted(runs)}, not {seed}: give the later stage the same "
        "seeds, or pretrain it with one seed"
    )


# --- pretraining ------------------------------------------------------------------------------------------------


def _pretraining(exp: Experiment, make_data: bool) -> tuple[dict[str, dict[int, Arm]], dict[str, Any], set[str]]:
    from lmforge.experiments.data import data_key, shared_data

    names = {a.name for a in exp.arms}
    pre: dict[str, dict[int, Arm]] = {}
    cfgs: dict[str, Any] = {}
    shared: dict[str, dict[str, Any]] = {}
    for spec in _ordered(exp.arms):
        recipe = str(spec.recipe or exp.recipe)
        over = exp.overrides | spec.overrides
        what = f"pretraining arm {spec.name}"
        budget = spec.budget or exp.budget
        if budget is not None and "train.max_steps" in over:
            raise LMForgeError(f"{what}: train.max_steps is set by the budget ({budget.describe()})")
        train_tokens = None
        if spec.init is not None and spec.init not in names:
            raise LMForgeError(f"{what}: init: '{spec.init}' is not a pretraining arm (run.init: PATH continues a run)")
        if spec.init is None and not over.get("run.init") and make_data:  # a continued run keeps its tokenizer
            cfg = _resolve(recipe, over, what)
            key = data_key(cfg)  # given data.tokenizer and data.prepared are used as they are
            if key not in shared:
                shared[key] = shared_data(cfg, exp.out / "shared" / key)
            train_tokens = shared[key]["train_tokens"]
            over = over | {k: v for k, v in shared[key].items() if k != "train_tokens"}
        pre[spec.name] = {}
        for seed in exp.seeds:
            o, after = over | {"run.seed": seed}, []
            if spec.init is not None:
                src = paired(pre[spec.init], seed, spec.init, what)
                o["run.init"], after = str(src.run_dir), [src.name]
            cfg = _resolve(recipe, o, what)
            if budget is not None and cfg.train.time_budget is not None:  # a recipe that ends on the clock
                if "train.time_budget" in o:
                    raise LMForgeError(f"{what}: train.time_budget ends a run on the clock, and the budget "
                                       f"({budget.describe()}) fixes its steps: set one of them")  # fmt: skip
                o["train.time_budget"] = cfg.train.time_budget = None  # equal compute: the same steps on any host
            if spec.init is not None:  # the run continues its init's model (apply_init replaces model.*)
                cfg.model = copy.deepcopy(cfgs[spec.init].model)
            run = f"{spec.name}-s{seed}"
            info = _pretrain_info(cfg, budget, what) | {"stage": "pretrain", "arm": spec.name, "seed": seed,
                                                        "recipe": recipe, "init": spec.init}  # fmt: skip
            if train_tokens:
                info["epochs"] = info["tokens"] / train_tokens
            arm = Arm(f"pretrain/{run}", exp.out / "pretrain" / run, recipe, o, info["steps"], info, after=after)
            pre[spec.name][seed] = arm
        cfgs[spec.name] = cfg
    tokenizers = {str(a.overrides["data.tokenizer"]) for runs in pre.values() for a in runs.values()
                  if a.overrides.get("data.tokenizer") and not a.overrides.get("run.init")}  # fmt: skip
    return pre, cfgs, tokenizers


def _ordered(arms: list[ArmSpec]) -> list[ArmSpec]:
    """Arms with every `init` arm before the arms that continue it."""
    by_name, out, state = {a.name: a for a in arms}, [], {}

    def visit(a: ArmSpec) -> None:
        if state.get(a.name) == "done":
            return
        if state.get(a.name) == "visiting":
            raise LMForgeError(f"pretraining arm {a.name}: its init: chain comes back to itself")
        state[a.name] = "visiting"
        if a.init in by_name:
            visit(by_name[a.init])
        state[a.name] = "done"
        out.append(a)

    for a in arms:
        visit(a)
    return out


def _pretrain_info(cfg, budget: Budget | None, what: str) -> dict[str, Any]:
    """Steps from the budget, with the tokens, FLOPs and parameters they come to."""
    import torch

    from lmforge.models import Transformer
    from lmforge.objectives import OBJECTIVES

    t = cfg.train
    tokens_step = t.batch_size * t.seq_len * t.grad_accum
    flops_step = OBJECTIVES.get(cfg.objective.name).window_flops(cfg) * t.batch_size * t.grad_accum
    if budget is None:
        steps = t.max_steps
    else:
        per_step = {"tokens": tokens_step, "flops": flops_step, "steps": 1}[budget.kind]
        steps = max(1, round(budget.value / per_step))
    if t.warmup_steps >= steps:
        raise LMForgeError(
            f"{what}: {steps} steps, not more than train.warmup_steps={t.warmup_steps}: lower the warmup or raise "
            "the budget"
        )
    with torch.device("meta"):  # shapes only
        params = Transformer(cfg.model).num_params()
    return {"objective": cfg.objective.name, "arch": cfg.model.arch, "params": params, "steps": steps,
            "tokens": steps * tokens_step, "flops": steps * flops_step, "tokens_per_step": tokens_step,
            "flops_per_step": flops_step, "batch_size": t.batch_size}  # fmt: skip


# --- fine-tuning and evaluation -----------------------------------------------------------------------------------


def _finetuning(exp: Experiment, plan: Plan, cfgs: dict[str, Any]) -> list[Arm]:
    """Every fine-tuning run: first the arms that start from pretraining (or a preset, a dir, none), then those that
    start from another task's fine-tune (`Experiment.source`), each after the run it continues."""
    from lmforge.tasks.config import load_finetune_config

    out: list[Arm] = []
    made: dict[tuple[str, str, int], tuple[Arm, str | None]] = {}  # (task, arm, seed) → its run, architecture
    specs = exp.finetune_arms
    for stage in ([s for s in specs if exp.source(s) is None], [s for s in specs if exp.source(s) is not None]):
        for task in exp.tasks:
            for spec in stage:
                src = exp.source(spec)
                if src is not None and src[0] == task.name:
                    continue  # a task is not its own intermediate task
                what = f"fine-tuning arm {spec.name} ({task.name})"
                over = exp.finetune_overrides | task.overrides | exp.finetune_cli | spec.overrides
                for seed in exp.finetune_seeds:
                    o = over | {"run.seed": seed}
                    if src is None:
                        init, arch, after = _init(spec, seed, plan, cfgs, what)
                        init_arm = spec.init if spec.init in plan.pretrain else None
                        pretrain_run = after[0] if after else None
                    else:
                        first, arch = made[(*src, seed)]
                        init, after = str(first.run_dir), [first.name]
                        init_arm, pretrain_run = first.info["init_arm"], first.info["pretrain_run"]
                    recipe = _recipe_for(task, arch, spec, o, what)
                    if spec.init == "none" and plan.tokenizer and "model.tokenizer" not in o:
                        o["model.tokenizer"] = plan.tokenizer  # random init: the pretrained arms' vocabulary
                    run = f"{spec.name}-s{seed}"
                    run_dir = exp.out / "finetune" / task.name / run
                    try:
                        load_finetune_config(recipe, cli_args(o | {"run.dir": str(run_dir)}), init=init)
                    except LMForgeError as e:
                        raise LMForgeError(f"{what}: {e}") from None
                    info = {"stage": "finetune", "task": task.name, "arm": spec.name, "seed": seed, "recipe": recipe,
                            "init": init, "init_arm": init_arm, "pretrain_run": pretrain_run,
                            "via": "/".join(src) if src else None}  # fmt: skip
                    arm = Arm(f"finetune/{task.name}/{run}", run_dir, recipe, o, None, info, "finetune", init,
                              after=after)  # fmt: skip
                    made[(task.name, spec.name, seed)] = (arm, arch)
                    out.append(arm)
    return out


def _init(spec: ArmSpec, seed: int, plan: Plan, cfgs: dict[str, Any], what: str) -> tuple[str, str | None, list]:
    """(--init value, architecture of what it starts from if known, arms it needs)."""
    from lmforge.registry import MODELS

    init = str(spec.init)
    if init in plan.pretrain:
        src = paired(plan.pretrain[init], seed, init, what)
        return str(src.run_dir), cfgs[init].model.arch, [src.name]
    if init != "none" and init in MODELS:
        return init, _preset_arch(init), []
    if init == "none":
        return init, None, []  # the architecture is model.preset's (`_recipe_for`)
    path = Path(init)
    if not path.exists():
        raise LMForgeError(f"{what}: init: '{init}' is neither a pretraining arm, a run dir, a preset nor none")
    return init, _path_arch(path), []


def _preset_arch(name: str) -> str:
    from lmforge.models import get_preset

    return get_preset(name).arch


def _path_arch(path: Path) -> str | None:
    from lmforge.checkpoint.read import read_config
    from lmforge.checkpoint.verify import model_checkpoint

    try:
        cfg = read_config(model_checkpoint(path))
    except LMForgeError:
        return None  # e.g. a Hugging Face dir: only a single recipe fits it
    model = cfg.get("backbone") or cfg.get("model") or {}
    return model.get("arch")


def _recipe_for(task: FinetuneTask, arch: str | None, spec: ArmSpec, over: dict, what: str) -> str:
    """The task's recipe, or its recipe for the architecture fine-tuned (a random init's: model.preset's)."""
    if isinstance(spec.recipe, str):
        return spec.recipe
    if isinstance(task.recipe, str):
        return task.recipe
    if arch is None and spec.init == "none" and "model.preset" in over:
        arch = _preset_arch(str(over["model.preset"]))
    if arch is None:
        raise LMForgeError(f"{what}: task {task.name} has a recipe per architecture; give this arm model.preset")
    if arch not in task.recipe:
        raise LMForgeError(f"{what}: task {task.name} has no recipe for the arm's architecture '{arch}'")
    return task.recipe[arch]


def _check_eval_data(exp: Experiment) -> None:
    """One line, before any run starts, for a BLiMP evaluation whose minimal pairs its arms would not find: no
    data.dir (BLiMP is not bundled), or one that is not a directory of <paradigm>.jsonl files. Otherwise the
    pretraining would run to its end and each eval arm fail."""
    from lmforge.data.labelled.blimp import paradigm_files
    from lmforge.eval.zeroshot import load_prompt_config

    for e in exp.evals:
        try:
            data = load_prompt_config(e.task, cli_args(e.overrides)).data
            if data.source != "blimp":
                continue
            if data.dir is None:
                raise LMForgeError(
                    "data.source=blimp needs data.dir, the directory of BLiMP's <paradigm>.jsonl files (BLiMP is "
                    "not bundled): --eval.data.dir=DIR"
                )
            paradigm_files(data.dir)
        except LMForgeError as err:
            raise LMForgeError(f"eval: {e.name}: {err}") from None


def _evaluations(exp: Experiment, pre: dict[str, dict[int, Arm]]) -> list[Arm]:
    from lmforge.eval.zeroshot import load_prompt_config

    out = []
    for e in exp.evals:
        unknown = [a for a in e.arms or [] if a not in pre]
        if unknown:
            raise LMForgeError(f"eval: {e.name}: arms: '{unknown[0]}' is not a pretraining arm")
        try:
            load_prompt_config(e.task, cli_args(e.overrides))
        except LMForgeError as err:
            raise LMForgeError(f"eval: {e.name}: {err}") from None
        for name in e.arms or list(pre):
            for seed, src in pre[name].items():
                run = f"{name}-s{seed}"
                info = {"stage": "eval", "eval": e.name, "arm": name, "seed": seed, "pretrain_run": src.name}
                out.append(Arm(f"eval/{e.name}/{run}", exp.out / "eval" / e.name / run, e.task, dict(e.overrides),
                               None, info, "eval", str(src.run_dir), [e.task], [src.name]))  # fmt: skip
    return out
