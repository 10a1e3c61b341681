"""Helpers for the task, fine-tuning and zero-shot tests: tiny tokenizers of each family, tiny models sized to them,
and small labelled sets built from real sentences."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import torch
from tokenizer_corpus import AUSTEN, GETTYSBURG

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.models import Transformer, get_preset
from lmforge.tokenizers import Tokenizer, train_tokenizer

TEXTS = [p.strip() for p in (AUSTEN + "\n\n" + GETTYSBURG).split("\n\n") if p.strip()]
KIND = {"gpt": "bpe", "bert": "wordpiece", "bart": "bpe", "t5": "unigram"}


@cache
def _trained(family: str) -> tuple[str, dict, str | None]:
    """(tokenizer.json text, roles, family) of a tiny tokenizer of `family` (cached; tests get fresh copies)."""
    vocab = {"gpt": 400, "bart": 400, "bert": 300, "t5": 320}[family]
    tok = train_tokenizer(TEXTS * 4, KIND[family], vocab, family=family, min_frequency=1)
    return tok.backend.to_str(), tok.special_tokens, tok.family


def tokenizer(family: str = "gpt") -> Tokenizer:
    """A fresh tiny tokenizer of a family (fresh: the GPT task tokens get added to it)."""
    import tokenizers

    text, roles, fam = _trained(family)
    return Tokenizer(tokenizers.Tokenizer.from_str(text), roles, fam)


def model(preset: str, tok: Tokenizer, seed: int = 0, **kw) -> Transformer:
    """A randomly initialised preset sized to the tokenizer, without dropout."""
    torch.manual_seed(seed)
    cfg = get_preset(preset, vocab_size=tok.vocab_size, dropout=0.0, attn_dropout=0.0, **kw)
    if tok.pad_id is not None:
        cfg.pad_id = tok.pad_id
    return Transformer(cfg)


POSITIVE = ["good", "great", "wonderful", "excellent", "delightful"]
NEGATIVE = ["bad", "awful", "terrible", "dull", "tedious"]


def sentiment(n: int, seed: int = 0) -> Dataset:
    """Real sentences (Austen, Gettysburg) with one sentiment word inserted: labels negative/positive."""
    g = torch.Generator().manual_seed(seed)
    sentences = [s.strip() for t in TEXTS for s in t.split(".") if len(s.split()) > 4]
    out = []
    for i in range(n):
        s = sentences[int(torch.randint(len(sentences), (1,), generator=g))].split()[:12]
        pos = bool(torch.randint(2, (1,), generator=g))
        words = POSITIVE if pos else NEGATIVE
        s.insert(int(torch.randint(len(s), (1,), generator=g)), words[int(torch.randint(5, (1,), generator=g))])
        out.append(Example(text=" ".join(s), label="positive" if pos else "negative", id=str(i)))
    return Dataset(out, ["negative", "positive"], "sentiment-test")


def write_labelled_dir(root: Path, splits: dict[str, Dataset]) -> Path:
    """A labelled-set dir (meta.json + split.jsonl) that `data.source=dir` reads."""
    from lmforge.data.labelled.readers import example_to_dict

    root.mkdir(parents=True, exist_ok=True)
    labels = next(iter(splits.values())).labels
    meta = {"labels": labels, "task_type": "classification", "splits": list(splits)}
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    for name, ds in splits.items():
        lines = [json.dumps(example_to_dict(e)) + "\n" for e in ds.examples]
        (root / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    return root


def pretrain_tiny(d: Path, recipe: str, preset: str, steps: int, *extra: str) -> Path:
    """`lmforge pretrain RECIPE` of PRESET for `steps` steps of 8 × 32 tokens on public-domain text in dir d (its
    tokenizer, of 400 tokens, trained by the run) → the run dir."""
    from lmforge.api import pretrain

    (d / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 3), encoding="utf-8")
    over = [f"--run.dir={d / 'run'}", f"--data.inputs=[{d / 'docs.jsonl'}]", "--data.vocab_size=400",
            f"--model.preset={preset}", "--train.batch_size=8", "--train.seq_len=32", f"--train.max_steps={steps}",
            "--train.warmup_steps=4", f"--train.eval_every={steps}", f"--train.save_every={steps}",
            f"--train.log_every={steps}", "--data.val_fraction=0.1", *extra]  # fmt: skip
    pretrain(recipe, over)
    return d / "run"
