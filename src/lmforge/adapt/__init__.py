"""Parameter-efficient adaptation applied to a built model: LoRA, Houlsby/Pfeiffer adapters, AdaMix, prefix and
prompt tuning, top-k layer fine-tuning. `apply_peft(model, method, options)` is the one entry point; each method
is an `ADAPTERS` registration with its own typed options."""

from lmforge.adapt.adamix import (
    AdaMixOptions,
    MixtureAdapter,
    apply_adamix,
    merge_adamix,
    symmetric_kl,
    with_consistency,
)
from lmforge.adapt.bottleneck import (
    AdapterLayer,
    BottleneckAdapter,
    HoulsbyOptions,
    PfeifferOptions,
    apply_houlsby,
    apply_pfeiffer,
)
from lmforge.adapt.inject import PeftOptions, PeftState, matches
from lmforge.adapt.lora import LoRALinear, LoRAOptions, apply_lora, merge_and_unload, merge_lora, unmerge_lora
from lmforge.adapt.peft import (
    ADAPTERS,
    PeftInfo,
    adapter_state_dict,
    apply_peft,
    load_adapter,
    read_adapter_config,
    save_adapter,
    trainable_parameters,
)
from lmforge.adapt.prefix import PrefixEncoder, PrefixOptions, apply_prefix, bake_prefix
from lmforge.adapt.prompt import PromptOptions, PromptStack, apply_prompt
from lmforge.adapt.topk import TopKOptions, apply_topk

__all__ = [
    "ADAPTERS",
    "AdaMixOptions",
    "AdapterLayer",
    "BottleneckAdapter",
    "HoulsbyOptions",
    "LoRALinear",
    "LoRAOptions",
    "MixtureAdapter",
    "PeftInfo",
    "PeftOptions",
    "PeftState",
    "PfeifferOptions",
    "PrefixEncoder",
    "PrefixOptions",
    "PromptOptions",
    "PromptStack",
    "TopKOptions",
    "adapter_state_dict",
    "apply_adamix",
    "apply_houlsby",
    "apply_lora",
    "apply_peft",
    "apply_pfeiffer",
    "apply_prefix",
    "apply_prompt",
    "apply_topk",
    "bake_prefix",
    "load_adapter",
    "matches",
    "merge_adamix",
    "merge_and_unload",
    "merge_lora",
    "read_adapter_config",
    "save_adapter",
    "symmetric_kl",
    "with_consistency",
    "trainable_parameters",
    "unmerge_lora",
]
