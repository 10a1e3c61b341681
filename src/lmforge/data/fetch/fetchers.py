"""The registries of fetch recipes (corpora and labelled sets) and the decorators that fill them; the recipes
themselves are in `data/fetch/recipes.py`, and `data/fetch/build.py` runs them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.data.fetch import sources
from lmforge.registry import Registry

if TYPE_CHECKING:
    from lmforge.data.fetch.labelled_sets import LabelledSet

Records = Iterator[sources.Record]


@dataclass(frozen=True)
class Fetcher:
    """A named corpus recipe: where the documents come from and how to extract them from a scratch dir."""

    name: str
    description: str
    origin: str
    build: Callable[[Path], Records]
    license: str = ""
    """The licence of the text (and of its packaging where it differs)."""
    estimate: str = ""
    """Size before it is built (documents, MB), as measured on the pinned package."""
    english: bool = True
    """Whether it belongs in the `all-english` mix."""
    mix_of: Callable[[], list[str]] | None = None
    """A mix: the corpora it combines (fetched first, then deduplicated across; see `lmforge.data.fetch.mix`)."""


FETCHERS: Registry[Fetcher] = Registry("dataset")


def register(
    name: str, description: str, origin: str, license: str, estimate: str, english: bool = True
) -> Callable[[Callable[[Path], Records]], Fetcher]:
    """Decorator: register a corpus recipe `name` built by the decorated function."""

    def deco(build: Callable[[Path], Records]) -> Fetcher:
        recipe = Fetcher(name, description, origin, build, license, estimate, english)
        return FETCHERS.register(name)(recipe)

    return deco


def register_mix(
    name: str, description: str, license: str, estimate: str, components: Callable[[], list[str]]
) -> Fetcher:
    """Register a mix of corpora: `components()` names them, in the order their paragraphs take precedence."""

    def unused(scratch: Path) -> Records:
        raise AssertionError("a mix is built from its components")

    origin = "the corpora it mixes"
    return FETCHERS.register(name)(Fetcher(name, description, origin, unused, license, estimate, False, components))


@dataclass(frozen=True)
class LabelledFetcher:
    """A named recipe for a labelled set: where it comes from and how to build it from a scratch dir."""

    name: str
    description: str
    origin: str
    build: Callable[[Path], LabelledSet]
    license: str = ""
    estimate: str = ""
    kind: str = ""
    """What the set is for: sentiment, NLI, POS tagging, summarisation, translation, ..."""


LABELLED: Registry[LabelledFetcher] = Registry("labelled dataset")


def register_labelled(
    name: str, description: str, origin: str, license: str, estimate: str, kind: str
) -> Callable[[Callable[[Path], LabelledSet]], LabelledFetcher]:
    """Decorator: register a labelled-set recipe `name` built by the decorated function."""

    def deco(build: Callable[[Path], LabelledSet]) -> LabelledFetcher:
        return LABELLED.register(name)(LabelledFetcher(name, description, origin, build, license, estimate, kind))

    return deco
