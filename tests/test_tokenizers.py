"""Training BPE/WordPiece/Unigram tokenizers, family special tokens, save/load and error cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizer_corpus import CORPUS, CORPUS_LINES, TRICKY

from lmforge.errors import LMForgeError
from lmforge.tokenizers import Tokenizer, train_tokenizer

# (kind, family, vocab_size) -> the ids that family's special tokens must have; V stands for vocab_size.
CASES = {
    ("bpe", "gpt", 400): {"<|endoftext|>": 0},
    ("wordpiece", "bert", 300): {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
    ("unigram", "t5", 300): {"<pad>": 0, "</s>": 1, "<unk>": 2, "<extra_id_0>": "V-1", "<extra_id_99>": "V-100"},
    ("bpe", "bart", 400): {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": "V-1"},
    ("bpe", "llama", 400): {"<unk>": 0, "<s>": 1, "</s>": 2},
    ("unigram", "gpt", 250): {"<|endoftext|>": 0, "<unk>": 1},
    ("wordpiece", "t5", 400): {"<pad>": 0, "</s>": 1, "<unk>": 2, "<extra_id_0>": "V-1"},
}
ROLE_IDS = {  # family -> role ids (None: the family has no such token)
    "gpt": {"bos": 0, "eos": 0, "pad": 0, "mask": None, "cls": None, "sep": None},
    "bert": {"bos": 2, "eos": 3, "pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
    "t5": {"bos": None, "eos": 1, "pad": 0, "unk": 2, "mask": None},
    "bart": {"bos": 0, "eos": 2, "pad": 1, "unk": 3, "cls": 0, "sep": 2, "mask": "V-1"},
    "llama": {"unk": 0, "bos": 1, "eos": 2, "pad": 2, "mask": None},
}

_cache: dict[tuple[str, str, int], Tokenizer] = {}


def trained(kind: str, family: str, vocab_size: int) -> Tokenizer:
    """A tokenizer trained on the test corpus (memoised: training is deterministic)."""
    key = (kind, family, vocab_size)
    if key not in _cache:
        _cache[key] = train_tokenizer(CORPUS_LINES, kind, vocab_size, family)
    return _cache[key]


def _resolve(v: int | str | None, vocab_size: int) -> int | None:
    return vocab_size - int(v.split("-")[1]) if isinstance(v, str) else v


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_vocab_size_and_special_ids(case: tuple[str, str, int]) -> None:
    kind, family, v = case
    tok = trained(kind, family, v)
    assert tok.vocab_size == v
    assert tok.kind == kind and tok.family == family
    # Every id 0..V-1 names exactly one token.
    assert sorted(tok.backend.get_vocab(with_added_tokens=True).values()) == list(range(v))
    for text, tid in CASES[case].items():
        assert tok.token_to_id(text) == _resolve(tid, v), text
    for role, tid in ROLE_IDS[family].items():
        assert getattr(tok, f"{role}_id") == _resolve(tid, v), role


def test_t5_sentinels_count_down_from_the_top() -> None:
    tok = trained("unigram", "t5", 300)
    assert tok.num_sentinels == 100
    assert tok.sentinel_ids(3) == [299, 298, 297]
    assert tok.sentinel_ids(100)[-1] == 200
    assert tok.decode([299], skip_special_tokens=False) == "<extra_id_0>"
    with pytest.raises(LMForgeError, match="tokenizer has 100 sentinel tokens"):
        tok.sentinel_ids(101)
    with pytest.raises(LMForgeError, match="tokenizer has 0 sentinel tokens"):
        trained("bpe", "gpt", 400).sentinel_ids(1)


def test_bpe_round_trip_is_exact_on_any_text() -> None:
    tok = trained("bpe", "gpt", 400)
    for text in (CORPUS, TRICKY, "\U0001f600 \u4e2d\u6587 \x00\x7f end"):
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert all(0 <= i < 400 for i in ids)
    # Learned merges make the corpus shorter than its 256-symbol byte encoding.
    assert len(tok.encode(CORPUS)) < 0.6 * len(CORPUS.encode("utf-8"))
    assert tok.encode(" the nation") == [tok.token_to_id("Ġthe"), tok.token_to_id("Ġnation")]


def test_wordpiece_lowercases_and_uses_continuation_prefix() -> None:
    tok = trained("wordpiece", "bert", 300)
    assert tok.decode(tok.encode("The Nation, Conceived in LIBERTY.")) == "the nation, conceived in liberty."
    pieces = [tok.id_to_token(i) for i in tok.encode("dedicated unfinished")]
    assert pieces[0] == "dedicated" and any(p.startswith("##") for p in pieces[1:])
    # Special tokens in text are matched before lowercasing.
    assert tok.encode("a [MASK] b")[1] == tok.mask_id == 4
    assert tok.encode("\u2603")[0] == tok.unk_id  # a character never seen in training


def test_unigram_round_trip_on_training_text() -> None:
    tok = trained("unigram", "t5", 300)
    assert tok.decode(tok.encode(CORPUS)) == CORPUS
    assert tok.id_to_token(tok.encode("nation")[0]).startswith("\u2581")
    assert tok.unk_id in tok.encode("\u2603 snowman")


@pytest.mark.parametrize("case", [("bpe", "bart", 400), ("wordpiece", "bert", 300), ("unigram", "t5", 300)])
def test_encode_batch_matches_encode_and_adds_no_specials(case: tuple[str, str, int]) -> None:
    tok = trained(*case)
    texts = CORPUS_LINES[:40]
    batch = tok.encode_batch(texts)
    assert batch == [tok.encode(t) for t in texts]
    specials = {tok.bos_id, tok.eos_id, tok.cls_id, tok.sep_id} - {None}
    assert not specials & {i for ids in batch for i in ids}


@pytest.mark.parametrize(
    ("case", "wrap"),
    [
        (("wordpiece", "bert", 300), lambda t, ids: [t.cls_id, *ids, t.sep_id]),
        (("unigram", "t5", 300), lambda t, ids: [*ids, t.eos_id]),
        (("bpe", "bart", 400), lambda t, ids: [t.bos_id, *ids, t.eos_id]),
        (("bpe", "gpt", 400), lambda t, ids: ids),
    ],
)
def test_saved_file_loads_in_transformers(case, wrap, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = trained(*case)
    tok.save(tmp_path)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = "It is a truth universally acknowledged, that a single man must be in want of a wife."
    ids = tok.encode(text)
    assert hf(text, add_special_tokens=False)["input_ids"] == ids
    assert hf(text)["input_ids"] == wrap(tok, ids)


@pytest.mark.parametrize("case", list(CASES)[:5], ids=lambda c: f"{c[0]}-{c[1]}")
def test_save_load_round_trip(case: tuple[str, str, int], tmp_path: Path) -> None:
    tok = trained(*case)
    out = tok.save(tmp_path / "tok")
    assert sorted(p.name for p in out.iterdir()) == ["lmforge_tokenizer.json", "tokenizer.json"]
    meta = json.loads((out / "lmforge_tokenizer.json").read_text(encoding="utf-8"))
    assert meta["kind"] == case[0] and meta["family"] == case[1]
    for path in (out, out / "tokenizer.json"):
        again = Tokenizer.load(path)
        assert again.encode(CORPUS) == tok.encode(CORPUS)
        assert again.special_tokens == tok.special_tokens
        assert (again.kind, again.family, again.vocab_size) == (tok.kind, tok.family, tok.vocab_size)
        assert [again.pad_id, again.eos_id, again.mask_id] == [tok.pad_id, tok.eos_id, tok.mask_id]


@pytest.mark.parametrize("case", list(CASES)[:5], ids=lambda c: f"{c[0]}-{c[1]}")
def test_load_without_metadata_infers_family(case: tuple[str, str, int], tmp_path: Path) -> None:
    tok = trained(*case)
    tok.save(tmp_path)
    (tmp_path / "lmforge_tokenizer.json").unlink()
    again = Tokenizer.load(tmp_path / "tokenizer.json")
    assert again.family == case[1]
    assert again.special_tokens == tok.special_tokens


def test_default_family_follows_kind() -> None:
    assert train_tokenizer(CORPUS_LINES, "wordpiece", 300).family == "bert"
    assert train_tokenizer(CORPUS_LINES, "unigram", 300).family == "t5"
    assert train_tokenizer(CORPUS_LINES, "bpe", 300).family == "gpt"


# ---------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("texts", "kind", "vocab_size", "family", "message"),
    [
        (
            CORPUS_LINES,
            "sentencepiece",
            300,
            None,
            "unknown tokenizer kind 'sentencepiece' (known: bpe, wordpiece, unigram)",
        ),
        (CORPUS_LINES, "bpe", 300, "gpt3", "unknown tokenizer family 'gpt3' (known: gpt, bert, t5, bart, llama)"),
        (CORPUS_LINES, "bpe", 0, "gpt", "vocab_size must be a positive integer, got 0"),
        (CORPUS_LINES, "unigram", 90, "t5", "vocab_size 90 is too small: family t5 alone has 103 special tokens"),
        (
            CORPUS_LINES,
            "bpe",
            200,
            "bart",
            "vocab_size 200 is too small for a bpe tokenizer of family bart: the 256 byte tokens and "
            "5 special tokens need at least 261",
        ),
        (
            CORPUS_LINES,
            "wordpiece",
            20,
            "bert",
            "vocab_size 20 is too small: the characters of the training text and the special tokens alone "
            "need 64 entries",
        ),
        (["", ""], "bpe", 300, "gpt", "no training text: every input text is empty"),
    ],
)
def test_train_errors(texts, kind, vocab_size, family, message) -> None:
    with pytest.raises(LMForgeError) as err:
        train_tokenizer(texts, kind, vocab_size, family)
    assert str(err.value) == message


def test_train_rejects_vocab_larger_than_the_text_supports() -> None:
    with pytest.raises(LMForgeError) as err:
        train_tokenizer(CORPUS_LINES, "bpe", 50_000, "gpt", min_frequency=2)
    msg = str(err.value)
    assert msg.startswith("the training text supports only ") and msg.endswith(
        "tokens for a bpe vocabulary, fewer than vocab_size 50000: lower vocab_size or min_frequency, or add text"
    )
    supported = int(msg.split()[5])
    assert 257 < supported < 2000
    assert train_tokenizer(CORPUS_LINES, "bpe", supported, "gpt").vocab_size == supported


def test_size_errors_name_the_callers_options() -> None:
    """A tokenizer trained for a run names the run's config key; one trained by the CLI names its flags."""
    with pytest.raises(LMForgeError, match=r"fewer than model\.vocab_size 50000: lower model\.vocab_size, or add"):
        train_tokenizer(CORPUS_LINES, "bpe", 50_000, "gpt", size_key="model.vocab_size", frequency_key=None)
    with pytest.raises(LMForgeError, match="lower --vocab-size or --min-frequency, or add text"):
        train_tokenizer(CORPUS_LINES, "bpe", 50_000, "gpt", size_key="--vocab-size", frequency_key="--min-frequency")
    with pytest.raises(LMForgeError, match="^data.vocab_size 90 is too small: family t5 alone"):
        train_tokenizer(CORPUS_LINES, "unigram", 90, "t5", size_key="data.vocab_size")


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(LMForgeError) as err:
        Tokenizer.load(tmp_path / "missing")
    assert str(err.value) == f"cannot load tokenizer: {tmp_path / 'missing'} does not exist"
    with pytest.raises(LMForgeError) as err:
        Tokenizer.load(tmp_path)
    assert str(err.value) == f"cannot load tokenizer: no tokenizer.json in directory {tmp_path}"
    (tmp_path / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    with pytest.raises(LMForgeError) as err:
        Tokenizer.load(tmp_path)
    assert str(err.value).startswith(f"cannot load tokenizer: {tmp_path / 'tokenizer.json'} is not a valid")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ("{oops", "is not valid JSON"),
        ('{"format": "other"}', "is not an lmforge tokenizer description"),
        ('{"format": "lmforge-tokenizer", "version": 9}', "has unsupported version 9"),
        (
            '{"format": "lmforge-tokenizer", "version": 1, "kind": "unigram", "special_tokens": {}}',
            "says kind 'unigram' but",
        ),
        (
            '{"format": "lmforge-tokenizer", "version": 1, "kind": "bpe", "special_tokens": {"eos": "<nope>"}}',
            "special token '<nope>' (eos) is not in the tokenizer's vocabulary",
        ),
    ],
)
def test_load_rejects_bad_metadata(meta: str, message: str, tmp_path: Path) -> None:
    trained("bpe", "gpt", 400).save(tmp_path)
    (tmp_path / "lmforge_tokenizer.json").write_text(meta, encoding="utf-8")
    with pytest.raises(LMForgeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Tokenizer.load(tmp_path)


def test_save_into_a_file_path_fails(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x", encoding="utf-8")
    with pytest.raises(LMForgeError) as err:
        trained("bpe", "gpt", 400).save(tmp_path / "f")
    assert str(err.value) == f"cannot save tokenizer: {tmp_path / 'f'} is a file, expected a directory"


def test_wordpiece_ids_follow_the_text_so_the_same_vocabulary_gets_the_same_ids(tmp_path: Path) -> None:
    """The trainer numbers its alphabet, and breaks ties, in a per-process hash order: the same tokens came under
    other ids in every process (another model init). Numbered by text, equal vocabularies have equal ids (which
    tokens are kept at the size limit can still differ between processes on ties; it did not on the recipes'
    test corpus)."""
    import os
    import subprocess
    import sys

    (tmp_path / "text.txt").write_text("\n".join(CORPUS_LINES), encoding="utf-8")
    code = (
        "import sys; from lmforge.tokenizers import train_tokenizer; "
        "lines = open(sys.argv[1], encoding='utf-8').read().split(chr(10)); "
        "t = train_tokenizer(lines, 'wordpiece', sys.argv[3] and int(sys.argv[3]), 'bert', show_progress=False); "
        "t.save(sys.argv[2])"
    )
    vocabs = []
    for size in (300, 300, 300, 120, 120, 120):
        out = tmp_path / f"tok{len(vocabs)}"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "text.txt"), str(out), str(size)], check=True,
                       env=env)  # fmt: skip
        vocabs.append(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    for vocab in vocabs:
        order = sorted(vocab, key=vocab.get)
        assert order[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        assert order[5:] == sorted(order[5:], key=lambda t: (t.startswith("##"), t))
    same = [(a, b) for a in vocabs for b in vocabs if a is not b and set(a) == set(b)]
    assert same  # the small vocabularies stop before any tie
    assert all(a == b for a, b in same)
