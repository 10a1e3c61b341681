"""torch.distributed setup for torchrun launches (NCCL on GPUs, gloo on CPUs)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group torchrun describes through RANK/WORLD_SIZE/LOCAL_RANK; single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def rank_seed(seed: int, rank: int) -> int:
    """The torch seed of one rank: `seed` on rank 0, a distinct one on every other rank."""
    return seed + 1_000_003 * rank


def broadcast_object(obj, info: DistInfo):
    """Rank 0's `obj` on every rank (a picklable Python object)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def mean_across(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Average a scalar tensor over ranks (for logging the global loss)."""
    if info.enabled:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM)
        if dist.get_backend() != "nccl":
            value /= info.world_size
    return value


def broadcast_parameters(module: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's parameters and buffers."""
    if info.enabled:
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def average_gradients(params: list[torch.Tensor], info: DistInfo) -> None:
    """Replace each parameter's gradient by its mean over ranks, in one all-reduce (a missing gradient is zero)."""
    if not info.enabled or not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch._utils._flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= info.world_size
    for p, g in zip(params, torch._utils._unflatten_dense_tensors(flat, grads)):
        p.grad = g


def sum_across(value: float, info: DistInfo) -> float:
    """The sum of a number over ranks."""
    return sums_across([value], info)[0]


def sums_across(values: list[float], info: DistInfo) -> list[float]:
    """The sums of several numbers over ranks, in one all-reduce (float64; every rank must call it)."""
    if not info.enabled:
        return list(values)
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
