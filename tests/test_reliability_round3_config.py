"""One clear line for bad configs and options, before any work: recipe sections that are not mappings, seeds out of
every generator's range, models too large for the machine, and generation options out of range or not finite. Each
case asserts the exact line (exit 2, nothing else on stderr) and that nothing was trained, written or loaded."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_generate import CharTokenizer, decoder
from test_reliability_inputs import TINY, cli, one_error_line

from lmforge.config import RECIPES_DIR
from lmforge.errors import LMForgeError
from lmforge.models import Transformer, get_preset
from lmforge.pretraining.config import load_config
from lmforge.registry import MODELS

pytestmark = pytest.mark.usefixtures("torch_globals")

GIB = 1024**3
SEED_MAX = 2**32 - 1
"""The largest seed: NumPy's legacy generator's, with room for what a run adds to it under torch's 2**64 - 1."""
BIG_SEED = "99999999999999999999"


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


def pretrain_args(prepared, run: Path, *extra: str) -> list[str]:
    """A one-step tiny pretraining on prepared data (what would run if nothing refused it)."""
    tok, data = prepared
    return ["pretrain", f"--run.dir={run}", f"--data.tokenizer={tok}", f"--data.prepared={data}", *TINY,
            "--model.vocab_size=512", "--train.max_steps=1", *extra]  # fmt: skip


# --- 10: recipe sections of the wrong type ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, shown",
    [
        ("train: 5", "train: expected a mapping of keys, got 5"),
        ("train: [1, 2]", "train: expected a mapping of keys, got [1, 2]"),
        ("train: fast", "train: expected a mapping of keys, got 'fast'"),
        ("run: 5", "run: expected a mapping of keys, got 5"),
        ("data: [a.txt]", "data: expected a mapping of keys, got ['a.txt']"),
        ("sample: 7", "sample: expected a mapping of keys, got 7"),
        ("objective: 5", "objective: expected a mapping of keys or a name (objective.name), got 5"),
        ("model: 5", "model: expected a mapping of keys or a name (model.preset), got 5"),
    ],
)
def test_a_pretraining_recipe_section_that_is_not_a_mapping_is_refused_before_any_work(
    section, shown, prepared, tmp_path, capsys
):
    recipe = tmp_path / "R.yaml"
    recipe.write_text(section + "\n")
    run = tmp_path / "run"  # the line's overrides set keys of the section, which merged over it without a word
    line = one_error_line(capsys, *pretrain_args(prepared, run, "--config", str(recipe), "--model.preset=gpt-tiny"))
    assert line == f"error: {recipe}: {shown}"
    assert not run.exists()


@pytest.mark.parametrize(
    "kind, section, override, shown",
    [
        (["finetune"], "train: 5", "--train.lr=1e-4", "train: expected a mapping of keys, got 5"),
        (["finetune"], "task: 5", "--task.max_len=16", "task: expected a mapping of keys, got 5"),
        (["finetune"], "peft: [lora]", "--peft.method=lora", "peft: expected a mapping of keys, got ['lora']"),
        (["align", "sft"], "run: [1]", "--run.seed=1", "run: expected a mapping of keys, got [1]"),
        (["align", "dpo"], "method: dpo\ndpo: 0.1", "--dpo.beta=0.2", "dpo: expected a mapping of keys, got 0.1"),
        (["compress", "report"], "distill: 5", "--distill.lr=1e-4", "distill: expected a mapping of keys, got 5"),
    ],
)
def test_every_run_kind_refuses_a_recipe_section_that_is_not_a_mapping(kind, section, override, shown, tmp_path,
                                                                       capsys):  # fmt: skip
    recipe = tmp_path / "R.yaml"
    recipe.write_text(section + "\n")
    rc, out, err = cli(capsys, *kind, "--config", str(recipe), override, "--print-config", "--quiet")
    assert (rc, out, err) == (2, "", f"error: {recipe}: {shown}\n")


def test_a_section_given_a_value_through_the_python_api_is_one_line_not_a_crash(tmp_path):
    from lmforge.eval.zeroshot import load_prompt_config
    from lmforge.tasks.config import load_finetune_config

    with pytest.raises(LMForgeError, match=r"^objective: expected a mapping, got 5$"):
        load_config(None, ["--objective=5"])  # was TypeError: 'int' object is not iterable
    with pytest.raises(LMForgeError, match=r"^task: expected a mapping, got 5$"):
        load_finetune_config(None, ["--task=5"])
    recipe = tmp_path / "E.yaml"
    for section, shown in (("eval: 5", "eval: expected a mapping of keys, got 5"),
                           ("data: 5", "data: expected a mapping of keys, got 5")):  # fmt: skip
        recipe.write_text(section + "\n")
        with pytest.raises(LMForgeError) as e:
            load_prompt_config(recipe)
        assert str(e.value) == f"{recipe}: {shown}"


