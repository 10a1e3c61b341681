"""Prompt tuning (Lester et al. 2021): n_prompt learned input embeddings put before every input sequence.

The prompt enters the first stack (a decoder's, or the encoder of an encoder or encoder-decoder) as token
embeddings, before positions, segments and the embedding norm are added, exactly where real tokens enter. The
real tokens so sit at positions n_prompt, n_prompt + 1, ... (a prefix of real tokens would put them there too),
the prompt is visible to every token (causal masks included, as it comes first) and the attention mask, segment
ids and prefix-LM length are extended to cover it.

Outputs: a decoder's and an encoder's hidden states are returned for the real tokens only, so logits, task heads
and generation line up with the inputs as without a prompt. An encoder-decoder's encoder output keeps the prompt's
states (B, n_prompt + S, d_model), and the decoder cross-attends to them too (Lester et al. §2, T5); code that
reads an encoder-decoder's encoder output against the source mask (B, S) must drop the first n_prompt states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from lmforge.adapt.inject import PeftOptions, PeftState, check_positive, freeze, named_transformers, train_extras
from lmforge.errors import LMForgeError
from lmforge.models.layers import KVCache


@dataclass
class PromptOptions(PeftOptions):
    """Prompt tuning (`peft.method: prompt`)."""

    n_prompt: int = 20
    """Soft prompt length in tokens (Lester et al. §3.2 try 1 to 150)."""
    init: Literal["vocab", "random"] = "vocab"
    """Start from the embeddings of randomly drawn vocabulary tokens (the paper's better choice) or from
    uniform [-0.5, 0.5] noise."""


class PromptStack(nn.Module):
    """A transformer stack whose inputs get the learned prompt (n_prompt, E) in front.

    Forward arguments are the stack's: `positions` are those of the real tokens counted without the prompt;
    `key_padding` covers the real tokens (and, when decoding with a cache, the earlier ones). The first forward
    of a sequence (no cache, or an empty one) runs the prompt through; cached steps only feed new tokens."""

    def __init__(self, base_layer: nn.Module, prompt: Tensor, keep_outputs: bool) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.prompt = nn.Parameter(prompt)  # (P, E)
        self.keep_outputs = keep_outputs
        self.train(base_layer.training)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)  # the stack's blocks, config, ... (read by other code)

    @property
    def n_prompt(self) -> int:
        return self.prompt.shape[0]

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        *,
        token_type_ids: Tensor | None = None,
        key_padding: Tensor | None = None,
        prefix_len: Tensor | None = None,
        cache: KVCache | None = None,
        memory: Tensor | None = None,
        memory_padding: Tensor | None = None,
    ) -> Tensor:
        B, T, _ = x.shape
        P = self.n_prompt
        first = cache is None or cache.length == 0
        cfg = self.base_layer.cfg
        n = (cache.length if not first else P) + T
        cfg.check_length(n, f"sequence of length {{n}} ({P} prompt tokens included) exceeds max_seq_len {{limit}}")
        positions = positions + P
        if first:
            x = torch.cat([self.prompt.to(x.dtype).expand(B, -1, -1), x], dim=1)  # (B, P + T, E)
            prompt_pos = torch.arange(P, device=positions.device)
            if positions.dim() == 2:
                prompt_pos = prompt_pos.expand(positions.shape[0], -1)
            positions = torch.cat([prompt_pos, positions], dim=-1)
            if token_type_ids is not None:
                token_type_ids = torch.cat([token_type_ids.new_zeros(B, P), token_type_ids], dim=1)
            if prefix_len is not None:
                prefix_len = prefix_len + P
        if key_padding is not None:  # (B, P + T_past + T): the prompt's keys are always real
            key_padding = torch.cat([key_padding.new_ones(B, P), key_padding], dim=1)
        h = self.base_layer(
            x,
            positions,
            token_type_ids=token_type_ids,
            key_padding=key_padding,
            prefix_len=prefix_len,
            cache=cache,
            memory=memory,
            memory_padding=memory_padding,
        )
        return h if self.keep_outputs or not first else h[:, P:]


def _real_positions(n_prompt: int):
    """Transformer pre-hook (decoders): pass the real tokens' positions explicitly. The model's own default counts
    the cache, which holds the prompt's n_prompt keys too; PromptStack adds n_prompt itself."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        if kwargs.get("position_ids") is not None:
            return None
        input_ids = args[0] if args else kwargs["input_ids"]
        cache = kwargs.get("cache")
        past = cache.length - n_prompt if cache is not None and cache.length > 0 else 0
        kwargs["position_ids"] = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        return args, kwargs

    return hook


def _memory_padding(n_prompt: int):
    """Decoder-stack pre-hook (encoder-decoders): extend the encoder padding mask over the prompt's states."""

    def hook(module: nn.Module, args: tuple, kwargs: dict):
        memory, pad = kwargs.get("memory"), kwargs.get("memory_padding")
        if memory is None or pad is None or memory.shape[1] != pad.shape[1] + n_prompt:
            return None
        kwargs["memory_padding"] = torch.cat([pad.new_ones(pad.shape[0], n_prompt), pad], dim=1)
        return args, kwargs

    return hook


def _initial_prompt(tok_emb: nn.Embedding, o: PromptOptions) -> Tensor:
    w = tok_emb.weight
    if o.init == "vocab":
        ids = torch.randint(w.shape[0], (o.n_prompt,), device=w.device)
        return w.detach()[ids].clone()
    return torch.empty(o.n_prompt, w.shape[1], device=w.device, dtype=w.dtype).uniform_(-0.5, 0.5)


def apply_prompt(model: nn.Module, options: PromptOptions | None = None) -> nn.Module:
    """Put a learned prompt before the inputs of every Transformer in `model`; freeze everything else (+ head)."""
    o = options or PromptOptions()
    check_positive("prompt", n_prompt=o.n_prompt)
    if getattr(model, "peft_config", None) is not None:
        raise LMForgeError(f"the model is already adapted with '{model.peft_config.method}'")
    freeze(model)
    sites = []
    for t_name, t in named_transformers(model):
        cfg = t.config
        name = cfg.input_stack
        wrapper = PromptStack(getattr(t, name), _initial_prompt(t.tok_emb, o), keep_outputs=cfg.is_encoder_decoder)
        setattr(t, name, wrapper)
        if cfg.is_decoder:
            t.register_forward_pre_hook(_real_positions(o.n_prompt), with_kwargs=True)
        if cfg.is_encoder_decoder:
            t.decoder.register_forward_pre_hook(_memory_padding(o.n_prompt), with_kwargs=True)
        sites.append(f"{t_name}.{name}".lstrip("."))
    train_extras(model, o)
    model.peft_config = PeftState("prompt", o, sites)
    return model
