"""The lmforge tokenizer in Hugging Face code: `transformers`' data collators take it as they take a fast tokenizer
(the same batches as `AutoTokenizer` built on its saved files), `to_transformers()` is that fast tokenizer,
model_max_length comes from the model's context and decoders get lmforge's chat template."""

from __future__ import annotations

import pytest
import tasks_testing as T
import torch
import transformers
from transformers import (
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorWithPadding,
)

from lmforge.align.templates import ChatTemplate, Conversation, Message
from lmforge.tokenizers import Tokenizer
from lmforge.tokenizers.hf_fast import CHAT_TEMPLATE

TEXTS = T.TEXTS[:4]
CHAT = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Who wants a wife?"},
    {"role": "assistant", "content": "A single man in possession of a good fortune."},
]


def _auto(tok: Tokenizer, path) -> transformers.PreTrainedTokenizerBase:
    """The `transformers` tokenizer that AutoTokenizer builds from `tok`'s saved files."""
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _examples(tok: Tokenizer) -> list[dict]:
    return [{"input_ids": ids} for ids in tok(TEXTS)["input_ids"]]  # unpadded rows of several lengths


# ----------------------------------------------------------------------------- data collators
def test_causal_lm_collator_pads_and_masks_the_padding(tmp_path) -> None:
    tok = T.tokenizer("gpt")
    rows = _examples(tok)
    batch = DataCollatorForLanguageModeling(tok, mlm=False)(rows)
    longest = max(len(r["input_ids"]) for r in rows)
    assert batch["input_ids"].shape == (4, longest) and batch["attention_mask"].sum(1).tolist() == [
        len(r["input_ids"]) for r in rows
    ]
    real = batch["attention_mask"].bool()
    assert (batch["labels"][~real] == -100).all() and torch.equal(batch["labels"][real], batch["input_ids"][real])
    _same(batch, DataCollatorForLanguageModeling(_auto(tok, tmp_path), mlm=False)(rows))
    plain = DataCollatorForLanguageModeling(tok, mlm=False)([r["input_ids"] for r in rows])  # lists of ids
    assert torch.equal(plain["input_ids"], batch["input_ids"])


def test_masked_lm_collator_never_masks_special_tokens(tmp_path) -> None:
    tok = T.tokenizer("bert")
    rows = _examples(tok)
    batch = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.5, seed=3)(rows)
    padded = tok.pad(rows, return_tensors="pt")["input_ids"]
    special = torch.isin(padded, torch.tensor([tok.cls_id, tok.sep_id, tok.pad_id]))
    chosen = batch["labels"] != -100
    assert chosen.sum() > 10 and not (chosen & special).any()
    assert torch.equal(batch["labels"][chosen], padded[chosen])
    assert (batch["input_ids"][chosen] == tok.mask_token_id).float().mean() > 0.5  # 80% [MASK]
    assert torch.equal(batch["input_ids"][~chosen], padded[~chosen])
    hf = DataCollatorForLanguageModeling(_auto(tok, tmp_path), mlm=True, mlm_probability=0.5, seed=3)(rows)
    _same(batch, hf)


def test_padding_collator_pads_to_a_multiple_and_on_the_tokenizers_side(tmp_path) -> None:
    tok = T.tokenizer("bert")
    rows = _examples(tok)
    batch = DataCollatorWithPadding(tok, pad_to_multiple_of=8)(rows)
    mask = batch["attention_mask"]
    assert batch["input_ids"].shape[1] % 8 == 0 and (batch["input_ids"][mask == 0] == tok.pad_id).all()
    assert mask.sum(1).tolist() == [len(r["input_ids"]) for r in rows] and (mask[:, 0] == 1).all()
    _same(batch, DataCollatorWithPadding(_auto(tok, tmp_path), pad_to_multiple_of=8)(rows))
    tok.padding_side = "left"
    left = DataCollatorWithPadding(tok)(rows)
    assert (left["attention_mask"][:, -1] == 1).all() and (left["attention_mask"][:, 0] == 0).any()


