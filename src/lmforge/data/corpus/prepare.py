"""Tokenize documents into memory-mappable token arrays split by document into train / val.

A prepared directory holds, for each split ``s`` in (train, val):

- ``s.bin``: the split's documents' token ids back to back, each followed by EOS (raw little-endian
  uint16 if vocab_size <= 65536 else uint32; read with ``np.memmap``);
- ``s.idx``: int64 start offset of each document in ``s.bin`` (``.npy`` format, ``np.load``);

and ``meta.json``: dtype, vocab_size, eos_id, per-split ``n_tokens`` (EOS included), ``n_docs`` and
``n_bytes`` (UTF-8 bytes of the documents' text, for bits-per-byte), cleaning counts, decontamination counts,
replaced-byte count, tokenizer fingerprint and sources.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import re
import shutil
import threading
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from lmforge.data.corpus.bundled import default_corpus_paths
from lmforge.data.corpus.clean import CleanConfig, Cleaner
from lmforge.data.corpus.decontaminate import Decontaminator
from lmforge.data.corpus.prepare_lock import PrepareLock, remove_stale_locks
from lmforge.data.corpus.readers import describe_input, read_documents
from lmforge.errors import LMForgeError
from lmforge.files import pid_alive, write_error

FORMAT = "lmforge-tokens"
VERSION = 1
SPLITS = ("train", "val")
_CHUNK_CHARS = 1 << 20  # characters per encode_batch call: bounds memory, keeps the Rust pool busy
# Scratch dirs carry the writer's pid and this nonce: in a container every process can be PID 1, so the pid alone
# cannot tell this process's scratch from a killed predecessor's with the same pid.
_NONCE = os.urandom(4).hex()
_SCRATCH_RE = re.compile(r"\.(.+)\.(tmp|old)-(\d+)-([0-9a-f]{8})")
_WRITTEN = {f"{s}.{ext}" for s in SPLITS for ext in ("bin", "idx")} | {"meta.json"}  # all a scratch dir may hold


class TokenizerLike(Protocol):
    """What ``prepare`` needs from a tokenizer."""

    @property
    def eos_id(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...


def tokenizer_fingerprint(tokenizer) -> str:
    """First 16 hex digits of the SHA-256 of the tokenizer's serialised form (its tokenizer.json)."""
    import hashlib

    return hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()[:16]


def prepared_tokenizer(directory: Path) -> str:
    """The tokenizer (a path or a published name) `lmforge data prepare` tokenized `directory` with, from its
    meta.json; one line when the directory does not name one."""
    meta_path = Path(directory) / "meta.json"
    if not meta_path.is_file():
        raise LMForgeError(f"data.prepared: {directory} is not a prepared data dir (no meta.json)")
    spec = json.loads(meta_path.read_text(encoding="utf-8")).get("tokenizer")
    if not spec:
        raise LMForgeError(f"data.prepared needs data.tokenizer: the tokenizer {directory} was prepared with")
    return spec


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype that holds every id of a vocabulary."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def pack_with_eos(ids: Sequence[Sequence[int]], eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate token lists with EOS after each; return (tokens int64 (N,), doc lengths int64 (D,))."""
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    total = int(lengths.sum())
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=total - len(ids))
    eos_pos = np.cumsum(lengths) - 1  # last slot of each document
    out = np.empty(total, dtype=np.int64)
    is_text = np.ones(total, dtype=bool)
    is_text[eos_pos] = False
    out[is_text] = flat
    out[eos_pos] = eos_id
    return out, lengths


class _SplitWriter:
    """Appends documents' tokens to ``<split>.bin`` and remembers their start offsets and byte counts."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype) -> None:
        self.directory, self.split, self.dtype = directory, split, dtype
        self.file: BinaryIO = open(directory / f"{split}.bin", "wb")
        self.starts: list[np.ndarray] = []
        self.n_tokens = self.n_bytes = 0

    def write(self, tokens: np.ndarray, lengths: np.ndarray, n_bytes: int) -> None:
        self.starts.append(self.n_tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
        self.file.write(tokens.astype(self.dtype).tobytes())
        self.n_tokens += len(tokens)
        self.n_bytes += n_bytes

    def close(self) -> dict[str, int]:
        self.file.close()
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0, dtype=np.int64)
        with open(self.directory / f"{self.split}.idx", "wb") as f:
            np.save(f, starts.astype(np.int64), allow_pickle=False)
        return {"n_tokens": self.n_tokens, "n_docs": len(starts), "n_bytes": self.n_bytes}


def split_documents(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean (n_docs,) mask of validation documents: a seeded random subset, at least one each side."""
    if not 0.0 < val_fraction < 1.0:
        raise LMForgeError(f"val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if n_docs < 2:
        raise LMForgeError(
            f"need at least 2 documents to split into train and val, got {n_docs} (a document is a JSONL line, a "
            "CSV or Parquet row, or a text file; one longer than 32k characters splits at paragraphs): add text or "
            "files"
        )
    n_val = min(n_docs - 1, max(1, round(n_docs * val_fraction)))
    is_val = np.zeros(n_docs, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n_docs)[:n_val]] = True
    return is_val


