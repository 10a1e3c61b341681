"""Training-curve parity: an lmforge model and its reference twin, each from its own init, trained on the same
batches with the same optimizer, schedule, precision and compile mode; validation loss of both on the same fixed
validation batches every N steps; a markdown table and one plot per family.

From the repository root (one process per family/impl/seed can run at once; they share the prepared data):

    PYTHONPATH=src python bench/train_parity.py --family gpt2 llama bert roberta electra t5 t5-v1_1 bart \\
        --prepare-only --out runs/parity                        # tokenizers + token shards, once
    PYTHONPATH=src python bench/train_parity.py --family gpt2 --impls lmforge hf nanogpt \\
        --nanogpt .peers/nanoGPT --steps 2000 --seeds 0 1 --out runs/parity [--compile] [--device cuda:0]
    PYTHONPATH=src python bench/train_parity.py --report runs/parity    # → runs/parity/report.md + parity-*.png

Families and their twins (`--impls`, default lmforge + hf): gpt2 (GPT2LMHeadModel; nanogpt: nanoGPT's `GPT` from
`--nanogpt PATH`), llama (LlamaForCausalLM), bert (BertForMaskedLM; the bert recipe with MLM alone, no NSP), roberta
(RobertaForMaskedLM), electra (ElectraForMaskedLM generator + ElectraForPreTraining discriminator, embeddings
shared), t5 (T5 v1.0, tied; T5ForConditionalGeneration), t5-v1_1 (untied, gated-GELU; nanot5: nanoT5's `MyT5` from
`--nanot5 PATH`), bart (BartForConditionalGeneration, text infilling + sentence permutation).

What is the same on both sides:
- config: the family's recipe through lmforge's config loader (`load_config(recipe, overrides)`), sized by
  `--size small` (default, ~20-40M parameters, seq 256, batch 32) or `tiny` (the recipe's test preset), then
  `--set key=value` overrides; the twin is built from that model config (`parity_refs.py`), never from its weights;
- batches: the objective's `transform` (masks, spans, corruptions) run once per step by lmforge's batch source,
  seeded from --seeds, so every impl of a seed sees identical batches (each JSON records a per-step hash);
  ELECTRA's generator samples draw on the global generator, re-seeded alike before every step;
- optimizer: lmforge's AdamW (`train/optim.py`: betas, eps, weight decay on matrices only, not embeddings, norms or
  biases), its schedule (warmup + the recipe's decay), gradient clipping as `train/loop.py` does it;
- precision: bf16 autocast on CUDA, fp32 on CPU (`train.precision`); `--compile` wraps each side's model and loss
  in torch.compile;
- validation: `--val-batches` batches of the val split through the objective's `eval_transform` (fixed masks) when
  it has one, token-weighted mean loss, every `--eval-every` steps and at the end.

Outputs: OUT/<family>-<impl>-seed<seed>.json (val curve and the loss's own metrics at each evaluation, e.g.
ELECTRA's disc_loss and disc_acc; per-step train loss and batch hash, wall time, tokens/s, parameter count,
environment). The loss on both sides is the objective's: see parity_refs.py for each reference.
nanoT5: only its model file is imported (the package needs hydra, accelerate, datasets and neptune), with lmforge's
optimizer instead of nanoT5's AdamWScale, as for every other twin. That file is written against transformers 4.x
(its T5Stack calls `ModuleUtilsMixin.get_extended_attention_mask`, gone in 5.x), so with transformers 5.x
`--impls nanot5` stops with that reason; the t5-v1_1 family then runs against T5ForConditionalGeneration only."""

from __future__ import annotations

import argparse
import copy
import fcntl
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.append(str(_HERE.parent / "src"))

from parity_refs import n_weights, reference  # noqa: E402

from lmforge.errors import LMForgeError  # noqa: E402
from lmforge.eval.plateau import plateau  # noqa: E402
from lmforge.pretraining.config import Config, load_config, to_dict  # noqa: E402

IMPLS = ("lmforge", "hf", "nanogpt", "nanot5")
NOISE_SEED = 0x7A1B  # global-generator seed of step s (plus s): ELECTRA's samples and dropout, alike on both sides
EVAL_NOISE_SEED = 0xE7A1


