"""Named architectures. Presets are data: each is a set of ModelConfig fields, registered in MODELS."""

from __future__ import annotations

from dataclasses import fields, replace

from lmforge.models.config import ModelConfig
from lmforge.registry import MODELS


def preset(name: str, **kw) -> None:
    MODELS.register(name)(ModelConfig(name=name, **kw))


# --- decoders -------------------------------------------------------------------------------------------------
# GPT-1 (Radford et al. 2018 §4.1): 12 post-LN layers, 768 wide, 12 heads, 3072 FFN, learned positions, GELU,
# tied input/output embeddings, 512 context, 40,478-token BPE.
_GPT1 = dict(
    arch="decoder",
    norm_position="post",
    final_norm=False,
    activation="gelu",
    position="learned",
    tie_embeddings=True,
)
preset("gpt1", vocab_size=40478, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=512, **_GPT1)
preset("gpt1-tiny", vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, **_GPT1)

# GPT-2 (Radford et al. 2019 §2.3): pre-LN with a final LayerNorm, tanh-GELU, 1024 context, 50,257 byte-level BPE.
_GPT2 = dict(arch="decoder", norm_position="pre", final_norm=True, activation="gelu_tanh", position="learned")
preset("gpt2-124m", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=1024, **_GPT2)
preset("gpt2-350m", vocab_size=50257, d_model=1024, n_layers=24, n_heads=16, d_ff=4096, max_seq_len=1024, **_GPT2)
preset("gpt2-774m", vocab_size=50257, d_model=1280, n_layers=36, n_heads=20, d_ff=5120, max_seq_len=1024, **_GPT2)
# Small sizes for CPU runs: `gpt-tiny` for tests, `gpt-mini` for the README demo.
preset("gpt-tiny", vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, **_GPT2)
preset("gpt-mini", vocab_size=4096, d_model=192, n_layers=4, n_heads=6, d_ff=768, max_seq_len=256, **_GPT2)


def get_preset(name: str, **overrides) -> ModelConfig:
    """The preset's config with field overrides applied."""
    cfg = MODELS.get(name)
    return replace(cfg, **overrides)


def preset_fields() -> set[str]:
    return {f.name for f in fields(ModelConfig)}
