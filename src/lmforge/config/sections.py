"""Config sections several kinds of run share — where it writes (`RunConfig`), how it optimises (`OptimConfig`), how
its loop runs (`LoopConfig`) and what model and tokenizer it starts from (`InitModel`) — defined once and embedded
in each schema (pretraining, fine-tuning, alignment, compression), so a key means the same everywhere and every
numeric value is range-checked when a recipe loads."""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from lmforge.config.types import Fraction, NonNegFloat, NonNegInt, OpenFraction, PosFloat, PosInt, Seed, UnitFraction


@dataclass
class RunConfig:
    dir: str = "runs/run"
    """Run directory: config.yaml, metrics.jsonl, checkpoints/, plots/."""
    seed: Seed = 0
    """Seeds weights, data order and every random choice of the run."""
    recipe: str | None = None
    """The recipe the run was made from (recorded; a resumed run continues with its own saved config)."""


@dataclass
class InitModel:
    """The keys of a run that starts from a model: fine-tuning and alignment (each kind's model section adds its
    own keys and its default `init`)."""

    init: str = "none"
    """The starting model: an lmforge run / checkpoint dir, a Hugging Face model dir, or a preset name (random
    init)."""
    tokenizer: str | None = None
    """Tokenizer dir/file or published name (gpt2) for a random init (None = train one on the run's texts) or when
    `init` has none."""
    vocab_size: PosInt = 2048
    """Vocabulary of a tokenizer trained for a random init."""


@dataclass
class OptimConfig:
    optimizer: Literal["adamw", "muon"] = "adamw"
    """adamw: AdamW on every parameter (decay on matrices only); muon: Muon (orthogonalised momentum, Jordan et
    al. 2024) on the blocks' weight matrices, AdamW on embeddings, heads, norms and biases."""
    lr: NonNegFloat = 6e-4
    """Peak learning rate (of AdamW's parameters when optimizer=muon)."""
    min_lr_ratio: Fraction = 0.1
    """Final learning rate as a fraction of lr."""
    schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    """After warmup: cosine or linear decay to min_lr_ratio·lr, constant, or wsd (warmup-stable-decay: constant,
    then a linear decay over the last decay_ratio of the steps)."""
    warmup_steps: NonNegInt = 100
    """Linear warmup steps (warmup_ratio, when set, replaces it)."""
    warmup_ratio: Fraction | None = None
    """Warmup as a fraction of the run's steps (GPT-1: 0.2%, BERT fine-tuning: 10%)."""
    decay_ratio: UnitFraction = 0.2
    """schedule=wsd: fraction of the steps in the final decay."""
    weight_decay: NonNegFloat = 0.1
    """Decoupled weight decay of weight matrices (not norms, biases or embeddings)."""
    beta1: OpenFraction = 0.9
    beta2: OpenFraction = 0.95
    eps: PosFloat = 1e-8
    grad_clip: NonNegFloat = 1.0
    """Clip the global gradient norm (0 = off)."""
    layer_decay: UnitFraction = 1.0
    """Layer-wise learning-rate decay (ELECTRA): block l of L learns at lr·decay^(L+1-l), embeddings least,
    heads at lr (1.0 = off)."""
    muon_lr: PosFloat = 0.02
    """optimizer=muon: learning rate of the orthogonalised updates of the blocks' matrices."""
    muon_momentum: OpenFraction = 0.95
    """optimizer=muon: Nesterov momentum of the matrix updates."""