@dataclass(frozen=True)
class Family:
    recipe: str
    refs: tuple[str, ...]
    tiny: str
    """Preset of --size tiny (test size: 2 layers, d_model 64)."""
    small: dict = field(default_factory=dict)
    """Overrides of --size small (~20-40M parameters, with seq 256, batch 32 and an 8192-token vocabulary)."""
    common: dict = field(default_factory=dict)
    """Overrides at every size (what makes the recipe comparable with the twin)."""


_W512 = {"model.d_model": 512, "model.n_heads": 8, "model.d_ff": 2048}
_ENC_DEC4 = {"model.n_layers": 4, "model.n_decoder_layers": 4}
FAMILIES: dict[str, Family] = {
    "gpt2": Family("gpt", ("hf", "nanogpt"), "gpt-tiny", {"model.preset": "gpt-small", "model.n_layers": 6}),
    "llama": Family("gpt", ("hf",), "llama-tiny", {"model.preset": "llama-60m", "model.n_layers": 6}),
    # BERT's recipe also trains NSP; parity compares the MLM alone (BertForMaskedLM has no pooler/NSP head).
    "bert": Family(
        "bert",
        ("hf",),
        "bert-tiny",
        {"model.preset": "bert-base", **_W512, "model.n_layers": 6},
        {"objective.name": "mlm", "model.pooler": False, "model.nsp_head": False},
    ),  # fmt: skip
    "roberta": Family("roberta", ("hf",), "roberta-tiny", {"model.preset": "roberta-small", "model.n_layers": 6}),
    "electra": Family("electra", ("hf",), "electra-tiny", {"model.preset": "electra-small"}),
    "t5": Family("t5", ("hf",), "t5-tiny", {"model.preset": "t5-small", **_ENC_DEC4}),
    "t5-v1_1": Family("t5", ("hf", "nanot5"), "t5-v1_1-tiny", {"model.preset": "t5-v1_1-small", **_ENC_DEC4}),
    "bart": Family("bart", ("hf",), "bart-tiny", {"model.preset": "bart-base", **_W512, **_ENC_DEC4}),
}
SMALL = {"train.seq_len": 256, "train.batch_size": 32, "data.vocab_size": 8192}


# --- configuration and data -------------------------------------------------------------------------------------------


