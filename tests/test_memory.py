"""The memory estimate of `lmforge model info --batch --seq`: model states by the ZeRO accounting, and the
activation term checked against the tensors autograd actually saves per layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lmforge.cli import main
from lmforge.models import Transformer, get_preset
from lmforge.train.memory import estimate, model_sizes


def test_model_states_are_16_bytes_per_parameter_divided_by_the_gpus_under_fsdp():
    s = model_sizes(get_preset("gpt2-124m"))
    assert s.params == 124_439_808
    one = estimate(s, "ddp", 1, 1024)
    assert one.weights + one.grads + one.optimizer == 16 * s.params
    assert estimate(s, "ddp", 8, 1024).weights == one.weights  # ddp replicates
    for n in (2, 4, 8):
        e = estimate(s, "fsdp", n, 1024)
        assert e.weights + e.grads + e.optimizer == pytest.approx(16 * s.params / n)
        assert e.activations == one.activations  # data parallelism: the same tokens per GPU
    # The root unit (tied embedding + positions + final norm) and the largest block are what FSDP unshards.
    assert s.root_params == 50257 * 768 + 1024 * 768 + 2 * 768
    assert s.block_params == (s.params - s.root_params) // 12


def test_activation_checkpointing_keeps_one_input_per_block():
    s = model_sizes(get_preset("llama-1b"))
    e = estimate(s, "fsdp", 2, 8 * 1024)
    tokens = 8 * 1024
    assert e.activations - e.activations_ckpt > 0.8 * tokens * s.act_per_token  # most of the blocks' activations
    assert e.activations_ckpt == tokens * (16 * 4 * 2048 + s.act_block + s.act_outside)


def _saved_bytes_per_token(cfg, batch: int = 2, seq: int = 64) -> float:
    """Bytes of the activations autograd saves for backward under bf16 autocast (weights and their casts left out)."""
    model = Transformer(cfg)
    shapes = {tuple(p.shape) for p in model.parameters()}
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in storages and not (t.dim() <= 2 and tuple(t.shape) in shapes):
            saved[st.data_ptr()] = st.nbytes()
        return t

    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids).logits.float().logsumexp(-1).sum()
    return sum(saved.values()) / (batch * seq)


@pytest.mark.parametrize("preset", ["gpt-tiny", "llama-tiny", "bert-tiny"])
def test_activation_estimate_per_layer_matches_what_autograd_saves(preset):
    base = replace(get_preset(preset), dropout=0.0, attn_dropout=0.0, d_model=128, n_heads=4, d_ff=512, vocab_size=256)
    measured = _saved_bytes_per_token(replace(base, n_layers=6)) - _saved_bytes_per_token(replace(base, n_layers=2))
    per_layer = measured / 4
    estimated = model_sizes(base).act_per_token / base.n_layers
    assert 0.75 < per_layer / estimated < 1.25, (per_layer, estimated)


def test_model_info_prints_the_table_where_ddp_needs_more_than_one_gpu_holds(capsys):
    assert main(["model", "info", "llama-3b", "--batch", "8", "--seq", "1024"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("llama-3b: 3,212,749,824 parameters")
    rows = {tuple(line.split()[:2]): [float(x) for x in line.split()[2:]] for line in lines[3:11]}
    assert sorted(rows) == sorted((p, str(n)) for p in ("ddp", "fsdp") for n in (1, 2, 4, 8))
    total = 5  # column of the total (weights, grads, AdamW, buffers, activations, total, with ckpt)
    assert rows[("ddp", "1")][total] > 80 > rows[("fsdp", "2")][total]  # an 80 GB GPU: ddp does not fit, fsdp does
    assert rows[("fsdp", "8")][total] < rows[("fsdp", "4")][total] < rows[("fsdp", "2")][total]


def test_model_info_states_non_embedding_parameters_and_training_flops(capsys):
    """What a FLOPs or scaling budget needs: N without embeddings (Kaplan et al.) and the FLOP formula's count."""
    from lmforge.models.flops import model_flops_per_token

    assert main(["model", "info", "gpt2-124m", "--seq", "512"]) == 0
    line = capsys.readouterr().out.strip()
    cfg = get_preset("gpt2-124m")
    with torch.device("meta"):
        body = Transformer(cfg).num_params(non_embedding=True)
    assert f"(124.4M; {body / 1e6:.1f}M non-embedding)" in line and body < 124.4e6 - 50257 * 768
    assert line.endswith(f"; {model_flops_per_token(cfg, 512):.3g} training FLOPs/token at 512 tokens")
    assert 6 * 124.4e6 < model_flops_per_token(cfg, 512) < model_flops_per_token(cfg, 1024)  # attention grows with T
