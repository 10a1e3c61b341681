"""Parallelism applied to a built model: DDP, or FSDP2 (`torch.distributed.fsdp.fully_shard`) per transformer block
and on the root, with activation checkpointing and torch.compile per block. Models know nothing of it.

Under fsdp every parameter becomes a DTensor sharded over the ranks (dim 0): each rank holds 1/N of the weights,
gradients and optimizer state, all-gathers a block's weights just before its forward (and backward) and
reduce-scatters its gradients right after. The root unit holds what lies outside the blocks (embeddings, LM head,
norms, task heads); it stays unsharded after forward, so objectives may call its head (`model.logits`) after the
model's forward. Blocks that run more than once per forward (ALBERT's shared block), whose parameters another block
shares (T5's shared encoder-decoder) or that are driven sublayer by sublayer (Transformer-XL / XLNet recurrence)
belong to the root unit, as every block does under fsdp_unit_blocks=0. On GPUs under precision auto/bf16,
parameters are all-gathered in bf16 and gradients reduced in fp32 (MixedPrecisionPolicy); on CPUs (gloo) everything
stays fp32."""

from __future__ import annotations

import atexit
import importlib.util
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from functools import cache, wraps
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from lmforge.adapt.inject import transformers_in
from lmforge.checkpoint.tensors import is_dtensor, local
from lmforge.config.sections import LoopConfig
from lmforge.errors import LMForgeError
from lmforge.models.layers import Block
from lmforge.models.stack import Stack
from lmforge.train.distributed import DistInfo


def check_parallel(cfg: LoopConfig) -> None:
    """Refuse settings that only mean something under parallel=fsdp, or that it cannot run."""
    for key in ("cpu_offload", "async_save"):
        if getattr(cfg, key, False) and cfg.parallel != "fsdp":
            raise LMForgeError(f"train.{key} needs train.parallel=fsdp (it is {cfg.parallel})")
    if cfg.fsdp_unit_blocks != 1 and cfg.parallel != "fsdp":
        raise LMForgeError(f"train.fsdp_unit_blocks needs train.parallel=fsdp (it is {cfg.parallel})")
    if cfg.parallel == "fsdp" and cfg.compile and cfg.compile_mode == "reduce-overhead":
        # CUDA graphs replay fixed addresses; FSDP gathers each block's weights into freshly allocated memory.
        raise LMForgeError("train.compile_mode=reduce-overhead (CUDA graphs) does not work with train.parallel=fsdp")


def parallelize(model: nn.Module, cfg: LoopConfig, dist_info: DistInfo, device: torch.device) -> nn.Module:
    """Apply activation checkpointing, compile and DDP or FSDP to `model` → the module the loop calls.

    With cfg.compile, regions are compiled here under fsdp or compile_scope=blocks|pointwise|head; otherwise the
    loop compiles the model together with its loss. fsdp shards `model` in place (the returned module is `model`
    itself); ddp wraps it. Build the optimizer afterwards: under fsdp its parameters are the shards."""
    check_parallel(cfg)
    if cfg.compile and dist_info.is_main and not bytecode_cached():
        print(
            "warning: torch's bytecode is not cached here (no .pyc files, and PYTHONDONTWRITEBYTECODE), so every "
            "process compiles torch's compiler sources again before its first graph (~8 s on a GPU host); on short "
            "runs train.compile_scope=head compiles least",
            file=sys.stderr,
        )
    blocks = all_blocks(model)
    if cfg.float8:  # before compile and sharding: both must see the float8 Linear layers
        from lmforge.train.float8 import to_float8

        to_float8(model, cfg, device)
    if cfg.activation_checkpointing:
        for block in blocks[:: cfg.checkpoint_every]:
            _checkpoint_forward(block, cfg.checkpoint_policy)
    if cfg.compile and compiles_regions(cfg):
        compile_regions(model, blocks, cfg)
    if cfg.parallel == "fsdp":
        shard(model, cfg, dist_info, device)
        return model
    if dist_info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        # Gradients live in the all-reduce buckets themselves (no copy in and out of them each step).
        model = DistributedDataParallel(
            model, device_ids=ids, bucket_cap_mb=cfg.ddp_bucket_mb, gradient_as_bucket_view=True
        )
        import torch._dynamo

        torch._dynamo.config.optimize_ddp = cfg.ddp_split_graph
    return model


def bytecode_cached(module: str = "torch._inductor.compile_fx") -> bool:
    """Whether `module`'s bytecode is on disk (an installation's .pyc, or sys.pycache_prefix's), or this process
    may write it for the next. Without either, every process compiles torch's compiler from its sources again."""
    cached = importlib.util.find_spec(module).cached
    return cached is not None and (os.path.exists(cached) or not sys.dont_write_bytecode)


