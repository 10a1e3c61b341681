"""Bench results: lmforge/HF ratios, the markdown table, and the JSON (+ markdown) files."""

from __future__ import annotations

import gc
import json
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def speed_ratios(rows: list[dict]) -> list[dict]:
    """lmforge ÷ HF tokens/s (above 1 = lmforge faster) and peak memory, per model and compile mode."""
    ok = {(r["model"], r["compile"], r["impl"]): r for r in rows if not r.get("error")}
    ratios = []
    for (model, compiled, impl), ours in ok.items():
        theirs = ok.get((model, compiled, "hf"))
        if impl != "lmforge" or theirs is None:
            continue
        mem = None
        if ours.get("peak_mem_gib") and theirs.get("peak_mem_gib"):
            mem = ours["peak_mem_gib"] / theirs["peak_mem_gib"]
        ratios.append(
            {
                "model": model,
                "compile": compiled,
                "tokens_per_s": ours["tokens_per_s"] / theirs["tokens_per_s"],
                "peak_mem": mem,
                "loss_step0_diff": abs(ours["loss_step0"] - theirs["loss_step0"]),
            }
        )
    return ratios


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def markdown_table(results: dict) -> str:
    """One row per variant; the lmforge row carries the lmforge/HF speed ratio."""
    env = results["env"]
    ratio = {(r["model"], r["compile"]): r["tokens_per_s"] for r in results["ratios"]}
    lines = [
        f"{env['device_name']} · torch {env['torch']} · transformers {env['transformers']} · {env['dtype']} · "
        f"{env['steps']} timed steps after {env['warmup']} warmup · compile mode {env.get('compile_mode', 'default')}",
        "",
        "| model | impl | compile | B×T | tokens/s | MFU | peak mem (GiB) | step (ms) | loss @ step 0 | lmforge/HF |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        compiled = {True: "on", False: "off", None: ""}[r["compile"]]
        shape = f"{r['batch']}×{r['seq_len']}" if "batch" in r else ""
        head = f"| {r['model']} ({r['preset']}) | {r['impl'] or ''} | {compiled} | {shape} |"
        if r.get("error"):
            err = r["error"].replace("|", "\\|")
            lines.append(f"{head} error: {err} | | | | | |")
            continue
        mfu = None if r["mfu"] is None else 100 * r["mfu"]
        rel = ratio.get((r["model"], r["compile"])) if r["impl"] == "lmforge" else None
        lines.append(
            f"{head} {r['tokens_per_s']:,.0f} | {_num(mfu, '.1f')}{'' if mfu is None else '%'} | "
            f"{_num(r['peak_mem_gib'], '.2f')} | {r['step_ms']:.1f} | {r['loss_step0']:.4f} | "
            f"{'' if rel is None else f'{rel:.3f}'} |"
        )
    return "\n".join(lines)


def default_path(device_name: str, out_env: str | None) -> Path:
    """`$OUT/<time>-<device>.json` when OUT is set, else `bench/results/<time>-<device>.json`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    return (Path(out_env) if out_env else RESULTS_DIR) / f"{stamp}-{slug}.json"


def write_results(results: dict, table: str, out: Path | None, out_env: str | None) -> Path:
    """Write the results JSON and, next to it, the markdown table (same name, .md)."""
    path = out or default_path(results["env"]["device_name"], out_env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
    return path


def free_memory(device) -> None:
    """Release the last variant's model, optimizer state and compiled graphs before the next one starts."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def one_line(e: BaseException) -> str:
    """An exception as one short line for a results row."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]
