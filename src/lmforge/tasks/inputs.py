"""Input transformations shared by the task types: how one or two texts become one token sequence.

- "gpt" (Radford et al. 2018 §3.3, Fig. 1): `<|start|> A <|delim|> B <|extract|>`; the three tokens are added
  to the tokenizer and the embedding table grows (`add_task_tokens`); the head reads the extract token.
- "bert" (Devlin et al. 2019 §3): `[CLS] A [SEP] B [SEP]` with segment ids 0…0 1…1 (RoBERTa/BART tokenizers:
  `<s> A </s></s> B </s>`; T5: `A </s> B </s>`); the head reads the first token (or BERT's pooler).
  On an encoder-decoder it runs the encoder alone.
- "encoder_mean": the "bert" framing, mean of the encoder's hidden states over real tokens (T5/BART encoders).
- "bart" (Lewis et al. 2020 §3.1): the same sequence into encoder and decoder (the decoder's prefixed with its
  start token); the head reads the decoder's last token (the final EOS, which has seen the whole input).
- "prompt" (PET / LM-BFF; classification on encoders with an LM head): the "bert" framing of the text inside a
  template with a mask token; the LM head scores each label's word at the mask (tasks/prompt.py).

Batches are right-padded; `collate` builds attention masks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.init import token_embedding_std

Format = Literal["auto", "gpt", "bert", "encoder_mean", "bart", "prompt"]
GPT_TOKENS = ("<|start|>", "<|delim|>", "<|extract|>")

# The token whose hidden state a sequence-level head reads, per format.
POOL_BY_FORMAT = {"gpt": "last", "bert": "first", "encoder_mean": "mean", "bart": "last"}


# "auto" format by model.arch (encoder-decoders: by the tokenizer, see `resolve_format`).
AUTO_FORMAT = {"decoder": "gpt", "encoder": "bert"}


def resolve_format(fmt: str, arch: str, tokenizer) -> str:
    """The concrete format for `fmt` ("auto": gpt for decoders, bert for encoders, bart for encoder-decoders with
    a BOS token (BART), encoder_mean otherwise (T5)); raises for a format the architecture cannot run."""
    if fmt == "auto":
        return AUTO_FORMAT.get(arch) or ("bart" if tokenizer.bos_id is not None else "encoder_mean")
    allowed = {"gpt": ("decoder",), "bart": ("encoder-decoder",), "prompt": ("encoder",)}.get(
        fmt, ("encoder", "encoder-decoder")
    )
    if arch not in allowed:
        raise LMForgeError(f"task.format '{fmt}' needs a model of arch {' or '.join(allowed)}, got '{arch}'")
    return fmt


# --- vocabulary growth ---------------------------------------------------------------------------------------


@torch.no_grad()
def resize_embeddings(model: nn.Module, vocab_size: int, reinit: list[int] | None = None) -> None:
    """Grow the token embedding table (and an untied or biased LM head) of a `Transformer` to `vocab_size` rows;
    a smaller `vocab_size` leaves the model as it is.

    New rows, and the rows listed in `reinit`, are drawn like the model's own token embedding
    (`models.init.token_embedding_std`); a new LM head bias is zero (`resize_token_embeddings` without
    mean_resizing: task tokens are new symbols, not averages of the old ones)."""
    cfg = model.config
    if vocab_size > cfg.vocab_size:
        model.resize_token_embeddings(vocab_size, mean_resizing=False)
    std = token_embedding_std(cfg)
    for i in reinit or []:
        model.tok_emb.weight[i].normal_(0.0, std)
        if cfg.lm_head and not cfg.tie_embeddings:
            model.lm_head.weight[i].normal_(0.0, std)


def add_task_tokens(model: nn.Module, tokenizer, tokens: tuple[str, ...] = GPT_TOKENS) -> list[int]:
    """Add special tokens to the tokenizer (those it lacks), grow the model to fit, initialise the new rows;
    returns the tokens' ids."""
    import tokenizers

    missing = [t for t in tokens if tokenizer.token_to_id(t) is None]
    if missing:
        added = [tokenizers.AddedToken(t, special=True, normalized=False) for t in missing]
        tokenizer.backend.add_special_tokens(added)
    ids = [tokenizer.token_to_id(t) for t in tokens]
    new_ids = [tokenizer.token_to_id(t) for t in missing]
    resize_embeddings(model, max(model.config.vocab_size, tokenizer.vocab_size), reinit=new_ids)
    return ids


# --- framing -------------------------------------------------------------------------------------------------


def truncate_pair(a: list[int], b: list[int] | None, budget: int) -> tuple[list[int], list[int] | None]:
    """Drop tokens from the end of the longer text until both fit in `budget` tokens (longest first; the second
    text on a tie, as Hugging Face tokenizers do)."""
    if budget < (2 if b is not None else 1):
        raise LMForgeError(f"task.max_len leaves room for only {max(budget, 0)} text tokens")
    if b is None:
        return a[:budget], None
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb]


@dataclass
class Framer:
    """Frames token ids of one text (or a pair) as model input for a format: `(ids, segment_ids)`."""

    start: list[int]
    """Tokens before A (GPT start, [CLS], <s>, or none)."""
    mid: list[int]
    """Tokens between A and B (GPT delimiter, [SEP], </s></s>)."""
    end: list[int]
    """Tokens after the last text (GPT extract, [SEP], </s>)."""
    segments: bool = False
    """Whether B's part gets segment id 1 (models with two token types)."""

    def n_special(self, pair: bool) -> int:
        return len(self.start) + len(self.end) + (len(self.mid) if pair else 0)

    def frame(self, a: list[int], b: list[int] | None = None, max_len: int | None = None) -> tuple[list, list]:
        """Token ids and segment ids of `a` (+ `b`), truncated (longest first) to max_len tokens in all."""
        if max_len is not None:
            a, b = truncate_pair(a, b, max_len - self.n_special(b is not None))
        first = self.start + a + (self.mid if b is not None else [])
        if b is None:
            ids = first + self.end
            return ids, [0] * len(ids)
        second = b + self.end
        seg = 1 if self.segments else 0
        # BERT: [CLS] A [SEP] is segment 0, B [SEP] segment 1.
        return first + second, [0] * len(first) + [seg] * len(second)


