"""Training metrics: the ``metrics.jsonl`` log, loss plots, a progress line, and MFU accounting.

Each line of ``RUN/metrics.jsonl`` is one JSON object with a ``step`` and any values logged at that step.
Names the plots understand: ``train_loss`` (or ``loss``), ``val_loss`` and ``lr``.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import torch

from lmforge.errors import LMForgeError
from lmforge.extras import available, hint
from lmforge.files import append_text, loads_json, refuse_link, write_atomic
from lmforge.models.flops import flops_per_token  # noqa: F401  (the trainer's MFU count; one definition)
from lmforge.progress import status
from lmforge.train.sinks import TENSORBOARD_DIR, open_sinks  # noqa: F401  (TENSORBOARD_DIR: where it was)

METRICS_FILE = "metrics.jsonl"
PLOTS_DIR = "plots"
_SIGNIFICANT_DIGITS = 6


def _clean_value(name: str, value: Any) -> Any:
    """A JSON-safe value: floats rounded, NaN/inf → None, 0-d tensors and NumPy scalars unwrapped."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"metric '{name}' is a tensor with {value.numel()} elements; log a scalar")
        value = value.item()
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return float(f"{value:.{_SIGNIFICANT_DIGITS}g}") if math.isfinite(value) else None
    raise TypeError(f"metric '{name}' has type {type(value).__name__}; log numbers or strings")


