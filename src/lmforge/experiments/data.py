"""One tokenizer and one prepared corpus for many arms, so that their losses count the same tokens: trained and
prepared once in the experiment's or sweep's `shared/` dir unless data.tokenizer and data.prepared name them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from lmforge.errors import LMForgeError
from lmforge.progress import status


def tokenizer_family(cfg) -> str:
    """The special-token family of a tokenizer trained for a pretraining Config (data.tokenizer_family, else the
    model architecture's)."""
    from lmforge.tokenizers.specials import FAMILY_BY_ARCH

    return cfg.data.tokenizer_family or FAMILY_BY_ARCH[cfg.model.arch]


def data_key(cfg, vocab_size: int | None = None) -> str:
    """A short directory name that differs whenever the data a Config trains on would: tokenizer kind, family
    and size, inputs, split and cleaning."""
    d = dataclasses.asdict(cfg.data)
    earlier = (("text_field", "text"), ("tokenizer_sample_chars", None), ("decontaminate", []), ("decontaminate_n", 8))
    for key, default in earlier:  # keys of earlier experiments
        if d.get(key) == default:
            d.pop(key)
    d["tokenizer_family"] = tokenizer_family(cfg)
    d["vocab_size"] = vocab_size or cfg.data.vocab_size
    d["seed"] = cfg.run.seed
    digest = hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]
    if cfg.data.tokenizer:
        return f"tokenizer-{digest}"
    return f"{cfg.data.tokenizer_kind}-{d['tokenizer_family']}-{d['vocab_size']}-{digest}"


def shared_data(cfg, dest: Path, vocab_size: int | None = None) -> dict[str, Any]:
    """Overrides pointing a pretraining Config at one tokenizer and one prepared corpus, made in `dest` if needed
    (`vocab_size`: of a tokenizer trained here, default data.vocab_size). `train_tokens` in the result is the
    corpus's training-split size, not an override."""
    from lmforge.data.corpus.bundled import load_default_corpus
    from lmforge.data.corpus.prepare import prepare
    from lmforge.data.corpus.readers import read_documents, resolve_sources
    from lmforge.tokenizers import Tokenizer, train_tokenizer
    from lmforge.tokenizers.published import load_tokenizer

    d = cfg.data
    if d.prepared and not d.tokenizer:
        from lmforge.data.corpus.prepare import prepared_tokenizer

        d.tokenizer = prepared_tokenizer(d.prepared)
    # The input files, found once (a missing input stops the experiment before anything is trained).
    inputs = resolve_sources(d.inputs) if d.inputs else None
    if d.tokenizer:  # a path, or a published tokenizer's name (gpt2), as `lmforge pretrain` takes it
        tok_spec, tok = d.tokenizer, load_tokenizer(d.tokenizer)
    else:
        tok_dir = dest / "tokenizer"
        if not (tok_dir / "tokenizer.json").is_file():
            status(f"training the shared tokenizer in {tok_dir}")
            texts = load_default_corpus() if inputs is None else list(read_documents(inputs, d.text_field))
            trained = train_tokenizer(texts, d.tokenizer_kind, vocab_size or d.vocab_size, family=tokenizer_family(cfg),
                                      size_key="data.vocab_size", frequency_key=None,
                                      sample_chars=d.tokenizer_sample_chars, cache=True)  # fmt: skip
            trained.save(tok_dir)
        tok_spec, tok = str(tok_dir), Tokenizer.load(tok_dir)
    data = Path(d.prepared) if d.prepared else dest / "data"
    if not (data / "meta.json").is_file():
        if d.prepared:
            raise LMForgeError(f"data.prepared: {data} is not a prepared data dir (no meta.json)")
        status(f"preparing the shared corpus in {data}")
        prepare(inputs, data, tok, val_fraction=d.val_fraction, clean=d.clean, seed=cfg.run.seed,
                tokenizer_source=tok_spec, text_field=d.text_field, decontaminate=d.decontaminate,
                decontaminate_n=d.decontaminate_n)  # fmt: skip
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    return {
        "data.tokenizer": tok_spec, "data.prepared": str(data), "model.vocab_size": tok.vocab_size,
        "train_tokens": int(meta["train"]["n_tokens"]),
    }  # fmt: skip
