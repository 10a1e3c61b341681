"""Time to MLM loss: Hugging Face's RoBERTa-base (post-LN, lr 1e-4, B256 × T128, 1,200 steps, compiled), trained by
bench/train_parity.py's `hf` side in its own process, against `lmforge pretrain encoder-fast` (the recipe, or each
--fast-args variant), in its own process; both final models are scored on the same validation windows with the
same 15% masks (the roberta objective's fixed validation masks; their hash is checked equal). Wall times are whole
processes from an empty compilation cache.

From the repository root, on data prepared with a BART-family BPE (`lmforge tokenizer train --family bart`, then
`lmforge data prepare ... --tokenizer TOK`):

    PYTHONPATH=src python bench/encoder_ttl.py --data DIR --tokenizer TOK \\
        --fast-args "" --fast-args "--train.time_budget=60" --out results.json --work runs/encoder-ttl
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.append(str(_HERE.parent / "src"))

from train_e2e import _cli, _cold_cache, _rows  # noqa: E402
from train_parity import batch_hash, evaluate, family_config, shared_data, val_batches  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a prepared data dir (lmforge data prepare)")
    p.add_argument("--tokenizer", type=Path, required=True, help="the tokenizer dir the data was prepared with")
    p.add_argument("--steps", type=int, default=1200, help="steps of the Hugging Face run")
    p.add_argument("--hf-lr", type=float, default=1e-4)
    p.add_argument("--batch", type=int, default=256, help="sequences of 128 tokens per step (both runs)")
    p.add_argument("--hf-set", nargs="+", default=[], metavar="KEY=VALUE", help="more overrides of the HF run")
    p.add_argument("--eager", action="store_true", help="compile neither run (CPU smoke runs)")
    p.add_argument("--val-batches", type=int, default=20, help="validation batches (of 256 × 128) both are scored on")
    p.add_argument("--fast-args", type=shlex.split, action="append", help="encoder-fast overrides, one string each "
                   "(default: the recipe as it is)")  # fmt: skip
    p.add_argument("--skip-hf", type=Path, help="reuse this train_parity JSON instead of training the HF model")
    p.add_argument("--out", type=Path, help="results JSON (default: $OUT/encoder_ttl.json)")
    p.add_argument("--work", type=Path, default=Path("runs/encoder-ttl"))
    return p.parse_args(argv)


def parity_args(a: argparse.Namespace) -> list[str]:
    """train_parity.py's command line for RoBERTa-base at B256 × T128 on the prepared data."""
    vocab = json.loads((a.data / "meta.json").read_text())["vocab_size"]
    sets = [f"data.tokenizer={a.tokenizer}", f"data.vocab_size={vocab}", "model.preset=roberta-base",
            "model.n_layers=12", "train.seq_len=128", f"train.batch_size={a.batch}", f"train.lr={a.hf_lr}",
            *a.hf_set]  # fmt: skip
    return ["--family", "roberta", "--prepared", str(a.data), "--set", *sets, "--steps", str(a.steps),
            "--eval-every", str(a.steps), "--val-batches", str(a.val_batches), "--seeds", "0",
            *([] if a.eager else ["--compile"]), "--out", str(a.work / "hf")]  # fmt: skip


def hf_run(a: argparse.Namespace) -> dict:
    if a.skip_hf:
        rec = json.loads(a.skip_hf.read_text())
        return {"wall_s": rec["wall_s"], "val_loss": rec["val"][-1][1], "val_hash": rec["val_hash"], "reused": True}
    log = a.work / "hf.log"
    cmd = [sys.executable, str(_HERE / "train_parity.py"), "--impls", "hf", *parity_args(a)]
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_cold_cache(log)).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        raise RuntimeError(f"the Hugging Face run failed (exit {rc}); see {log}")
    rec = json.loads((a.work / "hf" / "roberta-hf-seed0.json").read_text())
    return {"wall_s": wall, "val_loss": rec["val"][-1][1], "val_hash": rec["val_hash"],
            "tokens_per_s": rec["tokens_per_s"], "model_class": rec["model_class"],
            "n_params": rec["n_params"]}  # fmt: skip


class Scorer:
    """The roberta objective's fixed validation batches of the HF run, scored for any lmforge run."""

    def __init__(self, a: argparse.Namespace) -> None:
        from train_parity import parse_args as parity_parse

        from lmforge.objectives import OBJECTIVES
        from lmforge.train.device import autocast_for

        ns = parity_parse(["--impls", "lmforge", *parity_args(a)])
        cfg = family_config("roberta", ns, 0)
        tokenizer, data_dir = shared_data(cfg, ns.out)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.objective = OBJECTIVES.get(cfg.objective.name)(cfg, tokenizer)
        self.val = val_batches(cfg, self.objective, data_dir, self.device)
        self.hash = batch_hash({f"{i}.{k}": v for i, b in enumerate(self.val) for k, v in b.items()})
        self.autocast = autocast_for(self.device, cfg.train.precision)

    def __call__(self, run: Path) -> float:
        from lmforge import load

        model, _ = load(run, device=self.device)
        loss, _ = evaluate(model, self.objective.loss, self.val, self.autocast)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return loss


def fast_run(a: argparse.Namespace, i: int, args: list[str], hf: dict, score: Scorer) -> dict:
    run = a.work / f"encoder-fast-{i}"
    over = [f"--data.prepared={a.data}", f"--data.tokenizer={a.tokenizer}", f"--run.dir={run}",
            f"--train.batch_size={a.batch}", f"--train.compile={not a.eager}", *args]  # fmt: skip
    log = a.work / f"encoder-fast-{i}.log"
    wall = _cli(["pretrain", "encoder-fast", *over], log, env=_cold_cache(log))
    evals = [r for r in _rows(run) if "val_loss" in r]
    rates = [r["tokens_per_s"] for r in _rows(run) if "tokens_per_s" in r][3:]
    val = score(run)
    return {"args": args, "wall_s": wall, "steps": evals[-1]["step"], "val_loss_own_eval": evals[-1]["val_loss"],
            "val_loss": val, "tokens_per_s": sorted(rates)[len(rates) // 2] if rates else None,
            "time_ratio": wall / hf["wall_s"], "reached": val <= hf["val_loss"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.work = a.work.resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    out = a.out or Path(os.environ.get("OUT", _HERE / "results")) / "encoder_ttl.json"
    results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                     "torch": torch.__version__, "data": str(a.data)}  # fmt: skip
    results["hf"] = hf = hf_run(a)
    print(json.dumps({"hf": hf}), flush=True)
    score = Scorer(a)
    if score.hash != hf["val_hash"]:
        raise SystemExit(f"validation batches differ from the HF run's ({score.hash} vs {hf['val_hash']})")
    results["encoder_fast"] = []
    for i, args in enumerate(a.fast_args or [[]]):
        row = fast_run(a, i, args, hf, score)
        print(json.dumps(row), flush=True)
        results["encoder_fast"].append(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