class MetricsLogger:
    """Appends one JSON line per :meth:`log` call to ``run_dir/metrics.jsonl``.

    With ``resume_step``, lines logged after that step (by the run being resumed) are dropped first, so the
    resumed log has no duplicate steps. ``sinks`` (train.log_to) get every record too; ``config``, the run's resolved
    config, goes to those that keep one (W&B's config, MLflow's parameters).
    """

    def __init__(
        self, run_dir: Path, resume_step: int | None = None, sinks: list[str] | tuple = (), config: dict | None = None
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_link(self.path)  # before reading it: a planted link's target is neither read nor written
        if self.path.exists():
            self._rewrite_kept(resume_step)
        self._file: TextIO | None = append_text(self.path)
        try:
            self._sinks = open_sinks(list(sinks), Path(run_dir), resume_step, config)
        except BaseException:
            self._file.close()
            raise

    def _rewrite_kept(self, resume_step: int | None) -> None:
        """Drop a torn last line (a crash mid-write) and, when resuming, lines after ``resume_step``."""
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        kept = [ln for ln in lines if ln.endswith("\n")]
        if resume_step is not None:
            kept = [ln for ln in kept if not _after(ln, resume_step)]
        if len(kept) == len(lines):
            return
        write_atomic(self.path, "".join(kept))

    def log(self, step: int, **values: Any) -> None:
        """Append ``{"step": step, **values}`` as one line and flush it."""
        if self._file is None:
            raise ValueError("MetricsLogger is closed")
        record = {"step": int(step)} | {k: _clean_value(k, v) for k, v in values.items()}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        scalars.pop("step")
        for sink in list(self._sinks):
            try:
                sink.log(int(step), scalars)
            except Exception as e:  # noqa: BLE001 — a tracking server's hiccup must not stop the training
                self._sinks.remove(sink)
                print(f"warning: stopped logging to {type(sink).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _after(line: str, step: int) -> bool:
    """Whether a log line belongs to a step after ``step``; unparsable lines count as not after."""
    try:
        record = loads_json(line)
        return int(record["step"]) > step
    except (ValueError, KeyError, TypeError):
        return False


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of ``run_dir/metrics.jsonl`` in order; a torn last line (crash mid-write) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise LMForgeError(f"no metrics log at {path}") from e
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = loads_json(line)
        except ValueError as e:
            if i == len(lines):  # no trailing newline: the writer died mid-line
                break
            raise LMForgeError(f"{path}:{i}: not valid JSON") from e
        if not isinstance(record, dict):
            raise LMForgeError(f"{path}:{i}: expected a JSON object")
        records.append(record)
    return records


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    pairs = [(r["step"], r[key]) for r in records if r.get(key) is not None and "step" in r]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_metrics(run_dir: Path) -> list[Path]:
    """Write ``plots/loss.png`` (train and validation loss vs step), ``plots/lr.png`` and, for a fine-tuning run,
    ``plots/dev.png`` (each dev metric vs step) when logged.

    Returns the files written; empty when the log holds nothing to plot, or when matplotlib (lmforge's `plot`
    extra) is not installed: a run without it says so in one line and is otherwise complete.
    """
    if not available("matplotlib"):
        status("note: " + hint("matplotlib", "plots/loss.png"))
        return []
    # Figure without pyplot: no global backend switch, no GUI, safe in threads and headless jobs.
    from matplotlib.figure import Figure

    records = read_metrics(run_dir)
    out_dir = Path(run_dir) / PLOTS_DIR
    written = []
    for name, keys in plot_curves(records).items():
        series = [(label, *_series(records, key)) for key, label in keys]
        series = [s for s in series if s[1]]
        if not series:
            continue
        fig = Figure(figsize=(7, 4.5), dpi=100)
        ax = fig.subplots()
        for label, steps, values in series:
            marker = "o" if len(steps) < 50 else None
            ax.plot(steps, values, label=label, marker=marker, markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("dev metric" if name == "dev" else name)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        refuse_link(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        png = io.BytesIO()
        fig.savefig(png, format="png")
        path = out_dir / f"{name}.png"
        write_atomic(path, png.getvalue(), fsync=False)
        written.append(path)
    return written


def plot_curves(records: list[dict]) -> dict[str, list[tuple[str, str]]]:
    """Plot name → its curves as (logged key, legend label): train and validation loss, the learning rate, and the
    dev metrics a fine-tuning run logs after each epoch (`dev_accuracy`, `dev_f1`, ...)."""
    train_key = "train_loss" if any("train_loss" in r for r in records) else "loss"
    dev = sorted({k for r in records for k, v in r.items() if k.startswith("dev_") and _is_number(v)})
    return {
        "loss": [(train_key, "train"), ("val_loss", "validation")],
        "lr": [("lr", "learning rate")],
        "dev": [(k, f"dev {k[len('dev_') :]}") for k in dev],
    }


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class BackgroundPlot:
    """`plot_metrics` drawn in a thread (the first plot on a machine also builds matplotlib's font cache: seconds),
    so that a run's final checkpoint is written meanwhile; `wait()` returns the files or raises what the plotting
    raised."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.result: list[Path] | BaseException = []
        self.thread = threading.Thread(target=self._draw, name="lmforge-plot", daemon=True)
        self.thread.start()

    def _draw(self) -> None:
        try:
            self.result = plot_metrics(self.run_dir)
        except BaseException as e:  # noqa: BLE001 — handed to wait()
            self.result = e

    def wait(self) -> list[Path]:
        self.thread.join()
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class Progress:
    """Training progress on stderr: step, loss, learning rate, tokens/s, MFU and ETA.

    On a terminal a `tqdm` bar refreshes in place; otherwise (log files, CI) a plain line is written every
    ``every`` updates and at the last step. Nothing is written when quiet (``--quiet``)."""

    def __init__(self, total_steps: int, *, every: int = 10, stream: TextIO | None = None) -> None:
        from lmforge.progress import is_quiet

        self.total_steps = total_steps
        self.every = max(1, every)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.quiet = is_quiet()
        self._updates = 0
        self._start: tuple[float, int] | None = None  # (time, step) of the first update, for the ETA
        self._bar = None

    def format(self, step: int, loss: float, lr: float, tokens_per_s: float | None, mfu: float | None) -> str:
        """The progress line for one update (also records the ETA reference point)."""
        now = time.monotonic()
        if self._start is None:
            self._start = (now, step)
        pct = 100.0 * step / self.total_steps if self.total_steps > 0 else 100.0
        parts = [f"step {step}/{self.total_steps} ({pct:.1f}%)", *self._values(loss, lr, tokens_per_s, mfu)]
        t0, s0 = self._start
        if step > s0:
            remaining = (now - t0) / (step - s0) * max(0, self.total_steps - step)
            parts.append(f"eta {_format_duration(remaining)}")
        return " | ".join(parts)

    @staticmethod
    def _values(loss: float, lr: float, tokens_per_s: float | None, mfu: float | None) -> list[str]:
        parts = [f"loss {loss:.4f}", f"lr {lr:.2e}"]
        if tokens_per_s is not None:
            parts.append(f"{tokens_per_s / 1e3:,.1f}k tok/s")
        if mfu is not None:
            parts.append(f"mfu {100 * mfu:.1f}%")
        return parts

    def update(self, step: int, loss: float, lr: float, tokens_per_s: float | None, mfu: float | None) -> None:
        """Report the state after ``step`` optimizer steps."""
        if self.quiet:
            return
        self._updates += 1
        if self.tty:
            from tqdm.auto import tqdm

            if self._bar is None:
                self._bar = tqdm(total=self.total_steps, initial=step, unit="step", file=self.stream,
                                 dynamic_ncols=True, leave=True, desc="train")  # fmt: skip
            self._bar.set_postfix_str(" | ".join(self._values(loss, lr, tokens_per_s, mfu)), refresh=False)
            self._bar.update(step - self._bar.n)
            return
        if (self._updates - 1) % self.every == 0 or step >= self.total_steps:
            self.stream.write(self.format(step, loss, lr, tokens_per_s, mfu) + "\n")
            self.stream.flush()

    def set_total(self, total_steps: int) -> None:
        """A new planned length (a run on a time budget replans its steps)."""
        self.total_steps = total_steps
        if self._bar is not None:
            self._bar.total = total_steps

    def close(self) -> None:
        """Close the bar so later output starts on a fresh line."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Throughput:
    """Tokens/s over the steps since the last reading, excluding time spent evaluating and saving."""

    def __init__(self, tokens_per_step: int, step: int) -> None:
        self.tokens_per_step, self.step = tokens_per_step, step
        self.t0, self.excluded = time.perf_counter(), 0.0

    @contextmanager
    def paused(self):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t

    def tokens_per_s(self, step: int) -> float:
        now = time.perf_counter()
        rate = self.tokens_per_step * (step - self.step) / max(now - self.t0 - self.excluded, 1e-9)
        self.step, self.t0, self.excluded = step, now, 0.0
        return rate


# Dense (no sparsity) peak throughput from NVIDIA datasheets, FLOP/s. fp32 is plain FP32, not TF32.
_PEAK_FLOPS: list[tuple[str, float, float]] = [  # (name fragment, bf16/fp16, fp32); first match wins
    ("H100 PCIe", 756e12, 51e12),
    ("H100 NVL", 835e12, 60e12),
    ("H100", 989e12, 67e12),
    ("H200", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
]


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Peak dense FLOP/s of one accelerator for ``dtype``; None when unknown (CPU, other GPUs or dtypes)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, half, single in _PEAK_FLOPS:
        if fragment in name:
            if dtype in (torch.bfloat16, torch.float16):
                return half
            return single if dtype == torch.float32 else None
    return None


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float | None, n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved FLOP/s over ``n_devices`` × ``peak``; None when the peak is unknown.

    ``tokens_per_s`` is the throughput of all ``n_devices`` together.
    """
    if peak is None or peak <= 0:
        return None
    return tokens_per_s * flops_per_tok / (peak * n_devices)
