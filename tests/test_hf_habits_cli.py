"""Habits users bring from Hugging Face, litgpt and argparse tools, and what lmforge says back: overrides with their
value after a space, preset names by prefix, install hints a wheel user can run, MLflow and W&B stores where their
own tools read them, `lm_eval --model lmforge`, the dev curve of a fine-tuning run, one dev pass at its end, a
selection metric refused before training, a reused tokenizer said once, and a PEFT method's own learning rate."""

from __future__ import annotations

import pytest
import yaml
from training_testing import run_main

from lmforge.cli.args import join_spaced_values
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
