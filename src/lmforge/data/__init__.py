"""Data: bundled corpus, readers, cleaning, tokenization into token arrays, loaders, fetch recipes."""

from lmforge.data.clean import CleanConfig, clean_documents
from lmforge.data.corpus import default_corpus_paths, load_default_corpus, load_default_records
from lmforge.data.fetch import FETCHERS, LABELLED, cache_root, fetch, list_fetchers, list_labelled
from lmforge.data.loader import TokenLoader, read_meta, unigram_cross_entropy
from lmforge.data.prepare import prepare
from lmforge.data.readers import DocumentStream, read_documents
from lmforge.data.stream import StreamLoader

__all__ = [
    "FETCHERS",
    "LABELLED",
    "CleanConfig",
    "DocumentStream",
    "StreamLoader",
    "TokenLoader",
    "cache_root",
    "clean_documents",
    "default_corpus_paths",
    "fetch",
    "list_fetchers",
    "list_labelled",
    "load_default_corpus",
    "load_default_records",
    "prepare",
    "read_documents",
    "read_meta",
    "unigram_cross_entropy",
]