def test_a_recipe_preset_name_keeps_its_preset_under_model_overrides(tmp_path):
    recipe = tmp_path / "R.yaml"
    recipe.write_text("model: gpt-tiny\n")
    cfg = load_config(recipe, ["--model.n_layers=3"])  # the override's model section replaced the name
    assert (cfg.model.name, cfg.model.d_model, cfg.model.n_layers) == ("gpt-tiny", 64, 3)


def test_an_empty_recipe_section_sets_nothing(tmp_path):
    recipe = tmp_path / "R.yaml"
    recipe.write_text("train:  # every key commented out\nmodel:\n  preset: gpt-tiny\n")
    cfg = load_config(recipe)  # was: train is a section, not a value (got None)
    assert cfg.train.max_steps == load_config(None, ["--model.preset=gpt-tiny"]).train.max_steps


# --- 11: seeds ------------------------------------------------------------------------------------------------------


SEED_LINE = f"run.seed must be in [0, {SEED_MAX}], got {BIG_SEED}"


def test_a_seed_too_large_for_torch_is_refused_before_any_work(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    line = one_error_line(capsys, *pretrain_args(prepared, run, "--model.preset=gpt-tiny", f"--run.seed={BIG_SEED}"))
    assert line == f"error: {SEED_LINE}"  # was: internal error: RuntimeError: Overflow when unpacking long
    assert not run.exists()
    assert load_config(None, [f"--run.seed={SEED_MAX}"]).run.seed == SEED_MAX  # the largest is taken


@pytest.mark.parametrize(
    "args, shown",
    [
        (["finetune", f"--run.seed={BIG_SEED}"], SEED_LINE),
        (["align", "sft", f"--run.seed={BIG_SEED}"], SEED_LINE),
        (["compress", "report", f"--seed={BIG_SEED}"], f"seed must be in [0, {SEED_MAX}], got {BIG_SEED}"),
    ],
)
def test_every_run_kind_range_checks_its_seed(args, shown, capsys):
    rc, out, err = cli(capsys, *args, "--print-config", "--quiet")
    assert (rc, out, err) == (2, "", f"error: {shown}\n")


def test_an_experiments_seeds_are_range_checked_before_any_arm_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_error_line(capsys, "experiment", "gpt1-pretraining-tiny", f"--seeds={BIG_SEED}", "--dry-run")
    assert line.startswith("error: ") and line.endswith(SEED_LINE)
    assert not (tmp_path / "runs").exists()


# --- 12: models too large for the machine -------------------------------------------------------------------------


@functools.cache
def true_params(name: str) -> int:
    """A preset's parameters, counted on the meta device (built once per test process)."""
    with torch.device("meta"):
        return Transformer(get_preset(name)).num_params()


def test_the_size_estimate_never_exceeds_a_presets_parameters():
    """A lower bound, so the check refuses no model that fits; tight enough to mean something."""
    from lmforge.models.size import estimate_params

    for name in MODELS.names():
        est, real = estimate_params(get_preset(name)).total, true_params(name)
        assert 0.89 * real <= est <= real, name


def test_no_preset_or_bundled_recipe_that_fits_24_gib_is_refused():
    from lmforge.config import read_yaml
    from lmforge.train.memory import check_model_fits

    fits = []
    for name in MODELS.names():
        if true_params(name) * 16 <= 24 * GIB:  # fp32 weights, gradients, AdamW moments
            check_model_fits(get_preset(name), "adamw", 24 * GIB, "24 GiB")
            fits.append(name)
    assert {"gpt2-1.5b", "llama-1b", "t5-large", "bart-large"} <= set(fits)
    for recipe in sorted((RECIPES_DIR / "pretrain").glob("*.yaml")):
        raw = read_yaml(recipe)
        if (raw.get("data") or {}).get("tokenizer") is None:  # a published tokenizer would be looked up
            cfg = load_config(recipe)
            check_model_fits(cfg.model, cfg.train.optimizer, 24 * GIB, "24 GiB")


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("n_layers", 10**6, "model.n_layers=1000000: about 49.2 billion parameters (most in its blocks), whose "
                            "training needs at least 732 GiB"),
        ("vocab_size", 10**12, "model.vocab_size=1000000000000: about 64.0 trillion parameters (most in its "
                               "embeddings), whose training needs at least 953,674 GiB"),
        ("max_seq_len", 10**9, "model.max_seq_len=1000000000: about 64.0 billion parameters (most in its "
                               "positions), whose training needs at least 954 GiB"),
    ],
)  # fmt: skip
def test_a_model_too_large_for_the_memory_is_refused_naming_its_field(field, value, shown):
    from lmforge.train.memory import check_model_fits

    cfg = dataclasses.replace(get_preset("gpt-tiny"), **{field: value})
    with pytest.raises(LMForgeError) as e:
        check_model_fits(cfg, "adamw", 64 * GIB, "this machine's 64 GiB of RAM")
    tail = " for fp32 weights, gradients and AdamW state (16 bytes a parameter), more than this machine's 64 GiB of RAM"
    assert str(e.value) == shown + tail + "; make the model smaller"
    wide = dataclasses.replace(get_preset("gpt-tiny"), d_model=10**6, n_heads=1)
    with pytest.raises(LMForgeError, match=r"^model\.d_model=1000000, model\.n_heads=1: about 8\.0 trillion"):
        check_model_fits(wide, "adamw", 64 * GIB, "64 GiB")
    check_model_fits(get_preset("gpt2-1.5b"), "adamw", 24 * GIB, "24 GiB")  # 23.2 GiB: taken


