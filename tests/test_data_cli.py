"""cmd_prepare / cmd_fetch with the project's tokenizer, and prepared data read back by TokenLoader."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.cli.data import cmd_fetch, cmd_prepare
from lmforge.data.corpus.c4_filters import missing_packages
from lmforge.data.corpus.loader import TokenLoader, unigram_cross_entropy
from lmforge.errors import LMForgeError
from lmforge.tokenizers import Tokenizer, train_tokenizer

WEATHER = ["bright", "grey", "cold", "warm", "still", "windy"] * 5
TEXTS = [f"Chapter {i}. It was a {w} morning, and the {w} bells rang out over the town." for i, w in enumerate(WEATHER)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tok")
    train_tokenizer(TEXTS, "bpe", 300).save(d)
    return d


def test_cmd_prepare_then_load(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "docs.jsonl"
    src.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in TEXTS))
    (tmp_path / "bad.txt").write_bytes(b"A stray \xff byte in a small text.")
    meta = cmd_prepare([src, tmp_path / "bad.txt"], tmp_path / "out", tok_dir, 0.1, False)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"prepared {tmp_path / 'out'} (uint16, vocab_size 300)"
    assert printed[1].startswith("  train: 28 docs, ")
    assert printed[2].startswith("  val: 3 docs, ")
    assert printed[3:] == ["  cleaning: off", "  replaced non-UTF-8 bytes: 1"]
    fp = hashlib.sha256(Tokenizer.load(tok_dir).backend.to_str().encode()).hexdigest()[:16]
    assert meta["tokenizer_fingerprint"] == fp and meta["tokenizer"] == str(tok_dir.resolve())

    tok = Tokenizer.load(tok_dir)
    loader = TokenLoader(tmp_path / "out", "train", seq_len=32, batch_size=2)
    stream = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16).astype(np.int64)
    batch = next(loader)
    windows = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(stream, 33)[::32].copy())
    for row in batch:  # every row is one of the fixed windows (stride seq_len) of the packed stream
        assert (windows == row).all(dim=1).sum() == 1
    assert (stream == tok.eos_id).sum() == meta["train"]["n_docs"]  # documents separated by EOS
    assert 0 < unigram_cross_entropy(tmp_path / "out") < np.log(300)


@pytest.mark.skipif(bool(missing_packages()), reason="lmforge's `clean` extra is not installed")
def test_cmd_prepare_clean_summary(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "d.txt"
    src.write_text("\n".join(TEXTS[:6]))
    other = tmp_path / "e.txt"
    other.write_text("\n".join(TEXTS[6:12]) + "\nno end punctuation")
    cmd_prepare([src, other], tmp_path / "out", tok_dir, 0.5, True)
    out = capsys.readouterr().out
    assert "  cleaning: kept 2 of 2 docs; removed docs_too_long 0, lines_too_long_word 0, " in out
    assert "lines_no_terminal_punctuation 1," in out


def test_pretraining_on_prepared_data_takes_its_tokenizer_and_refuses_another(tmp_path: Path, tok_dir: Path, capsys):
    """`--data.prepared` alone: the tokenizer the data was prepared with (recorded in meta.json). Another tokenizer
    of the same size is refused — its ids would name other tokens."""
    from lmforge.cli import main

    src = tmp_path / "docs.jsonl"
    src.write_bytes(b"".join(json.dumps({"text": t}).encode() + b"\n" for t in TEXTS))
    cmd_prepare([src], tmp_path / "data", tok_dir, 0.1, False)
    tiny = ["--model.preset=gpt-tiny", "--train.max_steps=1", "--train.batch_size=2", "--train.seq_len=16",
            "--sample.prompts=[]", f"--data.prepared={tmp_path / 'data'}"]  # fmt: skip
    capsys.readouterr()
    assert main(["pretrain", "gpt", f"--run.dir={tmp_path / 'run'}", *tiny]) == 0
    err = capsys.readouterr().err
    assert f"note: data.tokenizer {tok_dir.resolve()} (what {tmp_path / 'data'} was prepared with)" in err
    train_tokenizer(list(reversed(TEXTS)) + ["Bells, bells, bells."], "bpe", 300).save(tmp_path / "other")
    assert Tokenizer.load(tmp_path / "other").vocab_size == 300
    assert (
        main(["pretrain", "gpt", f"--run.dir={tmp_path / 'run2'}", *tiny, f"--data.tokenizer={tmp_path / 'other'}"])
        == 2
    )
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: prepared data in {tmp_path / 'data'} was tokenized with another tokenizer ({tok_dir.resolve()}) "
        f"than data.tokenizer {tmp_path / 'other'}: give the one it was prepared with"
    )
    meta = json.loads((tmp_path / "data" / "meta.json").read_text())
    del meta["tokenizer"]  # data prepared by hand, or before meta.json named its tokenizer
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    assert main(["pretrain", "gpt", f"--run.dir={tmp_path / 'run3'}", *tiny]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: data.prepared needs data.tokenizer: the tokenizer {tmp_path / 'data'} was prepared with"
    )


def test_cmd_prepare_missing_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError, match="^cannot load tokenizer: no tokenizer.json in directory "):
        cmd_prepare([], tmp_path / "out", tmp_path, 0.05, False)


def test_cmd_fetch_prints_location(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def fake_fetch(name: str) -> Path:
        return tmp_path / "data" / name

    build = importlib.import_module("lmforge.data.fetch.build")
    monkeypatch.setattr(build, "fetch", fake_fetch)  # the module, not fetch()
    assert cmd_fetch("sotu") == tmp_path / "data" / "sotu"
    assert capsys.readouterr().out.startswith(f"sotu: {tmp_path / 'data' / 'sotu' / 'docs.jsonl'}")
