"""Hugging Face training habits of `Transformer` (a base of models/transformer.py's, beside the network):
`generation_config`, `resize_token_embeddings`, activation (gradient) checkpointing,
`prepare_decoder_input_ids_from_labels` (what `DataCollatorForSeq2Seq(model=...)` calls) and the tied-weight names
`transformers.Trainer` reads when it loads a checkpoint back.

The generation config is a `transformers.GenerationConfig` built on first use (transformers is an optional
dependency: a model nobody asks for one needs none). `model.generate` takes its defaults from it, as `transformers`
does: what a call passes wins, then the config, then the library's own defaults."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models.init import token_embedding_std

GENERATION_CONFIG = "generation_config.json"
_CONFIG, _PENDING_IDS = "_generation_config", "_generation_token_ids"
"""Where a model keeps its generation config, and the tokenizer ids given for it before it exists: the config (and
the transformers import it needs, ~0.5 s) is made when first read, not when a loaded model is given its tokenizer's
ids (every `lmforge finetune` and `lmforge eval` process loads a model)."""
IGNORE_INDEX = -100
"""Label value that takes no part in the loss (Hugging Face's and PyTorch's convention)."""

GENERATE_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": None, "max_length": None, "do_sample": False, "temperature": 1.0, "top_k": None,
    "top_p": None, "num_beams": 1, "length_penalty": 1.0, "eos_token_id": None, "pad_token_id": None,
    "num_return_sequences": 1,
}  # fmt: skip
"""The generation options `model.generate` takes and their values when neither the call nor the config sets one."""

# Config fields that say nothing about how tokens are chosen (ids generate does not read, bookkeeping).
_INERT = {"bos_token_id", "decoder_start_token_id", "transformers_version", "_from_model_config", "use_cache"}


def shift_right(labels: Tensor, start_id: int, pad_id: int) -> Tensor:
    """Decoder inputs (B, T) from decoder labels (B, T): the start token, then the labels but the last, with
    ignored positions (-100) as padding (HF T5/BART `shift_tokens_right`)."""
    start = labels.new_full((labels.shape[0], 1), start_id)
    shifted = torch.cat([start, labels[:, :-1]], dim=1)
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_id)


def new_generation_config(cfg, tokenizer=None, **fields: Any):
    """A `transformers.GenerationConfig` for a model of config `cfg`: an encoder-decoder's decoder-start id, the
    tokenizer's bos / eos / pad ids when a tokenizer is given, then `fields`."""
    try:
        from transformers import GenerationConfig
    except ImportError as e:
        raise LMForgeError("model.generation_config needs transformers: pip install -e '.[hf]'") from e
    ids: dict[str, Any] = {}
    if cfg.is_encoder_decoder:
        ids["decoder_start_token_id"] = cfg.decoder_start_id
    if tokenizer is not None:
        ids.update(token_ids(tokenizer))
    return GenerationConfig(**{**ids, **fields})


def token_ids(tokenizer) -> dict[str, int]:
    """The bos / eos / pad ids a tokenizer (lmforge's or a `transformers` one) defines, by HF's names."""
    names = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {n: int(getattr(tokenizer, n)) for n in names if getattr(tokenizer, n, None) is not None}


def generate_options(model, passed: dict[str, Any], config=None) -> dict[str, Any]:
    """The options of one `generate` call: each passed value (not None) wins, then the generation config's (the
    `generation_config=` argument, else the model's), then GENERATE_DEFAULTS. Fields of the config that change
    decoding and that lmforge's decoder does not implement are named in a warning (they are not applied)."""
    config = config if config is not None else own_generation_config(model)
    out = {}
    for name, default in GENERATE_DEFAULTS.items():
        value = passed.get(name)
        if value is None and config is not None:
            value = getattr(config, name, None)
        out[name] = default if value is None else value
    if config is not None:
        ignored = sorted(set(config.to_diff_dict()) - set(GENERATE_DEFAULTS) - _INERT)
        if ignored:
            values = ", ".join(f"{k}={getattr(config, k, None)!r}" for k in ignored)
            warnings.warn(f"generate() does not apply these generation_config fields: {values}", stacklevel=3)
    return out


def own_generation_config(model):
    """The model's generation config where it has one (set, read, or tokenizer ids given for it), else None: a model
    without one decodes with GENERATE_DEFAULTS and saves no generation_config.json."""
    has = _CONFIG in model.__dict__ or _PENDING_IDS in model.__dict__
    return model.generation_config if has else None


