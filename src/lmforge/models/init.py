"""Parameter initialisation: each family as its reference initialises it (ModelConfig.init_scheme).

The scheme is data on the config (families.py sets it per family, the Hugging Face importers through the family),
so one function serves every model. `tests/test_init_parity.py` compares the result, tensor by tensor, with the
`transformers` twin's own `_init_weights` (or, without a twin, with the reference code's rule).

Rules common to every scheme: biases start at 0, norm gains at 1 (T5: the factor; Transformer-XL: N(1, std));
`zero_init_proj` zeroes the residual output projections; `zero_pad_embedding` zeroes token-embedding row pad_id."""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.errors import LMForgeError
from lmforge.models.config import ModelConfig
from lmforge.models.layers import RMSNorm
from lmforge.models.relative import XLRelative

RESIDUAL_OUT = ("attn.o.weight", "mlp.down.weight")
"""Projections that write into the residual stream (attention output, cross-attention output, MLP down)."""
QUERY = ("attn.qkv.weight", "cross_attn.q.weight")
"""Weights whose first n_heads·head_dim rows are the query projection."""


@torch.no_grad()
def init_weights(root: nn.Module, cfg: ModelConfig) -> None:
    """(Re-)initialise every parameter under `root`: a Transformer, or a part built after its trunk (MTP heads)."""
    for name, m in _children_first(root):
        if isinstance(m, nn.Linear):
            _init_linear(m, cfg, name)
        elif isinstance(m, nn.Embedding):
            _init_embedding(m, cfg, name)
        elif isinstance(m, (nn.LayerNorm, RMSNorm)):
            _init_norm(m, cfg)
        elif isinstance(m, XLRelative):  # Transformer-XL §3.3 u, v; XLNet §2.5 segment bias and encodings
            for p in (m.u, m.v, getattr(m, "seg_bias", None), getattr(m, "seg", None)):
                if p is not None:
                    nn.init.normal_(p, std=cfg.init_std)
        if isinstance(getattr(m, "mask_emb", None), nn.Parameter):  # XLNet's query-stream start vector w
            nn.init.normal_(m.mask_emb, std=cfg.init_std)
    _tensor_rules(root, cfg)
    emb = getattr(root, "tok_emb", None)
    if cfg.zero_pad_embedding and isinstance(emb, nn.Embedding) and 0 <= cfg.pad_id < emb.num_embeddings:
        emb.weight[cfg.pad_id] = 0.0  # what nn.Embedding(padding_idx=pad_id) starts with in HF and fairseq


def token_embedding_std(cfg: ModelConfig) -> float:
    """The std of the token-embedding rows (and of an untied LM head's) at init: rows added to the vocabulary
    later should be drawn from it too."""
    return cfg.d_model**-0.5 if cfg.init_scheme == "t2t" else cfg.init_std


def _children_first(m: nn.Module, prefix: str = ""):
    """(name, module) pairs in nn.Module.apply's order, so the random draws of a scheme that existed before init
    schemes did (gpt2) come out in the same order and rebuild the same tensors from the same seed."""
    for name, child in m.named_children():
        yield from _children_first(child, f"{prefix}{name}.")
    yield prefix[:-1], m


def _init_linear(m: nn.Linear, cfg: ModelConfig, name: str) -> None:
    if m.bias is not None:
        nn.init.zeros_(m.bias)
    if cfg.init_scheme == "t2t":
        if name == "lm_head":  # an untied softmax matrix: drawn like the embedding (T2T modalities.get_weights)
            nn.init.normal_(m.weight, std=token_embedding_std(cfg))
        else:  # fused projections are redone per part in _tensor_rules
            nn.init.xavier_uniform_(m.weight, gain=cfg.init_std)
    elif cfg.init_scheme == "t5" and name != "lm_head":  # Mesh TF dense layers: fan-in variance scaling
        nn.init.normal_(m.weight, std=cfg.init_std * m.in_features**-0.5)
    else:  # t5's untied head: HF's N(0, factor) (Mesh TF's `logits` layer would be fan-in, d_model^-0.5)
        nn.init.normal_(m.weight, std=cfg.init_std)


