"""Discoverable options and configs that say what runs: --help lists recipes and every key, `config show` prints
the resolved YAML, a recipe fits the preset the user names, published tokenizers by name, TensorBoard logging."""

from __future__ import annotations

import json

import pytest
import yaml
from training_testing import make_prepared, run_main

from lmforge.cli import main
from lmforge.pretraining.config import load_config

pytestmark = pytest.mark.usefixtures("torch_globals")
run = run_main


def test_pretrain_help_lists_recipes_and_every_key_with_type_default_and_doc(capsys):
    rc, out, _ = run(capsys, "pretrain", "--help")
    assert rc == 0
    assert "recipes (recipes/pretrain):" in out and "\n  bert " in out and "\n  t5 " in out
    lines = out.splitlines()
    i = lines.index("  train.max_steps: integer > 0 = 600 (default 1000)")  # the demo's value, what `pretrain` runs
    assert lines[i + 1].strip().startswith("Optimizer steps of the run")
    assert "  train.lr: number >= 0 = 0.002 (default 0.0006)" in lines
    assert "  objective.name=t5" in lines and "    objective.noise_density: number = 0.15" in lines


@pytest.mark.parametrize(
    "args, expected",
    [
        (["finetune", "--help"], "  train.select_metric: string or null = null"),
        (["align", "dpo", "--help"], "  dpo.beta: number = 0.1"),
        (["compress", "report", "--help"], "  distill.max_steps: integer > 0 = 300"),
    ],
)
def test_every_training_command_lists_its_keys(args, expected, capsys):
    rc, out, _ = run(capsys, *args)
    assert rc == 0 and expected in out.splitlines()


def test_config_show_prints_the_resolved_yaml(capsys):
    rc, out, err = run(capsys, "config", "show", "gpt", "--model.preset=gpt-tiny", "--train.lr=3e-4")
    assert rc == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["model"]["name"] == "gpt-tiny" and cfg["model"]["d_model"] == 64 and cfg["train"]["lr"] == 3e-4
    assert cfg["train"]["seq_len"] == 128 and cfg["data"]["vocab_size"] == 512  # fitted to the preset
    assert load_config(None, cfg).train.lr == 3e-4  # the printed config is itself a recipe
    rc, out, _ = run(capsys, "config", "show", "sst2-bert", "--train.epochs=1")
    assert rc == 0 and yaml.safe_load(out)["train"]["epochs"] == 1 and yaml.safe_load(out)["task"]["type"]
    assert (
        run(capsys, "config", "show", "gtp", "--quiet")[2].strip()
        == "error: unknown recipe 'gtp' — did you mean 'gpt'?"
    )


def test_a_recipe_fits_the_preset_the_user_names(capsys):
    # The recipe's 8192-token vocabulary and 256-token sequences give way to gpt-tiny's 512 and 128 ...
    cfg = load_config("gpt", ["--model.preset=gpt-tiny"])
    assert (cfg.data.vocab_size, cfg.model.vocab_size, cfg.train.seq_len) == (512, 512, 128)
    assert "note: train.seq_len 256 → 128 (model gpt-tiny's max_seq_len)" in capsys.readouterr().err
    # ... what the user asks for wins ...
    cfg = load_config("gpt", ["--model.preset=gpt-tiny", "--data.vocab_size=1000", "--train.seq_len=64"])
    assert (cfg.data.vocab_size, cfg.model.vocab_size, cfg.train.seq_len) == (1000, 1000, 64)
    # ... the recipe's own values stand with its own preset ...
    cfg = load_config("gpt")
    assert (cfg.model.name, cfg.model.vocab_size, cfg.train.seq_len) == ("gpt-mini", 8192, 256)
    # ... and a value the model cannot take is refused before any work.
    rc, _, err = run(capsys, "pretrain", "gpt", "--model.preset=gpt-tiny", "--train.seq_len=256", "--quiet")
    assert rc == 2 and err.strip() == (
        "error: train.seq_len=256 exceeds model gpt-tiny's max_seq_len 128: lower --train.seq_len or raise "
        "--model.max_seq_len"
    )


def test_published_tokenizers_by_name(tmp_path, capsys):
    from lmforge.errors import LMForgeError
    from lmforge.tokenizers.published import tokenizer_vocab_size

    cfg = load_config("gpt", ["--model.preset=gpt-tiny", "--data.tokenizer=gpt2"])
    assert cfg.model.vocab_size == 50257  # the model's table follows the tokenizer (no fetch needed to know it)
    assert tokenizer_vocab_size("gpt2") == 50257
    with pytest.raises(LMForgeError, match="'gtp2' is neither a tokenizer dir/file nor a published tokenizer — did "):
        load_config("gpt", ["--data.tokenizer=gtp2"])
    # Fine-tuning from random init takes a published tokenizer by name too.
    assert main(["finetune", "sst2-gpt", "--init", "none", "--model.tokenizer=gtp2", f"--run.dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "model.tokenizer: 'gtp2' is neither a tokenizer dir/file nor a published tokenizer" in err


def test_tensorboard_logging_beside_metrics_jsonl(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "p").mkdir()
    tok, data = make_prepared(tmp_path / "p", 12)
    run_dir = tmp_path / "run"
    rc, _, err = run(capsys, "pretrain", "gpt", f"--run.dir={run_dir}", f"--data.tokenizer={tok}",
                     f"--data.prepared={data}", "--model.preset=gpt-tiny", "--train.seq_len=32",
                     "--train.batch_size=4", "--train.max_steps=4", "--train.log_every=2", "--train.log_to=tensorboard",
                     "--sample.prompts=[]", "--train.eval_batches=1")  # fmt: skip
    assert rc == 0, err
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    logged = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e.step for e in events.Scalars("loss")] == [r["step"] for r in logged if "loss" in r] == [2, 4]
    assert [e.value for e in events.Scalars("val_loss")] == pytest.approx(
        [r["val_loss"] for r in logged if "val_loss" in r]
    )
