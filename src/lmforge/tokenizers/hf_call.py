"""The Hugging Face-shaped surface of lmforge's `Tokenizer`: `tok(texts, padding=..., truncation=...,
return_tensors="pt")` returning input ids and attention masks, `batch_decode`, the `*_token_id` names and
`save_pretrained` / `from_pretrained`. Padding and truncation are the wrapped `tokenizers` backend's own, as in a
`transformers` fast tokenizer, so ids and masks match one built on the same tokenizer.json.

`to_transformers()` is the tokenizer as a `transformers.PreTrainedTokenizerFast` (tokenizers/hf_fast.py), and what
`transformers`' data collators and chat code call besides (`pad`, `get_special_tokens_mask`,
`convert_tokens_to_ids`, `apply_chat_template`, the `*_token` texts) is that tokenizer's, so the lmforge tokenizer
itself goes into `DataCollatorForLanguageModeling(tok)`, `DataCollatorWithPadding(tok)` and
`DataCollatorForSeq2Seq(tok)`. model_max_length (a checkpoint's: its model's max_seq_len) bounds truncation when no
max_length is given."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LMForgeError
from lmforge.tokenizers import hf_fast

Padding = bool | Literal["longest", "max_length", "do_not_pad"]
Truncation = bool | Literal["longest_first", "only_first", "only_second", "do_not_truncate"]
_CALL_ARGS = (
    "text, text_pair, add_special_tokens, padding, truncation, max_length, return_tensors, return_attention_mask, "
    "return_token_type_ids, padding_side"
)


class BatchEncoding(dict):
    """A tokenizer call's result: a dict (input_ids, attention_mask[, token_type_ids]) whose keys are also
    attributes, with `.to(device)` for tensors (as `transformers`' BatchEncoding)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device) -> BatchEncoding:
        """Move the tensors to `device` (in place, returning self)."""
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device)
        return self


def _padding_strategy(padding: Padding, max_length: int | None) -> int | None | Literal[False]:
    """False (no padding), None (to the longest) or the length to pad to."""
    if padding is False or padding == "do_not_pad":
        return False
    if padding is True or padding == "longest":
        return None
    if padding == "max_length":
        if max_length is None:
            raise LMForgeError("padding='max_length' needs max_length")
        return max_length
    raise LMForgeError(f"padding must be True, False, 'longest', 'max_length' or 'do_not_pad', got {padding!r}")


def _truncation_strategy(truncation: Truncation, max_length: int | None) -> str | None:
    if truncation is False or truncation == "do_not_truncate":
        return None
    strategy = "longest_first" if truncation is True else truncation
    if strategy not in ("longest_first", "only_first", "only_second"):
        raise LMForgeError(f"truncation must be True, False or a strategy name, got {truncation!r}")
    if max_length is None:
        raise LMForgeError("truncation needs max_length (lmforge tokenizers have no model_max_length)")
    return strategy


def _texts(text, text_pair) -> tuple[list, bool]:
    """(batch of inputs for the backend, whether a single text was given)."""
    single = isinstance(text, str)
    texts = [text] if single else list(text)
    if not all(isinstance(t, str) for t in texts):
        raise LMForgeError("a tokenizer call takes a string or a list of strings")
    if text_pair is None:
        return texts, single
    pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
    if len(pairs) != len(texts) or not all(isinstance(t, str) for t in pairs):
        raise LMForgeError(f"text_pair must match text: {len(texts)} text(s), {len(pairs)} pair(s)")
    return list(zip(texts, pairs)), single


def _as_tensors(enc: dict[str, list], return_tensors: str | None) -> dict[str, Any]:
    if return_tensors is None:
        return enc
    if return_tensors not in ("pt", "np"):
        raise LMForgeError(f"return_tensors must be 'pt', 'np' or None, got {return_tensors!r}")
    lengths = {len(row) for row in enc["input_ids"]}
    if len(lengths) > 1:
        raise LMForgeError(
            f"the texts have {min(lengths)} to {max(lengths)} tokens: pass padding=True to return them as tensors"
        )
    if return_tensors == "np":
        import numpy as np

        return {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()}
    import torch

    return {k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()}