def _init_embedding(m: nn.Embedding, cfg: ModelConfig, name: str) -> None:
    if cfg.init_scheme == "t5" and name.endswith("relative_attention_bias"):
        nn.init.normal_(m.weight, std=cfg.init_std * cfg.d_model**-0.5)
    elif cfg.init_scheme == "t2t" and name == "tok_emb":  # T2T modalities: N(0, d^-0.5), scaled up by sqrt(d)
        nn.init.normal_(m.weight, std=token_embedding_std(cfg))
    elif cfg.init_scheme == "t2t":  # other tables (Shaw's relative vectors): the scope's Glorot-uniform
        nn.init.xavier_uniform_(m.weight, gain=cfg.init_std)
    else:  # Mesh TF embeddings are N(0, 1) x factor
        nn.init.normal_(m.weight, std=cfg.init_std)


def _xavier_parts(p: torch.Tensor, sizes: list[int], gain: float) -> None:
    """Glorot-uniform per row block of a fused projection: T2T's q, k and v are separate dense layers."""
    for part in p.split(sizes, dim=0):
        nn.init.xavier_uniform_(part, gain=gain)


def _init_norm(m: nn.Module, cfg: ModelConfig) -> None:
    if cfg.init_scheme == "transformer_xl":  # the released code's weights_init: LayerNorm gains N(1, init_std)
        nn.init.normal_(m.weight, mean=1.0, std=cfg.init_std)
    elif cfg.init_scheme == "t5":  # HF T5LayerNorm: the initializer factor
        nn.init.constant_(m.weight, cfg.init_std)
    else:
        nn.init.ones_(m.weight)
    if getattr(m, "bias", None) is not None:
        nn.init.zeros_(m.bias)


def _tensor_rules(root: nn.Module, cfg: ModelConfig) -> None:
    """Rules over named tensors: per-part Glorot of fused projections (t2t), residual rescale or zeroing, q fold."""
    q_dim, kv_dim = cfg.n_heads * cfg.dim_head, cfg.kv_heads * cfg.dim_head
    for name, p in root.named_parameters():
        if cfg.init_scheme == "t2t" and name.endswith("attn.qkv.weight"):
            _xavier_parts(p, [q_dim, kv_dim, kv_dim], cfg.init_std)
        elif cfg.init_scheme == "t2t" and name.endswith("cross_attn.kv.weight"):
            _xavier_parts(p, [kv_dim, kv_dim], cfg.init_std)
        if name.endswith(RESIDUAL_OUT):
            if cfg.zero_init_proj:  # every block starts as the identity (modded-nanoGPT speedrun)
                nn.init.zeros_(p)
            elif cfg.init_scheme == "gpt2":
                # GPT-2 §2.3: residual-path projections scaled by 1/sqrt(N), N = 2 per layer (attention and MLP).
                nn.init.normal_(p, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))
        # Unscaled attention (T5) folds 1/sqrt(head_dim) into the query's init instead (Mesh TF attention.py):
        # under the t5 scheme q is then N(0, factor · (d_model · d_kv)^-0.5), as HF's T5Attention init.
        if not cfg.scale_attention and name.endswith(QUERY):
            p[:q_dim].mul_(cfg.dim_head**-0.5)


@torch.no_grad()
def reinit_top_blocks(model: nn.Module, n: int) -> list[str]:
    """Draw the last `n` blocks of the model's top stack (the decoder where it has one, else the encoder) afresh, as
    `init_weights` draws a new model's, with that stack's final norm and the model's pooler above them; returns the
    re-drawn parameters' names. A model with shared layers (ALBERT) has one block for the whole stack: refused."""
    cfg = model.config
    name = "decoder" if hasattr(model, "decoder") else "encoder"
    stack = getattr(model, name)
    if cfg.share_layers:
        raise LMForgeError("model.reinit_top: this model shares one block across its layers (ALBERT); re-drawing it "
                           "would re-draw the whole stack")  # fmt: skip
    if not 0 < n <= len(stack.blocks):
        raise LMForgeError(f"model.reinit_top={n}: the {name} has {len(stack.blocks)} blocks")
    parts = [(f"{name}.blocks.{i}", stack.blocks[i]) for i in range(len(stack.blocks) - n, len(stack.blocks))]
    parts += [(f"{name}.final_norm", getattr(stack, "final_norm", None)), ("pooler", getattr(model, "pooler", None))]
    names = []
    for prefix, part in parts:
        if part is not None:
            init_weights(part, cfg)
            names += [f"{prefix}.{p}" for p, _ in part.named_parameters()]
    return names