def compiles_regions(cfg: LoopConfig) -> bool:
    """Whether train.compile compiles regions of the model here (else the loop compiles the model with its loss)."""
    return cfg.parallel == "fsdp" or cfg.compile_scope in ("blocks", "pointwise", "head")


def compile_regions(model: nn.Module, blocks: list[nn.Module], cfg: LoopConfig) -> None:
    """Compile each block's forward under compile_scope=blocks or fsdp (blocks of one shape share one graph:
    Dynamo caches on the code of Block.forward, with the parameters as inputs; FSDP's hooks stay outside it), the
    model's whole forward under fsdp with fsdp_unit_blocks=0 (its one unit's hooks run around it), or
    its pointwise chains under compile_scope=pointwise (`_compile_pointwise`), and the LM head with
    its cross-entropy (`lm_loss`: logits over the whole vocabulary, most of a large-vocabulary model's elementwise
    work; under fsdp it runs after the root unit's forward, on its gathered weights). The regions are compiled for
    training steps only: evaluation and generation, under no_grad, run them eager rather than compiling a second
    set of graphs."""
    if cfg.parallel == "fsdp" and cfg.fsdp_unit_blocks == 0:  # one unit: its hooks run around the whole forward
        for m in transformers_in(model):
            m.forward = _compiled_with_grad(m.forward, cfg.compile_mode)
    elif cfg.parallel == "fsdp" or cfg.compile_scope == "blocks":
        for block in blocks:
            block.forward = _compiled_with_grad(block.forward, cfg.compile_mode)
    elif cfg.compile_scope == "pointwise":
        for block in blocks:
            _compile_pointwise(block, cfg.compile_mode)
    if hasattr(model, "lm_loss"):
        model.lm_loss = _compiled_with_grad(model.lm_loss, cfg.compile_mode)


def _compile_pointwise(block: Block, mode: str) -> None:
    """The block's chains of pointwise work, each a small graph that all blocks of one shape share: its norms,
    QK-norm with rotary positions, and the MLP (its two matmuls stay library calls; the activation fuses between
    them). The matmuls and attention in between run eager."""
    for name in ("norm1", "norm2", "norm_cross", "mlp"):
        if hasattr(block, name):
            module = getattr(block, name)
            module.forward = _compiled_with_grad(module.forward, mode)
    if block.attn.transforms_qk:
        block.attn.qk_transform = _compiled_with_grad(block.attn.qk_transform, mode)


def _compiled_with_grad(fn, mode: str):
    compiled = torch.compile(fn, mode=mode)

    @wraps(fn)
    def call(*args, **kwargs):
        return (compiled if torch.is_grad_enabled() else fn)(*args, **kwargs)

    return call


