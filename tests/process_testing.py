"""Shared set-up for tests that run lmforge in several processes on the CPU (torchrun, gloo): the environment they
run under, a free port, and a test script launched as one process or under torchrun."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_script(script: str, n: int, out: Path, *overrides: str) -> dict:
    """Run `script OUT OVERRIDES...` alone (n = 1) or under torchrun with n processes; the JSON of its last line."""
    me = [script, str(out), *overrides]
    if n > 1:
        me = ["-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={free_port()}", *me]
    res = subprocess.run([sys.executable, *me], env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])
