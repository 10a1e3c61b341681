"""Bringing torch.compile's compiler up while a run reads its tokenizer and data and builds its model.

A compiled run's first step pays for importing Dynamo and Inductor and for starting Inductor's pool of compile
workers (subprocesses that each import torch) before any kernel is compiled. On a GPU run with `train.compile`
those imports and the pool's start move to a thread that begins with the run; the run joins it before the loop
is built, so nothing is compiled while it runs. Failures are left to the first compilation, which reports them."""

from __future__ import annotations

import threading

import torch


def start_compiler_warmup(device: torch.device, compile: bool) -> threading.Thread | None:
    """The warm-up thread, started (None where there is nothing to warm: no compile, or not a GPU)."""
    if not compile or device.type != "cuda":
        return None
    thread = threading.Thread(target=_warm, name="lmforge-compiler-warmup", daemon=True)
    thread.start()
    return thread


def _warm() -> None:
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor.async_compile  # noqa: F401 — its import starts the pool of compile workers
        import torch._inductor.compile_fx  # noqa: F401
    except Exception:  # noqa: BLE001, S110 — the first compilation imports these again and says what is wrong
        pass
