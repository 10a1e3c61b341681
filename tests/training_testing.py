"""Shared set-up for tests that train through the CLI: a small corpus, its tokenizer and prepared shards."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from lmforge.data.corpus.bundled import load_default_corpus
from lmforge.data.corpus.prepare import prepare
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
    own = {n: torch.Tensor.__dict__[n] for n in names if n in torch.Tensor.__dict__}

    def refuse(self, *a, **k):
        raise AssertionError("a training step read a tensor value back")

    class NoMaskIndexing(torch.overrides.TorchFunctionMode):
        # Indexing is watched through a function mode, not by setting Tensor.__getitem__: a __getitem__ set on the
        # class stays a sequence slot of the type after it is put back (torch.tensor([0-d tensors]) then fails).
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__getitem__:
                keys = args[1] if isinstance(args[1], tuple) else (args[1],)
                if any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in keys):
                    raise AssertionError("a training step indexed with a boolean mask")
            return func(*args, **(kwargs or {}))

    try:
        for n in names:
            setattr(torch.Tensor, n, refuse)
        with NoMaskIndexing():
            yield
    finally:
        for n in names:  # torch.Tensor's own back; an inherited one from the C base class again
            setattr(torch.Tensor, n, own[n]) if n in own else delattr(torch.Tensor, n)