class HFTokenizerMixin:
    """Hugging Face-shaped methods of `Tokenizer` (mixed into it); see the module docstring."""

    padding_side: Literal["left", "right"] = "right"
    """Where `tok(..., padding=True)` pads: right (training batches) or left (decoder prompts to generate from)."""
    truncation_side: Literal["left", "right"] = "right"
    model_max_length: int | None = None
    """The longest sequence the model takes (a checkpoint's max_seq_len); truncation=True alone cuts to it."""

    def __call__(
        self,
        text: str | Sequence[str],
        text_pair: str | Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        padding: Padding = False,
        truncation: Truncation = False,
        max_length: int | None = None,
        return_tensors: Literal["pt", "np"] | None = None,
        return_attention_mask: bool = True,
        return_token_type_ids: bool | None = None,
        padding_side: Literal["left", "right"] | None = None,
        **unsupported: Any,
    ) -> BatchEncoding:
        """Encode one text or a batch as `transformers` does: {"input_ids", "attention_mask"} (+ "token_type_ids"
        for text pairs or when asked), lists (one per text; flat for a single string) or, with return_tensors="pt",
        (B, T) tensors. add_special_tokens applies the tokenizer's post-processor (e.g. BERT's [CLS] ... [SEP]);
        `encode` never does."""
        if unsupported:
            names = ", ".join(sorted(unsupported))
            raise LMForgeError(f"the tokenizer call does not support {names} (it takes: {_CALL_ARGS})")
        batch, single = _texts(text, text_pair)
        if max_length is None and truncation not in (False, "do_not_truncate"):
            max_length = self.model_max_length  # as transformers: truncation bounded by the model's context
        pad_to = _padding_strategy(padding, max_length)
        strategy = _truncation_strategy(truncation, max_length)
        side = padding_side or self.padding_side
        with self._backend_options(pad_to, side, strategy, max_length):
            encs = self.backend.encode_batch(batch, add_special_tokens=add_special_tokens)  # type: ignore[attr-defined]
        out: dict[str, list] = {"input_ids": [e.ids for e in encs]}
        if return_token_type_ids or (return_token_type_ids is None and text_pair is not None):
            out["token_type_ids"] = [e.type_ids for e in encs]
        if return_attention_mask:
            out["attention_mask"] = [e.attention_mask for e in encs]
        if single and return_tensors is None:
            out = {k: v[0] for k, v in out.items()}
        return BatchEncoding(_as_tensors(out, return_tensors))

    @contextmanager
    def _backend_options(self, pad_to, side: str, strategy: str | None, max_length: int | None) -> Iterator[None]:
        """The backend's padding and truncation for one call, restored afterwards."""
        backend = self.backend  # type: ignore[attr-defined]
        if side not in ("left", "right"):
            raise LMForgeError(f"padding_side must be 'left' or 'right', got {side!r}")
        if pad_to is not False and self.pad_token_id is None:
            raise LMForgeError("this tokenizer has no pad token: set one first (e.g. tok.pad_token = tok.eos_token)")
        saved_pad, saved_trunc = backend.padding, backend.truncation
        try:
            if pad_to is False:
                backend.no_padding()
            else:
                backend.enable_padding(
                    direction=side, pad_id=self.pad_token_id, pad_token=self.pad_token, length=pad_to
                )
            if strategy is None:
                backend.no_truncation()
            else:
                backend.enable_truncation(max_length, strategy=strategy, direction=self.truncation_side)
            yield
        finally:
            backend.no_padding() if saved_pad is None else backend.enable_padding(**saved_pad)
            backend.no_truncation() if saved_trunc is None else backend.enable_truncation(**saved_trunc)

    def __len__(self) -> int:
        return self.vocab_size  # type: ignore[attr-defined]

    def batch_decode(self, sequences: Iterable[Iterable[int]], skip_special_tokens: bool = True) -> list[str]:
        """Texts of several id sequences (lists, or the rows of a (B, T) tensor); as `decode_batch`."""
        return self.decode_batch(sequences, skip_special_tokens=skip_special_tokens)  # type: ignore[attr-defined]

    # Hugging Face's names of the special tokens: ids, and texts (None when the tokenizer has no such token).
    @property
    def pad_token_id(self) -> int | None:
        return self.pad_id  # type: ignore[attr-defined]

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_id  # type: ignore[attr-defined]

    @property
    def bos_token_id(self) -> int | None:
        return self.bos_id  # type: ignore[attr-defined]

    @property
    def unk_token_id(self) -> int | None:
        return self.unk_id  # type: ignore[attr-defined]

    @property
    def mask_token_id(self) -> int | None:
        return self.mask_id  # type: ignore[attr-defined]

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens.get("pad")  # type: ignore[attr-defined]

    @pad_token.setter
    def pad_token(self, token: str) -> None:
        """Make `token` (already in the vocabulary, e.g. the EOS token) the padding token."""
        self.set_special_token("pad", token)  # type: ignore[attr-defined]

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens.get("eos")  # type: ignore[attr-defined]

    @property
    def bos_token(self) -> str | None:
        return self.special_tokens.get("bos")  # type: ignore[attr-defined]

    def save_pretrained(self, save_directory: str | os.PathLike) -> tuple[str, ...]:
        """Write the tokenizer files into `save_directory` (`save`, plus the tokenizer_config.json that
        `AutoTokenizer.from_pretrained` reads); the lmforge files written, as `transformers` returns its paths."""
        out = self.save(save_directory)  # type: ignore[attr-defined]
        hf_fast.write_tokenizer_config(self, Path(out))
        return tuple(str(p) for p in sorted(Path(out).iterdir()) if p.name in self._FILES)  # type: ignore[attr-defined]

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike):
        """The tokenizer of a local tokenizer dir, Hugging Face model dir, checkpoint dir or run dir (its best
        checkpoint when it selected one, else its newest)."""
        path = Path(path)
        if path.is_dir() and not (path / "tokenizer.json").is_file():
            from lmforge.checkpoint.verify import latest_checkpoint

            best = path / "best"
            path = best if (best / "tokenizer.json").is_file() else latest_checkpoint(path)
        return cls.load(path)  # type: ignore[attr-defined]

    # ------------------------------------------------------------ as a transformers tokenizer (hf_fast.py)
    @property
    def chat_template(self) -> str | None:
        """Jinja chat template of `apply_chat_template`: lmforge's chat format (hf_fast.CHAT_TEMPLATE) for a
        decoder's tokenizer (a decoder checkpoint's, or a GPT / Llama family's), else None until set."""
        if "_chat_template" in self.__dict__:
            return self.__dict__["_chat_template"]
        return hf_fast.CHAT_TEMPLATE if self.family in hf_fast.DECODER_FAMILIES else None  # type: ignore[attr-defined]

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        self.__dict__["_chat_template"] = template

    def set_context(self, context: dict[str, Any]) -> None:
        """Take model_max_length, chat_template and padding_side from `context` (hf_fast.read_context)."""
        side = context.get("padding_side", self.padding_side)
        if side not in ("left", "right"):
            raise LMForgeError(f"padding_side must be 'left' or 'right', got {side!r}")
        self.padding_side = side
        self.model_max_length = context.get("model_max_length", self.model_max_length)
        if "chat_template" in context:
            self.chat_template = context["chat_template"]

    def to_transformers(self):
        """This tokenizer as a `transformers.PreTrainedTokenizerFast` (special tokens, model_max_length, padding
        side, chat template); the same object until one of those or the vocabulary changes."""
        key = (
            self.vocab_size, tuple(sorted(self.special_tokens.items())), self.padding_side,  # type: ignore[attr-defined]
            self.truncation_side, self.model_max_length, self.chat_template,
        )  # fmt: skip
        cached = self.__dict__.get("_hf_fast")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_hf_fast"] = (key, hf_fast.to_transformers(self))
        return cached[1]

    def pad(self, *args: Any, **kwargs: Any):
        """Pad encoded examples into a batch, as `transformers`' `tokenizer.pad` (collators call it)."""
        return self.to_transformers().pad(*args, **kwargs)

    def get_special_tokens_mask(self, *args: Any, **kwargs: Any) -> list[int]:
        return self.to_transformers().get_special_tokens_mask(*args, **kwargs)

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        return self.to_transformers().convert_tokens_to_ids(tokens)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        return self.to_transformers().convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, conversation, **kwargs: Any):
        """Render (and by default tokenize) a conversation with `chat_template`, as `transformers` does."""
        return self.to_transformers().apply_chat_template(conversation, **kwargs)

    @property
    def is_fast(self) -> bool:
        return True  # a Rust `tokenizers` backend, offsets included

    @property
    def all_special_ids(self) -> list[int]:
        return self.to_transformers().all_special_ids

    @property
    def mask_token(self) -> str | None:
        return self.special_tokens.get("mask")  # type: ignore[attr-defined]

    @property
    def unk_token(self) -> str | None:
        return self.special_tokens.get("unk")  # type: ignore[attr-defined]

    @property
    def cls_token(self) -> str | None:
        return self.special_tokens.get("cls")  # type: ignore[attr-defined]

    @property
    def sep_token(self) -> str | None:
        return self.special_tokens.get("sep")  # type: ignore[attr-defined]
