"""`lmforge scaling`: sweep files, arm planning, the subprocess runner's skip/resume logic, and the whole sweep end
to end on CPU (report, plot, finished arms skipped on rerun, a killed arm resumed)."""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from training_testing import run_main

from lmforge.errors import LMForgeError
from lmforge.experiments.arms import Arm, arm_command, final_record, format_value, resolve_config
from lmforge.experiments.data import shared_data
from lmforge.experiments.runner import check_all_finished, run_arms
from lmforge.experiments.sweep import ShapeRule, load_sweep, plan_arms, shape_sizes
from lmforge.experiments.tables import markdown_table, si
from lmforge.models import Transformer, get_preset
from lmforge.tokenizers import Tokenizer, published

SWEEP = {
    "recipe": "gpt",
    "vocab_size": 512,
    "shape": {"n_layers": [1, 2], "aspect_ratio": 32, "head_dim": 16, "preset": "gpt-tiny"},
    "tokens": [2560, 5120, 10240],  # 10, 20, 40 steps of 4 × 64 tokens
    "overrides": {
        "train": {"batch_size": 4, "seq_len": 64, "lr": 3.0e-3, "warmup_steps": 2, "eval_batches": 4},
        "train.eval_every": 1000,
        "train.save_every": 10,
        "train.log_every": 5,
        "sample.prompts": [],
    },  # fmt: skip
    "fit": {"bootstrap": 10, "top_k": 8},
}


def write_sweep(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "out": str(tmp_path / "sweep"), **changes}), encoding="utf-8")
    return path


def test_shape_rule_and_planned_arms(tmp_path):
    assert shape_sizes(ShapeRule([2, 1], 32, 16, 4.0, "gpt-tiny")) == [
        ("L1-d32", {"preset": "gpt-tiny", "n_layers": 1, "d_model": 32, "n_heads": 2, "d_ff": 128}),
        ("L2-d64", {"preset": "gpt-tiny", "n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256}),
    ]
    sweep = load_sweep(write_sweep(tmp_path), ["--train.lr=0.001"])
    assert sweep.overrides["train.lr"] == 1e-3 and sweep.overrides["train.batch_size"] == 4  # CLI wins, flattened
    arms = plan_arms(sweep, {"model.vocab_size": 512})
    assert [a.name for a in arms] == [f"L{n}-d{32 * n}-D{t}" for n in (1, 2) for t in (2560, 5120, 10240)]
    assert [a.max_steps for a in arms[:3]] == [10, 20, 40]
    model = Transformer(get_preset("gpt-tiny", n_layers=2, d_model=64, n_heads=4, d_ff=256, vocab_size=512))
    info = arms[3].info
    assert info["N_non_embedding"] == model.num_params(non_embedding=True) and info["N_total"] == model.num_params()
    assert arms[0].run_dir == tmp_path / "sweep" / "arms" / "L1-d32-D2560"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokenz": [1]}, "unknown key 'tokenz' — did you mean 'tokens'?"),
        ({"tokens": []}, "tokens: expected a list of positive token budgets"),
        ({"overrides": {"train.max_steps": 5}}, "train.max_steps is set by the sweep for each arm"),
        ({"sizes": ["gpt-tiny"]}, "either sizes: (a list) or shape: (a width/depth rule)"),
        ({"fit": {"params": "all"}}, "fit.params: expected one of 'non_embedding', 'total', got 'all'"),
    ],
)
def test_bad_sweep_files_are_one_line_errors(tmp_path, change, message):
    with pytest.raises(LMForgeError) as e:
        load_sweep(write_sweep(tmp_path, **change))
    assert message in str(e.value)


def test_sizes_list_with_presets_model_fields_and_per_size_overrides(tmp_path):
    sizes = ["gpt-tiny", {"name": "wide", "preset": "gpt-tiny", "d_model": 128, "n_heads": 4, "train.lr": 0.004}]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**{k: v for k, v in SWEEP.items() if k != "shape"}, "sizes": sizes}))
    arms = plan_arms(load_sweep(path), {})
    assert [a.name for a in arms] == [f"{n}-D{t}" for n in ("gpt-tiny", "wide") for t in (2560, 5120, 10240)]
    assert arms[0].overrides["train.lr"] == 3.0e-3 and arms[3].overrides["train.lr"] == 0.004
    assert "--model.d_model=128" in arm_command(arms[3]) and "--train.lr=0.004" in arm_command(arms[3])
    path.write_text(yaml.safe_dump({**SWEEP, "shape": None, "sizes": [{"name": "x", "train.max_steps": 3}]}))
    with pytest.raises(LMForgeError, match="sizes: run.dir, train.max_steps are set by the sweep"):
        load_sweep(path)


def test_warmup_longer_than_an_arm_is_refused(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path), ["--train.warmup_steps=10"])
    with pytest.raises(LMForgeError, match="L1-d32 at 2560 tokens has 10 steps, not more than train.warmup_steps=10"):
        plan_arms(sweep, {})


