"""torch.distributed setup for torchrun launches (NCCL on GPUs, gloo on CPUs), on one node or several."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lmforge.errors import LMForgeError
from lmforge.files import open_no_follow, os_reason


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


def gather_objects(obj, info: DistInfo) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank."""
    if not info.enabled:
        return [obj]
    out: list = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def check_shared_dir(path: Path, info: DistInfo, what: str = "run dir", option: str = "--run.dir") -> None:
    """Stop every rank with the same one line unless each of them sees a file rank 0 writes in `path`.

    Rank 0 alone writes a run's tokenizer, prepared data and plain checkpoints, and publishes the shards every rank
    writes; every rank reads them back (after a barrier, and when it resumes). Ranks on a node that has its own copy
    of `path` would read nothing or stale files: resume from another step than rank 0, then wait forever on a
    collective rank 0 never joins. The probe is a new file (fsynced and closed before the others look, so NFS's
    close-to-open consistency shows it to them), removed once every rank has looked."""
    if not info.enabled:
        return
    name, error = None, None
    if info.is_main:
        name = f".shared-probe-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = open_no_follow(Path(path) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, name.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            error = f"{what} {path} is not writable ({os_reason(e)}): choose another {option}"
    name, error = broadcast_object((name, error), info)
    if error:
        raise LMForgeError(error)
    probe = Path(path) / name
    try:
        seen = probe.read_bytes() == name.encode()
    except OSError:
        seen = False
    views = gather_objects((seen, socket.gethostname()), info)
    if info.is_main:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass  # a stray probe harms nothing; failing on rank 0 alone would leave the others waiting
    blind = [(rank, host) for rank, (ok, host) in enumerate(views) if not ok]
    if blind:
        rank, host = blind[0]
        others = f" (and {len(blind) - 1} more ranks)" if len(blind) > 1 else ""
        raise LMForgeError(
            f"{what} {path} is not one directory for every node: rank {rank} on {host}{others} does not see the "
            f"file rank 0 on {views[0][1]} wrote in it; a run over several nodes needs its {what} on a filesystem "
            f"every node mounts at the same path (NFS, Lustre, ...): choose such a {option}"
        )


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
