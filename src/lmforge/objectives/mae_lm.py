"""MAE-LM (Meng et al., "Representation Deficiency in Masked Language Modeling", ICLR 2024 §3): masked language
modelling in which the encoder never sees [MASK].

15% of the (non-special) tokens are selected as in BERT, then *removed* from the encoder's input: the encoder reads
only the real tokens, each at its original position (so it still knows where the gaps are). A shallow decoder
(§3: a few Transformer layers; the released pretraining script uses 4) gets the encoder's outputs back at their
positions, the [MASK] token embedding at every removed position, adds its own position embeddings and predicts
the original tokens there through a tied MLM head. There is no 80/10/10 replacement: nothing the encoder sees is
corrupted, and the decoder's inputs at the masked positions are all [MASK] (the released code's defaults). Like
the released code, the decoder runs without dropout and shares the encoder's token embeddings (for the [MASK]
vector and the output matrix).

The decoder exists only for pretraining: `lmforge.load(run)` returns the encoder (the run's `model` section), and
fine-tuning starts from it (§3: "only the encoder is fine-tuned")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer
from lmforge.models.lm_head import cross_entropy
from lmforge.models.position_schemes import POSITION_SCHEMES
from lmforge.objectives import masking as M
from lmforge.objectives.base import LossOutput
from lmforge.objectives.mlm import EVAL_SALT, MaskedObjective, MLMOptions
from lmforge.registry import OBJECTIVES

ABSOLUTE_OR_ROTARY = tuple(name for name, s in POSITION_SCHEMES.items() if s.per_token)
"""Position kinds that take each token's own position, so a shortened input keeps its original positions."""
UNUSED_HEADS = ("lm_head", "pooler", "nsp_head", "rtd_head", "mtp_heads")


