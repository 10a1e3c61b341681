"""Models: one config, one stack, presets, Hugging Face conversion."""

from lmforge.models import presets as _presets  # noqa: F401  (registers presets)
from lmforge.models.config import ModelConfig
from lmforge.models.layers import KVCache
from lmforge.models.output import ModelOutput
from lmforge.models.presets import get_preset
from lmforge.models.transformer import Transformer
from lmforge.models.wrappers import unwrap_model

__all__ = ["KVCache", "ModelConfig", "ModelOutput", "Transformer", "get_preset", "unwrap_model"]