def _limit_memory() -> None:  # the run before the check built its layers until the machine ran out (3.5 GB in 41 s)
    resource.setrlimit(resource.RLIMIT_AS, (6 * GIB, 6 * GIB))


def test_pretraining_an_absurdly_large_model_is_refused_before_any_work(prepared, tmp_path):
    run = tmp_path / "run"
    args = pretrain_args(prepared, run, "--model.preset=gpt-tiny", "--model.n_layers=100000000", "--quiet")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    p = subprocess.run([sys.executable, "-m", "lmforge.cli", *args], capture_output=True, text=True, timeout=300,
                       env=env, preexec_fn=_limit_memory)  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert re.fullmatch(
        r"error: model\.n_layers=100000000: about 4\.9 trillion parameters \(most in its blocks\), whose training "
        r"needs at least 73,242 GiB for fp32 weights, gradients and AdamW state \(16 bytes a parameter\), more than "
        r"this machine's [\d.,]+ GiB of RAM; make the model smaller\n",
        p.stderr,
    ), p.stderr
    assert sorted(q.name for q in run.iterdir()) == [".lock"]  # no tokenizer, data, config or checkpoint


# --- 17: generation options -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option, value, shown",
    [
        ("--temperature", "-1", "--temperature must be >= 0, got -1.0"),
        ("--temperature", "nan", "--temperature must be a finite number, got nan"),
        ("--temperature", "inf", "--temperature must be a finite number, got inf"),
        ("--top-p", "0", "--top-p must be in (0, 1], got 0.0"),
        ("--top-p", "1.5", "--top-p must be in (0, 1], got 1.5"),
        ("--top-k", "-1", "--top-k must be >= 0, got -1"),
        ("--num-beams", "0", "--num-beams must be >= 1, got 0"),
        ("--max-new-tokens", "-5", "--max-new-tokens must be >= 0, got -5"),
        ("--length-penalty", "nan", "--length-penalty must be a finite number, got nan"),
        ("--seed", "-1", f"--seed must be in [0, {SEED_MAX}], got -1"),
        ("--seed", BIG_SEED, f"--seed must be in [0, {SEED_MAX}], got {BIG_SEED}"),
    ],
)
def test_generate_refuses_an_option_out_of_range_before_loading_the_model(option, value, shown, monkeypatch, capsys):
    loads = []
    monkeypatch.setattr("lmforge.loading.load", lambda *a, **k: loads.append(a) or (decoder(), CharTokenizer()))
    line = one_error_line(capsys, "generate", "ckpt", "--prompt", "abc", "--max-new-tokens", "3", option, value)
    assert line == f"error: {shown}"
    assert loads == []


@pytest.mark.parametrize(
    "args, shown",
    [
        (["best-of-n", "P", "R", "--prompt", "hi", "--n", "0"], "--n must be >= 1, got 0"),
        (["best-of-n", "P", "R", "--prompt", "hi", "--temperature", "nan"], "--temperature must be a finite number, "
                                                                            "got nan"),
        (["compare", "--reference", "P", "--reward", "R", "--max-prompts", "0"], "--max-prompts must be >= 1, got 0"),
        (["compare", "--reference", "P", "--reward", "R", "--best-of-n", "4", "--best-of-n", "0"],
         "--best-of-n must be >= 1, got 0"),
        (["compare", "--reference", "P", "--reward", "R", "--seed", BIG_SEED],
         f"--seed must be in [0, {SEED_MAX}], got {BIG_SEED}"),
    ],
)  # fmt: skip
def test_align_sampling_commands_refuse_an_option_out_of_range_before_loading(args, shown, tmp_path, capsys):
    (tmp_path / "P").mkdir()
    (tmp_path / "R").mkdir()
    args = [str(tmp_path / a) if a in ("P", "R") else a for a in args]
    assert one_error_line(capsys, "align", *args) == f"error: {shown}"
