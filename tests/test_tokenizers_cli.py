"""The functions behind ``lmforge tokenizer train`` and ``lmforge tokenizer encode``."""

from __future__ import annotations

import gzip
import json
import lzma
from pathlib import Path

import pytest
from tokenizer_corpus import AUSTEN, DICKENS, GETTYSBURG, MELVILLE

from lmforge.cli.tokenizer import cmd_encode, cmd_train
from lmforge.errors import LMForgeError
from lmforge.tokenizers import Tokenizer


@pytest.fixture(autouse=True)
def tokenizer_cache(tmp_path: Path, monkeypatch) -> Path:
    """Each test its own tokenizer cache (`cmd_train` caches what it trains)."""
    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "tokenizer-cache"))
    return tmp_path / "tokenizer-cache"


@pytest.fixture
def corpus_files(tmp_path: Path) -> list[Path]:
    """A .txt file with one invalid UTF-8 byte, and a .jsonl file with a "text" field per line."""
    txt = tmp_path / "prose.txt"
    txt.write_bytes((GETTYSBURG + DICKENS).encode("utf-8") + b"caf\xe9\n")
    jsonl = tmp_path / "prose.jsonl"
    records = [{"text": AUSTEN, "id": 1}, {"text": MELVILLE, "id": 2}]
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    return [txt, jsonl]


def test_cmd_train_writes_tokenizer_and_summary(corpus_files: list[Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "tok"
    summary = cmd_train(corpus_files, out, "bpe", 400, "bart", 2)
    # The bad byte is replaced by U+FFFD, one character, rather than failing the run.
    chars = len(GETTYSBURG + DICKENS) + len("caf\ufffd\n") + len(AUSTEN) + len(MELVILLE)
    assert summary == {
        "out": str(out),
        "kind": "bpe",
        "family": "bart",
        "vocab_size": 400,
        "files": 2,
        "chars": chars,
        "trained_on_chars": chars,
        "special_tokens": {
            "bos": "<s>",
            "eos": "</s>",
            "pad": "<pad>",
            "unk": "<unk>",
            "mask": "<mask>",
            "cls": "<s>",
            "sep": "</s>",
        },
    }
    assert json.loads(capsys.readouterr().out) == summary
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 400 and tok.mask_id == 399
    assert tok.decode(tok.encode("caf\ufffd")) == "caf\ufffd"


def test_cmd_train_reads_compressed_files_as_data_prepare_does(corpus_files: list[Path], tmp_path: Path) -> None:
    """A .jsonl.xz / .txt.gz corpus gives the vocabulary of its decompressed text, not one learned from its bytes."""
    packed = [tmp_path / "prose.txt.gz", tmp_path / "prose.jsonl.xz"]
    packed[0].write_bytes(gzip.compress(corpus_files[0].read_bytes()))
    packed[1].write_bytes(lzma.compress(corpus_files[1].read_bytes()))
    plain = cmd_train(corpus_files, tmp_path / "a", "bpe", 400)
    compressed = cmd_train(packed, tmp_path / "b", "bpe", 400)
    assert compressed["chars"] == plain["chars"]
    vocab = [json.loads((tmp_path / d / "tokenizer.json").read_text())["model"]["vocab"] for d in "ab"]
    assert vocab[0] == vocab[1]


def test_cmd_train_reads_a_fetched_corpus_by_name(corpus_files: list[Path], tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "cache" / "data" / "prose"
    corpus.mkdir(parents=True)
    (corpus / "docs.jsonl").write_bytes(corpus_files[1].read_bytes())
    (corpus / "fetch.json").write_text("{}")
    by_name = cmd_train(["fetched:prose"], tmp_path / "a", "bpe", 400)
    assert by_name["chars"] == cmd_train([corpus_files[1]], tmp_path / "b", "bpe", 400)["chars"]
    with pytest.raises(LMForgeError, match=r"^fetched:verse: not fetched yet \(run: lmforge data fetch verse;"):
        cmd_train(["fetched:verse"], tmp_path / "c", "bpe", 400)


def test_cmd_train_wordpiece_default_family(corpus_files: list[Path], tmp_path: Path) -> None:
    summary = cmd_train(corpus_files, tmp_path / "wp", "wordpiece", 300)
    assert (summary["family"], summary["vocab_size"]) == ("bert", 300)
    assert Tokenizer.load(tmp_path / "wp").cls_id == 2


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: [d / "nope.txt"], "input file not found: {d}/nope.txt"),
        (lambda d: [d], "input {d} is a directory, expected a text file"),
        (lambda d: [], "no input files given"),
        (lambda d: [_write(d / "empty.txt", "")], "no text in the input files: {d}/empty.txt"),
        (
            lambda d: [_write(d / "blank.jsonl", '{"text": ""}\n\n'), _write(d / "e.txt", "")],
            "no text in the input files: {d}/blank.jsonl, {d}/e.txt",
        ),
        (lambda d: [_write(d / "bad.jsonl", '{"text": "ok"}\n{"text": \n')], "{d}/bad.jsonl:2: invalid JSON"),
        (
            lambda d: [_write(d / "nt.jsonl", '{"body": "x"}\n')],
            "{d}/nt.jsonl:1: expected an object with a string 'text' field",
        ),
        (lambda d: [_write_bytes(d / "data.bin", bytes(range(256)) * 4)], "{d}/data.bin: binary file"),
        (lambda d: [_write_bytes(d / "c.jsonl.xz", b"not xz data")], "{d}/c.jsonl.xz: cannot read"),
    ],
)
def test_cmd_train_input_errors(setup, message: str, tmp_path: Path) -> None:
    with pytest.raises(LMForgeError) as err:
        cmd_train(setup(tmp_path), tmp_path / "out", "bpe", 300, "gpt", 2)
    assert str(err.value).startswith(message.format(d=tmp_path))
    assert not (tmp_path / "out").exists()


