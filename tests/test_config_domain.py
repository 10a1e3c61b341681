"""Every numeric config value is checked for its domain once, at load time, before a run writes anything: NaN and
infinity are refused for every float field, and model fields have their ranges."""

from __future__ import annotations

import pytest

from lmforge.cli import main


def one_error_line(capsys, *args: str) -> str:
    rc = main([*args, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=nan", "train.lr must be a finite number, got 'nan'"),
        ("train.lr=inf", "train.lr must be a finite number, got 'inf'"),
        ("train.lr=1e400", "train.lr must be a finite number, got '1e400'"),
        ("train.beta1=nan", "train.beta1 must be a finite number, got 'nan'"),
        ("train.weight_decay=inf", "train.weight_decay must be a finite number, got 'inf'"),
        ("train.grad_clip=nan", "train.grad_clip must be a finite number, got 'nan'"),
        ("model.dropout=nan", "model.dropout must be a finite number, got 'nan'"),
    ],
)
def test_non_finite_values_are_refused_before_anything_is_written(override, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert one_error_line(capsys, "pretrain", "gpt", f"--run.dir={run}", f"--{override}") == f"error: {message}"
    assert not run.exists()


def test_non_finite_values_in_a_recipe_file_are_refused(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: .nan\n")  # YAML's own spelling of NaN reaches the loader as a float
    run = tmp_path / "run"
    assert one_error_line(capsys, "pretrain", str(recipe), f"--run.dir={run}") == (
        "error: train.lr must be a finite number, got nan"
    )
    assert not run.exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.dropout=1.5", "model.dropout must be in [0, 1), got 1.5"),
        ("model.dropout=-0.5", "model.dropout must be in [0, 1), got -0.5"),
        ("model.attn_dropout=2", "model.attn_dropout must be in [0, 1), got 2.0"),
        ("model.init_std=-1", "model.init_std must be > 0, got -1.0"),
        ("model.norm_eps=-1", "model.norm_eps must be > 0, got -1.0"),
        ("model.rope_base=-5", "model.rope_base must be > 0, got -5.0"),
        ("model.type_vocab_size=-1", "model.type_vocab_size must be >= 0, got -1"),
        ("model.pad_id=-1", "model.pad_id must be >= 0, got -1"),
        ("model.pad_id=99999", "model.pad_id=99999 is not a token of model.vocab_size=4096"),
    ],
)
def test_model_values_out_of_their_domain_are_refused_before_anything_is_written(override, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert one_error_line(capsys, "pretrain", "gpt", f"--run.dir={run}", f"--{override}") == f"error: {message}"
    assert not run.exists()


def test_a_config_built_in_python_is_checked_alike():
    from lmforge.errors import LMForgeError
    from lmforge.models import Transformer, get_preset

    cases = [({"dropout": 1.5}, "model.dropout must be in [0, 1), got 1.5"),
             ({"init_std": float("nan")}, "model.init_std must be a finite number, got nan")]  # fmt: skip
    for fields, message in cases:
        with pytest.raises(LMForgeError) as e:
            Transformer(get_preset("gpt-tiny", **fields))
        assert str(e.value) == message


def test_a_key_given_twice_in_a_recipe_is_refused(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("train:\n  lr: 1.0e-3\n  max_steps: 5\n  lr: 3.0e-4\n")  # plain YAML keeps 3e-4 silently
    run = tmp_path / "run"
    assert one_error_line(capsys, "pretrain", str(recipe), f"--run.dir={run}") == (
        f"error: {recipe}: invalid YAML (key 'lr' given twice (line 4))"
    )
    assert not run.exists()


def test_a_warmup_longer_than_the_run_is_noted(tmp_path, capsys, prepared_docs, torch_globals):
    tok, data = prepared_docs(12)  # shared prepared data: the note does not depend on the corpus
    args = ["pretrain", "gpt", "--model.preset=gpt-tiny", "--train.batch_size=2", "--train.seq_len=32",
            "--train.warmup_steps=8", "--sample.prompts=[]", "--train.eval_batches=1", f"--data.tokenizer={tok}",
            f"--data.prepared={data}", "--model.vocab_size=512"]  # fmt: skip
    note = "note: the warmup (8 steps) is longer than the run (train.max_steps=2): the learning rate rises for the "
    note += "whole run and peaks at 25% of train.lr (lower train.warmup_steps)"
    assert main([*args, f"--run.dir={tmp_path / 'short'}", "--train.max_steps=2"]) == 0
    assert note in capsys.readouterr().err.splitlines()
    assert main([*args, f"--run.dir={tmp_path / 'long'}", "--train.max_steps=8"]) == 0
    assert "note: the warmup" not in capsys.readouterr().err