def read_generation_config(model, ckpt: Path) -> None:
    """The model's generation config from a saved generation_config.json, its bos / eos / pad ids not set there
    from the tokenizer saved beside the model; nothing without either file (or without transformers)."""
    has_config, has_tokenizer = (ckpt / GENERATION_CONFIG).is_file(), (ckpt / "tokenizer.json").is_file()
    if not (has_config or has_tokenizer):
        return
    try:
        from transformers import GenerationConfig
    except ImportError:
        return
    if has_config:
        model.generation_config = GenerationConfig.from_pretrained(ckpt)
    if has_tokenizer:
        from lmforge.tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.load(ckpt)
        except LMForgeError:  # a Hugging Face tokenizer lmforge does not wrap: the config's ids stand
            return
        config = model.generation_config
        for name, value in token_ids(tokenizer).items():
            if getattr(config, name, None) is None:
                setattr(config, name, value)


class HFTrainingSurface:
    """Hugging Face training habits of `Transformer`; see the module docstring."""

    supports_gradient_checkpointing = True

    # ----------------------------------------------------------------- tied weights
    @property
    def _keys_to_ignore_on_save(self) -> list[str]:
        """Names of parameters tied to one named before them (the LM head to the token embedding, T5's shared
        decoder layers): lmforge checkpoints store each tied tensor once, and `transformers.Trainer` re-ties
        (`tie_weights`) a model whose loaded state lacks exactly these."""
        first: set[int] = set()
        tied = []
        for name, p in self.named_parameters(remove_duplicate=False):  # type: ignore[attr-defined]
            if id(p) in first:
                tied.append(name)
            first.add(id(p))
        return tied

    # ----------------------------------------------------------------- generation config
    @property
    def generation_config(self):
        """The `transformers.GenerationConfig` whose values `generate` takes when a call does not pass them (the
        decoder start id of an encoder-decoder; bos / eos / pad of the tokenizer the model was saved or loaded
        with, or of `set_generation_tokens`; a saved generation_config.json's values win over the tokenizer's)."""
        config = self.__dict__.get(_CONFIG)
        if config is None:
            config = self.__dict__[_CONFIG] = new_generation_config(self.config)  # type: ignore[attr-defined]
            for name, value in self.__dict__.pop(_PENDING_IDS, {}).items():
                setattr(config, name, value)
        return config

    @generation_config.setter
    def generation_config(self, config) -> None:
        self.__dict__.pop(_PENDING_IDS, None)
        self.__dict__[_CONFIG] = config

    def set_generation_tokens(self, tokenizer) -> None:
        """Give the generation config the bos / eos / pad ids `tokenizer` defines (lmforge's or a transformers
        tokenizer), as `transformers.Trainer` aligns a model with its tokenizer; a model without a generation config
        yet keeps them for the one `generation_config` makes when first read."""
        ids = token_ids(tokenizer)
        if _CONFIG not in self.__dict__:
            self.__dict__[_PENDING_IDS] = self.__dict__.get(_PENDING_IDS, {}) | ids
            return
        for name, value in ids.items():
            setattr(self.generation_config, name, value)

    # ----------------------------------------------------------------- vocabulary
    @torch.no_grad()
    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """Give the token embedding (and the LM head) `new_num_tokens` rows, rounded up to `pad_to_multiple_of`;
        returns the new embedding. Rows kept keep their values and a tied LM head stays tied. New rows are the mean
        of the old ones (mean_resizing, as `transformers` does by default; Hewitt 2021, "Initializing new word
        embeddings") or drawn as the model's own embedding was at init; an LM head bias grows the same way."""
        cfg = self.config  # type: ignore[attr-defined]
        old = self.tok_emb  # type: ignore[attr-defined]
        n = old.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of is not None:
            if pad_to_multiple_of < 1:
                raise LMForgeError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        floor = max(cfg.pad_id, cfg.decoder_start_id) + 1
        if n < floor:
            raise LMForgeError(f"resize_token_embeddings: {n} rows would drop the model's special id {floor - 1}")
        if n == old.num_embeddings:
            return old
        self.tok_emb = _resized(old, n, mean_resizing, token_embedding_std(cfg))
        if cfg.lm_head:
            self.lm_head = _resized_head(self.lm_head, n, mean_resizing, token_embedding_std(cfg))  # type: ignore[attr-defined]
        cfg.vocab_size = n
        self.tie_weights()  # type: ignore[attr-defined]
        return self.tok_emb

    # ----------------------------------------------------------------- activation checkpointing
    def activation_checkpointing_enable(
        self, activation_checkpointing_kwargs: dict | None = None, every_n_layers: int = 1, offload: bool = False
    ) -> None:
        """Recompute every `every_n_layers`-th transformer block's forward in backward (non-reentrant
        `torch.utils.checkpoint`; the remaining kwargs go to it), holding the saved inputs in host memory when
        `offload`; `transformers.Trainer` calls it for `activation_checkpointing=True`. The gradients are those of
        the model without it."""
        options = dict(activation_checkpointing_kwargs or {})
        if options.pop("use_reentrant", False):
            raise LMForgeError("activation checkpointing is non-reentrant here: use_reentrant=True is not supported")
        if every_n_layers < 1:
            raise LMForgeError(f"every_n_layers must be >= 1, got {every_n_layers}")
        self.activation_checkpointing_disable()
        from lmforge.models.layers import Block

        blocks = [m for m in self.modules() if isinstance(m, Block)]  # type: ignore[attr-defined]
        for block in blocks[::every_n_layers]:
            _checkpoint_block(block, options, offload)

    def activation_checkpointing_disable(self) -> None:
        """Undo `activation_checkpointing_enable`."""
        for m in self.modules():  # type: ignore[attr-defined]
            saved = m.__dict__.pop("_hf_plain_forward", None)
            if saved is not None:
                del m.forward
                if saved is not _CLASS_FORWARD:
                    m.forward = saved

    @property
    def is_activation_checkpointing(self) -> bool:
        return any("_hf_plain_forward" in m.__dict__ for m in self.modules())  # type: ignore[attr-defined]

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs: Any) -> None:
        """`transformers`' older name of `activation_checkpointing_enable`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.activation_checkpointing_disable()

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.is_activation_checkpointing

    # ----------------------------------------------------------------- seq2seq collation
    def prepare_decoder_input_ids_from_labels(self, labels: Tensor) -> Tensor:
        """Decoder inputs from labels (the start token, then the labels shifted right), for an encoder-decoder;
        `DataCollatorForSeq2Seq(model=...)` calls it."""
        cfg = self.config  # type: ignore[attr-defined]
        if not cfg.is_encoder_decoder:
            raise LMForgeError(f"decoder inputs from labels need an encoder-decoder, and '{cfg.name}' is {cfg.arch}")
        return shift_right(labels, cfg.decoder_start_id, cfg.pad_id)


_CLASS_FORWARD = object()
"""Marks a block whose forward was the class's own before checkpointing (no instance attribute to put back)."""


