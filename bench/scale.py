"""Data-parallel scaling of `lmforge pretrain`: tokens/s and peak memory per GPU on 1, 2, 4 (8) GPUs, ddp vs fsdp,
weak scaling (a fixed batch per GPU), each configuration a real torchrun launch of the CLI on a prepared corpus.

    PYTHONPATH=src python bench/scale.py                                   # gpt2-124m, 16 × 1024 per GPU
    PYTHONPATH=src python bench/scale.py --preset llama-1b --batch 4 --seq 2048 --parallel fsdp --compile
    PYTHONPATH=src python bench/scale.py --preset gpt-tiny --batch 4 --seq 64 --steps 6 --warmup 2 --gpus 1 2 \\
        --device cpu                                                       # CPU smoke run (gloo)

Scaling efficiency on N GPUs = tokens/s on N ÷ (N × tokens/s on 1) of the same parallelism (1.0 = linear). Each
row's per-GPU tokens/s is also divided by the plain loop's: one process on one GPU, no DDP wrapper or sharding
(ddp on 1 GPU is that loop; it is run first when the GPU counts or parallelisms asked for leave it out, unless
--no-plain).
Tokens/s is the loop's own clock (train/metrics.py: Throughput, evaluation and saving excluded): all tokens over all
time of the log windows after --warmup steps; memory is torch.cuda.max_memory_allocated, the largest over the ranks."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("scale_worker.py")
GIB = 1024**3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="gpt2-124m")
    p.add_argument("--batch", type=int, default=16, help="sequences per GPU per step (weak scaling)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10, help="steps left out of tokens/s (compilation, allocator)")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default: 1, 2, 4, 8 up to the machine's)")
    p.add_argument("--parallel", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--compile", action="store_true", help="--train.compile (per block under fsdp)")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument(
        "--no-save",
        action="store_true",
        help="write no checkpoint (a multi-billion-parameter run's final save is tens of GB of disk)",
    )
    p.add_argument("--no-plain", action="store_true", help="no plain 1-GPU loop run (a model too big for one GPU)")
    p.add_argument("--data", type=Path, help="prepared data dir (default: the bundled corpus, prepared in --work)")
    p.add_argument("--tokenizer", help="tokenizer of --data: a dir, or a published name such as gpt2")
    p.add_argument("--work", type=Path, default=Path("bench/results/scale-work"), help="runs and prepared data")
    p.add_argument("--out", type=Path, help="results JSON (default: $OUT or bench/results, by time and device)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides, e.g. model.n_layers=48")
    return p.parse_args(argv)


def gpu_counts(args: argparse.Namespace) -> list[int]:
    if args.gpus:
        return args.gpus
    import torch

    have = torch.cuda.device_count() if args.device == "cuda" else 2
    return [n for n in (1, 2, 4, 8) if n <= have] or [1]


def prepared_corpus(args: argparse.Namespace) -> tuple[Path, Path]:
    """(tokenizer dir, prepared data dir): --tokenizer/--data, else the bundled corpus with an 8,192-token BPE."""
    if args.data:
        if not args.tokenizer:
            sys.exit("error: --data needs --tokenizer")
        return args.tokenizer, args.data
    from lmforge.data.corpus.bundled import load_default_corpus
    from lmforge.data.corpus.prepare import prepare
    from lmforge.tokenizers import Tokenizer, train_tokenizer

    d = args.work / "corpus"
    if (d / "data" / "meta.json").is_file():
        return d / "tok", d / "data"
    d.mkdir(parents=True, exist_ok=True)
    docs = load_default_corpus()
    path = d / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    train_tokenizer(docs, "bpe", 8192, family="gpt").save(d / "tok")
    prepare([path], d / "data", Tokenizer.load(d / "tok"), val_fraction=0.01)
    return d / "tok", d / "data"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_one(args: argparse.Namespace, parallel: str, n: int, tok: Path, data: Path) -> dict:
    """One torchrun launch → {tokens_per_s, peak memory per GPU, ...} or {error}."""
    from lmforge.models import get_preset
    from lmforge.tokenizers.published import tokenizer_vocab_size

    name = f"{parallel}-{n}gpu"
    run_dir, stats = args.work / "runs" / name, args.work / "stats" / name
    for d in (run_dir, stats):
        shutil.rmtree(d, ignore_errors=True)
    stats.mkdir(parents=True)
    # The preset's head whatever the corpus tokenizer's size (unless the tokenizer has more tokens).
    vocab = max(get_preset(args.preset).vocab_size, tokenizer_vocab_size(str(tok)))
    overrides = [
        f"--run.dir={run_dir}", f"--data.tokenizer={tok}", f"--data.prepared={data}", f"--model.preset={args.preset}",
        f"--model.vocab_size={vocab}", f"--train.batch_size={args.batch}", f"--train.seq_len={args.seq}",
        f"--train.max_steps={args.steps}", f"--train.log_every={args.log_every}", f"--train.parallel={parallel}",
        f"--train.device={args.device}", "--train.eval_batches=1", "--train.warmup_steps=10", "--sample.prompts=[]",
        f"--train.compile={str(args.compile).lower()}",
        f"--train.activation_checkpointing={str(args.activation_checkpointing).lower()}",
        *(f"--{kv}" for kv in args.set),
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={free_port()}",
           str(WORKER), "pretrain", "gpt", *overrides]  # fmt: skip
    path = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "LMFORGE_SCALE_DIR": str(stats), "PYTHONPATH": path}
    if args.no_save:
        env["LMFORGE_SCALE_NO_SAVE"] = "1"
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    out = {"parallel": parallel, "gpus": n, "wall_s": round(time.time() - t0, 1), "command": " ".join(cmd[2:])}
    ranks = [json.loads(p.read_text()) for p in sorted(stats.glob("rank*.json"))]
    if ranks:
        out["peak_gib_per_gpu"] = round(max(r["peak_allocated"] for r in ranks) / GIB, 2)
        out["reserved_gib_per_gpu"] = round(max(r["peak_reserved"] for r in ranks) / GIB, 2)
        out["device_name"] = ranks[0]["device"]
    if proc.returncode != 0:
        oom = re.search(r"(CUDA )?[Oo]ut of memory[^\n]*", proc.stderr)
        out["error"] = oom[0][:300] if oom else failure_line(proc.stderr)
        out["oom"] = bool(oom)
        return out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s") and r["step"] >= args.warmup + args.log_every]
    if not rates:  # too few steps for a window after the warmup: every window
        rates = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")]
    # Every window holds the same tokens, so tokens over time is the harmonic mean of the rates (the arithmetic mean
    # lets one fast window outweigh a slow one); the spread of the windows goes beside it.
    out["tokens_per_s"] = round(statistics.harmonic_mean(rates), 1)
    out["window_tokens_per_s"] = {"min": round(min(rates)), "median": round(statistics.median(rates)),
                                  "max": round(max(rates))}  # fmt: skip
    out["tokens_per_s_per_gpu"] = round(out["tokens_per_s"] / n, 1)
    out["mfu"] = next((r["mfu"] for r in reversed(rows) if r.get("mfu") is not None), None)
    out["final_loss"] = next(r["loss"] for r in reversed(rows) if "loss" in r)
    return out


def failure_line(stderr: str) -> str:
    """The line that says why a launch failed: the last `...Error: ...` or `error: ...` line of any rank (torchrun
    ends with a banner of its own), else the last non-empty line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if re.search(r"(^|\w)(Error|error): ", ln) and "torch.distributed.elastic" not in ln]
    return (said or lines or ["no output"])[-1][:300]


def add_efficiency(results: list[dict]) -> None:
    """Weak-scaling efficiency of each row against the same parallelism's 1-GPU row, and its per-GPU tokens/s
    against the plain loop's (ddp on 1 GPU: no wrapper, no sharding)."""
    base = {r["parallel"]: r.get("tokens_per_s") for r in results if r["gpus"] == 1}
    plain = base.get("ddp")
    for r in results:
        b = base.get(r["parallel"])
        if b and r.get("tokens_per_s"):
            r["scaling_efficiency"] = round(r["tokens_per_s"] / (r["gpus"] * b), 3)
        if plain and r.get("tokens_per_s"):
            r["per_gpu_vs_plain"] = round(r["tokens_per_s_per_gpu"] / plain, 3)


def table(results: list[dict], args: argparse.Namespace) -> str:
    head = (f"{args.preset}, {args.batch} × {args.seq} tokens per GPU, {args.steps} steps "
            f"(tokens/s after step {args.warmup}){', compiled' if args.compile else ''}"
            f"{', activation checkpointing' if args.activation_checkpointing else ''}"
            f"{''.join(f', {kv}' for kv in args.set)}")  # fmt: skip
    lines = [head, "", "| parallel | GPUs | tokens/s | tokens/s per GPU | scaling efficiency | per GPU ÷ plain loop | "
             "MFU | peak GiB/GPU |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        if "error" in r:
            mem = f" (peak {r['peak_gib_per_gpu']} GiB)" if "peak_gib_per_gpu" in r else ""
            lines.append(f"| {r['parallel']} | {r['gpus']} | {'out of memory' if r.get('oom') else 'failed'}{mem}: "
                         f"{r['error'][:80]} | | | | | |")  # fmt: skip
            continue
        mfu = f"{r['mfu']:.3f}" if r.get("mfu") is not None else "n/a"
        rate = f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f}"
        lines.append(f"| {r['parallel']} | {r['gpus']} | {rate} | {r.get('scaling_efficiency', 'n/a')} | "
                     f"{r.get('per_gpu_vs_plain', 'n/a')} | {mfu} | {r.get('peak_gib_per_gpu', 'n/a')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work = args.work.resolve()
    tok, data = prepared_corpus(args)
    results = []
    runs = [(parallel, n) for parallel in args.parallel for n in gpu_counts(args)]
    if ("ddp", 1) not in runs and not args.no_plain:  # the plain loop every row is compared with
        runs.insert(0, ("ddp", 1))
    for parallel, n in runs:
        r = run_one(args, parallel, n, tok, data)
        results.append(r)
        print(json.dumps(r), flush=True)
    add_efficiency(results)
    text = table(results, args)
    print(text)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or Path(os.environ.get("OUT", ROOT / "bench" / "results")) / f"scale-{stamp}-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2))
    out.with_suffix(".md").write_text(text + "\n")
    print(f"wrote {out}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