def parse_sets(items: list[str]) -> dict:
    """--set key=value pairs → {dotted key: YAML-parsed value}."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LMForgeError(f"--set expects key=value, got '{item}'")
        out[key.removeprefix("--")] = yaml.safe_load(value) if value else ""
    return out


def family_config(name: str, args: argparse.Namespace, seed: int) -> Config:
    """The lmforge Config `lmforge pretrain RECIPE --key=value ...` would run for this family, size and seed."""
    fam = FAMILIES[name]
    size = {**fam.small, **SMALL} if args.size == "small" else {"model.preset": fam.tiny}
    over = {**fam.common, **size}
    over |= {"train.max_steps": args.steps, "train.eval_every": args.eval_every, "train.eval_batches": args.val_batches,
             "run.seed": seed, "train.compile": args.compile, "train.device": args.device}  # fmt: skip
    if args.data_inputs:
        over["data.inputs"] = list(args.data_inputs)
    if args.prepared:
        over["data.prepared"] = str(args.prepared)
    over |= parse_sets(args.set)
    tree: dict = {}
    for key, value in over.items():
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return load_config(fam.recipe, tree)


def data_key(cfg: Config) -> str:
    """Name of the shared data dir: what the tokenizer and the token shards depend on (not the run's seed)."""
    from lmforge.tokenizers.specials import FAMILY_BY_ARCH

    d = cfg.data
    family = d.tokenizer_family or FAMILY_BY_ARCH[cfg.model.arch]
    what = {"inputs": d.inputs, "kind": d.tokenizer_kind, "family": family, "vocab": d.vocab_size,
            "val_fraction": d.val_fraction, "clean": d.clean}  # fmt: skip
    digest = hashlib.sha1(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
    return f"{what['family']}-{d.tokenizer_kind}-{d.vocab_size}-{digest}"


def shared_data(cfg: Config, out: Path):
    """(tokenizer, prepared dir) for cfg, prepared once under OUT/data/<key> (a file lock serialises processes that
    start together) with the data split of seed 0 whatever the run's seed, so every seed validates alike."""
    from lmforge.pretraining.setup import check_inputs, check_vocab, load_or_train_tokenizer, prepare_data
    from lmforge.train.distributed import DistInfo

    check_inputs(cfg)
    data_cfg = copy.deepcopy(cfg)
    data_cfg.run.seed = 0
    root = out / "data" / data_key(cfg)
    root.mkdir(parents=True, exist_ok=True)
    with open(root.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tokenizer = load_or_train_tokenizer(data_cfg, root, DistInfo())
        check_vocab(cfg, tokenizer)
        data_dir = prepare_data(data_cfg, root, tokenizer, DistInfo())
    return tokenizer, data_dir


# --- batches ----------------------------------------------------------------------------------------------------------


def batch_hash(batch: dict[str, torch.Tensor]) -> str:
    """16 hex digits identifying a batch's tensors (names, dtypes, shapes and values)."""
    h = hashlib.blake2b(digest_size=8)
    for key in sorted(batch):
        t = batch[key].detach().cpu().contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class Repeat:
    """One batch over and over (--overfit: a tiny repeated batch both sides should drive down)."""

    def __init__(self, source) -> None:
        self.batch = next(source)

    def __next__(self):
        return self.batch


def train_batches(cfg: Config, objective, data_dir: Path, overfit: bool):
    """The batch source `lmforge pretrain` trains on (one process, rank 0), drawn on a prefetch thread."""
    from lmforge.pretraining.run import ObjectiveBatches
    from lmforge.train.distributed import rank_seed
    from lmforge.train.prefetch import Prefetcher

    loader = objective.make_loader(data_dir, "train")
    source = ObjectiveBatches(loader, objective.transform, rank_seed(cfg.run.seed, 0) + 0x0B1E)
    if overfit:
        return Repeat(source)
    return Prefetcher(source, cfg.train.prefetch)


def val_batches(cfg: Config, objective, data_dir: Path, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The fixed validation batches of Pretraining.evaluate (eval_transform: static masks / fixed noise)."""
    transform = getattr(objective, "eval_transform", objective.transform)
    loader = objective.make_loader(data_dir, "val")
    out = [transform(tokens) for tokens in loader.eval_batches(cfg.train.eval_batches)]
    if not out:
        raise LMForgeError(f"the validation split of {data_dir} holds no batch of {cfg.train.seq_len} tokens")
    return [{k: v.to(device) for k, v in b.items()} for b in out]


# --- models -----------------------------------------------------------------------------------------------------------


def build(impl: str, cfg: Config, objective, device: torch.device, checkouts: dict) -> tuple:
    """(model on device, loss fn, class name) of one implementation, initialised under torch seed run.seed."""
    torch.manual_seed(cfg.run.seed)
    if impl == "lmforge":
        with device:  # as Pretraining builds it: initialised where it trains
            model = objective.build_model(cfg.model).to(device)
        return model, objective.loss, type(model).__name__
    model, loss_fn, name = reference(impl, objective, cfg.model, checkouts)
    return model.to(device), loss_fn, name


def init_stats(model: torch.nn.Module) -> dict:
    """Trained parameters and all weights (shared tensors once), global parameter norm, hash of the initial weights."""
    h = hashlib.blake2b(digest_size=8)
    sq, n = 0.0, 0
    for p in model.parameters():
        t = p.detach().float().cpu()
        h.update(t.numpy().tobytes())
        sq += float(t.pow(2).sum())
        n += t.numel()
    return {"n_params": n, "n_weights": n_weights(model), "param_norm": sq**0.5, "init_hash": h.hexdigest()}


# --- training ---------------------------------------------------------------------------------------------------------


def evaluate(model, loss_fn, batches, autocast) -> tuple[float, dict[str, float]]:
    """Token-weighted mean validation loss (as Pretraining.evaluate), noise fixed per batch, and the same means of the
    loss's own metrics (ELECTRA's disc_loss, disc_acc, replaced_frac, ...) where both sides report them."""
    model.eval()
    total, n, metrics = 0.0, 0, {}
    with torch.no_grad(), autocast:
        for i, batch in enumerate(batches):
            torch.manual_seed(EVAL_NOISE_SEED + i)
            out = loss_fn(model, batch)
            k = int(out.n_tokens)
            total += float(out.loss) * k
            n += k
            for name, value in out.metrics.items():
                metrics[name] = metrics.get(name, 0.0) + float(value) * k
    model.train()
    return total / max(n, 1), {name: v / max(n, 1) for name, v in metrics.items()}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, loss_fn, cfg: Config, batches, val, device: torch.device) -> dict:
    """train.max_steps steps of the lmforge loop's update (train/loop.py: autocast, backward, global grad norm,
    clipping and non-finite skip inside the fused AdamW step, schedule), evaluating every train.eval_every."""
    from lmforge.train.device import autocast_for
    from lmforge.train.loop import LossStep
    from lmforge.train.optim import Schedule, build_optimizer
    from lmforge.train.parallel import clip_scale, grad_norm

    t = cfg.train
    step_fn = LossStep(model, loss_fn)
    if t.compile:
        step_fn = torch.compile(step_fn, mode=t.compile_mode)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, t, device)
    schedule = Schedule(optimizer, t, t.max_steps)
    autocast = autocast_for(device, t.precision)
    if device.type == "cuda":  # as the lmforge loop: float32 matmuls outside autocast on TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model.train()
    loss0, metrics0 = evaluate(model, loss_fn, val, autocast)
    rec = {"val": [[0, loss0]], "val_metrics": [[0, metrics0]], "train_loss": [], "grad_norm": [], "batch_hash": [],
           "skipped_steps": 0}  # fmt: skip
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    train_s, first_step_s = 0.0, None
    sync(device)
    start = time.perf_counter()
    for step in range(1, t.max_steps + 1):
        batch = next(batches)
        rec["batch_hash"].append(batch_hash(batch.data))
        data = {k: v.to(device, non_blocking=True) for k, v in batch.data.items()}
        torch.manual_seed(NOISE_SEED + step)
        with autocast:
            loss, _ = step_fn(data)
        loss.backward()
        gnorm = grad_norm(params, device)
        bad = (~(torch.isfinite(loss) & torch.isfinite(gnorm))).float()
        optimizer.step(found_inf=bad, grad_scale=clip_scale(gnorm, t.grad_clip))
        optimizer.zero_grad()
        schedule.step()
        pending.append((loss.detach().float(), gnorm.detach().float(), bad))
        if step == 1:
            sync(device)
            first_step_s = time.perf_counter() - start
        if step % t.eval_every == 0 or step == t.max_steps:
            sync(device)
            train_s += time.perf_counter() - start
            losses, norms, bads = (torch.stack(x).tolist() for x in zip(*pending))
            pending.clear()
            rec["train_loss"] += losses
            rec["grad_norm"] += norms
            rec["skipped_steps"] += int(sum(bads))
            val_loss, val_metrics = evaluate(model, loss_fn, val, autocast)
            rec["val"].append([step, val_loss])
            rec["val_metrics"].append([step, val_metrics])
            shown = "".join(f"  {k} {v:.4f}" for k, v in val_metrics.items())
            print(f"  step {step}: train {losses[-1]:.4f}  val {val_loss:.4f}{shown}", file=sys.stderr, flush=True)
            sync(device)
            start = time.perf_counter()
    tokens = t.batch_size * t.seq_len
    steady = train_s - (first_step_s or 0.0)  # the first step compiles (and warms up) on its own
    rate = tokens * (t.max_steps - 1) / steady if t.max_steps > 1 and steady > 0 else None
    rec |= {"train_s": train_s, "first_step_s": first_step_s, "tokens_per_s": rate}
    return rec


def environment(device: torch.device) -> dict:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": str(device), "device_name": name}  # fmt: skip


def prepare(family: str, args: argparse.Namespace) -> str:
    """Prepare one family's tokenizer and data; a line naming them and the unigram plateau of its validation."""
    from lmforge.objectives import OBJECTIVES

    cfg = family_config(family, args, args.seeds[0])
    tokenizer, data_dir = shared_data(cfg, args.out)
    val = val_batches(cfg, OBJECTIVES.get(cfg.objective.name)(cfg, tokenizer), data_dir, torch.device("cpu"))
    return f"{family}: data in {data_dir}; unigram plateau of its validation {plateau(val, tokenizer, data_dir):.4f}"


def run_one(family: str, impl: str, seed: int, args: argparse.Namespace) -> Path:
    """Train one (family, impl, seed) and write OUT/<family>-<impl>-seed<seed>.json."""
    from lmforge.objectives import OBJECTIVES
    from lmforge.train.device import pick_device
    from lmforge.train.distributed import DistInfo

    began = time.perf_counter()
    cfg = family_config(family, args, seed)
    device = pick_device(cfg.train.device, DistInfo())
    tokenizer, data_dir = shared_data(cfg, args.out)
    objective = OBJECTIVES.get(cfg.objective.name)(cfg, tokenizer)
    checkouts = {"nanogpt": args.nanogpt, "nanot5": args.nanot5}
    model, loss_fn, cls = build(impl, cfg, objective, device, checkouts)
    stats = init_stats(model)
    print(f"{family} {impl} seed {seed}: {cls}, {stats['n_params'] / 1e6:.2f}M parameters, {device}", file=sys.stderr)
    val = val_batches(cfg, objective, data_dir, device)
    floor = plateau(val, tokenizer, data_dir)
    batches = train_batches(cfg, objective, data_dir, args.overfit)
    try:
        rec = train(model, loss_fn, cfg, batches, val, device)
    finally:
        if hasattr(batches, "close"):
            batches.close()
    result = {"family": family, "impl": impl, "seed": seed, "model_class": cls, **stats, **rec,
              "plateau": floor,
              "val_hash": batch_hash({f"{i}.{k}": v for i, b in enumerate(val) for k, v in b.items()}),
              "wall_s": time.perf_counter() - began, "compile": cfg.train.compile, "precision": cfg.train.precision,
              "overfit": args.overfit, "data_dir": str(data_dir), "env": environment(device),
              "config": to_dict(cfg)}  # fmt: skip
    path = args.out / f"{family}-{impl}-seed{seed}.json"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# --- command line -----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", nargs="+", choices=sorted(FAMILIES), help="families to run (or prepare)")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=["lmforge", "hf"])
    p.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout (impl nanogpt imports its model.py)")
    p.add_argument("--nanot5", type=Path, help="a nanoT5 checkout (impl nanot5 imports nanoT5/utils/t5_model.py)")
    p.add_argument("--data-inputs", nargs="+", metavar="FILE", help="text files/dirs (default: the bundled corpus)")
    p.add_argument("--prepared", type=Path, help="a dir made by `lmforge data prepare` (its tokenizer comes along)")
    p.add_argument(
        "--size",
        choices=("small", "tiny"),
        default="small",
        help="small: ~20-40M parameters, seq 256, batch 32; tiny: the recipe's test preset",
    )
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="lmforge config overrides on top, e.g. model.d_model=384 train.lr=5e-4",
    )
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--val-batches", type=int, default=20)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--out", type=Path, default=Path("runs/parity"))
    p.add_argument("--compile", action="store_true", help="torch.compile both sides (model + loss)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--overfit", action="store_true", help="train on the first batch over and over (sanity check)")
    p.add_argument("--prepare-only", action="store_true", help="prepare the families' tokenizers and data, then stop")
    p.add_argument("--report", type=Path, metavar="DIR", help="merge DIR's JSONs into DIR/report.md + plots")
    args = p.parse_args(argv)
    if args.report is None and not args.family:
        p.error("give --family (to train or --prepare-only) or --report DIR")
    for name in ("steps", "eval_every", "val_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.report is not None:
            from parity_report import write_report

            print(write_report(args.report))
            return 0
        for path in (args.nanogpt, args.nanot5, args.prepared):
            if path is not None and not path.exists():
                raise LMForgeError(f"{path} does not exist")
        args.out.mkdir(parents=True, exist_ok=True)
        for family in args.family:
            if args.prepare_only:
                print(prepare(family, args), file=sys.stderr)
                continue
            wrong = [i for i in args.impls if i != "lmforge" and i not in FAMILIES[family].refs]
            if wrong:
                raise LMForgeError(f"family {family} has no reference '{wrong[0]}' (its references: "
                                   f"{', '.join(FAMILIES[family].refs)})")  # fmt: skip
            for seed in args.seeds:
                for impl in args.impls:
                    print(run_one(family, impl, seed, args))
    except LMForgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
