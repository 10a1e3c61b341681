"""Token shards cached by content (data/corpus/prepared_cache.py): a run that prepares the same files with the same
tokenizer and settings reuses the shards; other bytes or other settings prepare again; the cache can be turned off."""

from __future__ import annotations

from pathlib import Path

import pytest
from training_testing import run_main, write_docs

from lmforge.data.corpus import prepared_cache


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv(prepared_cache.ENV_VAR, str(tmp_path / "cache"))
    return write_docs(tmp_path / "docs.jsonl", 6)


def _pretrain(capsys, run: Path, corpus: Path, *extra: str) -> str:
    code, _, err = run_main(
        capsys, "pretrain", "gpt", "--model.preset=gpt-tiny", f"--run.dir={run}", f"--data.inputs=[{corpus}]",
        "--data.vocab_size=300", "--train.max_steps=1", "--train.batch_size=2", "--train.seq_len=32",
        "--train.eval_batches=1", "--sample.prompts=[]", *extra,
    )  # fmt: skip
    assert code == 0, err
    return err


def _shards(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run / "data").iterdir()) if p.suffix in (".bin", ".idx", ".json")}


def test_a_second_run_reuses_the_shards_and_other_bytes_prepare_again(tmp_path, corpus, capsys, torch_globals):
    first = _pretrain(capsys, tmp_path / "a", corpus)
    assert "preparing token shards" in first and "reusing the token shards" not in first
    second = _pretrain(capsys, tmp_path / "b", corpus)
    assert "reusing the token shards prepared before" in second and "preparing token shards" not in second
    assert _shards(tmp_path / "a") == _shards(tmp_path / "b")

    corpus.write_text(corpus.read_text().replace("the", "a", 1))  # the same name, other bytes
    assert "preparing token shards" in _pretrain(capsys, tmp_path / "c", corpus)
    assert "preparing token shards" in _pretrain(capsys, tmp_path / "d", corpus, "--data.val_fraction=0.2")


def test_the_cache_turned_off_prepares_every_time(tmp_path, corpus, capsys, monkeypatch, torch_globals):
    monkeypatch.setenv(prepared_cache.ENV_VAR, "off")
    assert "preparing token shards" in _pretrain(capsys, tmp_path / "a", corpus)
    assert "preparing token shards" in _pretrain(capsys, tmp_path / "b", corpus)
    assert prepared_cache.cache_dir() is None


def test_the_key_follows_the_settings_and_refuses_inputs_that_are_not_files(tmp_path, corpus) -> None:
    key = prepared_cache.cache_key([corpus], {"seed": 0})
    assert key == prepared_cache.cache_key([corpus], {"seed": 0}) != prepared_cache.cache_key([corpus], {"seed": 1})
    assert prepared_cache.cache_key(None, {"seed": 0}) not in (None, key)  # the bundled corpus
    assert prepared_cache.cache_key(["hf:imdb"], {"seed": 0}) is None


def test_a_damaged_cache_entry_is_prepared_again(tmp_path, corpus, capsys, torch_globals) -> None:
    _pretrain(capsys, tmp_path / "a", corpus)
    (entry,) = [p for p in (tmp_path / "cache").iterdir()]
    (entry / "meta.json").unlink()
    assert "preparing token shards" in _pretrain(capsys, tmp_path / "b", corpus)
    assert (entry / "meta.json").is_file()  # stored again
    assert "reusing the token shards" in _pretrain(capsys, tmp_path / "c", corpus)
