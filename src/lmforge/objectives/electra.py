"""ELECTRA replaced-token detection (Clark et al. 2020 §2).

A small generator is trained as a masked LM; its samples replace the masked tokens, and the discriminator
predicts for every token whether it was replaced. Loss = L_MLM(generator) + λ · L_Disc (λ = 50). The two share
their token, position and segment embeddings (and the embedding LayerNorm), as in the paper's §3.2.

Training draws the replacements from the generator's softmax with torch's generator. Validation draws them from a
uniform per (example, position), a hash of the example's masked tokens and the run seed (`sample_uniforms`), by
inverting the softmax's CDF: an example gets the same replacements whatever batch it is in and however many
processes share the global batch; and its generator term is the mean over the masked tokens of the whole global
batch, whichever of its rows a process scores. So the validation loss does not depend on the number of processes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.models import ModelConfig, Transformer
from lmforge.objectives import masking as M
from lmforge.objectives.base import LossOutput
from lmforge.objectives.mlm import EVAL_SALT, MaskedObjective, MLMOptions, check_rates
from lmforge.registry import OBJECTIVES

SHARED_EMBEDDINGS = ("pos_emb", "type_emb", "emb_norm")  # encoder-stack modules the generator borrows
SAMPLE_SALT = 0x5A3B_1E00  # keys the validation samples' uniforms apart from the validation masks'


def sample_uniforms(input_ids: Tensor, seed: int) -> Tensor:
    """(B, L) float64 uniforms in [0, 1), each a hash of its row's tokens (B, L), its position and the seed only."""
    return M.Draws.static(input_ids, seed ^ SAMPLE_SALT).uniform(*input_ids.shape)


def sample_by_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """(N,) one draw from each row of probs (N, V), the smallest k whose cumulative probability exceeds u (N,) ·
    the row's total (inverse-CDF sampling: P(k) = probs[k]; a token of probability 0 is never drawn)."""
    cdf = probs.double().cumsum(-1)  # (N, V)
    x = (u.to(cdf) * cdf[:, -1]).unsqueeze(-1)  # (N, 1)
    return torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


@dataclass
class ElectraOptions:
    mask_rate: float = 0.15
    """Fraction of the tokens the generator predicts (and may replace)."""
    mask_frac: float = 0.85
    """Of the masked tokens, the fraction shown to the generator as [MASK]; the released ELECTRA code uses 85%
    [MASK], 0% random, 15% unchanged."""
    random_frac: float = 0.0
    static: bool = False
    """Static masks: each example masked in dupe_factor fixed ways, chosen in advance, instead of anew every time it
    is seen (the generator still samples its replacements anew)."""
    dupe_factor: int | None = None
    """With static: the masked copies of each example, epoch e using copy e mod dupe_factor (BERT's
    create_pretraining_data --dupe_factor; mlm's objective.dupe_factor). None = 10; 1 = one mask for the run."""
    whole_word: bool = False
    disc_weight: float = 50.0
    """λ, the weight of the discriminator loss (§2: λ = 50)."""
    generator_scale: float = 0.25
    """Generator width (d_model, d_ff, heads) as a fraction of the discriminator's (§3.2: 1/4 to 1/2 work best)."""
    generator_preset: str | None = None
    """A preset for the generator instead of generator_scale (e.g. electra-small-generator)."""

    def __post_init__(self) -> None:
        check_rates(self)
        MLMOptions(static=self.static, dupe_factor=self.dupe_factor)  # dupe_factor's rules, as mlm states them
        if self.disc_weight < 0:
            raise LMForgeError(f"objective.disc_weight must be >= 0, got {self.disc_weight}")
        if not 0.0 < self.generator_scale <= 1.0:
            raise LMForgeError(f"objective.generator_scale must be in (0, 1], got {self.generator_scale}")


@dataclass
class ElectraOutput:
    gen_logits: Tensor
    """(N, V) generator logits at the N masked positions (row-major order)."""
    gen_labels: Tensor
    """(N,) the original tokens there."""
    rtd_logits: Tensor
    """(B, T) discriminator logits, > 0 = "replaced"."""
    replaced: Tensor
    """(B, T) bool: the discriminator's input differs from the original token there."""


