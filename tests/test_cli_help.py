"""What a user types first: per-recipe --help with the recipe's own values, recipe summaries whole, --config FILE,
--print-config, --model=PRESET / --objective=NAME, the names other trainers use (--lr, --output_dir) answered in one
line, and --run.init continuing the init run's model and tokenizer."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import tasks_testing as T
import torch
import yaml
from training_testing import run_main

from lmforge.config import RECIPES_DIR
from lmforge.errors import LMForgeError
from lmforge.pretraining.config import load_config

pytestmark = pytest.mark.usefixtures("torch_globals")
run = run_main


def shown(capsys, *args: str) -> dict:
    """The config `--print-config` prints for a command line."""
    rc, out, err = run(capsys, *args, "--print-config")
    assert rc == 0, err
    return yaml.safe_load(out)


# --- per-recipe help ---------------------------------------------------------------------------------------------


def test_recipe_help_shows_that_recipes_values_not_the_schema_defaults(capsys):
    rc, out, _ = run(capsys, "pretrain", "gpt", "--help")
    lines = out.splitlines()
    assert rc == 0 and "recipe gpt:" in lines and "  GPT-2 style causal LM pretraining." in lines
    assert "  train.max_steps: integer > 0 = 2000 (default 1000)" in lines
    assert "  run.dir: string = 'runs/gpt' (default 'runs/demo')" in lines
    assert "  model.preset: string = 'gpt-mini'" in lines and "  model.d_model: integer = 192 (default 768)" in lines
    # The overrides beside --help are part of what the values say.
    rc, out, _ = run(capsys, "pretrain", "gpt", "--model.preset=gpt-tiny", "--help")
    assert rc == 0 and "  model.d_model: integer = 64 (default 768)" in out.splitlines()
    assert "values below: recipe gpt" in out and "with --model.preset=gpt-tiny" in out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["finetune", "sst2-bert", "--help"], "  train.lr: number >= 0 = 5e-05 (default 6.25e-05)"),
        (["align", "dpo", "--help"], "  method: one of 'sft', 'reward', 'dpo', 'ppo' = 'dpo' (default 'sft')"),
        (["compress", "report", "--config", "sentiment-gpt", "--help"], "  out: string = 'runs/compress-sentiment' "
                                                                        "(default 'runs/compress')"),
    ],
)  # fmt: skip
def test_every_run_kind_has_per_recipe_help(args, expected, capsys):
    rc, out, _ = run(capsys, *args)
    assert rc == 0 and expected in out.splitlines()


def test_help_of_an_unknown_recipe_is_one_line(capsys):
    rc, out, err = run(capsys, "pretrain", "gtp", "--help")
    assert rc == 2 and out == "" and err == "error: unknown recipe 'gtp' — did you mean 'gpt'?\n"


@pytest.mark.parametrize("kind", ["pretrain", "finetune", "align", "compress", "experiments", "scaling"])
def test_recipe_summaries_end_at_a_sentence_or_a_clause_never_inside_a_word(kind):
    from lmforge.cli.help import recipe_comment, recipe_lines

    listing = "\n".join(recipe_lines(kind))
    for path in sorted((RECIPES_DIR / kind).glob("*.yaml")):
        block = re.search(rf"^  {re.escape(path.stem)}\s(.*?)(?=^  \S|\Z)", listing + "\n", re.S | re.M)
        assert block, path.stem
        summary = " ".join(block.group(1).split())
        prose = " ".join(" ".join(recipe_comment(path)).split())
        if summary.endswith(" …"):
            head = summary[:-2]
            assert prose.startswith(head) and prose[len(head)] in " ,;:—", (path.stem, summary)
        else:
            assert prose.startswith(summary.rstrip(":;,")), (path.stem, summary)
            rest = prose[len(summary) :]
            assert summary.endswith((".", "?", "!")) or rest[:1] in ("", ":", " ", ";", ","), (path.stem, summary)


def test_experiment_help_lists_the_bundled_files_or_describes_the_one_named(capsys):
    rc, out, _ = run(capsys, "experiment", "--help")
    assert rc == 0 and "bundled (recipes/experiments):" in out and "\n  roberta-masking-tiny" in out
    rc, out, _ = run(capsys, "experiment", "roberta-masking-tiny", "--help")
    assert rc == 0 and "  roberta-masking at CPU size: roberta-tiny, a 1,024-token BPE" in out
    assert "its runs, without running them: lmforge experiment roberta-masking-tiny --dry-run" in out


# --- --config, --print-config, section shorthands ----------------------------------------------------------------


def test_config_file_is_the_recipe_and_print_config_shows_it(tmp_path, capsys):
    recipe = tmp_path / "my.yaml"
    recipe.write_text("run:\n  dir: runs/mine\nmodel:\n  preset: gpt-tiny\ntrain:\n  max_steps: 7\n")
    cfg = shown(capsys, "pretrain", "--config", str(recipe), "--train.lr=1e-4")
    assert (cfg["run"]["dir"], cfg["model"]["name"], cfg["train"]["max_steps"], cfg["train"]["lr"]) == (
        "runs/mine", "gpt-tiny", 7, 1e-4,
    )  # fmt: skip
    assert shown(capsys, "finetune", "--config", "sst2-bert")["train"]["lr"] == 5e-5
    rc, out, err = run(capsys, "pretrain", "gpt", "--config", str(recipe))
    assert rc == 2 and err == f"error: give the recipe once: gpt or --config {recipe}, not both\n"
    rc, _, err = run(capsys, "pretrain", "--config", str(tmp_path / "nope.yaml"))
    assert rc == 2 and err == f"error: recipe file not found: {tmp_path / 'nope.yaml'}\n"


def test_a_bare_section_names_its_preset_or_is_refused_in_one_line(capsys):
    cfg = shown(capsys, "pretrain", "gpt", "--model=gpt-tiny", "--objective=prefix_lm")
    assert cfg["model"]["name"] == "gpt-tiny" and cfg["model"]["d_model"] == 64
    assert cfg["objective"]["name"] == "prefix_lm"
    cfg = shown(capsys, "finetune", "--model=gpt-tiny", "--task=regression", "--peft=lora")
    assert (cfg["model"]["init"], cfg["task"]["type"], cfg["peft"]["method"]) == ("gpt-tiny", "regression", "lora")
    rc, _, err = run(capsys, "pretrain", "--objective=bertt")
    assert rc == 2 and err.count("\n") == 1 and "unknown objective 'bertt'" in err
    rc, _, err = run(capsys, "pretrain", "--model=gpt-nano")
    assert rc == 2 and err.count("\n") == 1 and "gpt-nano" in err and "internal error" not in err
    rc, _, err = run(capsys, "pretrain", "--train=5")
    assert rc == 2 and err == (
        "error: --train=5: train is a section of keys (optimizer, lr, min_lr_ratio, schedule, …): set one, e.g. "
        "--train.optimizer=…\n"
    )
    # The Python API and recipes take the shorthand too.
    assert load_config("gpt", {"model": "gpt-tiny"}).model.name == "gpt-tiny"


# --- the names of other trainers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, use",
    [
        (["pretrain", "--output_dir", "x"], "--run.dir=DIR"),
        (["pretrain", "--out_dir=x"], "--run.dir=DIR"),
        (["pretrain", "gpt", "--lr", "3e-4"], "--train.lr=VALUE"),
        (["finetune", "--learning_rate=3e-4"], "--train.lr=VALUE"),
        (["pretrain", "--max_steps", "10"], "--train.max_steps=N"),
        (["finetune", "--per_device_train_batch_size=8"], "--train.batch_size=N"),
        (["finetune", "--num_train_epochs", "3"], "--train.epochs=N"),
        (["pretrain", "--gradient_accumulation_steps=4"], "--train.grad_accum=N"),
        (["pretrain", "--warmup-steps=10"], "--train.warmup_steps=N"),
        (["align", "sft", "--weight_decay=0.1"], "--train.weight_decay=F"),
        (["pretrain", "--seed=3"], "--run.seed=N"),
        (["pretrain", "--bf16"], "--train.precision=bf16"),
        (["experiment", "roberta-masking-tiny", "--batch_size=4"], "--train.batch_size=N"),
    ],
)
def test_flags_of_other_trainers_get_lmforges_name_in_one_line(args, use, capsys):
    rc, out, err = run(capsys, *args)
    flag = next(a for a in args if a.startswith("--")).split("=")[0]
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"error: unknown option {flag}: lmforge's name for it is {use}")


def test_own_keys_are_not_taken_for_foreign_flags_and_spaced_values_are_explained(capsys):
    assert shown(capsys, "compress", "report", "--seed=3")["seed"] == 3  # compression's own top-level key
    assert shown(capsys, "pretrain", "--train.lr", "3e-4")["train"]["lr"] == 3e-4  # a spaced value, as after '='
    assert shown(capsys, "pretrain", "--train.compile", "gpt")["train"]["compile"] is True  # a switch, then a recipe
    with pytest.raises(LMForgeError, match=r"^unknown config key 'lr': lmforge's name for it is --train\.lr=VALUE"):
        load_config("gpt", {"lr": 1e-3})


# --- continued pretraining ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def init_run(tmp_path_factory):
    """A saved gpt-tiny run (its tokenizer beside the weights), as `lmforge pretrain` leaves one."""
    from lmforge.checkpoint.write import save_checkpoint

    tok = T.tokenizer("gpt")
    model = T.model("gpt-tiny", tok, seed=3)
    run_dir = tmp_path_factory.mktemp("init")
    save_checkpoint(run_dir, 4, model, config={"model": dataclasses.asdict(model.config)}, tokenizer=tok)
    return run_dir, model


def test_run_init_takes_the_runs_model_and_tokenizer_and_the_recipes_other_values(init_run, capsys):
    run_dir, model = init_run
    ckpt = run_dir / "checkpoints" / "step_4"
    cfg = shown(capsys, "pretrain", "gpt", f"--run.init={run_dir}")
    assert cfg["model"] == {**dataclasses.asdict(model.config), "name": "gpt-tiny"}
    assert cfg["data"]["tokenizer"] == str(ckpt)
    assert (cfg["train"]["max_steps"], cfg["train"]["lr"], cfg["run"]["dir"]) == (2000, 6e-4, "runs/gpt")
    assert cfg["train"]["seq_len"] == model.config.max_seq_len  # the recipe's 256 gives way to the model's 128
    # What the user names still wins: a model key on top of the run's model, another preset, another tokenizer.
    cfg = shown(capsys, "pretrain", "gpt", f"--run.init={run_dir}", "--model.dropout=0.1")
    assert cfg["model"]["dropout"] == 0.1 and cfg["model"]["vocab_size"] == model.config.vocab_size
    assert shown(capsys, "pretrain", "gpt", f"--run.init={run_dir}", "--model.preset=gpt-mini")["model"]["name"] == (
        "gpt-mini"
    )
    rc, _, err = run(capsys, "pretrain", "gpt", f"--run.init={run_dir}", "--train.seq_len=512")
    assert rc == 2 and "train.seq_len=512 exceeds model gpt-tiny's max_seq_len 128" in err


def test_continued_pretraining_starts_from_the_init_runs_weights(init_run, tmp_path, capsys):
    from lmforge.checkpoint.read import read_weights

    run_dir, _ = init_run
    text = tmp_path / "new.jsonl"  # one document a line
    line = "Domain text number {0}: the quick brown fox jumps over the lazy dog. " * 6
    text.write_text("\n".join(json.dumps({"text": line.format(i)}) for i in range(40)))
    out = tmp_path / "continued"
    rc, _, err = run(capsys, "pretrain", "gpt", f"--run.init={run_dir}", f"--data.inputs=[{text}]",
                     f"--run.dir={out}", "--train.max_steps=1", "--train.save_every=1", "--train.lr=0",
                     "--train.batch_size=2", "--train.eval_batches=1", "--sample.prompts=[]", "--quiet")  # fmt: skip
    assert rc == 0, err
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["model"]["name"] == "gpt-tiny" and saved["train"]["warmup_steps"] == 100  # the recipe's
    before = read_weights(run_dir / "checkpoints" / "step_4")
    after = read_weights(out / "checkpoints" / "step_1")  # lr 0: the weights it started from
    assert after.keys() == before.keys() and "tok_emb.weight" in after
    for k, v in after.items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
