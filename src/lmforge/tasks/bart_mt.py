"""Machine translation with a pretrained BART as the target-side model (Lewis et al. 2020 §3.4, "Machine
Translation"): BART's encoder embedding layer is replaced by a new, randomly initialised source encoder with its own
vocabulary, which maps foreign tokens into the input of BART's encoder; the whole model is then trained end to end on
teacher-forced cross-entropy of the (English) target, decoded by beam search and scored by BLEU.

Training has two steps. Step 1 freezes most of BART and trains only the new source encoder, BART's (encoder)
positional embeddings and the self-attention input projection of BART's first encoder layer (the fused q/k/v matrix
and its bias); step 2 trains every parameter. `stage1_steps` sets the length of step 1 in training batches (optimizer
steps when train.grad_accum is 1). The count is a buffer of the model, so it is saved with each checkpoint and a
resumed run continues in the step it stopped in. Which parameters a step trains is set by `requires_grad` before each
training forward pass: the frozen ones get no gradient, and AdamW leaves a parameter without a gradient unchanged (no
update, no weight decay). The parameters trainable when training starts (all, or a PEFT method's) are what step 2
trains, so the two steps need one process (DDP fixes the set of parameters with gradients when it wraps the model).

The source vocabulary (`source_tokenizer`) is UTF-8 bytes by default (256 byte ids after pad, BOS and EOS: nothing to
train or ship), or a tokenizer of the source language trained beforehand (`lmforge tokenizer train`), by path.
The source encoder has BART's width, heads, feed-forward size and block kind, and `source_layers` blocks (the paper's
Romanian-English encoder has 6)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lmforge.config.types import NonNegInt, PosInt
from lmforge.errors import LMForgeError
from lmforge.models.beam import beam_search
from lmforge.models.generate import Seq2SeqSteps, sample
from lmforge.objectives.base import LossOutput
from lmforge.registry import TASKS
from lmforge.tasks import file_sources  # noqa: F401  (data.source=parallel)
from lmforge.tasks.model import TaskModel, TaskOutput
from lmforge.tasks.seq2seq import Seq2Seq, Seq2SeqOptions, fit, render


@dataclass
class BartMTOptions(Seq2SeqOptions):
    max_len: int = 256
    """Longest source in source tokens (bytes by default), BOS and EOS included; at most BART's max_seq_len."""
    source_tokenizer: str = "bytes"
    """The source language's vocabulary: "bytes" (UTF-8 bytes), or the path of a tokenizer trained on it."""
    source_layers: PosInt = 6
    """Transformer blocks of the new source encoder (BART §5.4, Romanian-English: 6)."""
    stage1_steps: NonNegInt = 1000
    """Training batches of step 1 (source encoder, positions and first input projection only); 0 skips it."""
    metrics: list[str] | None = field(default_factory=lambda: ["bleu"])


class ByteVocab:
    """UTF-8 bytes as a vocabulary: 0 pad, 1 BOS, 2 EOS, byte b is id b + 3."""

    vocab_size, pad_id, bos_id, eos_id = 259, 0, 1, 2

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode("utf-8")]


def source_vocab(spec: str):
    """The source tokenizer of `source_tokenizer`: ByteVocab, or a tokenizer loaded from a path."""
    if spec == "bytes":
        return ByteVocab()
    from lmforge.tokenizers.published import load_tokenizer

    return load_tokenizer(spec, "task.source_tokenizer")


class SourceEncoder(nn.Module):
    """The new source encoder: a randomly initialised transformer encoder of BART's width over the source
    vocabulary (its own token and position embeddings), whose output stands in for BART's token embeddings."""

    def __init__(self, bart_cfg, vocab_size: int, n_layers: int, pad_id: int | None) -> None:
        super().__init__()
        from lmforge.models import Transformer

        cfg = dataclasses.replace(
            bart_cfg, name="bart-mt-source", arch="encoder", n_layers=n_layers, vocab_size=vocab_size,
            lm_head=False, tie_embeddings=False, lm_head_bias=False, pooler=False, rtd_head=False, nsp_head=False,
            mtp_heads=0, pad_id=pad_id,
        )  # fmt: skip
        self.net = Transformer(cfg)  # initialised as BART initialises (models/init.py)
        self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))
        """Training batches so far: which step of the two the run is in (saved with the checkpoints)."""

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, S) source ids and mask → (B, S, d_model), the input of BART's encoder in place of its embeddings."""
        return self.net.encode(ids, mask)


class TranslationModel(TaskModel):
    """BART with the source encoder in front of its encoder (held as the task model's head)."""

    def __init__(self, backbone: nn.Module, source: SourceEncoder) -> None:
        super().__init__(backbone, source, "text")

    def encode_source(self, ids: Tensor, mask: Tensor) -> Tensor:
        """BART's encoder output (B, S, d_model) for source ids: its embedding layer replaced by the source encoder;
        its positions, embedding norm and blocks as pretrained."""
        x = self.head(ids, mask)  # (B, S, d)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.backbone.encoder(x, positions, key_padding=mask)

    def forward(self, batch: dict[str, Tensor]) -> TaskOutput:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        dec, dec_mask = batch["decoder_input_ids"], batch.get("decoder_attention_mask")
        memory = self.encode_source(ids, mask)
        out = self.backbone(ids, mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                            encoder_hidden_states=memory, return_logits=False)  # fmt: skip
        return TaskOutput(out.last_hidden_state, dec_mask if dec_mask is not None else torch.ones_like(dec))


