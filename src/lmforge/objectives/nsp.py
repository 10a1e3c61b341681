"""BERT pretraining = masked LM + next-sentence prediction (Devlin et al. 2019 §3.1), ALBERT's masked LM +
sentence-order prediction (Lan et al. 2020 §4.1), and RoBERTa's MLM-only inputs (Liu et al. 2019 §4.2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput
from lmforge.objectives.mlm import MaskedObjective, MLMOptions, mlm_loss
from lmforge.objectives.sentence_data import DocChunkLoader, SentencePairLoader, sentence_end_ids
from lmforge.registry import OBJECTIVES

SENTENCE_TASKS = {"nsp": "next-sentence", "sop": "sentence-order"}


@dataclass
class BertOptions(MLMOptions):
    sentence_task: Literal["nsp", "sop"] = "nsp"
    """The sentence-pair classifier's task: nsp = next-sentence prediction (BERT: negatives take B from another
    document), sop = sentence-order prediction (ALBERT: negatives are the two segments of one chunk swapped).
    Its loss and accuracy are logged as `<task>_loss` and `<task>_acc`."""


@dataclass
class AlbertOptions(BertOptions):
    sentence_task: Literal["nsp", "sop"] = "sop"


@OBJECTIVES.register("bert")
class BertPretraining(MaskedObjective):
    """MLM + NSP on "[CLS] A [SEP] B [SEP]" sentence pairs; loss = L_MLM + L_NSP (BERT App. A.2).

    The model needs a sentence classifier over its pooled [CLS] output (model.pooler and model.nsp_head)."""

    name = "bert"
    Options = BertOptions

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        if self.pad_id is None or self.cls_id is None or self.sep_id is None:
            raise LMForgeError(
                f"objective '{cfg.objective.name}' needs a tokenizer with distinct [CLS], [SEP] and [PAD] tokens "
                "(data.tokenizer_family: bert or bart)"
            )
        self.end_ids = sentence_end_ids(tokenizer)
        self.task = self.options.sentence_task

    def build_model(self, model_cfg) -> nn.Module:
        if not (getattr(model_cfg, "pooler", False) and getattr(model_cfg, "nsp_head", False)):
            raise LMForgeError(
                f"objective '{self.name}' trains a {SENTENCE_TASKS[self.task]} classifier: the model needs "
                "model.pooler=true and model.nsp_head=true"
            )
        return super().build_model(model_cfg)

    def make_loader(self, data_dir, split: str, *, rank: int = 0, world_size: int = 1) -> SentencePairLoader:
        t = self.cfg.train
        return SentencePairLoader(
            data_dir, split, t.seq_len, t.batch_size, rank=rank, world_size=world_size, seed=self.cfg.run.seed,
            end_ids=self.end_ids, cls_id=self.cls_id, sep_id=self.sep_id, pad_id=self.pad_id, task=self.task,
        )  # fmt: skip

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        mlm, n, acc, out = mlm_loss(model, batch)
        logits = out.nsp_logits.float()  # (B, 2): the sentence classifier (model.nsp_head), NSP or SOP
        target = batch["sentence_label"]
        pair = F.cross_entropy(logits, target)
        metrics = {  # tensors: the loop reads them back on log steps only
            "mlm_loss": mlm.detach(), "mlm_acc": acc, f"{self.task}_loss": pair.detach(),
            f"{self.task}_acc": (logits.argmax(-1) == target).float().mean(),
        }  # fmt: skip
        return LossOutput(mlm + pair, n, metrics)


@OBJECTIVES.register("albert")
class AlbertPretraining(BertPretraining):
    """ALBERT §4.1: MLM + sentence-order prediction (SOP) on "[CLS] A [SEP] B [SEP]" pairs of consecutive
    segments of one document, swapped for the negatives; loss = L_MLM + L_SOP. (ALBERT's n-gram masking is the
    `ngram` option; its factorised, shared-layer model is the albert presets.)"""

    name = "albert"
    Options = AlbertOptions


@dataclass
class RobertaOptions(MLMOptions):
    inputs: Literal["full_sentences", "doc_sentences"] = "full_sentences"
    """full_sentences: packed windows of contiguous text that may cross documents (separated by </s>);
    doc_sentences: whole sentences of a single document, padded (RoBERTa §4.2)."""


@OBJECTIVES.register("roberta")
class RoBERTa(MaskedObjective):
    """Dynamic-masking MLM without NSP (RoBERTa §4.1-4.2) on FULL-SENTENCES or DOC-SENTENCES inputs."""

    name = "roberta"
    scores_labels = True
    Options = RobertaOptions

    @classmethod
    def packed_windows(cls, options) -> bool:
        return options.inputs == "full_sentences"  # DOC-SENTENCES: padded chunks of one document

    def make_loader(self, data_dir, split: str, *, rank: int = 0, world_size: int = 1):
        if self.options.inputs == "full_sentences":
            return super().make_loader(data_dir, split, rank=rank, world_size=world_size)
        if self.pad_id is None:
            raise LMForgeError("objective.inputs=doc_sentences pads its inputs: the tokenizer needs a pad token")
        t = self.cfg.train
        return DocChunkLoader(
            data_dir, split, t.seq_len, t.batch_size, rank=rank, world_size=world_size, seed=self.cfg.run.seed,
            end_ids=sentence_end_ids(self.tokenizer), pad_id=self.pad_id,
        )  # fmt: skip