def all_blocks(model: nn.Module) -> list[nn.Module]:
    """Every transformer block of `model` (stacks, multi-token-prediction heads), once each."""
    return [m for m in model.modules() if isinstance(m, Block)]


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The blocks that get an FSDP unit of their own (see the module docstring for those that do not)."""
    own: set[int] = set()
    for stack in (m for m in model.modules() if isinstance(m, Stack)):
        if stack.cfg.share_layers or stack.cfg.position_scheme.recurrent:
            own |= {id(b) for b in stack.blocks}
    blocks = [b for b in all_blocks(model) if id(b) not in own]
    holders: dict[int, int] = {}
    for b in blocks:
        for p in b.parameters():
            holders[id(p)] = holders.get(id(p), 0) + 1
    return [b for b in blocks if all(holders[id(p)] == 1 for p in b.parameters())]


def _checkpoint_forward(block: nn.Module, policy: str = "full") -> None:
    """Recompute `block`'s forward in backward (non-reentrant checkpointing); hooks and parameter names stay.
    policy=selective keeps what the matrix products and attention computed (see `_keep_costly`)."""
    forward = block.forward
    options: dict[str, Any] = {}
    if policy == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        options["context_fn"] = lambda: create_selective_checkpoint_contexts(_keep_costly)

    @wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)

    block.forward = checkpointed


@cache
def _costly_ops() -> frozenset:
    aten = torch.ops.aten
    names = ["mm", "addmm", "bmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_flash_attention_forward", "_efficient_attention_forward"]  # fmt: skip
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


def _keep_costly(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    """Selective checkpointing: store the outputs of matrix products and attention, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _costly_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def shard(model: nn.Module, cfg: LoopConfig, dist_info: DistInfo, device: torch.device) -> None:
    """fully_shard each block unit, then the root, over all ranks (rank 0's initial weights on every rank). A model
    still on the CPU moves to `device` unit by unit as it is sharded."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    ensure_process_group(device)
    _same_start(model, dist_info, device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = MixedPrecisionPolicy()
    if device.type == "cuda" and cfg.precision != "fp32" and torch.cuda.is_bf16_supported():
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
    groups = unit_groups(model, cfg.fsdp_unit_blocks)
    keep = keeps_gathered(cfg, mesh.size())
    reshard = reshards_after_forward(model, cfg, device) and not keep
    for i, group in enumerate(groups):
        # The last unit's weights are needed again first in backward: keeping them saves one all-gather.
        last = i == len(groups) - 1
        fully_shard(group if len(group) > 1 else group[0], mesh=mesh, reshard_after_forward=reshard and not last,
                    mp_policy=mp, offload_policy=offload)  # fmt: skip
    fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp, offload_policy=offload)
    if keep:
        model.register_forward_pre_hook(_Regather(model), prepend=True)
    # Each unit's all-gather is issued while the unit before it (forward) or after it (backward) computes, rather
    # than when the unit's own hooks run (the modules of one unit share its state).
    heads = [group[0] for group in groups]
    for before, after in zip(heads, heads[1:]):
        before.set_modules_to_forward_prefetch([after])
        after.set_modules_to_backward_prefetch([before])


def unit_groups(model: nn.Module, per_unit: int) -> list[list[nn.Module]]:
    """`shard_units` in runs of up to `per_unit` consecutive blocks of one stack, each run one FSDP unit (none for
    per_unit=0: the root unit holds the whole model)."""
    if per_unit == 0:
        return []
    stack_of = {id(b): id(s) for s in model.modules() if isinstance(s, Stack) for b in s.blocks}
    groups: list[list[nn.Module]] = []
    for unit in shard_units(model):
        last, stack = (groups[-1] if groups else None), stack_of.get(id(unit))
        if last and len(last) < per_unit and stack is not None and stack == stack_of.get(id(last[0])):
            last.append(unit)
        else:
            groups.append([unit])
    return groups


def keeps_gathered(cfg: LoopConfig, world_size: int) -> bool:
    """Whether the units are gathered by `_Regather` rather than by FSDP, and kept gathered from forward to
    backward: on one process, where a "shard" is the whole tensor and FSDP's gather is, per parameter, a cast into
    a new tensor and a copy of it (two kernels and tens of microseconds of host work each, per step). Not under
    fsdp_reshard=always (least memory: each unit's bf16 copy is freed after its forward), with float8 weights
    (torchao gathers those itself) or with cpu_offload (the shards live on the CPU)."""
    if world_size != 1 or cfg.fsdp_reshard == "always" or cfg.float8 or cfg.cpu_offload:
        return False
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    # torch's own classes, not its public API: where a release lacks what `_Regather` calls, FSDP gathers itself.
    return all(hasattr(FSDPParamGroup, a) for a in ("_to_unsharded", "is_sharded", "is_unsharded")) and all(
        hasattr(FSDPParam, a) for a in ("alloc_all_gather_outputs", "unsharded_param")
    )


class _Regather:
    """Forward pre-hook of the root unit under `keeps_gathered`: gathers every sharded unit before FSDP's hooks
    would, with one multi-tensor copy (and cast to the compute dtype) of all shards into the units' unsharded
    parameters, whose memory FSDP allocated at its first gather and frees after each backward. FSDP's hooks then
    find the units gathered and do nothing; between steps the modules hold the sharded parameters as before. The
    first forward is gathered by FSDP itself (it creates the unsharded parameters); a unit still gathered from
    an earlier forward (under no_grad, no backward frees it) is used as it is, as FSDP does."""

    def __init__(self, model: nn.Module) -> None:
        self.groups = _param_groups(model)

    @torch.no_grad()
    def __call__(self, module: nn.Module, args: Any) -> None:
        ready = [g for g in self.groups if g.is_sharded and all(hasattr(p, "_unsharded_param") for p in g.fsdp_params)]
        params = [fp for g in ready for fp in g.fsdp_params]
        if not params:
            return
        for fp in params:
            fp.alloc_all_gather_outputs()  # the memory FSDP freed after the last backward
        torch._foreach_copy_([fp.unsharded_param for fp in params], [fp.sharded_param._local_tensor for fp in params])
        for g in ready:
            g._to_unsharded()  # the gathered parameters into the modules


def _param_groups(model: nn.Module) -> list[Any]:
    """The FSDP parameter groups of `model`'s units (torch's FSDPParamGroup), each once, in module order."""
    from torch.distributed.fsdp import FSDPModule

    out: dict[int, Any] = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.12 (grouped units); else one group
            for g in groups if groups is not None else [state._fsdp_param_group]:
                if g is not None:
                    out.setdefault(id(g), g)
    return list(out.values())


def reshards_after_forward(model: nn.Module, cfg: LoopConfig, device: torch.device) -> bool:
    """train.fsdp_reshard as a bool; auto keeps the gathered blocks when the model's bf16 weights take under a tenth
    of the GPU's memory (the second all-gather in backward costs more than the memory saved)."""
    if cfg.fsdp_reshard != "auto":
        return cfg.fsdp_reshard == "always"
    if device.type != "cuda":
        return True
    weights = 2 * sum(p.numel() for p in model.parameters())
    return weights >= torch.cuda.get_device_properties(device).total_memory / 10


