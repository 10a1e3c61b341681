"""Top-k layer fine-tuning: train the k blocks nearest the output and everything above them; freeze the rest.

Blocks are ordered as data flows through them: an encoder-decoder's encoder blocks, then its decoder blocks, so
the top k are decoder blocks first. "Above the top k blocks" means the final norm of each stack with a trained
block, the backbone's output heads (LM-head transform and bias, pooler, NSP/RTD heads) and the task head. A token
embedding matrix tied to the LM head is an input layer and stays frozen. With ALBERT's cross-layer sharing every
layer is the one shared block, so any k trains it."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lmforge.adapt.inject import PeftOptions, PeftState, freeze, named_transformers, stacks_of, train_extras
from lmforge.errors import LMForgeError

HEAD_MODULES = ("head_dense", "head_norm", "lm_head", "pooler", "rtd_head", "nsp_head")
"""A Transformer's output heads: its modules above the last block."""


@dataclass
class TopKOptions(PeftOptions):
    """Top-k layer fine-tuning (`peft.method: topk`)."""

    k: int = 2
    """Blocks to train, counted from the top."""
    train_head: bool = True
    """Train the backbone's output heads and the task head as well."""


def top_blocks(transformer: nn.Module, k: int) -> list[tuple[str, nn.Module]]:
    """The (stack name, block) pairs of the top k layers, bottom first; a shared block appears once."""
    layers = []
    for name, stack in stacks_of(transformer):
        for i in range(stack.n_layers):
            layers.append((name, stack.blocks[0 if stack.cfg.share_layers else i]))
    if not 0 < k <= len(layers):
        raise LMForgeError(f"topk.k must be in [1, {len(layers)}] (the model's layers), got {k}")
    seen: set[int] = set()
    out = []
    for name, block in layers[len(layers) - k :]:
        if id(block) not in seen:
            seen.add(id(block))
            out.append((name, block))
    return out


def apply_topk(model: nn.Module, options: TopKOptions | None = None) -> nn.Module:
    """Freeze every parameter except the top k blocks, the final norms above them and (train_head) the heads."""
    o = options or TopKOptions()
    if getattr(model, "peft_config", None) is not None:
        raise LMForgeError(f"the model is already adapted with '{model.peft_config.method}'")
    freeze(model)
    sites = []
    for t_name, t in named_transformers(model):
        tied = t.tok_emb.weight
        trained = []
        for stack_name, block in top_blocks(t, o.k):
            trained.append(block)
            final = getattr(dict(stacks_of(t))[stack_name], "final_norm", None)
            if final is not None:
                trained.append(final)
        if o.train_head:
            trained += [getattr(t, n) for n in HEAD_MODULES if isinstance(getattr(t, n, None), nn.Module)]
        for m in trained:
            for p in m.parameters():
                if p is not tied:
                    p.requires_grad_(True)
        sites += [f"{t_name}.{n}".lstrip(".") for n, m in t.named_modules() if any(m is x for x in trained)]
    train_extras(model, o)
    model.peft_config = PeftState("topk", o, sites)
    return model
