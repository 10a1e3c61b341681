"""The compression report end to end: a tiny fine-tuned classifier (the fine-tuning code's run), every variant,
and the table's numbers."""

from __future__ import annotations

import json

import pytest
import tasks_testing as T
import torch

from lmforge.cli.compress import cmd_compress_report
from lmforge.compress.config import load_compress_config
from lmforge.compress.report import Row, format_table
from lmforge.data.labelled.examples import Dataset
from lmforge.errors import LMForgeError
from lmforge.finetuning.run import FineTuner
from lmforge.tasks.config import load_finetune_config


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """gpt-tiny fine-tuned from scratch on real sentences with one inserted sentiment word (train 240, dev 80)."""
    d = tmp_path_factory.mktemp("teacher")
    full = T.sentiment(320, seed=1)
    splits = {"train": Dataset(full.examples[:240], full.labels), "dev": Dataset(full.examples[240:], full.labels)}
    data = T.write_labelled_dir(d / "data", splits)
    over = [f"--run.dir={d / 'run'}", "--data.source=dir", f"--data.dir={data}", "--train.batch_size=16",
            "--train.lr=2e-3", "--train.warmup_ratio=0.1", "--task.max_len=48", "--train.epochs=4",
            "--model.vocab_size=400", "--train.device=cpu"]  # fmt: skip
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        FineTuner(load_finetune_config("sst2-gpt", over, init="gpt-tiny")).fit()
    finally:
        torch.set_num_threads(n)
    return d / "run"


def test_report_rows_and_files(teacher_run, tmp_path, capsys):
    over = [f"--out={tmp_path / 'report'}", "--distill.max_steps=40", "--distill.lr=1e-3", "--prune.max_steps=20",
            "--prune.lr=5e-4", "--bench.runs=3", "--bench.warmup=1"]  # fmt: skip
    rows = cmd_compress_report(None, str(teacher_run), over)
    names = [r.name for r in rows]
    assert names == [
        "teacher (fp32)", "teacher int8 (dynamic)", "student (distilled)", "student int8",
        "magnitude-pruned 50% + fine-tuned", "50% heads removed + fine-tuned",
    ]  # fmt: skip
    by = dict(zip(names, rows))
    teacher = by["teacher (fp32)"]
    # The teacher's accuracy is the fine-tuning run's own dev evaluation of its best checkpoint.
    assert teacher.accuracy == pytest.approx(json.loads((teacher_run / "eval.json").read_text())["accuracy"])
    assert teacher.accuracy > 0.7
    assert abs(by["teacher int8 (dynamic)"].accuracy - teacher.accuracy) <= 0.05
    assert by["teacher int8 (dynamic)"].size_mb < 0.8 * teacher.size_mb
    assert (teacher.layers, teacher.heads) == (2, 8)
    assert (by["student (distilled)"].layers, by["student (distilled)"].heads) == (1, 4)
    assert by["student (distilled)"].size_mb < teacher.size_mb
    assert by["student (distilled)"].accuracy > 0.6
    assert by["magnitude-pruned 50% + fine-tuned"].sparsity == pytest.approx(0.5, abs=1e-3)
    assert by["50% heads removed + fine-tuned"].heads == 4
    assert all(r.latency_b1_ms > 0 and r.latency_b8_ms > 0 for r in rows)
    report = (tmp_path / "report" / "report.md").read_text()
    assert report.count("\n| ") == 1 + len(rows)  # header + one line per variant
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [r["name"] for r in saved] == names
    assert "report written to" in capsys.readouterr().out


def test_distillation_trains_on_its_device_and_logs_to_its_sinks(teacher_run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    over = ["--distill.max_steps=2", "--prune.max_steps=1", "--bench.runs=1", "--bench.warmup=0",
            "--teacher.max_eval=16"]  # fmt: skip
    with pytest.raises(LMForgeError, match="^distill.device: unknown device 'gpu0'$"):
        cmd_compress_report(None, str(teacher_run), [f"--out={tmp_path / 'a'}", *over, "--distill.device=gpu0"])
    out = tmp_path / "b"
    sinks = ["--distill.device=cpu", "--distill.log_to=[tensorboard]", "--distill.log_every=1"]
    cmd_compress_report(None, str(teacher_run), [f"--out={out}", *over, *sinks])
    events = EventAccumulator(str(out / "distill" / "tensorboard"))
    events.Reload()
    logged = [json.loads(x) for x in (out / "distill" / "metrics.jsonl").read_text().splitlines()]
    assert [e.step for e in events.Scalars("soft_loss")] == [r["step"] for r in logged] == [1, 2]
    assert [e.value for e in events.Scalars("soft_loss")] == pytest.approx([r["soft_loss"] for r in logged])
    assert not (out / "prune-heads" / "tensorboard").exists()  # prune.log_to is its own


def test_table_ratios():
    rows = [Row("a", 2, 8, 0.0, 2.0, 10.0, 40.0, 0.9), Row("b", 1, 4, float("nan"), 1.0, 5.0, 10.0, 0.8)]
    table = format_table(rows)
    assert "| b | 1 | 4 | – | 1.00 (0.50×) | 5.0 (0.50×) | 10.0 (0.25×) | 0.8000 |" in table


def test_config_errors():
    with pytest.raises(LMForgeError, match="unknown config key 'prune.sparsty' — did you mean 'prune.sparsity'"):
        load_compress_config("sentiment-gpt", ["--prune.sparsty=0.3"])
    with pytest.raises(LMForgeError, match=r"prune.heads must be in \[0, 1\), got 1.0"):
        load_compress_config("sentiment-gpt", ["--prune.heads=1.0"])
    with pytest.raises(LMForgeError, match="teacher.run: .*nowhere not found"):
        cmd_compress_report(None, "/nowhere", [])