def _same_start(model: nn.Module, dist_info: DistInfo, device: torch.device) -> None:
    """Rank 0's parameters and buffers on every rank (ranks seeded apart must shard one model), one tensor at a
    time through `device`, so a model still on the CPU never needs a full copy on the GPU."""
    if not dist_info.enabled:
        return
    for t in [*model.parameters(), *model.buffers()]:
        if t.device == device:
            dist.broadcast(t.data, src=0)
        else:
            buf = t.data.to(device)
            dist.broadcast(buf, src=0)
            t.data.copy_(buf)


_OWN_GROUP = False


def ensure_process_group(device: torch.device) -> None:
    """A one-process group when no torchrun launch made one: FSDP and sharded checkpoints need a group."""
    global _OWN_GROUP
    if dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not _OWN_GROUP:
        _OWN_GROUP = True
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are DTensor shards (fully_shard was applied)."""
    return any(is_dtensor(p) for p in model.parameters())


def no_sync(model: nn.Module, last: bool) -> AbstractContextManager:
    """DDP: skip the gradient all-reduce on all but the last micro-step. FSDP reduce-scatters every micro-step
    (keeping unsharded gradients across micro-steps would cost a full gradient copy per rank)."""
    if isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


@torch.no_grad()  # DTensor.to_local is an autograd function where grad is enabled: host time per gradient
def grad_norm(params: list[Tensor], device: torch.device) -> Tensor:
    """The global gradient norm (over every rank's shards) on `device`; clipping is the optimizer's (see
    `clip_scale` and `Optimizers.step`)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=device)
    if is_dtensor(grads[0]) and all(p.is_shard() for p in grads[0].placements):
        # fsdp shards over one mesh dimension: each element lies in one rank's shard, so the squares of the local
        # norms add up over the ranks. Computed on the local tensors: DTensor's dispatch of every gradient would
        # cost milliseconds of host time per step. (Under cpu_offload the shards are on the CPU, the collective on
        # `device`.)
        squares = _total_norm([g.to_local() for g in grads]).to(device) ** 2
        dist.all_reduce(squares)
        return squares.sqrt()
    norm = _total_norm(grads)
    if is_dtensor(norm):
        norm = norm.full_tensor()
    return norm.to(device, non_blocking=True)


def _total_norm(tensors: list[Tensor]) -> Tensor:
    """The 2-norm of all `tensors` together, in fp32."""
    first = tensors[0]
    if not is_dtensor(first) and all(t.device == first.device and t.dtype == first.dtype for t in tensors):
        # One multi-tensor kernel, then the norm of the per-tensor norms: what get_total_norm does, less its
        # per-tensor Python (a loop bound by kernel launches pays for every call).
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors, 2.0))).float()
    return torch.nn.utils.get_total_norm(tensors, 2.0, foreach=True).float()


def nonfinite_params(params: list[Tensor], device: torch.device) -> Tensor:
    """1.0 on `device` where this rank's part of any parameter holds NaN or infinity, else 0.0 (a 0-d tensor; no
    sync). After optimizer steps it catches an update that overflowed finite gradients into the weights. The
    largest |value| cannot overflow where a sum of squares could; a NaN propagates through it."""
    tensors = [local(p).detach() for p in params]
    if not tensors:
        return torch.zeros((), device=device)
    peak = torch.stack([m.float() for m in torch._foreach_norm(tensors, float("inf"))]).max()
    return (~torch.isfinite(peak)).float().to(device, non_blocking=True)  # one copy where params are offloaded


def clip_scale(norm: Tensor, max_norm: float) -> Tensor | None:
    """What the gradients are divided by to clip them to `max_norm` (≥ 1; None when max_norm ≤ 0), as
    `torch.nn.utils.clip_grads_with_norm_` scales them."""
    if max_norm <= 0:
        return None
    return ((norm.float() + 1e-6) / max_norm).clamp_(min=1.0)


def full_state_dict(module: nn.Module) -> dict[str, Tensor]:
    """`module`'s state dict with full tensors on the CPU; sharded ones are all-gathered, so every rank must call
    it (the same tensor under two names, e.g. tied embeddings, stays one tensor)."""
    out: dict[str, Tensor] = {}
    done: dict[int, Tensor] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        key = id(t)
        if key not in done:
            if is_dtensor(t) and t.device.type != t.device_mesh.device_type:
                t = t.to(t.device_mesh.device_type)  # offloaded shards: gathered through the GPU's group
            done[key] = (t.full_tensor() if is_dtensor(t) else t).detach().cpu()
        out[name] = done[key]
    return out