@dataclass
class LoopConfig:
    max_steps: PosInt = 1000
    """Optimizer steps of the run (with time_budget: the most it may take)."""
    time_budget: PosFloat | None = None
    """Seconds of training (from the first step: compilation, steps and evaluations; not start-up, the final
    evaluation or save): the run measures its step time and plans its steps to end on the budget, its schedule
    (warmup, wsd decay, cosine) following the planned steps, replanned at each logged step until the decay begins."""
    batch_size: PosInt = 16
    """Examples (sequences) per device per micro-step."""
    grad_accum: PosInt = 1
    """Micro-steps accumulated into one optimizer step."""
    eval_every: PosInt = 200
    """Evaluate every this many steps (and at the end)."""
    save_every: PosInt = 500
    """Save a resumable checkpoint every this many steps (and at the end, and when stopped by a signal)."""
    keep_last: PosInt = 3
    """Checkpoints kept (older ones are deleted; one from before a non-finite streak always stays)."""
    log_every: PosInt = 10
    """Log (and read loss values back from the device) every this many steps."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto = bf16 autocast on GPUs that support it, fp32 on CPU."""
    compile: bool = False
    """torch.compile the model (see compile_scope)."""
    compile_scope: Literal["step", "blocks", "pointwise", "head"] = "step"
    """What compile compiles: step = the model with its loss as one graph (the fastest steps, the longest
    compilation: tens of seconds at GPT-2-small size on a GPU); blocks = each transformer block on its own (one
    graph shared by all blocks of a stack, so compilation costs about one block's) and the LM head with its loss,
    for training steps only; head = the LM head with its loss alone (a few seconds: for runs of a few hundred steps,
    where the vocabulary-sized elementwise work is what eager steps lose most to; a model without an LM head, such as
    a classifier, then compiles nothing); pointwise = head, plus small graphs for the blocks' chains of pointwise
    work (norms, QK-norm with rotary positions, the MLP), with attention and the projections between them eager.
    parallel=fsdp always compiles blocks (FSDP's hooks stay outside the graphs)."""
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile mode when compile is on; reduce-overhead replays CUDA graphs, for steps bound by kernel
    launches (small batches, many layers)."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism over torchrun's processes: ddp replicates the model on every GPU; fsdp (PyTorch FSDP2)
    shards parameters, gradients and optimizer state per transformer block (bf16 parameters, fp32 gradient
    reduction on GPUs under precision auto/bf16) and saves sharded checkpoints (torch.distributed.checkpoint)."""
    cpu_offload: bool = False
    """parallel=fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory (the optimizer
    steps on the CPU); fits larger models, trains slower."""
    activation_checkpointing: bool = False
    """Recompute transformer blocks' activations in the backward pass instead of storing them (see
    checkpoint_policy)."""
    checkpoint_policy: Literal["full", "selective"] = "full"
    """activation_checkpointing: full = recompute each block's whole forward (about one more forward pass of
    compute; one block input stored per layer); selective = keep the outputs of the matrix products and attention,
    recompute only the elementwise work (norms, activations, dropout masks, rotary): little extra compute, most of
    the memory of the elementwise intermediates saved."""
    checkpoint_every: PosInt = 1
    """activation_checkpointing: checkpoint every this many blocks (1 = all; 2 = every other block)."""
    float8: bool = False
    """Train the blocks' Linear layers in float8 (torchao's dynamic tensorwise scaling; Hopper-class GPUs, compute
    capability ≥ 8.9; `pip install 'lmforge[float8]'`). Under parallel=fsdp their weights are also all-gathered in
    float8."""
    ddp_bucket_mb: PosFloat = 25.0
    """parallel=ddp: gradient all-reduce bucket size in MiB (larger buckets: fewer, bigger all-reduces)."""
    ddp_split_graph: bool = False
    """parallel=ddp with compile: split the compiled step at the gradient buckets, so that each bucket's all-reduce
    overlaps the rest of the backward (torch's DDPOptimizer). Off: one graph, its all-reduces after the backward,
    which ran faster for GPT-2 124M on 2 H200s (docs/distributed.md); models with far more gradient bytes per
    token of compute may gain from the overlap."""
    fsdp_reshard: Literal["auto", "always", "never"] = "auto"
    """parallel=fsdp: free each block's gathered weights after its forward (always: least memory, one more
    all-gather per block in backward) or keep them until backward (never: like ZeRO-2). auto = never when the
    whole model's bf16 weights take under a tenth of a GPU's memory, else always."""
    fsdp_unit_blocks: NonNegInt = 1
    """parallel=fsdp: consecutive blocks of one stack that share an FSDP unit (one all-gather and one
    reduce-scatter for all of them). Fewer units mean fewer per-unit hooks on the host, which a small model's step
    can be bound by; larger units hold more gathered weights at a time and overlap less communication. 0 = no unit
    per block: the whole model is one unit, all-gathered once before the forward and reduce-scattered once after
    the backward (no overlap with compute), and train.compile compiles its forward whole, as under ddp: for small
    models, whose blocks are too short to hide per-unit hooks (docs/distributed.md)."""
    async_save: bool = False
    """parallel=fsdp: write checkpoints in a background thread once they are copied to CPU memory; training goes on
    meanwhile and a checkpoint appears (manifest last) when its files are on disk."""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK if a GPU is present, else cpu), cpu, cuda or cuda:N."""
    deterministic: bool = False
    """Deterministic algorithms (bitwise-reproducible CPU runs)."""
    max_nonfinite: PosInt = 5
    """Stop after this many consecutive steps with a non-finite loss or gradient (each one is skipped)."""
    spike_factor: NonNegFloat = 3.0
    """Warn and log when a step's loss exceeds this multiple of the median of the last spike_window losses
    (0 = off)."""
    spike_window: PosInt = 100
    prefetch: NonNegInt = 2
    """Batches built ahead of the step in a background thread or worker process, in pinned memory (0 = build each
    in the step)."""
    prefetch_worker: Literal["auto", "thread", "process"] = "auto"
    """Where batches are built ahead: process = a forked worker process, whose work never holds the training
    thread's GIL (a thread's masking or span corruption slows a loop bound by kernel launches); thread = a thread of
    the training process. auto = process for pretraining on a GPU, else thread. Fine-tuning, and pretraining with a
    sequence-length schedule under a time budget (its stages follow the loop's replanning), build in a thread."""
    log_to: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=list)
    """Extra metric sinks beside metrics.jsonl, each lmforge's extra of the same name: tensorboard (RUN/tensorboard),
    wandb (W&B's WANDB_* settings; WANDB_MODE=offline works without an account), mlflow (MLFLOW_TRACKING_URI, else
    the SQLite store RUN/mlflow.db)."""


def optim_defaults(**values: Any) -> Callable[[type], type]:
    """A run kind's own defaults for OptimConfig's keys, set under `@dataclass` (`@dataclass` then
    `@optim_defaults(lr=1e-4, ...)` on a `train` section that derives from OptimConfig): each key keeps its one
    declaration (type, range, docstring) in OptimConfig and the kind states its value only."""
    types = typing.get_type_hints(OptimConfig, include_extras=True)  # objects: the kind's module need not import them

    def apply(cls: type) -> type:
        unknown = sorted(set(values) - set(types))
        if unknown or not issubclass(cls, OptimConfig):
            raise TypeError(
                f"{cls.__name__}: optim_defaults takes OptimConfig keys of an OptimConfig section: {unknown}"
            )
        own = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in values.items():
            own[name] = types[name]  # a redefinition keeps the base field's place and type
            setattr(cls, name, value)
        cls.__annotations__ = own
        return cls

    return apply