class SourceSteps(Seq2SeqSteps):
    """Decoding state of the translation model: the source runs through the source encoder and BART's encoder once,
    BART's decoder runs cached (models/generate.py)."""

    def __init__(self, model: TranslationModel, ids: Tensor, mask: Tensor) -> None:
        super().__init__(model.backbone, ids, mask)
        self.task_model = model

    def start(self) -> Tensor:
        self.memory = self.task_model.encode_source(self.input_ids, self.enc_mask)
        return self.step(self.start_ids[:, 0])


def stage1_parameters(model: TranslationModel) -> list[nn.Parameter]:
    """What step 1 trains (BART §3.4): the source encoder, the positional embeddings of BART's encoder and the
    self-attention input projection (q, k, v) of its first layer."""
    enc = model.backbone.encoder
    return [*model.head.parameters(), *enc.pos.parameters(), *enc.blocks[0].attn.qkv.parameters()]


@TASKS.register("bart_mt")
class BartMT(Seq2Seq):
    """Source-language text → English with pretrained BART behind a new source encoder, trained in two steps."""

    name = "bart_mt"
    Options = BartMTOptions
    default_metrics = ("bleu",)

    def build(self, backbone) -> TaskModel:
        cfg = backbone.config
        if not cfg.is_encoder_decoder or not cfg.lm_head:
            raise LMForgeError(f"task 'bart_mt' needs an encoder-decoder (BART) with an LM head, got '{cfg.arch}'")
        super().build(backbone)  # the target side: decoder start, max_len capped at BART's positions
        self.source = source_vocab(self.options.source_tokenizer)
        self._frozen_at: list[bool] | None = None  # requires_grad of each parameter when training started
        self._stage: int | None = None
        enc = SourceEncoder(cfg, self.source.vocab_size, self.options.source_layers, self.source.pad_id)
        return TranslationModel(backbone, enc)

    def source_ids(self, ex, budget: int, where: str | None = None) -> list[int]:
        """`[BOS] source [EOS]` in the source vocabulary, cut to the budget."""
        ids = self.source.encode(render(self.options.template, ex))
        frame = [i for i in (self.source.bos_id, self.source.eos_id) if i is not None]
        budget -= len(frame)
        self.n_truncated += self.check_length(len(ids), budget, where or f"example {ex.id}")
        ids = fit(ids, budget, 0)
        bos = [self.source.bos_id] if self.source.bos_id is not None else []
        eos = [self.source.eos_id] if self.source.eos_id is not None else []
        return bos + ids + eos

    # --- the two steps -------------------------------------------------------------------------------------------

    def stage(self, model: TranslationModel) -> int:
        """1 while the model has seen fewer than `stage1_steps` training batches, else 2."""
        return 1 if int(model.head.batches_seen) < self.options.stage1_steps else 2

    def set_stage(self, model: TranslationModel, stage: int) -> None:
        """Let exactly the parameters of `stage` take gradients (of those trainable when training started)."""
        params = list(model.parameters())
        if self._frozen_at is None:
            self._frozen_at = [not p.requires_grad for p in params]
        keep = {id(p) for p in stage1_parameters(model)} if stage == 1 else None
        for p, frozen in zip(params, self._frozen_at):
            p.requires_grad_(not frozen and (keep is None or id(p) in keep))
        self._stage = stage

    def scored(self, model: TranslationModel, batch: dict[str, Tensor]) -> tuple[LossOutput, tuple[Tensor, Tensor]]:
        training = model.training and torch.is_grad_enabled()
        if training:  # a training pass (not the loop's probe of saved weights, nor an evaluation)
            if not isinstance(model, TranslationModel):  # DDP's or FSDP's wrapper
                raise LMForgeError("task 'bart_mt' trains on one process: its two steps change which parameters "
                                   "have gradients, which DDP cannot follow")  # fmt: skip
            stage = self.stage(model)
            if stage != self._stage:
                self.set_stage(model, stage)
            model.head.batches_seen += 1
        out, parts = super().scored(model, batch)
        if training:
            out.metrics["stage"] = float(stage)
        return out, parts

    # --- generation ------------------------------------------------------------------------------------------------

    def generate_batch(self, model: TranslationModel, feats: list[dict], num_beams: int, max_new: int) -> list[str]:
        device = next(model.parameters()).device
        prompts = [f["_prompt"] for f in feats]
        S, pad = max(len(p) for p in prompts), self.source.pad_id or 0
        ids = torch.tensor([p + [pad] * (S - len(p)) for p in prompts], device=device)
        mask = torch.tensor([[1] * len(p) + [0] * (S - len(p)) for p in prompts], device=device)
        steps = SourceSteps(model, ids, mask)
        eos = self.tokenizer.eos_id
        with torch.no_grad():
            if num_beams > 1:
                new = beam_search(steps, num_beams=num_beams, max_new_tokens=max_new, eos_id=eos,
                                  length_penalty=self.options.length_penalty)  # fmt: skip
            else:
                new = sample(steps, max_new_tokens=max_new, temperature=0.0, eos_id=eos)
        texts = []
        for row in new.tolist():
            if eos in row:
                row = row[: row.index(eos)]
            texts.append(self.tokenizer.decode(row).strip())
        return texts