# What the first pass remembers of each input document (one byte each), when cleaning or decontamination is on.
_DROPPED, _KEPT, _TRIMMED = 0, 1, 2  # _TRIMMED: decontamination dropped some of its paragraphs


class _Survey:
    """What the first pass over the input finds: documents (after decontamination and cleaning), their characters,
    which input documents stay and which decontamination trimmed (one byte each), the cleaning and decontamination
    counts and the replaced-byte count."""

    def __init__(self, inputs: Sequence, text_field: str, cleaner: Cleaner | None,
                 decon: Decontaminator | None = None) -> None:  # fmt: skip
        from lmforge.progress import progress

        stream = read_documents(inputs, text_field)
        self.n_docs = self.n_chars = 0
        self.kept: bytearray | None = None if cleaner is None and decon is None else bytearray()
        bar = progress(desc="reading", unit="char", unit_scale=True)
        for doc in stream:
            bar.update(len(doc))
            if self.kept is not None:
                state = _KEPT
                if decon is not None:  # before cleaning, which drops the blank lines between paragraphs
                    text = decon.filter(doc)
                    state = _DROPPED if text is None else _KEPT if text == doc else _TRIMMED
                    doc = text  # type: ignore[assignment]
                if doc is not None and cleaner is not None:
                    doc = cleaner.clean(doc)  # type: ignore[assignment]
                    state = _DROPPED if doc is None else state
                self.kept.append(state)
                if doc is None:
                    continue
            self.n_docs += 1
            self.n_chars += len(doc)
        bar.close()
        self.counts = None if cleaner is None else cleaner.counts
        self.decontamination = None if decon is None else decon.summary()
        self.replaced_bytes = stream.replaced_bytes


