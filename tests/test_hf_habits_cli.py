"""Habits users bring from Hugging Face, litgpt and argparse tools, and what lmforge says back: overrides with their
value after a space, preset names by prefix, install hints a wheel user can run, MLflow and W&B stores where their
own tools read them, `lm_eval --model lmforge`, the dev curve of a fine-tuning run, one dev pass at its end, a
selection metric refused before training, a reused tokenizer said once, and a PEFT method's own learning rate."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from training_testing import run_main

from lmforge.errors import LMForgeError

pytestmark = pytest.mark.usefixtures("torch_globals")


def shown(capsys, *args: str) -> dict:
    """The config `--print-config` prints for a command line."""
    rc, out, err = run_main(capsys, *args, "--print-config")
    assert rc == 0, err
    return yaml.safe_load(out)


# --- item 3: `--section.key VALUE` and preset names ----------------------------------------------------------------


def test_an_override_takes_its_value_after_a_space_as_after_equals(capsys):
    cfg = shown(capsys, "pretrain", "gpt", "--train.max_steps", "5", "--model", "gpt-tiny", "--train.lr", "3e-4")
    assert cfg["train"]["max_steps"] == 5 and cfg["model"]["name"] == "gpt-tiny" and cfg["train"]["lr"] == 3e-4
    assert cfg["run"]["dir"] == "runs/gpt"  # 5 was not taken for the recipe
    rc, _, err = run_main(capsys, "pretrain", "gpt", "--train.lr", "-1e-3", "--print-config")
    assert rc == 2 and err == "error: train.lr must be >= 0, got -0.001\n"  # a negative number is a value
    cfg = shown(capsys, "finetune", "--train.max_steps", "7", "--peft.method", "lora", "--train.select_metric", "f1")
    assert (cfg["train"]["max_steps"], cfg["peft"]["method"], cfg["train"]["select_metric"]) == (7, "lora", "f1")
    rc, out, err = run_main(capsys, "config", "show", "sst2-gpt", "--train.epochs", "2")
    assert rc == 0 and yaml.safe_load(out)["train"]["epochs"] == 2, err


def test_a_switch_takes_only_true_or_false_after_a_space():
    from lmforge.cli.args import join_spaced_values

    # train.compile is a switch: the word after it is the recipe unless it reads as true/false.
    assert join_spaced_values(["--train.compile", "gpt"], "pretrain") == ["--train.compile", "gpt"]
    assert join_spaced_values(["--train.compile", "false", "gpt"], "pretrain") == ["--train.compile=false", "gpt"]
    # a task type's own switch (pair classification's `symmetric`), a value starting with '-' only as a number
    assert join_spaced_values(["--task.symmetric", "sst2-gpt"], "finetune") == ["--task.symmetric", "sst2-gpt"]
    assert join_spaced_values(["--train.lr", "-3e-4", "--train.lr", "--help"], "pretrain") == [
        "--train.lr=-3e-4", "--train.lr", "--help",
    ]  # fmt: skip
    assert join_spaced_values(["--", "--train.lr", "1"], "pretrain") == ["--", "--train.lr", "1"]
    assert join_spaced_values(["--lr", "3e-4"], "pretrain") == ["--lr", "3e-4"]  # another trainer's flag: its hint


def test_a_spaced_switch_before_the_recipe_stays_a_switch(capsys):
    cfg = shown(capsys, "pretrain", "--train.compile", "gpt")
    assert cfg["train"]["compile"] is True and cfg["run"]["dir"] == "runs/gpt"
    assert shown(capsys, "pretrain", "--train.compile", "no", "gpt")["train"]["compile"] is False


@pytest.mark.parametrize("flags", [["--model=gpt2"], ["--model", "gpt2"], ["--model.preset=gpt2"]])
def test_an_unknown_preset_suggests_the_presets_it_names_the_start_of(flags, capsys):
    rc, out, err = run_main(capsys, "pretrain", "gpt", *flags, "--print-config")
    assert rc == 2 and out == ""
    assert err == (
        "error: unknown model preset 'gpt2' — did you mean 'gpt2-124m'? (or gpt2-350m, gpt2-774m, gpt2-1.5b)\n"
    )


def test_an_unknown_finetuning_init_suggests_presets_too(capsys):
    rc, _, err = run_main(capsys, "finetune", "--model", "llama", "--print-config")
    assert rc == 2 and err == (
        "error: model.init: 'llama' is neither a run/checkpoint/model dir nor a model preset — did you mean "
        "'llama-60m'? (or llama-130m, llama-350m, llama-1b)\n"
    )
    with pytest.raises(LMForgeError, match="^unknown model preset 'gtp2' "):  # nothing close: the known ones
        from lmforge.cli.args import check_overrides

        check_overrides("pretrain", ["--model=gtp2"])


# --- item 8: a reused tokenizer is not said to be trained ---------------------------------------------------------


def test_a_reused_unigram_tokenizer_says_only_that_it_is_reused(tmp_path, monkeypatch, capsys):
    from tokenizer_corpus import AUSTEN, GETTYSBURG

    from lmforge.tokenizers import train_tokenizer

    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "cache"))
    texts = [f"{p} ({i})" for i in range(12) for p in (GETTYSBURG, AUSTEN)]
    train_tokenizer(texts, "unigram", 300, sample_chars=8000, cache=True, show_progress=False)
    first = [line for line in capsys.readouterr().err.splitlines() if "tokenizer" in line]
    assert first[0].startswith("training the unigram tokenizer on a sample of ") and "trained the" in first[-1]
    train_tokenizer(texts, "unigram", 300, sample_chars=8000, cache=True, show_progress=False)
    again = [line for line in capsys.readouterr().err.splitlines() if "tokenizer" in line]
    assert len(again) == 1 and again[0].startswith("reusing the unigram tokenizer of 300 tokens trained before")


# --- item 6: MLflow and W&B stores where their own tools read them ------------------------------------------------


@pytest.fixture
def tracking_env(monkeypatch, tmp_path):
    """W&B offline with its settings in tmp_path; MLflow on its default (the run dir's file store)."""
    for var, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONSOLE", "off")):
        monkeypatch.setenv(var, value)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    for var in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="mlflow is not installed")
