"""Compression: knowledge distillation (DistilBERT, TinyBERT), int8 dynamic quantisation, Q8BERT quantisation-aware
training, magnitude and head pruning, and the report. Pruning while pretraining lives in lmforge.train.gradual_prune."""

from lmforge.compress.distill import (
    DistillWeights,
    distillation_loss,
    hidden_state_loss,
    init_student_from_teacher,
    soft_target_loss,
)
from lmforge.compress.prune import (
    head_importance,
    least_important_heads,
    magnitude_prune,
    make_permanent,
    mask_heads,
    remove_heads,
    weight_sparsity,
)
from lmforge.compress.qat import apply_qat, export_int8, fake_quantize
from lmforge.compress.quantize import quantize_int8
from lmforge.compress.tinybert import attention_loss, embedding_loss, hidden_loss, layer_map, prediction_loss

__all__ = [
    "DistillWeights",
    "apply_qat",
    "attention_loss",
    "embedding_loss",
    "export_int8",
    "fake_quantize",
    "hidden_loss",
    "layer_map",
    "prediction_loss",
    "distillation_loss",
    "head_importance",
    "hidden_state_loss",
    "init_student_from_teacher",
    "least_important_heads",
    "magnitude_prune",
    "make_permanent",
    "mask_heads",
    "quantize_int8",
    "remove_heads",
    "soft_target_loss",
    "weight_sparsity",
]
