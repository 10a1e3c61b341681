"""Metrics log, plots, progress line, FLOPs and MFU accounting."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from lmforge.errors import LMForgeError
from lmforge.train import metrics as mx
from lmforge.train.metrics import (
    BackgroundPlot,
    MetricsLogger,
    Progress,
    flops_per_token,
    mfu,
    peak_flops,
    plot_metrics,
    read_metrics,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _strict_json(line: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(line, parse_constant=refuse)


# ---------------------------------------------------------------------------------------------- log


def test_log_lines_are_strict_json_with_rounding_and_nulls(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(1, train_loss=float("nan"), lr=1 / 3, tokens=4096, grad_norm=float("inf"))
        log.log(2, train_loss=torch.tensor(2.0), val_loss=np.float32(1.5), note="eval", skipped=False)
        log.log(3, train_loss=123456789.0, tiny=1.23456789e-12, neg=-float("inf"))
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [_strict_json(line) for line in lines]
    assert records == [
        {"step": 1, "train_loss": None, "lr": 0.333333, "tokens": 4096, "grad_norm": None},
        {"step": 2, "train_loss": 2.0, "val_loss": 1.5, "note": "eval", "skipped": False},
        {"step": 3, "train_loss": 123457000.0, "tiny": 1.23457e-12, "neg": None},
    ]
    assert read_metrics(tmp_path) == records


def test_each_line_is_flushed_before_close(tmp_path):
    log = MetricsLogger(tmp_path)
    log.log(1, train_loss=3.0)
    assert read_metrics(tmp_path) == [{"step": 1, "train_loss": 3.0}]
    log.close()


def test_bad_metric_values(tmp_path):
    with MetricsLogger(tmp_path) as log:
        with pytest.raises(TypeError, match="metric 'x' has type list"):
            log.log(1, x=[1, 2])
        with pytest.raises(TypeError, match="metric 'y' is a tensor with 3 elements"):
            log.log(1, y=torch.zeros(3))
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_resume_drops_later_steps_without_duplicates(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for step in range(1, 11):
            log.log(step, train_loss=10.0 - step)
        log.log(10, val_loss=0.5)
    with MetricsLogger(tmp_path, resume_step=6) as log:
        assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
        log.log(7, train_loss=2.5)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert records[-1] == {"step": 7, "train_loss": 2.5}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temp file left


def test_torn_last_line_is_skipped_and_repaired(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train_loss": 2.0}\n{"step": 2, "train_lo')
    assert read_metrics(tmp_path) == [{"step": 1, "train_loss": 2.0}]
    with MetricsLogger(tmp_path) as log:
        log.log(2, train_loss=1.0)
    assert [_strict_json(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "train_loss": 2.0},
        {"step": 2, "train_loss": 1.0},
    ]


def test_read_metrics_errors(tmp_path):
    with pytest.raises(LMForgeError, match="no metrics log at"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(LMForgeError, match=r"metrics.jsonl:2: not valid JSON$"):
        read_metrics(tmp_path)


# ---------------------------------------------------------------------------------------------- plots


def test_plot_writes_png_files(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for step in range(1, 21):
            log.log(step, train_loss=5.0 / step, lr=1e-3 * min(1.0, step / 5))
            if step % 5 == 0:
                log.log(step, val_loss=5.5 / step)
    written = plot_metrics(tmp_path)
    assert written == [tmp_path / "plots" / "loss.png", tmp_path / "plots" / "lr.png"]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["loss.png", "lr.png"]


def test_a_background_plot_draws_the_log_and_hands_back_its_error(tmp_path, monkeypatch):
    with MetricsLogger(tmp_path) as log:
        for step in range(1, 11):
            log.log(step, train_loss=5.0 / step)
    assert BackgroundPlot(tmp_path).wait() == [tmp_path / "plots" / "loss.png"]
    assert (tmp_path / "plots" / "loss.png").read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(LMForgeError, match="no metrics log"):  # raised in the thread, handed over by wait()
        BackgroundPlot(tmp_path / "elsewhere").wait()


def test_plot_with_nothing_to_plot(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(1, tokens=10)
    assert plot_metrics(tmp_path) == []
    assert not (tmp_path / "plots").exists()


# ---------------------------------------------------------------------------------------------- progress


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_plain_lines_every_k_updates():
    out = io.StringIO()
    progress = Progress(7, every=3, stream=out)
    for step in range(1, 8):
        progress.update(step, loss=2.0, lr=3e-4, tokens_per_s=12345.0, mfu=0.412)
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "step 1/7 (14.3%)",
        "step 4/7 (57.1%)",
        "step 7/7 (100.0%)",
    ]
    assert lines[0].startswith("step 1/7 (14.3%) | loss 2.0000 | lr 3.00e-04 | 12.3k tok/s | mfu 41.2%")
    assert "\r" not in out.getvalue()


def test_progress_refreshes_in_place_on_tty():
    out = FakeTTY()
    progress = Progress(100, stream=out)
    progress.update(1, loss=12.5, lr=1e-3, tokens_per_s=1000.0, mfu=None)
    progress.update(2, loss=2.5, lr=1e-3, tokens_per_s=1000.0, mfu=None)
    progress.close()
    text = out.getvalue()
    # One tqdm bar redrawn in place (carriage returns), ended by one newline when closed.
    assert text.count("\r") >= 2 and text.count("\n") == 1 and text.endswith("\n")
    last = text.rstrip("\n").split("\r")[-1]
    assert "2/100" in last and "loss 2.5000 | lr 1.00e-03 | 1.0k tok/s" in last and "mfu" not in last


def test_progress_is_silent_when_quiet(monkeypatch):
    monkeypatch.setenv("LMFORGE_QUIET", "1")
    for stream in (FakeTTY(), io.StringIO()):
        progress = Progress(10, every=1, stream=stream)
        progress.update(1, loss=1.0, lr=1e-3, tokens_per_s=1.0, mfu=None)
        progress.close()
        assert stream.getvalue() == ""


def test_progress_eta(monkeypatch):
    clock = iter([100.0, 110.0])
    monkeypatch.setattr(mx.time, "monotonic", lambda: next(clock))
    progress = Progress(100, stream=io.StringIO())
    assert "eta" not in progress.format(0, 1.0, 1e-3, 1.0, None)
    # 10 steps took 10 s, 90 steps remain.
    assert progress.format(10, 1.0, 1e-3, 1.0, None).endswith("| eta 1m30s")


# ---------------------------------------------------------------------------------------------- FLOPs, MFU


def test_flops_per_token_hand_computed():
    # 6·1000 + 12·2·64·128 = 6000 + 196608
    assert flops_per_token(1000, 2, 64, 128) == 202608.0
    # GPT-2 small shape: 6·124e6 + 12·12·768·1024
    assert flops_per_token(124_000_000, 12, 768, 1024) == 744e6 + 113_246_208
    with pytest.raises(ValueError):
        flops_per_token(-1, 2, 64, 128)


def test_mfu_hand_computed():
    # 52k tok/s × 6 GFLOP/token = 312 TFLOP/s: all of one A100, half of two.
    assert mfu(52_000, 6e9, 312e12) == pytest.approx(1.0)
    assert mfu(52_000, 6e9, 312e12, n_devices=2) == pytest.approx(0.5)
    assert mfu(10_000, flops_per_token(1000, 2, 64, 128), 989e12) == pytest.approx(2_026_080_000 / 989e12)
    assert mfu(52_000, 6e9, None) is None


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.float16, 989e12),
        ("NVIDIA H100 80GB HBM3", torch.float32, 67e12),
        ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
        ("NVIDIA H200", torch.bfloat16, 989e12),
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),
        ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
        ("NVIDIA A100-SXM4-80GB", torch.float64, None),
        ("Tesla T4", torch.float16, None),
    ],
)
def test_peak_flops_by_device_name(monkeypatch, name, dtype, expected):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0), dtype) == expected


def test_peak_flops_cpu_is_unknown():
    assert peak_flops(torch.device("cpu"), torch.float32) is None
    assert peak_flops(torch.device("cpu"), torch.bfloat16) is None