def test_cmd_train_output_is_a_file(corpus_files: list[Path], tmp_path: Path) -> None:
    out = _write(tmp_path / "out", "x")
    with pytest.raises(LMForgeError) as err:
        cmd_train(corpus_files, out, "bpe", 300)
    assert str(err.value) == f"output {out} is a file, expected a directory"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def saved(corpus_files: list[Path], tmp_path: Path) -> Path:
    cmd_train(corpus_files, tmp_path / "tok", "bpe", 400, "gpt", 2)
    return tmp_path / "tok"


def test_cmd_encode_text_and_file(saved: Path, tmp_path: Path, capsys) -> None:
    tok = Tokenizer.load(saved)
    capsys.readouterr()
    text = "Four score and seven years ago"
    ids = cmd_encode(saved, text=text)
    assert ids == tok.encode(text) and tok.decode(ids) == text
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ids: " + " ".join(map(str, ids))
    tokens = json.loads(lines[1].removeprefix("tokens: "))
    assert tokens == [tok.id_to_token(i) for i in ids] and "".join(tokens).replace("Ġ", " ") == text
    f = _write(tmp_path / "in.txt", GETTYSBURG)
    assert cmd_encode(saved / "tokenizer.json", file=f) == tok.encode(GETTYSBURG)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give exactly one of a text or --file to encode"),
        ({"text": "a", "file": Path("x")}, "give exactly one of a text or --file to encode"),
        ({"text": ""}, "nothing to encode: the text is empty"),
        ({"file": "{d}/missing.txt"}, "input file not found: {d}/missing.txt"),
        ({"file": "{d}"}, "input {d} is a directory, expected a text file"),
        ({"file": "{d}/empty.txt"}, "nothing to encode: {d}/empty.txt is empty"),
    ],
)
def test_cmd_encode_errors(saved: Path, tmp_path: Path, kwargs: dict, message: str) -> None:
    _write(tmp_path / "empty.txt", "")
    if isinstance(kwargs.get("file"), str):
        kwargs = {"file": Path(kwargs["file"].format(d=tmp_path))}
    with pytest.raises(LMForgeError) as err:
        cmd_encode(saved, **kwargs)
    assert str(err.value) == message.format(d=tmp_path)


def test_cmd_encode_missing_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError) as err:
        cmd_encode(tmp_path / "none", text="hi")
    assert str(err.value) == (
        f"tokenizer: '{tmp_path / 'none'}' is neither a tokenizer dir/file nor a published tokenizer "
        "(published tokenizers: gpt2)"
    )


def test_cmd_encode_takes_a_run_dir(saved: Path, tmp_path: Path) -> None:
    """The tokenizer of a run (its latest checkpoint's), as `lmforge generate RUN` would encode with."""
    import dataclasses

    from lmforge.checkpoint.write import write_checkpoint_dir
    from lmforge.models import Transformer, get_preset

    tok = Tokenizer.load(saved)
    cfg = dataclasses.replace(get_preset("gpt-tiny"), vocab_size=tok.vocab_size)
    write_checkpoint_dir(tmp_path / "run" / "checkpoints" / "step_3", Transformer(cfg),
                         config={"model": dataclasses.asdict(cfg)}, tokenizer=tok, step=3)  # fmt: skip
    assert cmd_encode(tmp_path / "run", text="Four score") == tok.encode("Four score")


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_cmd_train_samples_unigram_text_and_reuses_the_cached_tokenizer(
    tmp_path: Path, tokenizer_cache: Path, capsys
) -> None:
    """A unigram tokenizer trains on a bounded sample (recorded with it); a second run with the same text and
    settings loads the cached one instead of training again, and a change of settings trains anew."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"{p} ({i})" for i in range(12) for p in (GETTYSBURG, DICKENS, AUSTEN, MELVILLE)))
    first = cmd_train([corpus], tmp_path / "a", "unigram", 150, sample_chars=12000)
    assert first["chars"] > 4 * 12000 and 8000 < first["trained_on_chars"] <= 12000
    training = json.loads((tmp_path / "a" / "lmforge_tokenizer.json").read_text())["training"]
    assert training["sampled"] and training["sample_chars"] == 12000
    assert training["trainer"] == {"shrinking_factor": 0.75, "n_sub_iterations": 2, "max_piece_length": 16}
    assert len(list(tokenizer_cache.iterdir())) == 1
    capsys.readouterr()
    cmd_train([corpus], tmp_path / "b", "unigram", 150, sample_chars=12000)
    assert "reusing the unigram tokenizer of 150 tokens" in capsys.readouterr().err
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    cmd_train([corpus], tmp_path / "c", "unigram", 150, sample_chars=13000)
    assert "reusing" not in capsys.readouterr().err and len(list(tokenizer_cache.iterdir())) == 2


def test_the_commands_family_choices_are_the_families() -> None:
    from lmforge.cli.tokenizer import FAMILY_CHOICES
    from lmforge.tokenizers.specials import FAMILIES

    assert tuple(FAMILY_CHOICES) == FAMILIES
