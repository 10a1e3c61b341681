"""Writers for experiment results: markdown tables, JSON files written atomically, compact number formats."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge import files


def si(x: float, digits: int = 3) -> str:
    """1234567 → '1.23M' (k, M, B, T; plain below 1000)."""
    if x is None or not math.isfinite(x):
        return "–"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g}{unit}"
    return f"{x:.{digits}g}"


def sci(x: float, digits: int = 3) -> str:
    """3.1e+15 style, '–' for missing values."""
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits - 1}e}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; `align` has one letter per column, l or r (default: l for the first, r else)."""
    align = align or "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers) or any(len(r) != len(headers) for r in rows):
        raise ValueError("every row and the alignment need one entry per header")
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> Path:
    """Write text to a sibling temp file renamed into place (readers never see half a file; never through a
    symbolic link: files.write_atomic)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, text, fsync=False)
    return path


def write_json(path: Path, data: Any) -> Path:
    """Indented JSON; NaN and infinities (not JSON) become null."""
    return write_atomic(path, json.dumps(_finite(data), indent=2, allow_nan=False, default=_plain) + "\n")


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _plain(x: Any) -> Any:
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item"):  # NumPy scalars
        return x.item()
    raise TypeError(f"{type(x).__name__} is not JSON serialisable")