def test_seq2seq_collator_pads_labels_and_shifts_them_for_the_decoder() -> None:
    tok = T.tokenizer("t5")
    model = T.model("t5-tiny", tok)
    rows = [{"input_ids": s, "labels": t} for s, t in zip(tok(TEXTS)["input_ids"], tok(TEXTS[::-1])["input_ids"])]
    batch = DataCollatorForSeq2Seq(tok, model=model)(rows)
    n = [len(r["labels"]) for r in rows]
    assert [int((row != -100).sum()) for row in batch["labels"]] == n
    assert torch.equal(batch["decoder_input_ids"][:, 0], torch.full((4,), model.config.decoder_start_id))
    assert torch.equal(batch["decoder_input_ids"], model.prepare_decoder_input_ids_from_labels(batch["labels"]))
    with torch.no_grad():
        loss = model(**batch).loss
        same = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"]).loss
    torch.testing.assert_close(loss, same)


# ----------------------------------------------------------------------------- the transformers tokenizer
def test_to_transformers_is_the_same_tokenizer() -> None:
    tok = T.tokenizer("t5")
    hf = tok.to_transformers()
    assert isinstance(hf, transformers.PreTrainedTokenizerFast) and hf is tok.to_transformers()
    assert (hf.eos_token, hf.pad_token, hf.unk_token) == (tok.eos_token, tok.pad_token, tok.unk_token)
    assert hf.extra_special_tokens == [f"<extra_id_{i}>" for i in range(tok.num_sentinels)]
    assert hf(TEXTS)["input_ids"] == tok(TEXTS)["input_ids"] and len(hf) == len(tok)
    tok.pad_token = tok.eos_token
    assert tok.to_transformers() is not hf and tok.to_transformers().pad_token == tok.eos_token


def test_model_max_length_and_padding_side_come_from_the_model(tmp_path) -> None:
    tok = T.tokenizer("gpt")
    model = T.model("gpt-tiny", tok)
    model.save_pretrained(tmp_path / "ckpt", tokenizer=tok)
    back = Tokenizer.from_pretrained(tmp_path / "ckpt")
    assert back.model_max_length == model.config.max_seq_len == 128
    assert back.to_transformers().model_max_length == 128
    long = " ".join(TEXTS * 4)
    assert len(back(long, truncation=True)["input_ids"]) == 128  # truncation=True alone: the model's context
    back.padding_side, back.model_max_length = "left", 64
    again = Tokenizer.load(_saved(back, tmp_path / "tok"))
    assert (again.padding_side, again.model_max_length) == ("left", 64)
    auto = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert (auto.padding_side, auto.model_max_length, auto.eos_token) == ("left", 64, tok.eos_token)
    assert auto(TEXTS)["input_ids"] == back(TEXTS)["input_ids"]


def _saved(tok: Tokenizer, path):
    tok.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- chat template
def test_chat_template_renders_lmforges_chat_format() -> None:
    tok = T.tokenizer("gpt")
    conv = Conversation([Message(m["role"], m["content"]) for m in CHAT])
    template = ChatTemplate(tok)
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.apply_chat_template(CHAT, return_dict=False) == template.encode(conv).input_ids
    prompt = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, return_dict=False)
    assert prompt == template.prompt_ids(conv)
    text = tok.apply_chat_template(CHAT[:2], add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>\nAnswer briefly.<|endoftext|><|user|>\nWho wants a wife?<|endoftext|><|assistant|>\n"


def test_only_decoders_get_a_chat_template(tmp_path) -> None:
    bert = T.tokenizer("bert")
    assert bert.chat_template is None
    T.model("bert-tiny", bert).save_pretrained(tmp_path / "enc", tokenizer=bert)
    assert Tokenizer.from_pretrained(tmp_path / "enc").chat_template is None
    gpt = T.tokenizer("gpt")
    T.model("gpt-tiny", gpt).save_pretrained(tmp_path / "hf", tokenizer=gpt, format="hf")
    auto = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert auto.chat_template == CHAT_TEMPLATE and auto.model_max_length == 128
    assert auto.apply_chat_template(CHAT, return_dict=False) == gpt.apply_chat_template(CHAT, return_dict=False)
    with pytest.raises(ValueError, match="chat_template"):
        bert.apply_chat_template(CHAT)
