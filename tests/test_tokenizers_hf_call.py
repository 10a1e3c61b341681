"""A callable lmforge tokenizer: ids and attention masks as a transformers fast tokenizer returns them."""

from __future__ import annotations

import re

import pytest
import torch
import transformers
from test_tokenizers import trained

from lmforge.errors import LMForgeError
from lmforge.tokenizers import Tokenizer

TEXTS = ["It is a truth universally acknowledged.", "My dear Mr. Bennet, have you heard that Netherfield Park is let?"]


def _reference(tok: Tokenizer, tmp_path) -> transformers.PreTrainedTokenizerFast:
    tok.save(tmp_path)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"), pad_token=tok.pad_token
    )


@pytest.mark.parametrize("case", [("wordpiece", "bert", 300), ("bpe", "bart", 400)], ids=["bert", "bart"])
def test_call_matches_a_transformers_fast_tokenizer(case, tmp_path) -> None:
    tok = trained(*case)
    ref = _reference(tok, tmp_path)
    kw = dict(padding=True, truncation=True, max_length=12, return_tensors="pt")
    ours, theirs = tok(TEXTS, **kw), ref(TEXTS, **kw)
    assert torch.equal(ours["input_ids"], theirs["input_ids"]) and ours.input_ids.shape == (2, 12)
    assert torch.equal(ours.attention_mask, theirs["attention_mask"])
    pair = tok(TEXTS[0], TEXTS[1])
    assert pair == dict(ref(TEXTS[0], TEXTS[1], return_token_type_ids=True))  # a pair's token_type_ids too
    left = tok(TEXTS, padding="longest", padding_side="left", return_tensors="pt")
    assert left.attention_mask[0, 0] == 0 and left.attention_mask[:, -1].all()
    assert tok(TEXTS[0], add_special_tokens=False)["input_ids"] == tok.encode(TEXTS[0])
    assert tok.batch_decode(ours.input_ids) == tok.decode_batch(ours.input_ids.tolist())
    assert tok.backend.padding is None and tok.backend.truncation is None  # the call's options do not stick


def test_pad_token_can_be_set_and_save_pretrained_round_trips(tmp_path) -> None:
    tok = Tokenizer.load(_saved(trained("bpe", "llama", 400), tmp_path / "a"))
    assert len(tok) == 400 and tok.eos_token == "</s>"
    tok.pad_token = tok.eos_token
    assert tok.pad_token_id == tok.eos_token_id == 2
    files = tok.save_pretrained(tmp_path / "b")
    assert sorted(p.rsplit("/", 1)[1] for p in files) == ["lmforge_tokenizer.json", "tokenizer.json"]
    assert Tokenizer.from_pretrained(tmp_path / "b").pad_token == "</s>"


def _saved(tok: Tokenizer, path):
    tok.save(path)
    return path


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"return_tensors": "pt"}, r"the texts have \d+ to \d+ tokens: pass padding=True to return them as tensors$"),
        ({"truncation": True}, r"truncation needs max_length \(lmforge tokenizers have no model_max_length\)$"),
        ({"padding": "max_length"}, r"padding='max_length' needs max_length$"),
        (
            {"return_offsets_mapping": True},
            r"the tokenizer call does not support return_offsets_mapping \(it takes: text, text_pair,",
        ),
        ({"return_tensors": "tf"}, r"return_tensors must be 'pt', 'np' or None, got 'tf'$"),
    ],
)
def test_call_errors_are_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(LMForgeError) as e:
        trained("wordpiece", "bert", 300)(TEXTS, **kwargs)
    assert re.match(message, str(e.value))


def test_padding_needs_a_pad_token() -> None:
    tok = trained("bpe", "llama", 400)
    tok = Tokenizer(tok.backend, {k: v for k, v in tok.special_tokens.items() if k != "pad"}, tok.family)
    with pytest.raises(LMForgeError, match=r"^this tokenizer has no pad token: set one first"):
        tok(TEXTS, padding=True)