def test_an_mlflow_store_is_read_as_is_and_the_note_says_the_ui_command(tracking_env, tmp_path, monkeypatch, capsys):
    from lmforge.train.metrics import MetricsLogger

    monkeypatch.chdir(tmp_path)
    with MetricsLogger(Path("run"), sinks=["mlflow"]) as log:
        log.log(1, loss=2.5)
    err = capsys.readouterr().err
    assert err == (
        "note: MLflow logs to sqlite:///run/mlflow.db; to see it: pip install mlflow (the UI; lmforge's `mlflow` extra "
        "is mlflow-skinny, which has none), then mlflow ui --backend-store-uri sqlite:///run/mlflow.db\n"
    )
    read = (
        "from mlflow.tracking import MlflowClient as C; "
        "print(C('sqlite:///run/mlflow.db').get_metric_history('{}', 'loss')[0].value)"
    )
    run_id = (tmp_path / "run" / "mlflow-run-id").read_text().strip()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    res = subprocess.run(
        [sys.executable, "-c", read.format(run_id)], env=env, capture_output=True, text=True, cwd=tmp_path
    )  # fmt: skip  (MLflow as is: no MLFLOW_ALLOW_FILE_STORE)
    assert res.returncode == 0 and res.stdout == "2.5\n", res.stderr[-300:]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "shared").as_uri())  # a store the user names: no note
    with MetricsLogger(Path("other"), sinks=["mlflow"]) as log:
        log.log(1, loss=1.0)
    assert "note: MLflow" not in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_keeps_its_files_in_the_users_wandb_dir(tracking_env, tmp_path, monkeypatch):
    from lmforge.train.metrics import MetricsLogger

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "mine"))
    (tmp_path / "mine").mkdir()
    with MetricsLogger(tmp_path / "run", sinks=["wandb"]) as log:
        log.log(1, loss=2.5)
    assert list((tmp_path / "mine" / "wandb").glob("offline-run-*"))
    assert not (tmp_path / "run" / "wandb").exists()


