"""One clear line for bad configs and options, before any work: recipe sections that are not mappings, seeds out of
every generator's range, models too large for the machine, and generation options out of range or not finite. Each
case asserts the exact line (exit 2, nothing else on stderr) and that nothing was trained, written or loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_reliability_inputs import TINY, cli, one_error_line

from lmforge.errors import LMForgeError
from lmforge.train.pretrain_config import load_config

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