def test_runner_command_and_finished_detection(tmp_path):
    arm = Arm("a", tmp_path / "a", "gpt", {"train.lr": 0.001, "sample.prompts": [], "run.seed": 3, "x.y": "12"}, 40)
    cmd = arm_command(arm)
    assert cmd[1:5] == ["-m", "lmforge.cli", "pretrain", "gpt"] and cmd[-1] == "--train.max_steps=40"
    assert "--sample.prompts=[]" in cmd and '--x.y="12"' in cmd  # a string that YAML would read as a number
    assert format_value("runs/x") == "runs/x" and format_value(True) == "true"
    (tmp_path / "a" / "checkpoints" / "step_20").mkdir(parents=True)
    assert arm_command(arm)[-1] == "--resume"
    lines = [{"step": 20, "val_loss": 5.0}, {"step": 40, "loss": 4.0}]
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert final_record(arm.run_dir, 40) is None and final_record(arm.run_dir, 20) == lines[0]
    assert final_record(tmp_path / "missing", 40) is None


def test_run_arms_skips_finished_arms_and_reports_failures(tmp_path):
    done = Arm("done", tmp_path / "done", "gpt", {}, 5)
    done.run_dir.mkdir()
    (done.run_dir / "metrics.jsonl").write_text('{"step": 5, "val_loss": 3.5}\n')
    bad = Arm("bad", tmp_path / "bad", str(tmp_path / "missing.yaml"), {}, 5)
    results = run_arms([done, bad], jobs=2, poll_s=0.1)
    assert [(r.arm.name, r.state) for r in results] == [("done", "skipped"), ("bad", "failed")]
    assert results[0].final == {"step": 5, "val_loss": 3.5}
    assert results[1].error == f"error: recipe file not found: {tmp_path / 'missing.yaml'}"
    with pytest.raises(LMForgeError, match=r"1 of 2 arms failed \(bad\); bad: error: recipe file not found"):
        check_all_finished(results)


def test_table_writer():
    assert markdown_table(["arm", "N"], [["a", si(1234567)]]) == "| arm | N |\n|---|---:|\n| a | 1.23M |\n"
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [["only one"]])


@pytest.mark.slow
def test_scaling_sweep_end_to_end_with_skip_and_resume(tmp_path, capsys):  # the runner here, its arms as processes
    path = write_sweep(tmp_path)
    out = tmp_path / "sweep"
    rc, stdout, err = run_main(capsys, "scaling", str(path), "--dry-run")
    assert rc == 0, err
    assert "| L2-d64-D10240 | 100k | 10.2k | 40 |" in stdout and not out.exists()  # a dry run writes nothing

    rc, _, err = run_main(capsys, "scaling", str(path), "--jobs", "2")
    assert rc == 0, err[-3000:]
    assert "[1/6] starting L2-d64-D10240" in err  # the costliest arm first
    report = (out / "scaling.md").read_text()
    assert "## L(N, D) = E + A / N^α + B / D^β" in report and "| L1-d32-D2560 |" in report
    assert report.index("| L1-d32-D2560 |") < report.index("| L2-d64-D10240 |")  # the table in the sweep's order
    data = json.loads((out / "scaling.json").read_text())
    assert len(data["points"]) == 6 and {"E", "alpha", "beta", "a", "b"} <= set(data["surface"])
    for p in data["points"]:
        metrics = [json.loads(x) for x in (Path(p["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        assert p["val_loss"] == [m["val_loss"] for m in metrics if "val_loss" in m][-1]
        assert p["D"] == p["steps"] * 4 * 64 and p["C"] == 6 * p["N"] * p["D"]
    assert (out / "plots" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Rerun: every arm is skipped, nothing is rewritten.
    logs = {p["arm"]: Path(p["run_dir"]) / "metrics.jsonl" for p in data["points"]}
    mtimes = {k: v.stat().st_mtime_ns for k, v in logs.items()}
    rc, _, err = run_main(capsys, "scaling", str(path))
    assert rc == 0 and "6 of 6 arms already finished: skipped" in err
    assert {k: v.stat().st_mtime_ns for k, v in logs.items()} == mtimes

    # An arm killed after its step-20 checkpoint (step_30, step_40 and later log lines never written) resumes.
    killed = out / "arms" / "L2-d64-D10240"
    before = next(p["val_loss"] for p in data["points"] if p["arm"] == killed.name)
    lines = logs[killed.name].read_text().splitlines()
    logs[killed.name].write_text("".join(x + "\n" for x in lines if json.loads(x)["step"] <= 20))
    for step in ("step_30", "step_40"):
        shutil.rmtree(killed / "checkpoints" / step)
    rc, _, err = run_main(capsys, "scaling", str(path))
    assert rc == 0, err[-3000:]
    assert "5 of 6 arms already finished: skipped" in err and "resuming L2-d64-D10240" in err
    assert "resumed from" in (killed / "arm.log").read_text()
    after = json.loads((out / "scaling.json").read_text())
    assert next(p["val_loss"] for p in after["points"] if p["arm"] == killed.name) == pytest.approx(before, rel=1e-3)


def test_shared_data_takes_a_published_tokenizer_by_name(tmp_path, monkeypatch):
    """--data.tokenizer=gpt2 names a published tokenizer, as `lmforge pretrain` takes it, not a path."""
    from training_testing import make_prepared

    tok_dir, data = make_prepared(tmp_path, 6)
    entry = published.Published(512, "test", lambda: Tokenizer.load(tok_dir))
    monkeypatch.setitem(published.PUBLISHED, "pub-bpe", entry)
    cfg = resolve_config("gpt", {"data.prepared": str(data), "data.tokenizer": "pub-bpe"})
    shared = shared_data(cfg, tmp_path / "shared")
    assert shared["data.tokenizer"] == "pub-bpe" and shared["data.prepared"] == str(data)
    assert shared["model.vocab_size"] == 512 and not (tmp_path / "shared").exists()  # nothing trained or prepared