@dataclass
class MAELMOptions:
    """Options of MAE-LM (the recipe's `objective.*` keys)."""

    mask_rate: float = 0.15
    """Fraction of the (non-special) tokens removed from the encoder input and predicted by the decoder (§4.1: the
    standard 15%)."""
    whole_word: bool = False
    """Select whole words: all sub-word tokens of a word are removed together."""
    static: bool = False
    """Static masks: each example masked in dupe_factor fixed ways, chosen in advance, instead of anew every time it
    is seen."""
    dupe_factor: int | None = None
    """With static: the masked copies of each example, epoch e using copy e mod dupe_factor (BERT's
    create_pretraining_data --dupe_factor; mlm's objective.dupe_factor). None = 10; 1 = one mask for the run."""
    decoder_layers: int = 4
    """Depth of the shallow decoder (the released base pretraining script: 4 layers, the encoder's width)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_rate < 1.0:
            raise LMForgeError(f"objective.mask_rate must be between 0 and 1 (exclusive), got {self.mask_rate}")
        if self.decoder_layers < 1:
            raise LMForgeError(f"objective.decoder_layers must be at least 1, got {self.decoder_layers}")
        MLMOptions(static=self.static, dupe_factor=self.dupe_factor)  # dupe_factor's rules, as mlm states them


def decoder_config(encoder: ModelConfig, n_layers: int) -> ModelConfig:
    """The decoder: the encoder's layer type and width, `n_layers` bidirectional layers, no segment embeddings,
    no dropout, and a BERT MLM head tied to the (shared) token embeddings."""
    return dataclasses.replace(
        encoder, name=f"{encoder.name}-mae-decoder", n_layers=n_layers, n_decoder_layers=None, type_vocab_size=0,
        embedding_dim=None, share_layers=False, lm_head=True, lm_head_transform=True, lm_head_bias=True,
        tie_embeddings=True, pooler=False, nsp_head=False, rtd_head=False, mtp_heads=0, dropout=0.0,
        attn_dropout=0.0,
    )  # fmt: skip


class MAELMModel(nn.Module):
    """The encoder (`encoder`, what fine-tuning keeps) and the shallow decoder (`decoder`) sharing the token
    embeddings. `forward` takes the shortened encoder input and returns logits at the masked positions only."""

    def __init__(self, enc_cfg: ModelConfig, dec_cfg: ModelConfig, mask_id: int) -> None:
        super().__init__()
        self.encoder = Transformer(enc_cfg)
        self.decoder = Transformer(dec_cfg)
        self.config = enc_cfg
        self.mask_id = mask_id
        self.decoder.tok_emb = self.encoder.tok_emb
        self.decoder.tie_weights()  # the decoder's output matrix is the shared input embedding matrix

    def num_params(self, non_embedding: bool = False) -> int:
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or (non_embedding and (name.endswith("tok_emb.weight") or ".pos_emb." in name)):
                continue
            seen.add(id(p))
            total += p.numel()
        return total

    def decoder_inputs(self, h: Tensor, positions: Tensor, keep: Tensor, masked: Tensor) -> Tensor:
        """(B, T, d): the encoder outputs h (B, T', d) scattered back to their positions (B, T'), the [MASK]
        embedding at the masked positions (B, T), zeros at padding."""
        B, T = masked.shape
        d = h.shape[-1]
        slot = torch.where(keep, positions, T)  # padding slots of the shortened input go to a spare column
        x = h.new_zeros(B, T + 1, d).scatter(1, slot[..., None].expand(-1, -1, d), h)[:, :T]
        mask_vec = self.encoder.tok_emb.weight[self.mask_id].to(x.dtype)  # (d,)
        return torch.where(masked[..., None], mask_vec, x)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, labels: Tensor,
        decoder_attention_mask: Tensor | None = None, index: Tensor | None = None,
    ) -> Tensor:  # fmt: skip
        """input_ids, attention_mask, position_ids: (B, T') the unmasked tokens, right-padded, with their original
        positions; labels: (B, T) the original token at masked positions, IGNORE elsewhere → (N, V) logits of the
        N masked positions, in row-major order. index: their flat positions (the batch's `mlm_index`, found on the
        CPU); without it they are found here, which waits for the device."""
        masked = labels != M.IGNORE  # (B, T)
        if index is None:
            index = M.labelled_index(labels)
        cfg = self.config
        cfg.check_length(masked.shape[1])  # checked on Python ints
        h = self.encoder(input_ids, attention_mask, position_ids=position_ids, return_logits=False)
        x = self.decoder_inputs(h.last_hidden_state, position_ids, attention_mask.bool(), masked)
        pos = torch.arange(masked.shape[1], device=x.device)
        out = self.decoder.encoder(x, pos, key_padding=decoder_attention_mask)  # (B, T, d)
        return self.decoder.logits(out.flatten(0, 1).index_select(0, index))


@OBJECTIVES.register("mae-lm")
class MAELM(MaskedObjective):
    """MLM with the masked tokens removed from the encoder and predicted by a shallow decoder (MAE-LM)."""

    name = "mae-lm"
    Options = MAELMOptions
    # lmforge.load(run) returns the encoder: the model section of the run's config describes it
    # (checkpoint/read.py, EXPORT_MODULES)

    def __init__(self, cfg, tokenizer) -> None:
        super().__init__(cfg, tokenizer)
        fills = (tokenizer.pad_id, self.sep_id, tokenizer.eos_id, 0)
        self.fill_id = next(i for i in fills if i is not None and i != self.mask_id)
        """What pads the shortened encoder rows (never attended to, and never [MASK])."""

    def build_model(self, model_cfg) -> nn.Module:
        if not model_cfg.is_encoder:
            raise LMForgeError(f"objective 'mae-lm' pretrains an encoder, not arch '{model_cfg.arch}'")
        if not model_cfg.position_scheme.per_token:
            raise LMForgeError(
                f"objective 'mae-lm' keeps each token's own position id in a shortened input: model.position must be "
                f"one of {', '.join(ABSOLUTE_OR_ROTARY)}, not '{model_cfg.position}'"
            )
        if (model_cfg.embedding_dim or model_cfg.d_model) != model_cfg.d_model:
            raise LMForgeError("objective 'mae-lm' puts the [MASK] embedding among encoder outputs: it needs "
                               "model.embedding_dim equal to model.d_model (or null)")  # fmt: skip
        heads = [f"model.{h}" for h in UNUSED_HEADS if getattr(model_cfg, h)]
        if heads:
            raise LMForgeError(
                f"objective 'mae-lm' predicts with its own decoder, so the encoder takes no heads: turn off "
                f"{', '.join(heads)} (e.g. --model.preset=mae-lm-tiny)"
            )
        return MAELMModel(model_cfg, decoder_config(model_cfg, self.options.decoder_layers), self.mask_id)

    def eval_transform(self, tokens) -> dict[str, Tensor]:
        batch = self.inputs(tokens)
        return self.mask(batch, M.Draws.static(batch["input_ids"], self.seed ^ EVAL_SALT))

    def mask(self, batch: dict[str, Tensor], draws: M.Draws) -> dict[str, Tensor]:
        """Select tokens as BERT does, then remove them: the encoder input is the remaining tokens, moved left in
        their order (vectorised: a stable sort puts the kept positions first) with their original positions."""
        ids = batch["input_ids"]
        selected, _ = self.select(batch, self.candidates(batch), draws)
        real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(selected)
        keep = real & ~selected  # (B, T)
        n_keep = keep.sum(1)  # (B,)
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept positions first, in order
        # Padded to a multiple of 8: packed windows then give one encoder length (one compiled graph, aligned
        # tensor-core shapes) although the number of masked tokens varies by one between rows.
        width = min(ids.shape[1], -(-max(1, int(n_keep.max())) // 8) * 8)
        positions = order[:, :width]  # (B, T')
        enc_mask = torch.arange(width)[None, :] < n_keep[:, None]
        out = {
            "input_ids": ids.gather(1, positions).masked_fill(~enc_mask, self.fill_id),
            "attention_mask": enc_mask.long(),
            "position_ids": positions.masked_fill(~enc_mask, 0),
            "labels": torch.where(selected, ids, torch.full_like(ids, M.IGNORE)),
        }
        if "attention_mask" in batch:
            out["decoder_attention_mask"] = batch["attention_mask"]
        out["mlm_index"] = M.labelled_index(out["labels"])
        return out

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        labels = batch["labels"]
        index = M.labelled_index(labels, batch)
        args = (batch["input_ids"], batch["attention_mask"], batch["position_ids"], labels)
        logits = model(*args, batch.get("decoder_attention_mask"), index)  # (N, V): the masked positions only
        target = labels.flatten().index_select(0, index)
        n = len(index)  # known on the host
        if n == 0:  # nothing selected: a zero loss that keeps the graph
            return LossOutput(logits.sum() * 0.0, 0, {"mlm_acc": 0.0})
        loss = cross_entropy(logits, target)
        return LossOutput(loss, n, {"mlm_acc": (logits.argmax(-1) == target).float().mean()})
