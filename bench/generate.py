"""Generation speed of lmforge, eager and compiled, against Hugging Face `generate`: same weights, same prompts.

From the repository root:

    PYTHONPATH=src python bench/generate.py                 # gpt2-124m, bf16, 128-token prompts → 256 new, B=1 and 32
    PYTHONPATH=src python bench/generate.py --batch 32      # one batch size
    PYTHONPATH=src python bench/generate.py --impls lmforge-compiled hf hf-static   # with HF's static cache + compile
    PYTHONPATH=src python bench/generate.py --preset gpt-tiny --prompt-len 16 --new-tokens 16 --batch 2 --device cpu

Every variant decodes greedily (no sampling, no EOS: exactly --new-tokens per row) from the same random prompts, with
the same fp32 weights cast to --dtype. A call's time covers everything `generate` does: the prompt's forward, every
decoding step, the token selection. The first call of a variant (compilation, CUDA-graph recording) is timed apart.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from torch import Tensor, nn

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))  # model_table, report (already there when run as a script)
sys.path.append(str(_HERE.parent / "src"))  # lmforge from the checkout when neither PYTHONPATH nor an install has it

from model_table import BENCH_MODELS, require_available  # noqa: E402
from report import default_path, free_memory, one_line, write_results  # noqa: E402

from lmforge.errors import LMForgeError  # noqa: E402
from lmforge.models import Transformer  # noqa: E402
from lmforge.models.generate import decoding_steps, generate, sample  # noqa: E402
from lmforge.models.static_decode import StaticSteps  # noqa: E402

IMPLS = ("lmforge", "lmforge-compiled", "lmforge-static", "hf", "hf-static")
"""lmforge: eager, dynamic KV cache (the default); lmforge-compiled: generate(compile=True), static cache +
torch.compile (CUDA graphs on GPU); lmforge-static: the static cache without compiling; hf: `generate` with its
default (dynamic) cache; hf-static: `generate` with cache_implementation="static", which `transformers` compiles on
GPU."""
GEN_MODELS = ("gpt2", "t5")  # the bench models that generate (a decoder, an encoder-decoder)
GIB = 2**30


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["gpt2"], choices=GEN_MODELS, help="default: gpt2")
    p.add_argument("--preset", help="lmforge preset to use instead of the model's default (one model only)")
    p.add_argument("--batch", nargs="+", type=int, default=[1, 32], help="batch sizes (default: 1 32)")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt (or source) tokens per row")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per row")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per variant (the median is reported)")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=["lmforge", "lmforge-compiled", "hf"])
    p.add_argument("--device", help="cuda (default when available) or cpu")
    p.add_argument("--dtype", choices=["bf16", "fp32"], help="weights' dtype: bf16 (default on cuda) or fp32 (cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompts")
    p.add_argument("--out", type=Path, help="results JSON (default: bench/results/<time>-<device>-generate.json)")
    args = p.parse_args(argv)
    if args.preset and len(args.models) > 1:
        p.error("--preset applies to one model; pass a single --models name")
    for name in ("prompt_len", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.batch) < 1:
        p.error("--batch sizes must be at least 1")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.device.type == "cuda" and not torch.cuda.is_available():
        p.error("CUDA is not available here; pass --device cpu")
    args.dtype = args.dtype or ("bf16" if args.device.type == "cuda" else "fp32")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hf_call(hf: nn.Module, x: Tensor, impl: str, args):
    import transformers

    # A fresh generation config: greedy, exactly new_tokens per row (no EOS), none of the model's defaults.
    gen = transformers.GenerationConfig(
        max_new_tokens=args.new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        pad_token_id=0,
        decoder_start_token_id=getattr(hf.config, "decoder_start_token_id", None),
        cache_implementation="static" if impl == "hf-static" else None,
    )
    mask = torch.ones_like(x)
    return lambda: hf.generate(input_ids=x, attention_mask=mask, generation_config=gen)


def _lmforge_call(model: nn.Module, x: Tensor, impl: str, args):
    n = args.new_tokens
    if impl == "lmforge-static":  # what generate(compile=True) runs, minus torch.compile

        def call() -> Tensor:
            steps = StaticSteps(decoding_steps(model, x), n, mode=None)
            return steps.output(sample(steps, max_new_tokens=n, temperature=0))

        return call
    return lambda: generate(model, x, max_new_tokens=n, temperature=0, compile=impl == "lmforge-compiled")


def measure(impl: str, ref: nn.Module, prompts: Tensor, args) -> tuple[dict, Tensor]:
    """Copy the reference model to the device, time its generate calls; (measurements, new tokens (B, n) on CPU)."""
    device, dtype = args.device, torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = copy.deepcopy(ref).to(device=device, dtype=dtype).eval()
    x = prompts.to(device)
    call = _hf_call(model, x, impl, args) if impl.startswith("hf") else _lmforge_call(model, x, impl, args)
    counters = torch._dynamo.utils.counters
    graphs, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        t0 = time.perf_counter()
        out = call()
        _sync(device)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = call()
            _sync(device)
            times.append(time.perf_counter() - t0)
    n = args.new_tokens
    if out.shape[1] < n:
        raise LMForgeError(f"{impl} generated {out.shape[1]} tokens per row, fewer than --new-tokens {n}")
    call_s = statistics.median(times)
    row = {
        "tokens_per_s": prompts.shape[0] * n / call_s,
        "call_s": call_s,
        "ms_per_token": 1e3 * call_s / n,
        "first_call_s": first,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
        # Compiled graphs (1 when nothing recompiled) and graphs that CUDA graphs skipped (0 when every step replays).
        "graphs_compiled": counters["stats"]["unique_graphs"] - graphs,
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"] - skips,
    }
    return row, out[:, -n:].cpu()


def agreement(new: Tensor, ref: Tensor) -> dict:
    """How far `new` (B, n) agrees with the reference tokens: all equal, rows equal, mean first differing index."""
    same = new == ref
    first_diff = torch.where(same.all(1), same.shape[1], (~same).int().argmax(1))  # (B,)
    return {
        "equal": bool(same.all()),
        "rows_equal": same.all(1).float().mean().item(),
        "first_diff": first_diff.float().mean().item(),
    }


def run_variant(name: str, impl: str, refs: dict, prompts: Tensor, args) -> tuple[dict, Tensor | None]:
    """One row of results; a failure (no HF twin, compile error, out of memory) becomes the row's `error`."""
    B = prompts.shape[0]
    row: dict = {"model": name, "preset": refs["lmforge"].config.name, "impl": impl, "batch": B}
    row |= {"prompt_len": prompts.shape[1], "new_tokens": args.new_tokens}
    label = f"{name} B={B} {impl}"
    ref = refs["hf" if impl.startswith("hf") else "lmforge"]
    if isinstance(ref, str):
        row["error"] = ref
        print(f"{label}: error: {ref}", flush=True)
        return row, None
    print(f"{label}: running", flush=True)
    try:
        measured, tokens = measure(impl, ref, prompts, args)
        row |= measured
        print(
            f"{label}: {row['tokens_per_s']:,.0f} tok/s, {row['ms_per_token']:.2f} ms/token, "
            f"first call {row['first_call_s']:.1f} s, {row['graphs_compiled']} graphs compiled, "
            f"{row['cudagraph_skips']} CUDA-graph skips",
            flush=True,
        )
        return row, tokens
    except Exception as e:  # noqa: BLE001 — one broken variant must not stop the others
        row["error"], row["traceback"] = one_line(e), traceback.format_exc()
        print(f"{label}: error: {row['error']}", flush=True)
        return row, None
    finally:
        free_memory(args.device)


def reference_models(name: str, args) -> dict[str, nn.Module | str]:
    """CPU fp32 models every variant copies: lmforge's and its HF twin (or why there is none)."""
    spec = BENCH_MODELS[name]
    cfg = require_available(name, spec, args.preset)
    if cfg.position == "learned" and args.prompt_len + args.new_tokens > cfg.max_seq_len:
        raise LMForgeError(
            f"--prompt-len + --new-tokens ({args.prompt_len + args.new_tokens}) exceeds preset '{cfg.name}' "
            f"max_seq_len {cfg.max_seq_len}"
        )
    torch.manual_seed(args.seed)
    ref = Transformer(cfg).eval()
    try:
        twin: nn.Module | str = spec.build_hf(ref).eval()
    except Exception as e:  # noqa: BLE001 — no converter, or a transformers version without the model
        twin = f"no Hugging Face twin for '{cfg.name}': {one_line(e)}"
    return {"lmforge": ref, "hf": twin}


def bench_model(name: str, args) -> list[dict]:
    """Every requested variant and batch size of one model; agreement with lmforge eager's tokens per row."""
    try:
        refs = reference_models(name, args)
    except LMForgeError as e:
        print(f"{name}: error: {e}", flush=True)
        return [{"model": name, "preset": args.preset or BENCH_MODELS[name].preset, "impl": None, "error": str(e)}]
    rows = []
    g = torch.Generator().manual_seed(args.seed)
    for B in args.batch:
        prompts = torch.randint(0, refs["lmforge"].config.vocab_size, (B, args.prompt_len), generator=g)
        order = ["lmforge"] + [i for i in args.impls if i != "lmforge"]  # the reference tokens first
        tokens: dict[str, Tensor | None] = {}
        for impl in order:
            row, tokens[impl] = run_variant(name, impl, refs, prompts, args)
            if impl in args.impls:
                rows.append(row)
        for row in rows[-len(args.impls) :]:
            ours, ref = tokens[row["impl"]], tokens["lmforge"]
            if row["impl"] != "lmforge" and ours is not None and ref is not None:
                row["vs_lmforge_eager"] = agreement(ours, ref)
    return rows