def make_framer(fmt: str, tokenizer, type_vocab_size: int = 0) -> Framer:
    """The framer of a resolved format; "gpt" expects `add_task_tokens` to have run."""
    if fmt == "gpt":
        ids = [tokenizer.token_to_id(t) for t in GPT_TOKENS]
        if any(i is None for i in ids):
            raise LMForgeError("the tokenizer lacks the GPT task tokens (add_task_tokens was not applied)")
        return Framer([ids[0]], [ids[1]], [ids[2]])
    cls = tokenizer.cls_id if tokenizer.cls_id is not None else tokenizer.bos_id
    sep = tokenizer.sep_id if tokenizer.sep_id is not None else tokenizer.eos_id
    start = [cls] if cls is not None else []
    end = [sep] if sep is not None else []
    # RoBERTa / BART separate the two texts with a doubled </s> (fairseq's sentence-pair convention).
    mid = end * 2 if tokenizer.family == "bart" else end
    return Framer(start, mid, end, segments=type_vocab_size >= 2)


# --- batching ------------------------------------------------------------------------------------------------

PAD_KEYS = ("input_ids", "decoder_input_ids")
ZERO_KEYS = ("token_type_ids",)


def _pad_rows(rows: list[list], value: int, length: int) -> list[list]:
    return [r + [value] * (length - len(r)) for r in rows]


def _pad_seqs(values: list, pad: int) -> tuple[Tensor, Tensor]:
    """Pad (B, T) or (B, N, T) nested lists to a tensor and its mask (1 = real). Rows of a multi-sequence example
    with fewer sequences than the batch maximum get one-token dummy sequences (mask 1 on that token)."""
    if values and values[0] and isinstance(values[0][0], list):
        n = max(len(v) for v in values)
        t = max(len(s) for v in values for s in v)
        data, mask = [], []
        for v in values:
            seqs = v + [[pad]] * (n - len(v))
            data.append(_pad_rows(seqs, pad, t))
            mask.append(_pad_rows([[1] * len(s) for s in seqs], 0, t))
        return torch.tensor(data), torch.tensor(mask)
    t = max(len(v) for v in values)
    return torch.tensor(_pad_rows(values, pad, t)), torch.tensor(_pad_rows([[1] * len(v) for v in values], 0, t))


def collate(features: list[dict], pad_id: int) -> dict[str, Tensor]:
    """Right-pad a list of feature dicts into a batch. Sequence keys: input_ids / decoder_input_ids (pad_id, and
    an attention mask each), token_type_ids (0), any other list (-100, e.g. labels). Scalars become tensors;
    keys starting with "_" are bookkeeping and left out."""
    batch: dict[str, Tensor] = {}
    for key in features[0]:
        if key.startswith("_"):
            continue
        values = [f[key] for f in features]
        if isinstance(values[0], list):
            pad = pad_id if key in PAD_KEYS else 0 if key in ZERO_KEYS else -100
            batch[key], mask = _pad_seqs(values, pad)
            if key in PAD_KEYS:
                batch["attention_mask" if key == "input_ids" else "decoder_attention_mask"] = mask
            if key == "input_ids" and batch[key].dim() == 3:
                batch["n_seqs"] = torch.tensor([len(v) for v in values])
        else:
            batch[key] = torch.tensor(values)
    return batch


LENGTH_POOL = 50
"""Batches per pool that `length_grouped` sorts by length."""


def length_grouped(order: list[int], lengths: list[int], batch_size: int, generator: torch.Generator) -> list[int]:
    """A shuffled order regrouped so that each batch holds examples of similar length, and pads little: the order
    cut into pools of LENGTH_POOL batches, each pool sorted longest first and cut into batches, then the batches
    (all but a last, short one) shuffled. Each entry of `order` is kept once; batches stay batch_size."""
    pool = batch_size * LENGTH_POOL
    cut: list[list[int]] = []
    for i in range(0, len(order), pool):
        part = sorted(order[i : i + pool], key=lambda j: -lengths[j])
        cut += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    last = [cut.pop()] if cut and len(cut[-1]) < batch_size else []
    cut = [cut[k] for k in torch.randperm(len(cut), generator=generator).tolist()] + last
    return [j for b in cut for j in b]


def feature_length(feature: dict) -> int:
    """Tokens a feature takes in a padded batch: its input (all of a multi-sequence example's rows at their longest)
    and decoder sequences."""
    n = 0
    for key in PAD_KEYS:
        v = feature.get(key)
        if v:
            n += len(v) * max(len(s) for s in v) if isinstance(v[0], list) else len(v)
    return n


def eval_batches(features: list[dict], batch_size: int):
    """(positions, features) of batches of up to batch_size in order of length, longest first, so that a pass
    over a split pads little and fails early if memory is short; callers put the results back by position."""
    order = sorted(range(len(features)), key=lambda j: -feature_length(features[j]))
    for i in range(0, len(order), batch_size):
        idx = order[i : i + batch_size]
        yield idx, [features[j] for j in idx]
