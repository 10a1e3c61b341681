"""Inputs beyond text files: Hugging Face datasets (objects, save_to_disk dirs, hf:NAME offline), another text
field, fetched corpora by bare name; and `prepare`'s memory staying flat as its input grows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_data_prepare import DOCS, HFStandIn

from lmforge.data.corpus.prepare import prepare
from lmforge.data.corpus.readers import read_documents
from lmforge.errors import LMForgeError

datasets = pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def tok() -> HFStandIn:
    return HFStandIn(DOCS)


def _bins(out: Path) -> dict[str, bytes]:
    return {f: (out / f).read_bytes() for f in ("train.bin", "train.idx", "val.bin", "val.idx")}


@pytest.fixture
def reference(tmp_path: Path, tok: HFStandIn) -> dict[str, bytes]:
    """DOCS prepared from a JSONL file, the outputs the dataset inputs must reproduce."""
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    prepare([src], tmp_path / "ref", tok, val_fraction=0.2, seed=3)
    return _bins(tmp_path / "ref")


def test_a_dataset_object_and_a_save_to_disk_dir_prepare_as_the_same_jsonl_does(tmp_path, tok, reference) -> None:
    ds = datasets.Dataset.from_dict({"content": DOCS, "id": list(range(len(DOCS)))})
    meta = prepare([ds], tmp_path / "obj", tok, val_fraction=0.2, seed=3, text_field="content")
    assert _bins(tmp_path / "obj") == reference
    assert meta["sources"][0].startswith("datasets.Dataset(rows=40, fingerprint=")
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(tmp_path / "saved")
    prepare([str(tmp_path / "saved")], tmp_path / "disk", tok, val_fraction=0.2, seed=3, text_field="content")
    assert _bins(tmp_path / "disk") == reference  # a DatasetDict gives its train split
    prepare([tmp_path / "saved" / "test"], tmp_path / "split", tok, val_fraction=0.5, text_field="content")
    with pytest.raises(LMForgeError, match=r"no column 'text' \(columns: content, id\)$"):
        prepare([ds], tmp_path / "bad", tok)


def test_another_text_field_of_jsonl(tmp_path: Path, tok: HFStandIn, reference) -> None:
    src = tmp_path / "e.jsonl"
    src.write_text("".join(json.dumps({"content": d}) + "\n" for d in DOCS), encoding="utf-8")
    with pytest.raises(LMForgeError, match=r"e\.jsonl:1: no field 'text' \(fields: content\)$"):
        prepare([src], tmp_path / "no", tok)
    prepare([src], tmp_path / "yes", tok, val_fraction=0.2, seed=3, text_field="content")
    assert _bins(tmp_path / "yes") == reference


def test_hf_name_reads_the_local_cache_offline(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    with pytest.raises(
        LMForgeError, match=r"^hf:nobody/absent: not in the local Hugging Face datasets cache .*offline"
    ):
        list(read_documents(["hf:nobody/absent"]))
    assert datasets.config.HF_HUB_OFFLINE  # reading never reached for the network


def test_a_fetched_corpus_by_bare_name(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "cache" / "data" / "prose"
    corpus.mkdir(parents=True)
    (corpus / "docs.jsonl").write_text(json.dumps({"text": "A fetched document."}) + "\n")
    assert list(read_documents(["prose"])) == list(read_documents(["fetched:prose"])) == ["A fetched document."]
    with pytest.raises(LMForgeError, match=r"^brown: no such file .*not fetched yet \(run: lmforge data fetch brown;"):
        read_documents(["brown"])
    (tmp_path / "prose").write_text("A local file wins over the fetched corpus.")
    assert list(read_documents(["prose"])) == ["A local file wins over the fetched corpus."]


_CHILD = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
from lmforge.data.corpus.prepare import prepare
def kb(key):  # this process's own figures (ru_maxrss would carry the forking parent's peak across exec)
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
words = [f"w{i}" for i in range(200)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words + ["<eos>", "<unk>"])}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.encode_batch(["w1 w2"])  # the Rust thread pool up before the baseline
class Tok:
    eos_id, vocab_size = 200, 202
    def encode_batch(self, texts):
        return [e.ids for e in tok.encode_batch(texts)]
before = kb("VmRSS:")
meta = prepare([Path(sys.argv[1])], Path(sys.argv[2]), Tok())
print(json.dumps({"growth_kb": kb("VmHWM:") - before, "docs": meta["train"]["n_docs"] + meta["val"]["n_docs"]}))
"""