def _checkpoint_block(block: nn.Module, options: dict, offload: bool) -> None:
    from torch.utils.checkpoint import checkpoint

    forward = block.forward
    saved = block.__dict__.get("forward", _CLASS_FORWARD)  # an earlier wrapper (train/parallel) stays under ours

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation and generation run the block as it is
            return forward(*args, **kwargs)
        where = torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()) if offload else nullcontext()
        with where:
            return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)

    block.forward = checkpointed
    block.__dict__["_hf_plain_forward"] = saved


def _grown(old: Tensor, n: int, mean_resizing: bool, std: float) -> Tensor:
    """`old` (V, ...) with n rows: the first min(V, n) kept, the rest the mean of the old rows or N(0, std)."""
    out = old.new_empty((n, *old.shape[1:]))
    keep = min(n, old.shape[0])
    out[:keep] = old[:keep]
    if n > keep:
        if mean_resizing:
            out[keep:] = old.float().mean(0).to(old.dtype)
        elif old.dim() > 1:
            out[keep:].normal_(0.0, std)
        else:  # a bias
            out[keep:] = 0.0
    return out


def _resized(old: nn.Embedding, n: int, mean_resizing: bool, std: float) -> nn.Embedding:
    w = old.weight
    emb = nn.Embedding(n, w.shape[1], device=w.device, dtype=w.dtype)
    emb.weight.copy_(_grown(w, n, mean_resizing, std))
    emb.weight.requires_grad_(w.requires_grad)
    return emb


def _resized_head(old: nn.Linear, n: int, mean_resizing: bool, std: float) -> nn.Linear:
    w = old.weight
    head = nn.Linear(old.in_features, n, bias=old.bias is not None, device=w.device, dtype=w.dtype)
    head.weight.copy_(_grown(w, n, mean_resizing, std))  # a tied head's weight is the embedding's after tie_weights
    head.weight.requires_grad_(w.requires_grad)
    if old.bias is not None:
        head.bias.copy_(_grown(old.bias, n, mean_resizing, std))
        head.bias.requires_grad_(old.bias.requires_grad)
    return head