class ElectraModel(nn.Module):
    """Generator + discriminator with shared embeddings. `forward` masks nothing: it takes the masked inputs and
    labels, runs the generator, samples replacements (no gradient through sampling) and runs the discriminator."""

    def __init__(self, disc_cfg: ModelConfig, gen_cfg: ModelConfig) -> None:
        super().__init__()
        self.discriminator = Transformer(disc_cfg)
        self.generator = Transformer(gen_cfg)
        self.config = disc_cfg
        g, d = self.generator, self.discriminator
        g.tok_emb = d.tok_emb
        for name in SHARED_EMBEDDINGS:
            if hasattr(d.encoder, name):
                setattr(g.encoder, name, getattr(d.encoder, name))
        g.tie_weights()  # the generator's output matrix is the (shared) input embedding matrix

    def num_params(self, non_embedding: bool = False) -> int:
        seen, total = set(), 0
        for name, p in self.named_parameters():
            if id(p) in seen or (non_embedding and (name.endswith("tok_emb.weight") or ".pos_emb." in name)):
                continue
            seen.add(id(p))
            total += p.numel()
        return total

    def forward(
        self, input_ids: Tensor, labels: Tensor, attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None, index: Tensor | None = None, sample_u: Tensor | None = None,
    ) -> ElectraOutput:  # fmt: skip
        """index: the flat positions of the labelled tokens (the batch's `mlm_index`, found on the CPU when it was
        made); without it they are found here, which waits for the device. sample_u (B, T): a uniform per position
        that draws its replacement (`sample_by_cdf`); None draws from torch's generator."""
        if index is None:
            index = M.labelled_index(labels)
        h = self.generator(input_ids, attention_mask, token_type_ids=token_type_ids, return_logits=False)
        gen_logits = self.generator.logits(h.last_hidden_state.flatten(0, 1).index_select(0, index))  # (N, V)
        original = torch.where(labels != M.IGNORE, labels, input_ids)
        gen_labels = original.flatten().index_select(0, index)
        with torch.no_grad():
            probs = torch.softmax(gen_logits.detach().float(), -1)
            if not len(probs):
                sampled = gen_labels
            elif sample_u is not None:
                sampled = sample_by_cdf(probs, sample_u.flatten().index_select(0, index))
            else:
                sampled = torch.multinomial(probs, 1).squeeze(-1)
        corrupted = original.flatten().index_copy(0, index, sampled).view_as(original)
        out = self.discriminator(corrupted, attention_mask, token_type_ids=token_type_ids, return_logits=False)
        return ElectraOutput(gen_logits, gen_labels, out.rtd_logits, corrupted != original)


def generator_config(disc: ModelConfig, scale: float, preset: str | None) -> ModelConfig:
    """The generator: a scaled-down copy of the discriminator with an MLM head and its embedding width."""
    emb = disc.embedding_dim or disc.d_model
    if preset is not None:
        from lmforge.models import get_preset

        gen = get_preset(preset, vocab_size=disc.vocab_size, max_seq_len=disc.max_seq_len)
        if (gen.embedding_dim or gen.d_model) != emb:
            raise LMForgeError(
                f"objective.generator_preset '{preset}' has embedding width {gen.embedding_dim or gen.d_model}, "
                f"the discriminator {emb}: shared embeddings need the same width"
            )
        return gen
    heads = max(1, round(disc.n_heads * scale))
    d_model = heads * max(1, round(disc.d_model * scale / heads))
    return dataclasses.replace(
        disc, name=f"{disc.name}-generator", d_model=d_model, n_heads=heads, n_kv_heads=None, head_dim=None,
        d_ff=max(1, round(disc.d_ff * scale)), embedding_dim=emb, lm_head=True, lm_head_transform=True,
        lm_head_bias=True, tie_embeddings=True, rtd_head=False, pooler=False, nsp_head=False,
    )  # fmt: skip