def _corpus(path: Path, mb: int) -> tuple[Path, int]:
    line = json.dumps({"text": " ".join(f"w{i % 200}" for i in range(250))}) + "\n"  # ~1.2 kB a document
    n = mb * 1_000_000 // len(line)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(line)
    return path, n


def _peak_growth_mb(tmp_path: Path, mb: int) -> float:
    src, n = _corpus(tmp_path / f"{mb}mb.jsonl", mb)
    cmd = [sys.executable, "-c", _CHILD, str(src), str(tmp_path / f"out-{mb}")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={"LMFORGE_QUIET": "1", "PATH": ""})
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["docs"] == n
    return result["growth_kb"] / 1024


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the peak RSS from /proc")
def test_prepare_memory_does_not_grow_with_the_input(tmp_path: Path) -> None:
    """Peak memory while preparing a 4 MB and a 36 MB corpus: streamed, the 32 MB more text take under half of that
    in memory (measured 4.5-8.4 MB more, the noise of the reading thread and the allocator included); holding the
    documents, the old `list(stream)`, took about twice the text (31 MB more for 16 MB)."""
    small = _peak_growth_mb(tmp_path, 4)
    large = _peak_growth_mb(tmp_path, 36)
    assert large - small < 32 / 2, (small, large)


def test_pretraining_reads_a_save_to_disk_dir_by_its_text_field_and_caches_its_tokenizer(tmp_path, monkeypatch, capsys):
    """`--data.inputs=[DIR] --data.text_field=content`: the run trains its tokenizer on the dataset's column and
    prepares it; a second run with the same text and settings reuses the cached tokenizer."""
    from lmforge.cli import main

    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "tok-cache"))
    datasets.Dataset.from_dict({"content": DOCS * 3}).save_to_disk(tmp_path / "saved")
    args = ["--model.preset=gpt-tiny", "--train.max_steps=1", "--train.batch_size=2", "--train.seq_len=16",
            "--sample.prompts=[]", "--data.vocab_size=300", f"--data.inputs=[{tmp_path / 'saved'}]",
            "--data.text_field=content"]  # fmt: skip
    assert main(["pretrain", "gpt", f"--run.dir={tmp_path / 'a'}", *args]) == 0
    meta = json.loads((tmp_path / "a" / "data" / "meta.json").read_text())
    assert meta["train"]["n_docs"] + meta["val"]["n_docs"] == 120 and meta["sources"] == [str(tmp_path / "saved")]
    capsys.readouterr()
    assert main(["pretrain", "gpt", f"--run.dir={tmp_path / 'b'}", *args]) == 0
    assert "reusing the bpe tokenizer of 300 tokens" in capsys.readouterr().err


def test_documented_cli_commands(tmp_path: Path, monkeypatch, capsys) -> None:
    """docs/data.md: `data prepare e.jsonl --text-field content`, a save_to_disk dir by path, and `tokenizer train
    --kind unigram --sample-chars N` (a sample of the text, recorded with the tokenizer)."""
    from lmforge.cli import main
    from lmforge.tokenizers import train_tokenizer

    monkeypatch.setenv("LMFORGE_TOKENIZER_CACHE", str(tmp_path / "tok-cache"))
    monkeypatch.chdir(tmp_path)
    train_tokenizer(DOCS, "bpe", 300).save("TOK")
    Path("e.jsonl").write_text("".join(json.dumps({"content": d}) + "\n" for d in DOCS), encoding="utf-8")
    assert main(["data", "prepare", "e.jsonl", "--text-field", "content", "--out", "data/e", "--tokenizer", "TOK"]) == 0
    datasets.Dataset.from_dict({"content": DOCS}).save_to_disk("my_saved_dataset")
    assert main(["data", "prepare", "my_saved_dataset", "--text-field", "content", "--out", "data/mine",
                 "--tokenizer", "TOK"]) == 0  # fmt: skip
    assert _bins(Path("data/e")) == _bins(Path("data/mine"))
    Path("corpus.jsonl").write_text("".join(json.dumps({"text": f"{d} ({i})"}) + "\n" for i in range(8) for d in DOCS))
    capsys.readouterr()
    args = ["--out", "tok", "--kind", "unigram", "--vocab-size", "150", "--sample-chars", "20000"]
    assert main(["tokenizer", "train", "corpus.jsonl", *args]) == 0
    assert "training the unigram tokenizer on a sample of " in capsys.readouterr().err
    assert json.loads(Path("tok/lmforge_tokenizer.json").read_text())["training"]["sample_chars"] == 20000