def _chunks(inputs: Sequence, text_field: str, kept: bytearray | None, cfg: CleanConfig | None, clean: bool = True,
            decon: Decontaminator | None = None) -> Iterator[list[str]]:  # fmt: skip
    """The second pass: the documents again, decontaminated and cleaned as the first pass did, in lists of about
    `_CHUNK_CHARS` characters. The first pass decided which documents stay; a fresh Cleaner over only those, in
    order, gives the first pass's texts (its span deduplication included). The English and bad-words filters only
    drop pages, so it skips them."""
    chunk: list[str] = []
    size = 0
    cleaner = None
    if clean and kept is not None:
        cleaner = Cleaner(dataclasses.replace(cfg or CleanConfig(), english=False, bad_words=False))
    for i, doc in enumerate(read_documents(inputs, text_field)):
        if kept is not None:
            if kept[i] == _DROPPED:
                continue
            if kept[i] == _TRIMMED:
                doc = decon.apply(doc)[0]  # type: ignore[union-attr,assignment]
            if cleaner is not None:
                doc = cleaner.clean(doc)  # type: ignore[assignment]
        chunk.append(doc)
        size += len(doc)
        if size >= _CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _prefetch(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, produced by a thread `depth` ahead: reading and parsing the next chunk overlaps the (GIL-free, Rust)
    encoding of this one, so every core works. An error in the producer is raised here."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, which raises it
            q.put(e)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _tokenize_into(chunks: Iterator[list[str]], n_chars: int, is_val: np.ndarray, tokenizer: TokenizerLike,
                   writers: dict) -> None:  # fmt: skip
    from lmforge.progress import progress

    eos, vocab = int(tokenizer.eos_id), int(tokenizer.vocab_size)  # type: ignore[arg-type]
    bar = progress(total=n_chars, desc="tokenizing", unit="char", unit_scale=True)
    first = 0  # index of the chunk's first document
    for docs in _prefetch(chunks):
        ids = tokenizer.encode_batch(docs)
        val = is_val[first : first + len(docs)]
        for split, writer in writers.items():
            pick = np.flatnonzero(val == (split == "val"))
            if not len(pick):
                continue
            tokens, lengths = pack_with_eos([ids[j] for j in pick], eos)
            if tokens.min() < 0 or tokens.max() >= vocab:
                bad = int(tokens.max() if tokens.max() >= vocab else tokens.min())
                raise LMForgeError(f"tokenizer produced id {bad}, outside its vocab_size {vocab}")
            writer.write(tokens, lengths, sum(len(docs[j].encode("utf-8")) for j in pick))
        first += len(docs)
        bar.update(sum(map(len, docs)))
    bar.close()


def _scratch(out: Path, kind: str) -> Path:
    """Where a prepare of `out` writes (`tmp`), or parks the data it replaces (`old`): named by the writer's pid and
    this process's nonce, so a later prepare tells a killed writer's leftovers from a live one's."""
    return out.with_name(f".{out.name}.{kind}-{os.getpid()}-{_NONCE}")


def _remove_stale_scratch(parent: Path) -> None:
    """Remove what killed prepares left in `parent`: scratch dirs holding only what prepare writes, and replaced data
    parked next to its finished successor. A live process's are kept; so is parked data whose successor is missing
    (it is the only copy). Lock files nobody holds go too (`remove_stale_locks`)."""
    for p in parent.iterdir():
        m = _SCRATCH_RE.fullmatch(p.name)
        if not m or m[4] == _NONCE or not p.is_dir() or (int(m[3]) != os.getpid() and pid_alive(int(m[3]))):
            continue
        if m[2] == "old" and (parent / m[1] / "meta.json").is_file():
            shutil.rmtree(p, ignore_errors=True)
        elif m[2] == "tmp" and all(f.name in _WRITTEN for f in p.iterdir()):
            shutil.rmtree(p, ignore_errors=True)
    remove_stale_locks(parent)


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` to ``out``, replacing a previously prepared ``out``."""
    if not out.exists():
        tmp.rename(out)
        return
    old = _scratch(out, "old")
    out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise LMForgeError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").is_file():
        raise LMForgeError(f"refusing to overwrite {out}: it is not empty and not a prepared data dir")


def prepare(
    inputs: Sequence[Path] | None,
    out: Path,
    tokenizer: TokenizerLike,
    val_fraction: float = 0.05,
    clean: bool = False,
    seed: int = 0,
    *,
    text_field: str = "text",
    tokenizer_source: str | None = None,
    clean_config: CleanConfig | None = None,
    decontaminate: Sequence[str] = (),
    decontaminate_n: int = 8,
) -> dict:
    """Read, optionally decontaminate and clean, split by document and tokenize ``inputs`` (None: bundled corpus)
    into ``out``. ``tokenizer_source`` (a path or a published name) is recorded in meta.json for runs that read
    ``out``. ``decontaminate`` names labelled sets (bundled, fetched, or labelled-set dirs): every paragraph sharing a
    word ``decontaminate_n``-gram with their dev or test splits is dropped first (see
    `lmforge.data.corpus.decontaminate`).

    Writes to a temporary sibling directory renamed into place at the end, so ``out`` is never left
    half-prepared. Returns the contents of ``meta.json``.
    """
    out = Path(out)
    _check_out(out)
    if tokenizer.eos_id is None:
        raise LMForgeError("the tokenizer has no EOS token; prepare needs one to separate documents")
    lock = PrepareLock(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()  # before any work: a second prepare into `out` is refused at once
    except OSError as e:
        raise write_error(out, e) from e
    with lock:
        _check_out(out)  # again: another prepare may have written it before this one held the lock
        sources = default_corpus_paths() if inputs is None else list(inputs)
        decon = Decontaminator(decontaminate, decontaminate_n) if decontaminate else None
        # Two passes over the input, so that memory does not grow with it: the first counts the documents (and
        # decides which ones cleaning keeps), for the seeded split; the second tokenizes them chunk by chunk.
        survey = _Survey(sources, text_field, Cleaner(clean_config) if clean else None, decon)
        counts = survey.counts
        if counts is not None and survey.n_docs < 2:
            raise LMForgeError(f"cleaning kept {survey.n_docs} of {counts['docs_in']} documents; need at least 2")
        if decon is not None and survey.n_docs < 2:
            raise LMForgeError(
                f"decontamination kept {survey.n_docs} of {len(survey.kept or ())} documents; need at least 2"
            )
        is_val = split_documents(survey.n_docs, val_fraction, seed)
        settings = {"val_fraction": val_fraction, "seed": seed, "cleaning": counts,
                    **({"decontamination": survey.decontamination} if decon is not None else {}),
                    "replaced_bytes": survey.replaced_bytes, "tokenizer": tokenizer_source}  # fmt: skip
        chunks = _chunks(sources, text_field, survey.kept, clean_config, clean, decon)
        return _write(out, chunks, survey.n_chars, is_val, tokenizer, settings, sources)


def _write(out: Path, chunks: Iterator[list[str]], n_chars: int, is_val: np.ndarray, tokenizer: TokenizerLike,
           settings: dict, sources: Sequence) -> dict:  # fmt: skip
    """Tokenize `chunks` into a scratch dir renamed onto `out` at the end; return its meta.json."""
    dtype = token_dtype(tokenizer.vocab_size)
    tmp = _scratch(out, "tmp")
    try:
        _remove_stale_scratch(out.parent)
        tmp.mkdir()
        writers = {s: _SplitWriter(tmp, s, dtype) for s in SPLITS}
        try:
            _tokenize_into(chunks, n_chars, is_val, tokenizer, writers)
        finally:
            stats = {s: w.close() for s, w in writers.items()}
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": dtype.name,
            "vocab_size": int(tokenizer.vocab_size),
            "eos_id": int(tokenizer.eos_id),
            **stats,
            **settings,
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer) if hasattr(tokenizer, "backend") else None,
            "sources": [describe_input(p) for p in sources],
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        _replace_dir(tmp, out)
    except OSError as e:  # a full disk above all: one line naming the output, and no scratch left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(out, e) from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta
