"""Checkpoints under attack, round three: a RUN/checkpoints link to a dir outside the run, a forged manifest entry
that points outside the checkpoint, a run dir whose name is not UTF-8, an update at a huge learning rate that leaves
finite weights too large for a forward pass, `--resume` after a non-finite streak, and reading (generate, eval) a
checkpoint a diverging run saved."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_reliability_inputs import TINY, cli, last_error_line, one_error_line, pretrain

from lmforge.checkpoint.layout import checkpoints_in, step_of
from lmforge.checkpoint.read import read_config
from lmforge.checkpoint.verify import verify_checkpoint
from lmforge.checkpoint.write import save_checkpoint
from lmforge.cli import main
from lmforge.errors import LMForgeError

pytestmark = pytest.mark.usefixtures("torch_globals")
LINK_WHY = "it is a symbolic link (to {}); a run writes only its own files, so remove the link"


@pytest.fixture(scope="module")
def prepared(prepared_docs) -> tuple[Path, Path]:
    return prepared_docs(24)


def _max_abs(step_dir: Path) -> float:
    return max(float(t.abs().max()) for t in load_file(step_dir / "model.safetensors").values())


# --- links and names ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["checkpoints", "best"])
def test_a_checkpoints_dir_linked_outside_the_run_is_refused_before_any_work(name, prepared, tmp_path, capsys):
    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "step_1").mkdir()  # what rotation would have deleted through the link
    (outside / "step_1" / "precious.txt").write_text("keep me\n")
    run.mkdir()
    (run / name).symlink_to(outside)
    line = one_error_line(capsys, *pretrain(prepared, run, "--train.max_steps=3", "--train.save_every=1"))
    assert line == f"error: refusing to write {run / name}: {LINK_WHY.format(outside)}"
    assert sorted(p.name for p in outside.rglob("*")) == ["precious.txt", "step_1"]
    assert not (run / "metrics.jsonl").exists()  # refused before the first step


def test_a_checkpoint_save_refuses_a_linked_checkpoints_dir_and_step_dir(tmp_path):
    """The save path refuses the links too (a link planted while the run trains)."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    model = torch.nn.Linear(2, 2)
    for run, link in [(tmp_path / "a", "checkpoints"), (tmp_path / "b", "checkpoints/step_3")]:
        (run / link).parent.mkdir(parents=True, exist_ok=True)
        (run / link).symlink_to(outside)
        with pytest.raises(Exception, match=r"refusing to write .*: it is a symbolic link"):
            save_checkpoint(run, 3, model, config={}, keep_last=1)
    assert list(outside.iterdir()) == []