@OBJECTIVES.register("electra")
class Electra(MaskedObjective):
    """Replaced-token detection with a jointly trained MLM generator."""

    name = "electra"
    val_loss_fixed = False  # the generator's samples get harder to spot as it learns: λ · RTD rises with no overfit
    Options = ElectraOptions
    # lmforge.load(run) returns the discriminator: the model section of the run's config describes it
    # (checkpoint/read.py, EXPORT_MODULES)

    def build_model(self, model_cfg) -> nn.Module:
        if not model_cfg.is_encoder or not model_cfg.rtd_head:
            raise LMForgeError(
                "objective 'electra' trains a discriminator: the model needs arch 'encoder' and model.rtd_head=true "
                "(e.g. --model.preset=electra-tiny)"
            )
        o = self.options
        return ElectraModel(model_cfg, generator_config(model_cfg, o.generator_scale, o.generator_preset))

    @classmethod
    def window_flops(cls, cfg) -> float:
        """Generator and discriminator, as Clark et al. 2020 count training FLOPs (Table 1): the discriminator's
        stack and RTD head on every token, the generator's stack on every token and its MLM head on the masked
        mask_rate share."""
        from lmforge.models.flops import lm_head_weights, training_flops

        o, T = cfg.objective.options, cfg.train.seq_len
        gen = generator_config(cfg.model, o.generator_scale, o.generator_preset)
        disc = training_flops(cfg.model, T) - 6.0 * lm_head_weights(cfg.model) * T  # its LM head (if any) never runs
        return disc + training_flops(gen, T) - 6.0 * lm_head_weights(gen) * T * (1.0 - o.mask_rate)

    def eval_transform(self, tokens) -> dict[str, Tensor]:
        """Static validation masks (MaskedObjective) and a uniform per position for the generator's samples, both
        functions of the example alone (module docstring)."""
        batch = super().eval_transform(tokens)
        batch["sample_u"] = sample_uniforms(batch["input_ids"], self.seed ^ EVAL_SALT)
        # The generator's loss is a mean over the masked tokens of the whole (global) batch, which the trainer
        # transforms on every rank before each takes its rows: each row carries real/masked tokens of the whole
        # batch, so that the ranks' losses, weighted by their real tokens, add up to one process's loss.
        ids = batch["input_ids"]
        n_real = int(batch["attention_mask"].sum()) if "attention_mask" in batch else ids.numel()
        n_masked = int((batch["labels"] != M.IGNORE).sum())
        batch["mlm_scale"] = torch.full((len(ids),), n_real / max(n_masked, 1), dtype=torch.float64)
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        out: ElectraOutput = model(
            batch["input_ids"], batch["labels"], batch.get("attention_mask"), batch.get("token_type_ids"),
            batch.get("mlm_index"), batch.get("sample_u"),
        )  # fmt: skip
        labelled = len(out.gen_labels)  # known on the host: the index came with the batch
        # §2: the discriminator scores every (non-padding) token; a sample equal to the original counts as real.
        # Means weighted by the padding mask rather than boolean indexing, which would wait for the device.
        logits, target = out.rtd_logits.float(), out.replaced.float()
        real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(out.replaced)
        weight, n_real = real.float(), real.sum()
        if "mlm_scale" in batch:  # validation: the whole batch's masked-token mean, whatever rows this rank has
            nll = F.cross_entropy(out.gen_logits.float(), out.gen_labels, reduction="sum")
            mlm = nll * batch["mlm_scale"][0].float() / n_real
        elif labelled:
            mlm = F.cross_entropy(out.gen_logits.float(), out.gen_labels)
        else:
            mlm = out.gen_logits.sum() * 0.0
        disc = (F.binary_cross_entropy_with_logits(logits, target, reduction="none") * weight).sum() / n_real
        metrics = {  # tensors: the loop reads them back on log steps only
            "mlm_loss": mlm.detach(), "disc_loss": disc.detach(),
            "disc_acc": (((logits > 0).float() == target).float() * weight).sum() / n_real,
            "replaced_frac": (target * weight).sum() / n_real,
        }  # fmt: skip
        return LossOutput(mlm + self.options.disc_weight * disc, n_real, metrics)
