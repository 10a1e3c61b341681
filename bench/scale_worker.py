"""One rank of a bench/scale.py run: `lmforge pretrain` exactly as the CLI runs it, plus this rank's peak GPU memory
written to $LMFORGE_SCALE_DIR/rank<R>.json when it ends (also when it fails, e.g. out of memory). With
LMFORGE_SCALE_NO_SAVE=1 (scale.py --no-save) the loop writes no checkpoint."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from lmforge.cli import main


def _record(error: str | None) -> None:
    out = os.environ.get("LMFORGE_SCALE_DIR")
    if not out or not torch.cuda.is_available():
        return
    rank = int(os.environ.get("RANK", "0"))
    stats = {
        "rank": rank,
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "device": torch.cuda.get_device_name(),
        "error": error,
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(stats) + "\n")


if __name__ == "__main__":
    if os.environ.get("LMFORGE_SCALE_NO_SAVE") == "1":
        from lmforge.train.loop import Loop

        Loop.save = lambda self: None
    rc = main(sys.argv[1:])
    _record(None if rc == 0 else f"exit status {rc}")
    sys.exit(rc)