def test_a_manifest_entry_pointing_outside_the_checkpoint_is_never_read(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(pretrain(prepared, run, "--train.max_steps=2", "--train.save_every=1", "--quiet")) == 0
    capsys.readouterr()
    secret = tmp_path / "secret.txt"
    secret.write_text("x" * 1234)
    step = run / "checkpoints" / "step_2"
    manifest = json.loads((step / "manifest.json").read_text())
    rel = os.path.relpath(secret, step)  # ../../../secret.txt
    manifest["files"][rel] = {"size": 1, "sha256": "0" * 64}  # the checker would say "has 1234 bytes"
    (step / "manifest.json").write_text(json.dumps(manifest))
    why = f"manifest.json names '{rel}', which is not a file inside the checkpoint"
    assert verify_checkpoint(step) == why
    line = one_error_line(capsys, "generate", str(step), "--prompt", "It is")
    assert line == f"error: checkpoint {step} is not usable: {why}"
    assert "1234" not in line
    # --resume skips it with a warning and continues from step_1
    rc, _, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=3", "--quiet")
    assert rc == 0, err
    assert f"warning: skipping checkpoint {step}: {why}" in err.splitlines()


def test_a_manifest_entry_through_a_symbolic_link_is_refused(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(pretrain(prepared, run, "--train.max_steps=1", "--quiet")) == 0
    step = run / "checkpoints" / "step_1"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "f").write_text("x")
    (step / "link").symlink_to(tmp_path / "outside")
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["link/f"] = {"size": 1, "sha256": "0" * 64}
    (step / "manifest.json").write_text(json.dumps(manifest))
    assert verify_checkpoint(step) == "manifest.json names 'link/f', which is not a file inside the checkpoint"


def test_a_run_dir_whose_name_is_not_utf8_is_refused_before_any_work(prepared, tmp_path, capsys):
    run = Path(os.fsdecode(os.fsencode(tmp_path) + b"/run\xff"))
    line = one_error_line(capsys, *pretrain(prepared, run, "--train.max_steps=2", "--train.save_every=1"))
    shown = os.fsencode(run).decode("utf-8", "backslashreplace")
    assert line == (
        f"error: run dir '{shown}' has a name that is not valid UTF-8: the run records its paths in UTF-8 files "
        "(config, checkpoint manifests, tokenizer), so rename it or choose another --run.dir"
    )
    assert not os.path.exists(run)


# --- a huge learning rate: finite weights too large for a forward pass ---------------------------------------------


def _diverge(prepared, run: Path, capsys) -> str:
    """Four good steps (keep_last=2), then a resume at lr 1e38 whose first update leaves finite weights that give
    NaN from the next step on → the stop line."""
    assert main(pretrain(prepared, run, "--train.max_steps=4", "--train.save_every=1", "--train.keep_last=2",
                         "--quiet")) == 0  # fmt: skip
    capsys.readouterr()
    return last_error_line(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.lr=1e38",
                           "--train.max_steps=14")  # fmt: skip


def test_an_update_to_finite_but_unusable_weights_is_not_a_good_checkpoint(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    line = _diverge(prepared, run, capsys)
    aside = run / "checkpoints" / "nonfinite"
    assert line.endswith(
        "lower train.lr or check the data; the last checkpoint before it is step_4, which --resume continues from; "
        f"2 checkpoint(s) saved after it (step_8, step_9) are moved to {aside}"
    ), line
    # step_4 survived keep_last=2 although six checkpoints were written after it; its weights are those of training
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["nonfinite", "step_4"]
    assert verify_checkpoint(run / "checkpoints" / "step_4") is None
    assert _max_abs(run / "checkpoints" / "step_4") < 100
    # what made step_5 unusable: finite weights, far too large (the overflow check passes them)
    assert 1e30 < _max_abs(aside / "step_9") < float("inf")


def test_resume_after_a_streak_continues_from_the_last_good_checkpoint_and_says_so(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    _diverge(prepared, run, capsys)
    rc, _, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.lr=1e-3", "--train.max_steps=8")
    assert rc == 0, err
    lines = err.splitlines()
    aside = run / "checkpoints" / "nonfinite"
    assert (
        "note: resuming from step_4, the last good checkpoint before the non-finite streak that stopped the run; the "
        f"checkpoints saved after it (step_8, step_9) are set aside in {aside}"
    ) in lines
    assert f"resumed from {run}/checkpoints/step_4 at step 4 (data position: epoch 0, batch 4)" in lines
    assert not [ln for ln in lines if "non-finite" in ln and ln.startswith("warning")]
    assert _max_abs(run / "checkpoints" / "step_8") < 100  # trained on from the good weights
    assert sorted(p.name for p in aside.iterdir()) == ["step_8", "step_9"]  # kept, apart


# --- reading what a diverging run saved --------------------------------------------------------------------------


def test_generate_and_eval_on_a_diverged_checkpoint_are_one_line(prepared, tmp_path, capsys):
    tok, data = prepared
    run = tmp_path / "run"
    base = [
        "pretrain",
        "gpt",
        f"--run.dir={run}",
        f"--data.tokenizer={tok}",
        f"--data.prepared={data}",
        *TINY,
        "--model.vocab_size=512",
        "--train.warmup_steps=0",
        "--train.save_every=1",
        "--train.max_nonfinite=3",
    ]
    assert main([*base, "--train.max_steps=2", "--quiet"]) == 0
    # An overflowing update (inf weights), saved by lmforge itself in the streak, then set aside
    rc, _, err = cli(capsys, "pretrain", f"--run.dir={run}", "--resume", "--train.max_steps=8", "--train.lr=1e38",
                     "--train.schedule=constant", "--quiet")  # fmt: skip
    assert rc == 2, err
    inf_ckpt = max(checkpoints_in(run / "checkpoints" / "nonfinite"), key=step_of)
    assert _max_abs(inf_ckpt) == float("inf")
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged.\n")
    for args in (["generate", str(inf_ckpt), "--prompt", "It is"], ["generate", str(inf_ckpt), "--prompt", "It is",
                 "--greedy"], ["eval", str(inf_ckpt), "--text", str(text)]):  # fmt: skip
        line = one_error_line(capsys, *args)
        assert line.startswith(f"error: {inf_ckpt}: ") and "weight tensor(s) hold NaN or infinity (first: " in line
        assert line.endswith("the run had diverged when it saved them; use an earlier checkpoint")
    # the run itself still reads back: its newest good checkpoint
    rc, out, err = cli(capsys, "generate", str(run), "--prompt", "It is", "--max-new-tokens", "3", "--quiet")
    assert rc == 0, err
    assert out.startswith("It is")


def test_generate_and_eval_on_finite_but_unusable_weights_are_one_line(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    _diverge(prepared, run, capsys)
    huge = run / "checkpoints" / "nonfinite" / "step_9"
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged.\n")
    logits = (
        "error: the model's logits for the prompt are not finite (NaN or infinity): its weights are unusable, as "
        "those of a run that diverged are; use an earlier checkpoint"
    )
    assert one_error_line(capsys, "generate", str(huge), "--prompt", "It is") == logits
    assert one_error_line(capsys, "generate", str(huge), "--prompt", "It is", "--greedy") == logits
    assert one_error_line(capsys, "generate", str(huge), "--prompt", "It is", "--num-beams", "2") == logits
    assert one_error_line(capsys, "eval", str(huge), "--text", str(text)) == (
        f"error: the model's loss on {text} is nan: its weights give non-finite values, as those of a run that "
        "diverged do; use an earlier checkpoint"
    )


def test_a_manifest_nested_too_deeply_makes_the_checkpoint_unusable_not_an_internal_error(prepared, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(pretrain(prepared, run, "--train.max_steps=2", "--train.save_every=1", "--quiet")) == 0
    capsys.readouterr()
    step = run / "checkpoints" / "step_2"
    (step / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    assert verify_checkpoint(step) == "manifest.json is unreadable"
    assert one_error_line(capsys, "generate", str(step), "--prompt", "It is") == (
        f"error: checkpoint {step} is not usable: manifest.json is unreadable"
    )


# --- left by the round's fixes at other entry points ---------------------------------------------------------------


@pytest.mark.parametrize("temperature", [-1.0, float("nan"), float("inf")])
def test_the_python_generate_refuses_a_temperature_out_of_range(temperature):
    from lmforge.models import Transformer
    from lmforge.models.generate import generate
    from lmforge.models.presets import get_preset

    model = Transformer(get_preset("gpt-tiny"))
    with pytest.raises(LMForgeError, match=rf"^temperature must be a finite number >= 0, got {temperature}$"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2, temperature=temperature)


def test_eval_text_refuses_a_stride_below_one_before_loading(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("Some text.\n")
    # the run does not exist: the stride is refused before anything is read
    assert one_error_line(capsys, "eval", str(tmp_path / "none"), "--text", str(text), "--stride", "0") == (
        "error: --stride must be >= 1, got 0"
    )


def test_yaml_nested_too_deeply_is_one_line(prepared, tmp_path, capsys):
    recipe = tmp_path / "deep.yaml"
    recipe.write_text("train: " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert one_error_line(capsys, "pretrain", str(recipe)) == f"error: {recipe}: invalid YAML (nested too deeply)"
    run = tmp_path / "run"
    assert main(pretrain(prepared, run, "--train.max_steps=1", "--quiet")) == 0
    capsys.readouterr()
    step = run / "checkpoints" / "step_1"
    (step / "config.yaml").write_text("a: " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(LMForgeError, match=r"could not read .*config\.yaml: nested too deeply"):
        read_config(step)