def speed_ratios(rows: list[dict]) -> list[dict]:
    """tokens/s of each variant ÷ HF generate's (dynamic cache) at the same model and batch size."""
    ok = {(r["model"], r["batch"], r["impl"]): r for r in rows if not r.get("error")}
    out = []
    for (model, batch, impl), r in ok.items():
        hf = ok.get((model, batch, "hf"))
        if hf is not None and impl != "hf":
            out.append({"model": model, "batch": batch, "impl": impl, "vs_hf": r["tokens_per_s"] / hf["tokens_per_s"]})
    return out


def markdown_table(results: dict) -> str:
    env = results["env"]
    ratio = {(r["model"], r["batch"], r["impl"]): r["vs_hf"] for r in results["ratios"]}
    lines = [
        f"{env['device_name']} · torch {env['torch']} · transformers {env['transformers']} · {env['dtype']} · greedy, "
        f"{env['prompt_len']}-token prompts → {env['new_tokens']} new tokens · median of {env['repeats']} calls",
        "",
        "| model | B | impl | tokens/s | ms/token | first call (s) | peak mem (GiB) | ÷ HF | = lmforge eager |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results["rows"]:
        head = f"| {r['model']} ({r['preset']}) | {r.get('batch', '')} | {r['impl'] or ''} |"
        if r.get("error"):
            lines.append(f"{head} error: {r['error'].replace('|', chr(92) + '|')} | | | | | |")
            continue
        rel = ratio.get((r["model"], r["batch"], r["impl"]))
        agree = r.get("vs_lmforge_eager")
        same = "" if agree is None else ("yes" if agree["equal"] else f"no (first diff @ {agree['first_diff']:.0f})")
        mem = "n/a" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.2f}"
        lines.append(
            f"{head} {r['tokens_per_s']:,.0f} | {r['ms_per_token']:.2f} | {r['first_call_s']:.1f} | {mem} | "
            f"{'' if rel is None else f'{rel:.2f}'} | {same} |"
        )
    return "\n".join(lines)


def environment(args) -> dict:
    import platform

    import transformers

    device = args.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    keys = ("dtype", "prompt_len", "new_tokens", "repeats", "seed")
    return {
        "device": device.type,
        "device_name": name,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        **{k: getattr(args, k) for k in keys},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()  # generation-config notes about unset EOS are noise here
    rows = [row for name in args.models for row in bench_model(name, args)]
    results = {"env": environment(args), "rows": rows, "ratios": speed_ratios(rows)}
    table = markdown_table(results)
    print("\n" + table)
    out = args.out
    if out is None:
        out = default_path(results["env"]["device_name"], os.environ.get("OUT"))
        out = out.with_name(f"{out.stem}-generate.json")
    path = write_results(results, table, out, None)
    print(f"\nwrote {path}")
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