# --- item 5: install hints a wheel user can run ------------------------------------------------------------------


def test_a_missing_extra_names_lmforges_extra_as_a_wheel_user_installs_it(monkeypatch, tmp_path, capsys):
    from lmforge import extras
    from lmforge.eval import harness

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "lm_eval" else real(name, *a))
    monkeypatch.setattr(extras, "source_checkout", lambda: None)  # installed from a wheel
    assert harness.main(["--model", "lmforge"]) != 0
    assert capsys.readouterr().err == (
        "error: lmforge eval --harness needs lmforge's `harness` extra (lm-eval), which is not installed: "
        "pip install 'lmforge[harness]'\n"
    )
    assert extras.extra_hint("hf", "lmforge.hf_trainer") == (
        "lmforge.hf_trainer needs lmforge's `hf` extra (transformers, accelerate), which is not installed: "
        "pip install 'lmforge[hf]'"
    )
    monkeypatch.setattr(extras, "source_checkout", lambda: tmp_path)  # a source checkout: the editable form
    assert extras.install_extra("harness") == f"pip install -e '{tmp_path}[harness]'"


def test_a_source_checkout_is_told_from_an_installed_package(monkeypatch, tmp_path):
    from lmforge import extras

    assert extras.source_checkout() == Path(__file__).resolve().parents[1]  # these tests run from the checkout
    wheel = tmp_path / "lib" / "python3.11" / "site-packages" / "lmforge"
    wheel.mkdir(parents=True)
    monkeypatch.setattr(extras, "__file__", str(wheel / "extras.py"))
    assert extras.source_checkout() is None


# --- item 7: `lm_eval --model lmforge` ----------------------------------------------------------------------------


def test_lmforge_declares_its_model_in_lm_evals_plugin_group():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["entry-points"]["lm_eval.models"] == {"lmforge": "lmforge.eval.harness_model:LMForgeLM"}


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_lm_evals_registry_loads_the_entry_point_as_the_lmforge_model():
    from importlib.metadata import EntryPoint

    from lm_eval.api.registry import Registry

    from lmforge.eval.harness_model import LMForgeLM

    # What lm-eval's entry-point discovery does with the declared entry point: a placeholder, loaded on first use.
    models = Registry("model")
    models.register("lmforge", target=EntryPoint("lmforge", "lmforge.eval.harness_model:LMForgeLM", "lm_eval.models"))
    assert models.get("lmforge") is LMForgeLM


# --- item 8: the dev curve, one dev pass at the end, the selection metric checked first ---------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    """A small labelled set of real sentences with one inserted sentiment word (train 96, dev 32)."""
    import tasks_testing as T

    from lmforge.data.labelled.examples import Dataset

    full = T.sentiment(128, seed=1)
    splits = {"train": Dataset(full.examples[:96], full.labels), "dev": Dataset(full.examples[96:], full.labels)}
    return T.write_labelled_dir(tmp_path_factory.mktemp("labelled") / "sentiment", splits)


def tiny_finetune(run: Path, data: Path, *extra: str) -> list[str]:
    return [f"--run.dir={run}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16", "--train.lr=2e-3",
            "--task.max_len=48", "--model.vocab_size=300", *extra]  # fmt: skip


