"""The bundled default corpus: public-domain English (Austen's novels, Shakespeare's works).

Stored as ``src/lmforge/assets/corpus/<name>.jsonl.xz`` (one ``{"text", "source"}`` object per line,
one document per novel chapter or play); see SOURCES.md there and ``scripts/build_corpus.py``.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path

from lmforge.errors import LMForgeError

CORPUS_DIR = Path(__file__).resolve().parents[2] / "assets" / "corpus"
CORPUS_FILES = ("austen.jsonl.xz", "shakespeare.jsonl.xz")


def default_corpus_paths() -> list[Path]:
    """Paths of the bundled corpus files (readable by ``read_documents``)."""
    paths = [CORPUS_DIR / name for name in CORPUS_FILES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise LMForgeError(f"bundled corpus is missing {', '.join(missing)} in {CORPUS_DIR}")
    return paths


def load_default_records() -> list[dict[str, str]]:
    """The bundled documents as ``{"text": ..., "source": ...}`` records, in file order."""
    records = []
    for path in default_corpus_paths():
        with lzma.open(path, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def load_default_corpus() -> list[str]:
    """The bundled documents' texts (312: 270 Austen chapters and prefaces, 42 Shakespeare works)."""
    return [r["text"] for r in load_default_records()]
