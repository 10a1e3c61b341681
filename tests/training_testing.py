"""Shared set-up for tests that train through the CLI: a small corpus, its tokenizer and prepared shards."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from lmforge.data import load_default_corpus, prepare
from lmforge.tokenizers import train_tokenizer


def write_docs(path: Path, n_docs: int) -> Path:
    """The first n_docs bundled documents as one jsonl file."""
    docs = load_default_corpus()[:n_docs]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs), encoding="utf-8")
    return path


def make_prepared(d: Path, n_docs: int) -> tuple[Path, Path]:
    """A 512-token GPT BPE tokenizer (d/tok) and prepared shards (d/data) of the first n_docs bundled documents."""
    docs = write_docs(d / "docs.jsonl", n_docs)
    tok = train_tokenizer(load_default_corpus()[:n_docs], "bpe", 512, family="gpt")
    tok.save(d / "tok")
    prepare([docs], d / "data", tok, val_fraction=0.1)
    return d / "tok", d / "data"


def restore_torch_globals():
    """Generator for an autouse fixture: one thread while the test runs (tiny models: one thread beats two
    contended ones), and deterministic-algorithm mode put back as it was afterwards."""
    det, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.use_deterministic_algorithms(det)
    torch.set_num_threads(threads)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """`lmforge ARGS` in this process → (exit code, stdout, stderr); an argparse exit (--help) counts as a return."""
    from lmforge.cli import main

    try:
        rc = main(list(args))
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@contextlib.contextmanager
def no_device_reads():
    """Fail on every way a tensor's value reaches Python, and on indexing with a boolean mask (its shape depends on
    the values): each one waits for the device on a GPU."""
    names = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero")
    saved = {n: getattr(torch.Tensor, n) for n in [*names, "__getitem__"]}

    def refuse(self, *a, **k):
        raise AssertionError("a training step read a tensor value back")

    def getitem(self, key):
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys):
            raise AssertionError("a training step indexed with a boolean mask")
        return saved["__getitem__"](self, key)

    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        torch.Tensor.__getitem__ = getitem
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)
