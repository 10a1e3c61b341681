"""What users run, timed: `lmforge pretrain` end to end (the CLI's process, real prepared data) beside the step-only
figure of `bench/run.py` for the same model and batch, and optionally beside nanoGPT's `train.py` loop on the same
data (a local checkout of karpathy/nanoGPT, never part of this repository).

From the repository root, on a prepared GPT-2-BPE corpus (`lmforge data prepare ... --tokenizer gpt2`):

    PYTHONPATH=src python bench/train_e2e.py --data DIR --tokenizer gpt2 --models gpt2 --steps 300
    PYTHONPATH=src python bench/train_e2e.py --data DIR --tokenizer gpt2 --nanogpt ~/nanoGPT --time-to-loss

Throughput of a CLI run is read from its own metrics.jsonl (tokens/s of each logged interval, the first ones —
compilation, warmup — left out). Time to loss: nanoGPT's recipe for 1,200 steps of 16×1024 tokens, then the
`gpt-fast` recipe (as it is, or each --fast-args variant) until its validation loss reaches nanoGPT's; both final
models are scored on the same validation windows, and both wall times are whole processes (start-up, compilation,
evaluation included), each with an empty compilation cache.

--ablation: the gpt-fast recipe with each of its changes undone on its own, all for the same number of steps."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.append(str(_HERE.parent / "src"))

from model_table import BENCH_MODELS, require_available  # noqa: E402

from lmforge.models import get_preset  # noqa: E402

# Each bench model → the recipe the CLI trains it with (the objective bench/run.py's loss stands for).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RECIPES = {"gpt2": ("gpt", "gpt2-124m"), "bert": ("bert", "bert-base"), "roberta": ("roberta", "roberta-base"),
           "t5": ("t5", "t5-base")}  # fmt: skip


# Each change of the gpt-fast recipe undone on its own (the AdamW arm: every matrix on AdamW, at an lr tuned for it).
ABLATION = {  # arm → (what it changes, its overrides)
    "gpt-fast": ("the recipe as it is", []),
    "adamw": ("AdamW instead of Muon", ["--train.optimizer=adamw", "--train.lr=0.002"]),
    "learned-pos": ("learned positions instead of rotary", ["--model.position=learned"]),
    "no-qk-norm": ("no QK-norm", ["--model.qk_norm=false"]),
    "gelu": ("GELU instead of ReLU²", ["--model.activation=gelu_tanh"]),
    "untied-head": ("untied head", ["--model.tie_embeddings=false"]),
    "no-softcap": ("no logit soft-cap", ["--model.logit_softcap=null"]),
    "cosine": ("cosine instead of WSD", ["--train.schedule=cosine"]),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a prepared data dir (lmforge data prepare)")
    p.add_argument("--tokenizer", required=True, help="the tokenizer the data was prepared with (path or gpt2)")
    p.add_argument("--models", nargs="*", default=["gpt2"], choices=sorted(RECIPES))
    p.add_argument("--batch", type=int, help="default: per model (bench/run.py's)")
    p.add_argument("--seq", type=int, help="default: per model (bench/run.py's)")
    p.add_argument("--steps", type=int, default=200, help="CLI steps per model")
    p.add_argument("--compile", choices=["on", "off"], default="on")
    p.add_argument("--nanogpt", type=Path, help="a local nanoGPT checkout: run its train.py on the same data")
    p.add_argument("--time-to-loss", action="store_true", help="gpt-fast vs nanoGPT's 1,200-step loss")
    p.add_argument("--nanogpt-args", type=shlex.split, default=[], help="extra train.py overrides, one string")
    p.add_argument("--fast-args", type=shlex.split, action="append", help="gpt-fast overrides, one string; "
                   "repeat to time several variants (default: the recipe as it is)")  # fmt: skip
    p.add_argument("--ablation", action="store_true", help="gpt-fast with each change undone, at equal steps")
    p.add_argument("--ablation-steps", type=int, default=300, help="steps of each ablation arm")
    p.add_argument("--ablation-args", type=shlex.split, default=[], help="overrides for every arm, one string")
    p.add_argument("--arms", nargs="+", choices=list(ABLATION), default=list(ABLATION), help="default: every arm")
    p.add_argument("--val-batches", type=int, default=20, help="validation windows (of 16) both models are scored on")
    p.add_argument("--out", type=Path, help="results JSON (default: $OUT/train_e2e.json or bench/results/)")
    p.add_argument("--work", type=Path, help="keep the runs and logs here (default: a temporary dir)")
    return p.parse_args(argv)


def _cold_cache(log: Path) -> dict[str, str]:
    """The environment of a process timed from a cold start: a compilation cache of its own, empty."""
    return {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(log.with_suffix(".inductor"))}


def _cli(args: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run `lmforge ...` in a subprocess; wall seconds. Its output goes to `log`, each line stamped with the seconds
    since the start, which shows where a run's fixed costs go (startup, compilation, evaluation, the final save)."""
    env = {**(env or os.environ), "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "lmforge.cli", *args]
    with open(log, "w") as f, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                               text=True) as p:  # fmt: skip
        for line in p.stdout:
            f.write(f"[{time.perf_counter() - t0:7.2f} s] {line}")
    if p.returncode != 0:
        raise RuntimeError(f"lmforge {' '.join(args[:2])} failed (exit {p.returncode}); see {log}")
    return time.perf_counter() - t0


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def cli_throughput(name: str, a, work: Path) -> dict:
    """Tokens/s of `lmforge pretrain` on the prepared data: median of the logged intervals after the first 3."""
    recipe, preset = RECIPES[name]
    spec = BENCH_MODELS[name] if name in BENCH_MODELS else None
    batch, seq = a.batch or (spec.batch if spec else 16), a.seq or (spec.seq_len if spec else 1024)
    run = work / f"cli-{name}"
    window = t5_window(seq) if name == "t5" else seq
    over = [f"--model.preset={preset}", f"--data.prepared={a.data}", f"--data.tokenizer={a.tokenizer}",
            f"--train.batch_size={batch}", f"--train.seq_len={window}", f"--train.max_steps={a.steps}",
            f"--model.max_seq_len={max(window, 128)}", "--train.log_every=10", f"--train.eval_every={a.steps}",
            f"--train.save_every={a.steps}", "--train.eval_batches=2", "--sample.prompts=[]",
            f"--run.dir={run}", "--train.compile" if a.compile == "on" else "--train.compile=false"]  # fmt: skip
    if spec is not None:  # the step bench's vocabulary (it may exceed the tokenizer's), so both time one model
        over.append(f"--model.vocab_size={get_preset(spec.preset).vocab_size}")
    if name == "t5":
        over.append("--objective.style=span")
    wall = _cli(["pretrain", recipe, *over], work / f"cli-{name}.log")
    rates = [r["tokens_per_s"] for r in _rows(run) if "tokens_per_s" in r][3:]
    rate = statistics.median(rates) if rates else None
    return {"model": name, "preset": preset, "batch": batch, "seq": seq, "window": window, "steps": a.steps,
            "wall_s": wall, "cli_tokens_per_s": rate,
            "cli_step_ms": batch * window / rate * 1e3 if rate else None}  # fmt: skip


def t5_window(inputs: int) -> int:
    """The raw window whose span corruption gives `inputs` encoder tokens (T5's 568 → 512), so the CLI's encoder and
    decoder lengths are the step bench's (512 in, 114 out)."""
    from lmforge.objectives.t5 import T5Options, T5SpanCorruption

    window = inputs
    while T5SpanCorruption.lengths(T5Options(), window)[0] < inputs:
        window += 1
    if T5SpanCorruption.lengths(T5Options(), window)[0] != inputs:
        raise SystemExit(f"no T5 window gives exactly {inputs} encoder tokens; pick another --seq")
    return window


def step_throughput(name: str, a) -> dict:
    """bench/run.py's step-only tokens/s of the lmforge model, same preset, batch and compile, over the steps the CLI's
    figure covers (its first 3 logged intervals of 10 are left out): a host-bound step slows on some hosts after its
    first second (T5-base on an H200 host: 33.2 ms over 20 steps, 40.9 ms over 150)."""
    import run as bench_run  # bench/run.py

    skip = min(30, a.steps // 2)
    argv = ["--models", name, "--impls", "lmforge", "--compile", a.compile, "--steps", str(a.steps - skip),
            "--warmup", str(skip)]  # fmt: skip
    argv += [f"--batch={a.batch}"] if a.batch else []
    argv += [f"--seq={a.seq}"] if a.seq else []
    if name not in BENCH_MODELS:
        return {}
    args = bench_run.parse_args(argv)
    cfg = require_available(name, BENCH_MODELS[name], args.preset)
    rows = bench_run.bench_model(name, args)
    ok = [r for r in rows if not r.get("error")]
    return {"step_tokens_per_s": ok[-1]["tokens_per_s"] if ok else None, "step_ms": ok[-1]["step_ms"] if ok else None,
            "step_preset": cfg.name}  # fmt: skip


# --- nanoGPT and time to loss -------------------------------------------------------------------------------------


def nanogpt_run(a, work: Path, steps: int = 1200) -> dict:
    """nanoGPT's train.py with its own recipe (model, optimizer, schedule) at batch 16 × 1024, one accumulation
    step, on our prepared train.bin/val.bin (the same uint16 GPT-2-BPE format)."""
    wd = work / "nanogpt"
    (wd / "data").mkdir(parents=True, exist_ok=True)
    link = wd / "data" / "lmforge"
    if not link.exists():
        link.symlink_to(a.data.resolve())
    for f in ("configurator.py",):
        if not (wd / f).exists():
            (wd / f).symlink_to((a.nanogpt / f).resolve())
    args = ["--dataset=lmforge", "--batch_size=16", "--block_size=1024", "--gradient_accumulation_steps=1",
            f"--max_iters={steps}", f"--eval_interval={steps}", "--eval_iters=20", "--log_interval=50",
            "--compile=True", f"--out_dir={wd / 'out'}", "--always_save_checkpoint=True", *a.nanogpt_args]  # fmt: skip
    t0 = time.perf_counter()
    with open(work / "nanogpt.log", "w") as f:
        rc = subprocess.run([sys.executable, str(a.nanogpt.resolve() / "train.py"), *args], cwd=wd, stdout=f,
                            stderr=subprocess.STDOUT, env=_cold_cache(work / "nanogpt.log")).returncode  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"nanoGPT train.py failed (exit {rc}); see {work / 'nanogpt.log'}")
    wall = time.perf_counter() - t0
    train_tokens = json.loads((a.data / "meta.json").read_text())["train"]["n_tokens"]
    return {"wall_s": wall, "ckpt": str(wd / "out" / "ckpt.pt"), "args": args,
            "epochs": round(steps * 16 * 1024 / train_tokens, 2),
            "own_last_eval": nanogpt_last_eval((work / "nanogpt.log").read_text())}  # fmt: skip


def nanogpt_last_eval(log: str) -> dict | None:
    """The train and val losses of nanoGPT's last evaluation ("step N: train loss X, val loss Y"): their gap shows
    whether the reference overfits a small corpus, which makes its final loss an easier target."""
    last = None
    for line in log.splitlines():
        m = re.match(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", line.strip())
        if m:
            last = {"step": int(m.group(1)), "train_loss": float(m.group(2)), "val_loss": float(m.group(3))}
    return last


@torch.no_grad()
def nanogpt_val_loss(a, ckpt: Path, windows: list[torch.Tensor]) -> float:
    """nanoGPT's final model (its own model.py) scored on the validation windows lmforge scores."""
    sys.path.insert(0, str(a.nanogpt.resolve()))
    from model import GPT, GPTConfig  # nanoGPT's

    state = torch.load(ckpt, map_location=DEVICE, weights_only=True)
    model = GPT(GPTConfig(**state["model_args"])).to(DEVICE).eval()
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in state["model"].items()})
    total, n = 0.0, 0
    for w in windows:
        w = w.to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            logits, _ = model(w[:, :-1].contiguous(), w[:, 1:].contiguous())
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum")
        total, n = total + float(loss), n + w[:, 1:].numel()
    return total / n


@torch.no_grad()
def lmforge_val_loss(run: Path, windows: list[torch.Tensor]) -> float:
    from lmforge import load
    from lmforge.objectives.losses import lm_head_loss

    model, _ = load(run, device=DEVICE)
    total, n = 0.0, 0
    for w in windows:
        w = w.to(DEVICE)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            h = model(w[:, :-1], return_logits=False).last_hidden_state
            total += float(lm_head_loss(model, h, w[:, 1:])) * w[:, 1:].numel()
        n += w[:, 1:].numel()
    return total / n


def time_to_loss(a, work: Path) -> dict:
    from lmforge.data.corpus.loader import TokenLoader

    seq = a.seq or 1024
    a.windows = list(TokenLoader(a.data, "val", seq_len=seq, batch_size=16).eval_batches(a.val_batches))
    nano = nanogpt_run(a, work)
    nano["val_loss"] = nanogpt_val_loss(a, Path(nano["ckpt"]), a.windows)
    fast = [gpt_fast_run(a, work, i, args, nano) for i, args in enumerate(a.fast_args or [[]])]
    return {"nanogpt": nano, "gpt_fast": fast}


def gpt_fast_run(a, work: Path, i: int, args: list[str], nano: dict) -> dict:
    """One gpt-fast variant until it reaches nanoGPT's validation loss, timed from a cold start."""
    run = work / f"gpt-fast-{i}"
    over = [f"--data.prepared={a.data}", f"--data.tokenizer={a.tokenizer}", f"--run.dir={run}",
            f"--train.target_loss={nano['val_loss']:.4f}", "--sample.prompts=[]", *args]  # fmt: skip
    log = work / f"gpt-fast-{i}.log"
    wall = _cli(["pretrain", "gpt-fast", *over], log, env=_cold_cache(log))
    rows = _rows(run)
    evals = [r for r in rows if "val_loss" in r]
    val = lmforge_val_loss(run, a.windows)
    return {"args": args, "wall_s": wall, "steps": evals[-1]["step"], "val_loss_own_eval": evals[-1]["val_loss"],
            "val_loss": val, "time_ratio": wall / nano["wall_s"], "reached": val <= nano["val_loss"],
            **run_timing(log.read_text(), rows)}  # fmt: skip


def run_timing(log: str, rows: list[dict]) -> dict:
    """Where a timed run's seconds went, from its stamped log and its metrics (so that a result file alone says
    whether fewer steps came from a longer start-up, a longer compilation or slower steps): when the model line
    and the first logged step came, and the median tokens/s of the logged windows after the first (which holds
    the compilation)."""
    stamps = {}
    for line in log.splitlines():
        m = re.match(r"\[\s*([\d.]+) s\] (model |step )", line)
        if m and m.group(2) not in stamps:
            stamps[m.group(2)] = float(m.group(1))
    rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]
    return {"model_line_s": stamps.get("model "), "first_step_log_s": stamps.get("step "),
            "tokens_per_s": statistics.median(rates) if rates else None}  # fmt: skip


def ablation(a, work: Path) -> list[dict]:
    """Each arm for --ablation-steps steps on the same data: final validation loss and the step's time."""
    rows = []
    for name in a.arms:
        what, args = ABLATION[name]
        run = work / f"ablation-{len(rows)}"
        over = [f"--data.prepared={a.data}", f"--data.tokenizer={a.tokenizer}", f"--run.dir={run}",
                "--train.time_budget=null", f"--train.max_steps={a.ablation_steps}",
                f"--train.eval_every={a.ablation_steps}",
                f"--train.save_every={a.ablation_steps}", "--sample.prompts=[]", *a.ablation_args, *args]  # fmt: skip
        wall = _cli(["pretrain", "gpt-fast", *over], work / f"ablation-{len(rows)}.log")
        metrics = _rows(run)
        rates = [r["tokens_per_s"] for r in metrics if "tokens_per_s" in r][3:]
        t = yaml.safe_load((run / "config.yaml").read_text())["train"]
        tokens_per_step = t["batch_size"] * t["seq_len"] * t["grad_accum"]
        ms = tokens_per_step / statistics.median(rates) * 1e3 if rates else None
        row = {"arm": name, "change": what, "args": args, "steps": a.ablation_steps, "wall_s": wall, "ms_per_step": ms,
               "val_loss": [r["val_loss"] for r in metrics if "val_loss" in r][-1]}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = a.out or Path(os.environ.get("OUT", _HERE / "results")) / "train_e2e.json"
    results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                     "torch": torch.__version__, "models": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="lmforge-e2e-") as tmp:
        work = (a.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for name in a.models:
            row = cli_throughput(name, a, work) | step_throughput(name, a)
            if row.get("cli_step_ms") and row.get("step_ms"):  # per step: T5's window counts more tokens
                row["cli_over_step"] = row["step_ms"] / row["cli_step_ms"]
            print(json.dumps(row), flush=True)
            results["models"].append(row)
        if a.time_to_loss:
            if a.nanogpt is None:
                raise SystemExit("--time-to-loss needs --nanogpt DIR")
            results["time_to_loss"] = time_to_loss(a, work)
            print(json.dumps(results["time_to_loss"]), flush=True)
        if a.ablation:
            results["ablation"] = ablation(a, work)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