def test_finetuning_plots_its_dev_metric_and_scores_dev_once_per_evaluation(tmp_path, labelled, monkeypatch):
    import json

    from lmforge.finetuning.run import FineTuner
    from lmforge.tasks.config import load_finetune_config
    from lmforge.train.metrics import read_metrics

    passes: list[str] = []
    for name in ("evaluate", "label_probabilities"):  # every way fine-tuning scores a split
        real = getattr(FineTuner, name)
        monkeypatch.setattr(
            FineTuner, name, lambda self, split="dev", _real=real: passes.append(split) or _real(self, split)
        )
    over = tiny_finetune(tmp_path / "run", labelled, "--train.max_steps=6", "--train.eval_every=3")
    tuner = FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny"))
    final = tuner.fit()
    rows = read_metrics(tmp_path / "run")
    dev = [r for r in rows if "dev_accuracy" in r]
    assert [r["step"] for r in dev] == [3, 6]
    assert passes == ["dev", "dev"]  # one pass per evaluation; the best one's is the final score, not a third pass
    best = max(dev, key=lambda r: r["dev_accuracy"])
    assert final == {"accuracy": best["dev_accuracy"]} == json.loads((tmp_path / "run" / "eval.json").read_text())
    pred = json.loads((tmp_path / "run" / "predictions.json").read_text())["dev"]
    right = [max(range(len(p)), key=p.__getitem__) == g for p, g in zip(pred["probs"], pred["gold"])]
    assert sum(right) / len(right) == pytest.approx(best["dev_accuracy"])  # the best checkpoint's probabilities
    from lmforge.train.metrics import plot_curves

    assert plot_curves(rows)["dev"] == [("dev_accuracy", "dev accuracy")]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "run" / "plots" / "dev.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_selection_metric_the_task_does_not_report_is_refused_before_training(tmp_path, labelled, capsys):
    over = tiny_finetune(tmp_path / "run", labelled, "--train.max_steps=2", "--train.select_metric=f1")
    rc, _, err = run_main(capsys, "finetune", "sst2-gpt", "--init", "gpt-tiny", *over)
    assert rc == 2 and err.splitlines()[-1] == (
        "error: train.select_metric 'f1' is not among the task's dev metrics ['accuracy'] (task.metrics sets them)"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and not (tmp_path / "run" / "checkpoints").exists()


# --- item 9: a PEFT method turned on trains at its own learning rate ----------------------------------------------


def test_lora_over_a_full_finetuning_recipe_takes_loras_learning_rate_and_says_so(capsys):
    rc, out, err = run_main(capsys, "finetune", "glue-sst2", "--peft.method=lora", "--print-config")
    assert rc == 0 and yaml.safe_load(out)["train"]["lr"] == 5e-4  # not the recipe's 2e-5, BERT's full fine-tuning
    assert err == "note: train.lr 2e-5 → 5e-4 (peft.method=lora's learning rate; --train.lr=VALUE sets another)\n"
    rc, out, err = run_main(capsys, "finetune", "glue-sst2", "--peft", "lora", "--train.lr", "1e-4", "--print-config")
    assert rc == 0 and yaml.safe_load(out)["train"]["lr"] == 1e-4 and "note" not in err  # the user's lr wins
    assert shown(capsys, "finetune", "glue-sst2")["train"]["lr"] == 2e-5  # full fine-tuning keeps the recipe's
    assert shown(capsys, "finetune", "glue-sst2", "--peft.method=topk")["train"]["lr"] == 2e-5  # no rate of its own


def test_a_recipe_that_names_its_peft_method_keeps_its_learning_rate(tmp_path, capsys):
    from lmforge.adapt.peft import PEFT_LR, peft_lr
    from lmforge.tasks.config import load_finetune_config

    recipe = tmp_path / "lora-recipe.yaml"
    recipe.write_text("peft:\n  method: lora\ntrain:\n  lr: 3.0e-4\n")
    assert load_finetune_config(recipe, ["--peft.method=lora"]).train.lr == 3e-4
    assert load_finetune_config(recipe, ["--peft.method=prompt"]).train.lr == PEFT_LR["prompt"]  # another method
    assert capsys.readouterr().err == (
        "note: train.lr 3e-4 → 1e-2 (peft.method=prompt's learning rate; --train.lr=VALUE sets another)\n"
    )
    assert peft_lr("lora", 5e-4, "none") == (5e-4, None)  # already the method's own: nothing to say
