"""Hugging Face checkpoint conversion, one module per family group; converters are keyed by HF `model_type`.

`import_hf(dir)` builds a Transformer from config.json + weights; `export_hf(model, dir)` writes a dir that
`transformers` Auto classes load; `to_hf_model(model)` returns that `transformers` model directly."""

from lmforge.models.hf import decoders, encoders, seq2seq, xlnet  # noqa: F401  (registers the converters)
from lmforge.models.hf.base import CONVERTERS, Converter, canonical, converter_for, converter_of
from lmforge.models.hf.io import export_hf, import_hf, is_hf_dir, read_hf_weights, to_hf_model

__all__ = [
    "CONVERTERS",
    "Converter",
    "canonical",
    "converter_for",
    "converter_of",
    "export_hf",
    "import_hf",
    "is_hf_dir",
    "read_hf_weights",
    "to_hf_model",
]
