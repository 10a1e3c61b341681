"""The reference side of `bench/train_parity.py`: each lmforge model's twin, built from the same architecture with
the reference's own init, and one loss per objective kind with the definition of lmforge's objective.

A twin is never given lmforge's weights. Hugging Face twins come from the converters' config (`config_to_hf`) and
`from_config`, so `transformers`' own `_init_weights` runs; nanoGPT's `GPT` and nanoT5's `MyT5` are imported from a
local checkout at run time and initialise themselves. Every loss returns lmforge's `LossOutput`, so the harness
trains and evaluates both sides with one loop."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.errors import LMForgeError
from lmforge.objectives.base import LossOutput

IGNORE = -100
LossFn = Callable[[nn.Module, dict[str, Tensor]], LossOutput]


# --- building -------------------------------------------------------------------------------------------------------


def hf_config(model_cfg, state_dict, tokenizer=None):
    """The `transformers` config and Auto-class name of an lmforge model config (its converter's mapping), with
    the tokenizer's bos/eos ids as `export_hf` writes them."""
    import transformers

    from lmforge.models.hf import converter_of

    conv = converter_of(model_cfg, state_dict)
    d = dict(conv.config_to_hf(model_cfg))
    check_dropout_sites(model_cfg, d["model_type"])
    for role in ("bos", "eos"):
        if tokenizer is not None and getattr(tokenizer, f"{role}_id", None) is not None:
            d[f"{role}_token_id"] = getattr(tokenizer, f"{role}_id")
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    return config, conv.auto_class(model_cfg)


def check_dropout_sites(model_cfg, model_type: str) -> None:
    """Refuse a config whose dropout the twin's config cannot express: T5 drops at every site (embedding, attention
    probabilities, FFN hidden activation, sublayer outputs, final norm output) with its one dropout_rate; the other
    twins drop neither the FFN hidden activation nor the final norm's output."""
    m = model_cfg
    if m.dropout == 0 and m.attn_dropout == 0:
        return
    if model_type == "t5":
        if m.attn_dropout != m.dropout or not (m.dropout_ffn_hidden and m.dropout_final_norm):
            raise LMForgeError("the t5 twin drops at every site with one rate (dropout_rate): it needs "
                               "model.attn_dropout = model.dropout and model.dropout_ffn_hidden, "
                               "model.dropout_final_norm true")  # fmt: skip
    elif m.dropout > 0 and (m.dropout_ffn_hidden or m.dropout_final_norm):
        raise LMForgeError(f"the {model_type} twin drops neither the FFN hidden activation nor the final norm's "
                           "output: model.dropout_ffn_hidden and model.dropout_final_norm must be false")  # fmt: skip


def hf_from_config(model_cfg, state_dict, tokenizer=None) -> nn.Module:
    """A freshly initialised `transformers` model of the same architecture (`from_config`: HF's own init)."""
    import transformers

    config, auto = hf_config(model_cfg, state_dict, tokenizer)
    model = getattr(transformers, auto).from_config(config)
    if model_cfg.lm_head and not model_cfg.tie_embeddings:
        untie_output(model)
    return model


def untie_output(model: nn.Module) -> None:
    """Give a model whose output matrix `transformers` tied to the input table against its config its own matrix,
    initialised by the model's own `_init_weights`. transformers 5.x's T5Config reads tie_word_embeddings=False
    as "do not rescale the decoder output" and then forces tying on, so a T5 v1.1 built by `from_config` would
    share its output matrix, which the released v1.1 checkpoints do not."""
    out, table = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or out.weight is not table.weight:
        return
    out.weight = nn.Parameter(torch.empty_like(out.weight))
    model.config.tie_word_embeddings = False  # what _init_weights reads to initialise an untied head
    model._init_weights(model)  # T5: shared and lm_head ~ N(0, initializer_factor²); initialised tensors are kept


def meta_model(objective, model_cfg) -> nn.Module:
    """lmforge's model for the objective on the meta device: its config and tensor names, nothing allocated."""
    with torch.device("meta"):
        return objective.build_model(model_cfg)


def load_module(path: Path, name: str):
    """Import one file of a local checkout as a module (the checkout's package imports nothing else)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LMForgeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def nanogpt_model(model_cfg, checkout: Path) -> nn.Module:
    """nanoGPT's `GPT` (model.py of a local checkout) with the lmforge GPT-2 config's sizes, its own init."""
    path = Path(checkout) / "model.py"
    if not path.is_file():
        raise LMForgeError(f"--nanogpt: {checkout} is not a nanoGPT checkout (no model.py)")
    m = model_cfg
    if m.d_ff != 4 * m.d_model or not m.tie_embeddings:
        raise LMForgeError(f"nanoGPT's GPT has d_ff = 4·d_model and tied embeddings; model {m.name} has "
                           f"d_ff {m.d_ff}, tie_embeddings {m.tie_embeddings}")  # fmt: skip
    mod = load_module(path, "nanogpt_model")
    # dropout: GPT-2's residual/embedding dropout; nanoGPT uses one rate for attention and residual alike.
    cfg = mod.GPTConfig(block_size=m.max_seq_len, vocab_size=m.vocab_size, n_layer=m.n_layers, n_head=m.n_heads,
                        n_embd=m.d_model, dropout=m.dropout, bias=True)  # fmt: skip
    return mod.GPT(cfg)


def nanot5_model(model_cfg, state_dict, checkout: Path, tokenizer=None) -> nn.Module:
    """nanoT5's `MyT5` (nanoT5/utils/t5_model.py of a local checkout) for a T5 v1.1 config, its own init.

    Only that file is imported: the package's __init__ pulls in hydra, accelerate, datasets and neptune for its
    training script, none of which the model needs. Its T5Config comes from lmforge's converter instead of
    `AutoConfig.from_pretrained('google/t5-v1_1-base')` (a download), with nanoT5's overrides (no dropout).
    The model file needs transformers 4.x (see the error below): with 5.x this reference is refused."""
    path = Path(checkout) / "nanoT5" / "utils" / "t5_model.py"
    if not path.is_file():
        raise LMForgeError(f"--nanot5: {checkout} is not a nanoT5 checkout (no nanoT5/utils/t5_model.py)")
    if not model_cfg.gated or model_cfg.tie_embeddings:
        raise LMForgeError("nanoT5's MyT5 is T5 v1.1 only (gated FFN, untied output): use --family t5-v1_1")
    from transformers.modeling_utils import ModuleUtilsMixin

    if not hasattr(ModuleUtilsMixin, "get_extended_attention_mask"):
        import transformers

        raise LMForgeError(
            "nanot5: nanoT5's T5Stack calls ModuleUtilsMixin.get_extended_attention_mask/invert_attention_mask, "
            f"which transformers 5.x removed (installed: {transformers.__version__}); it runs with transformers 4.x"
        )
    config, _ = hf_config(model_cfg, state_dict, tokenizer)
    config.is_bf16 = False  # nanoT5's default: fp32 weights under bf16 autocast
    config.tie_word_embeddings = False  # transformers 5.x forces it on (see untie_output); MyT5 asserts it off
    return load_module(path, "nanot5_model").MyT5(config)


# --- losses (one per objective kind) --------------------------------------------------------------------------------


def causal_lm_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """objectives/causal_lm.py: mean next-token cross-entropy over every position, float32 softmax statistics."""
    logits = model(input_ids=batch["input_ids"], use_cache=False).logits  # (B, T, V); no KV cache in training
    labels = batch["labels"]
    return LossOutput(F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()), labels.numel())


def nanogpt_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """nanoGPT's own loss (GPT.forward with targets): the mean cross-entropy over every position, as causal_lm's
    (F.cross_entropy runs in float32 under autocast)."""
    labels = batch["labels"].contiguous()  # GPT.forward views it flat
    _, loss = model(batch["input_ids"], labels)
    return LossOutput(loss, labels.numel())


# Module that maps an HF masked-LM's hidden states to logits (transform + decoder), by model_type.
MLM_HEADS: dict[str, Callable[[nn.Module, Tensor], Tensor]] = {
    "bert": lambda m, h: m.cls(h),
    "roberta": lambda m, h: m.lm_head(h),
    "electra": lambda m, h: m.generator_lm_head(m.generator_predictions(h)),
}


def mlm_hidden(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """(B, T, d) last hidden states of an HF masked LM's encoder on the batch's (corrupted) inputs."""
    base = getattr(model, model.base_model_prefix)
    out = base(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
               token_type_ids=batch.get("token_type_ids"))  # fmt: skip
    return out.last_hidden_state


def mlm_logits(model: nn.Module, h: Tensor) -> Tensor:
    return MLM_HEADS[model.config.model_type](model, h)


def mlm_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """objectives/mlm.py: mean cross-entropy over the selected positions; like lmforge, the head runs on those
    positions only (the same math as HF's full-sequence logits, without the 85% nobody scores)."""
    labels = batch["labels"]
    index = batch.get("mlm_index")
    if index is None:
        index = (labels != IGNORE).flatten().nonzero().squeeze(1)
    h = mlm_hidden(model, batch).flatten(0, 1).index_select(0, index)  # (N, d)
    logits = mlm_logits(model, h)
    target = labels.flatten().index_select(0, index)
    return LossOutput(F.cross_entropy(logits.float(), target), index.numel())


def seq2seq_loss(model: nn.Module, batch: dict[str, Tensor], **kwargs) -> LossOutput:
    """objectives/seq2seq.py: the decoder teacher-forced on the batch's decoder_input_ids (no shift by the
    reference), mean cross-entropy over the non-padding labels. nanoT5's MyT5 takes it as it is.

    attention_mask is in the batch only when a source row is padded (objectives/seq2seq.py): T5 span corruption's
    rows are all one length, so both sides then run cross-attention unmasked."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                decoder_input_ids=batch["decoder_input_ids"], **kwargs)  # fmt: skip
    labels = batch["labels"]
    loss = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    return LossOutput(loss, (labels != IGNORE).sum())


def hf_seq2seq_loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
    """seq2seq_loss without a KV cache: HF turns it off itself only when given labels, and a cache in training
    costs time and, compiled, recompilations."""
    return seq2seq_loss(model, batch, use_cache=False)


# --- ELECTRA ----------------------------------------------------------------------------------------------------------


class HFElectra(nn.Module):
    """ElectraForMaskedLM generator + ElectraForPreTraining discriminator sharing the embedding module (token,
    position and segment tables and their LayerNorm: what objectives/electra.py shares, Clark et al. §3.2), the
    generator's output matrix tied to the shared token table."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module) -> None:
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        generator.electra.embeddings = discriminator.electra.embeddings
        generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight


def hf_electra(objective, model_cfg) -> HFElectra:
    """The HF pair of the configs lmforge's electra objective builds (generator from `generator_config`)."""
    lm = meta_model(objective, model_cfg)
    disc = hf_from_config(lm.discriminator.config, lm.discriminator.state_dict(), objective.tokenizer)
    gen = hf_from_config(lm.generator.config, lm.generator.state_dict(), objective.tokenizer)
    return HFElectra(gen, disc)


def electra_loss_fn(disc_weight: float) -> LossFn:
    """objectives/electra.py: generator MLM on the masked positions + λ · BCE of replaced-token detection over the
    non-padding tokens; replacements sampled from the generator with torch.multinomial from the global generator,
    which the harness seeds alike for both sides before every step, so the draws differ only by the models."""

    def loss(model: nn.Module, batch: dict[str, Tensor]) -> LossOutput:
        labels, ids, mask = batch["labels"], batch["input_ids"], batch.get("attention_mask")
        sel = labels != IGNORE  # (B, T)
        h = mlm_hidden(model.generator, batch)
        gen_logits = mlm_logits(model.generator, h[sel])  # (N, V)
        original = torch.where(sel, labels, ids)
        with torch.no_grad():
            probs = torch.softmax(gen_logits.detach().float(), -1)
            sampled = torch.multinomial(probs, 1).squeeze(-1) if len(probs) else original[sel]
        corrupted = original.masked_scatter(sel, sampled)
        rtd = model.discriminator(input_ids=corrupted, attention_mask=mask,
                                  token_type_ids=batch.get("token_type_ids")).logits  # (B, T)  # fmt: skip
        mlm = F.cross_entropy(gen_logits.float(), labels[sel])
        real = mask.bool() if mask is not None else torch.ones_like(sel)
        logits, target = rtd.float()[real], (corrupted != original)[real].float()
        disc = F.binary_cross_entropy_with_logits(logits, target)
        acc, frac = ((logits > 0).float() == target).float().mean(), target.mean()
        metrics = {"mlm_loss": mlm.detach(), "disc_loss": disc.detach(), "disc_acc": acc, "replaced_frac": frac}
        return LossOutput(mlm + disc_weight * disc, real.sum(), metrics)

    return loss


# --- the table -------------------------------------------------------------------------------------------------------


def reference(impl: str, objective, model_cfg, checkouts: dict[str, Path | None]) -> tuple[nn.Module, LossFn, str]:
    """(model on the CPU, loss, class name) of reference `impl` (hf, nanogpt, nanot5) for lmforge's objective; its
    parameter count must be lmforge's."""
    model, loss_fn, name = _reference(impl, objective, model_cfg, checkouts)
    check_same_size(model, meta_model(objective, model_cfg), impl)
    return model, loss_fn, name


def _reference(impl: str, objective, model_cfg, checkouts: dict[str, Path | None]) -> tuple[nn.Module, LossFn, str]:
    kind = objective.name
    if impl == "nanogpt":
        if kind != "causal_lm":
            raise LMForgeError("nanogpt is a reference for the gpt2 family only")
        model = nanogpt_model(model_cfg, _checkout(checkouts, "nanogpt"))
        return model, nanogpt_loss, "nanoGPT GPT"
    if impl == "nanot5":
        if kind != "t5":
            raise LMForgeError("nanot5 is a reference for the t5-v1_1 family only")
        lm = meta_model(objective, model_cfg)
        model = nanot5_model(model_cfg, lm.state_dict(), _checkout(checkouts, "nanot5"), objective.tokenizer)
        return model, seq2seq_loss, "nanoT5 MyT5"
    if impl != "hf":
        raise LMForgeError(f"unknown implementation '{impl}' (lmforge, hf, nanogpt, nanot5)")
    if kind == "electra":
        model = hf_electra(objective, model_cfg)
        return model, electra_loss_fn(objective.options.disc_weight), "ElectraForMaskedLM + ElectraForPreTraining"
    losses = {"causal_lm": causal_lm_loss, "mlm": mlm_loss, "roberta": mlm_loss, "t5": hf_seq2seq_loss,
              "bart": hf_seq2seq_loss}  # fmt: skip
    if kind not in losses:
        raise LMForgeError(f"objective '{kind}' has no reference loss here (supported: {', '.join(losses)}, electra)")
    lm = meta_model(objective, model_cfg)
    model = hf_from_config(model_cfg, lm.state_dict(), objective.tokenizer)
    return model, losses[kind], type(model).__name__


def n_weights(model: nn.Module) -> int:
    """Elements of the model's floating-point state (parameters and persistent buffers), shared tensors once: what
    defines the architecture, whether a reference trains a tensor or keeps it fixed (HF BART's final_logits_bias is
    a buffer, lmforge's logits bias a parameter)."""
    seen, n = set(), 0
    for t in model.state_dict(keep_vars=True).values():
        if id(t) not in seen and t.is_floating_point():
            seen.add(id(t))
            n += t.numel()
    return n


def check_same_size(twin: nn.Module, lm: nn.Module, impl: str) -> None:
    """Refuse a twin whose size differs from lmforge's model: the architectures would not be the same."""
    n_twin, n_lm = n_weights(twin), n_weights(lm)
    if n_twin != n_lm:
        raise LMForgeError(f"{impl} twin has {n_twin:,} weights, the lmforge model {n_lm:,}: not the same "
                           "architecture")  # fmt: skip


def _checkout(checkouts: dict[str, Path | None], name: str) -> Path:
    path = checkouts.get(name)
    if path is None:
        raise LMForgeError(f"impl {name} needs --{name} PATH (a local checkout)")
    if not Path(path).is_dir():
        raise LMForgeError(f"--{name}: {path} is not a directory")
    return Path(path)
