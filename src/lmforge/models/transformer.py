"""`Transformer`, the model users build and load: models/model.py's network (`TransformerCore`) with the Hugging
Face-shaped surface added: `generate`, `save_pretrained` / `from_pretrained`, `labels=` returning a loss, and the
training habits of hf_training.py (`generation_config`, `resize_token_embeddings`, activation checkpointing).

The surface stands beside the network, a module above it, not mixed into it: the network imports none of what the
surface reads and writes (generation, checkpoints, Hugging Face conversion), and those read and write a
`TransformerCore`, building the class they are given (`read_pretrained`, `import_hf`). Every model lmforge builds
or loads is a `Transformer`, so every documented call keeps working on whatever `lmforge.load`, `from_pretrained`
or a run returns.

It is a thin layer over lmforge's own code, which stays the way in: generation is `models/generate.py` (sampling,
beam search, static-cache decoding), checkpoints are lmforge checkpoint dirs (written by `checkpoint/write.py`,
read back by `models/pretrained.py`, which `lmforge.load` reads through too), and the loss of `labels=` is the LM
head's cross-entropy the objectives use (`lm_head.py`). The network's own forward stays loss-free: the loss is
added here, after it, only when labels are given. Nothing here reaches above models/: a fine-tuned run, whose task
head lives in tasks/, is read with `lmforge.load`."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from lmforge.checkpoint.layout import MANIFEST_FILE
from lmforge.checkpoint.read import is_finetuned
from lmforge.checkpoint.write import write_failure, write_model_files
from lmforge.errors import LMForgeError
from lmforge.models.generate import generate as generate_tokens
from lmforge.models.hf import export_hf
from lmforge.models.hf_training import (
    IGNORE_INDEX,
    HFTrainingSurface,
    generate_options,
    own_generation_config,
    read_generation_config,
    shift_right,
)
from lmforge.models.layers import KVCache
from lmforge.models.lm_head import cross_entropy
from lmforge.models.model import TransformerCore
from lmforge.models.output import ModelOutput
from lmforge.models.pretrained import find_pretrained, read_pretrained

_GENERATE_ARGS = (
    "input_ids, attention_mask, max_new_tokens, max_length, do_sample, temperature, top_k, top_p, num_beams, "
    "length_penalty, eos_token_id, pad_token_id, num_return_sequences, generation_config, generator, compile, "
    "use_cache"
)


def _one_line_kwargs(what: str, unsupported: dict, supported: str) -> LMForgeError:
    names = ", ".join(sorted(unsupported))
    return LMForgeError(f"{what} does not support {names} (it takes: {supported})")


def labels_loss(model, out, labels: Tensor, num_items_in_batch: int | Tensor | None = None) -> Tensor:
    """Cross-entropy (nats) of the LM head against `labels` (B, T), -100 ignored, as the objectives score it.

    Decoders predict the next token: position t is scored against labels[t + 1] (labels = input_ids, as HF's
    causal LMs take them). Encoders (MLM) and encoder-decoders score each position against its own label. The mean
    is over the labelled tokens, or a sum over `num_items_in_batch` (what `transformers.Trainer` passes so that
    gradient accumulation averages over every token of the accumulated batch)."""
    cfg = model.config
    if not cfg.lm_head:
        raise LMForgeError(f"labels= needs a model with an LM head, and '{cfg.name}' ({cfg.arch}) has none")
    if labels.shape != out.last_hidden_state.shape[:2]:
        got, want = tuple(labels.shape), tuple(out.last_hidden_state.shape[:2])
        raise LMForgeError(f"labels have shape {got}, the model's output positions are {want}")
    labels = labels.to(out.last_hidden_state.device)
    causal = cfg.is_decoder
    if out.logits is not None:
        logits = out.logits[:, :-1] if causal else out.logits
        target = labels[:, 1:] if causal else labels
        loss = cross_entropy(logits, target, IGNORE_INDEX)
    else:  # return_logits=False: the head runs inside the loss (Transformer.lm_loss, as causal_lm's objective)
        h = out.last_hidden_state[:, :-1] if causal else out.last_hidden_state
        target = labels[:, 1:] if causal else labels
        loss = model.lm_loss(h, target)
    if num_items_in_batch is not None:
        loss = loss * (target != IGNORE_INDEX).sum() / num_items_in_batch
    return loss


def _max_new_tokens(cfg, input_ids: Tensor, max_new_tokens: int | None, max_length: int | None) -> int:
    """HF's length arguments as new tokens: max_new_tokens wins; max_length counts the prompt (decoders) or the
    decoder start token (encoder-decoders); neither means max_length 20, as HF's default generation config."""
    if max_new_tokens is not None:
        return max_new_tokens
    length = 20 if max_length is None else max_length
    used = 1 if cfg.is_encoder_decoder else input_ids.shape[1]
    return max(0, length - used)


def _eos_id(eos_token_id: int | list[int] | None) -> int | None:
    if isinstance(eos_token_id, (list, tuple)):
        if len(eos_token_id) > 1:
            raise LMForgeError(f"generate stops on one eos_token_id, got {len(eos_token_id)}: {list(eos_token_id)}")
        return int(eos_token_id[0]) if eos_token_id else None
    return None if eos_token_id is None else int(eos_token_id)


def _pad_after_eos(out: Tensor, start: int, eos_id: int | None, pad_id: int | None) -> Tensor:
    """Positions after each row's first EOS among the generated tokens (from column `start`) set to pad_id (lmforge
    fills them with EOS; HF with pad_token_id)."""
    if eos_id is None or pad_id is None or pad_id == eos_id or out.shape[1] <= start:
        return out
    new = out[:, start:]
    after = (new == eos_id).int().cumsum(1) - (new == eos_id).int() > 0  # strictly after the first EOS
    return torch.cat([out[:, :start], new.masked_fill(after, pad_id)], dim=1)


class Transformer(HFTrainingSurface, TransformerCore):
    """A decoder, encoder or encoder-decoder transformer, chosen by `ModelConfig.arch` (models/model.py's network),
    with the Hugging Face-shaped methods: generate, save_pretrained / from_pretrained, `labels=` on forward and the
    training habits of hf_training.py. Every model lmforge builds or loads is one."""

    main_input_name = "input_ids"
    accepts_loss_kwargs = True
    """`transformers.Trainer` passes num_items_in_batch to forward (exact averaging under gradient accumulation)."""

    @property
    def loss_type(self) -> str:
        """What `labels=` scores, in `transformers`' names: "ForCausalLM" (decoders: the labels are shifted, which
        `transformers.Trainer` reads to count a batch's scored tokens) or "ForMaskedLM" (every labelled position)."""
        return "ForCausalLM" if self.config.is_decoder else "ForMaskedLM"  # type: ignore[attr-defined]

    @property
    def device(self) -> torch.device:
        """Device of the model's parameters (of the first one)."""
        return next(self.parameters()).device  # type: ignore[attr-defined]

    @property
    def dtype(self) -> torch.dtype:
        """Floating-point dtype of the model's parameters (of the first one)."""
        return next(self.parameters()).dtype  # type: ignore[attr-defined]

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """HF's parameter count (tied tensors once); `transformers.Trainer` reads it for its FLOP estimate."""
        if not only_trainable:
            return self.num_params(non_embedding=exclude_embeddings)  # type: ignore[attr-defined]
        seen = {id(p): p for p in self.parameters() if p.requires_grad}  # type: ignore[attr-defined]
        return sum(p.numel() for p in seen.values())

    def get_input_embeddings(self):
        return self.tok_emb  # type: ignore[attr-defined]

    def get_output_embeddings(self):
        return self.lm_head if self.config.lm_head else None  # type: ignore[attr-defined]

    def _hf_decoder_inputs(self, labels: Tensor | None, decoder_input_ids: Tensor | None) -> Tensor | None:
        """An encoder-decoder given labels but no decoder inputs decodes the labels shifted right (HF T5/BART)."""
        cfg = self.config  # type: ignore[attr-defined]
        if labels is None or decoder_input_ids is not None or not cfg.is_encoder_decoder:
            return decoder_input_ids
        return shift_right(labels, cfg.decoder_start_id, cfg.pad_id)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        prefix_len: Tensor | int | None = None,
        cache: KVCache | None = None,
        use_cache: bool = False,
        return_logits: bool = True,
        mtp: bool = False,
        output_hidden_states: bool = False,
        mems: list[Tensor] | None = None,
        use_mems: bool = False,
        mem_len: int | None = None,
        perm_mask: Tensor | None = None,
        query_positions: Tensor | None = None,
        attn_kind: Tensor | None = None,
        labels: Tensor | None = None,
        num_items_in_batch: int | Tensor | None = None,
    ) -> ModelOutput:
        """The network's forward (`TransformerCore.forward`, whose arguments these are; named here for
        `transformers.Trainer`, which keeps the batch columns a forward names), and, as a `transformers` model takes
        them, labels (B, T), -100 where ignored: their loss is returned too (ModelOutput.loss; next-token for
        decoders, `labels_loss`), and an encoder-decoder without decoder_input_ids decodes the labels shifted
        right. num_items_in_batch: see `labels_loss`."""
        out = super().forward(
            input_ids, attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
            decoder_input_ids=self._hf_decoder_inputs(labels, decoder_input_ids),
            decoder_attention_mask=decoder_attention_mask, encoder_hidden_states=encoder_hidden_states,
            prefix_len=prefix_len, cache=cache, use_cache=use_cache, return_logits=return_logits, mtp=mtp,
            output_hidden_states=output_hidden_states, mems=mems, use_mems=use_mems, mem_len=mem_len,
            perm_mask=perm_mask, query_positions=query_positions, attn_kind=attn_kind,
        )  # fmt: skip
        if labels is not None:
            out.loss = labels_loss(self, out, labels, num_items_in_batch)
        return out

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        max_new_tokens: int | None = None,
        max_length: int | None = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        num_return_sequences: int | None = None,
        generation_config=None,
        generator: torch.Generator | None = None,
        compile: bool = False,
        use_cache: bool = True,
        **unsupported: Any,
    ) -> Tensor:
        """Generate as `transformers`' `model.generate` does, through `lmforge.models.generate.generate`.

        Decoders take left-padded prompts and return prompt + continuation (B, T + n); encoder-decoders take the
        source and return the decoder sequence from its start token (B, 1 + n). An option not passed comes from
        `generation_config` (this call's, else the model's: its eos / pad ids, num_beams, ...), else greedy decoding
        of max_length 20 with no top-k filter. do_sample uses temperature / top_k / top_p; num_beams > 1 runs beam
        search. After a row's EOS come pad_token_id (when set) or EOS. use_cache is accepted either way (decoding
        always caches; the tokens are the same). Other `transformers` options are refused in one line."""
        if unsupported:
            raise _one_line_kwargs("generate()", unsupported, _GENERATE_ARGS)
        if input_ids is None:
            raise LMForgeError("generate() needs input_ids (a (batch, length) tensor of prompt token ids)")
        passed = dict(
            max_new_tokens=max_new_tokens, max_length=max_length, do_sample=do_sample, temperature=temperature,
            top_k=top_k, top_p=top_p, num_beams=num_beams, length_penalty=length_penalty, eos_token_id=eos_token_id,
            pad_token_id=pad_token_id, num_return_sequences=num_return_sequences,
        )  # fmt: skip
        o = generate_options(self, passed, generation_config)
        do_sample, temperature, n_return = o["do_sample"], o["temperature"], o["num_return_sequences"]
        if do_sample and temperature <= 0:
            raise LMForgeError(f"do_sample=True needs temperature > 0, got {temperature} (greedy: do_sample=False)")
        if do_sample and o["num_beams"] > 1:
            raise LMForgeError("do_sample=True with num_beams > 1 (beam sampling) is not supported: pick one")
        if n_return != 1:
            if not do_sample or n_return < 1:
                raise LMForgeError(
                    f"num_return_sequences={n_return} needs do_sample=True and a value >= 1 "
                    "(greedy and beam search return one sequence per prompt)"
                )
            input_ids = input_ids.repeat_interleave(n_return, dim=0)
            if attention_mask is not None:
                attention_mask = attention_mask.repeat_interleave(n_return, dim=0)
        eos = _eos_id(o["eos_token_id"])
        out = generate_tokens(
            self, input_ids, attention_mask,
            max_new_tokens=_max_new_tokens(self.config, input_ids, o["max_new_tokens"], o["max_length"]),  # type: ignore[attr-defined]
            temperature=temperature if do_sample else 0.0, top_k=o["top_k"] if do_sample else None,
            top_p=o["top_p"] if do_sample else None, eos_id=eos, num_beams=o["num_beams"],
            length_penalty=o["length_penalty"], generator=generator, compile=compile,
        )  # fmt: skip
        start = 1 if self.config.is_encoder_decoder else input_ids.shape[1]  # type: ignore[attr-defined]
        return _pad_after_eos(out, start, eos, o["pad_token_id"])

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        *,
        tokenizer=None,
        format: Literal["lmforge", "hf"] = "lmforge",
        state_dict: dict[str, Tensor] | None = None,
        is_main_process: bool = True,
        safe_serialization: bool = True,
        **unsupported: Any,
    ) -> Path:
        """Write the model (and `tokenizer`, when given) into `save_directory`, kept with any other files there.

        format="lmforge": an lmforge checkpoint dir (model.safetensors with tied weights stored once, config.yaml,
        manifest.json), which `from_pretrained`, `lmforge.load` and every lmforge command read. format="hf": a
        Hugging Face model dir through lmforge's converter (`lmforge convert --to hf`), which `transformers`' Auto
        classes load. state_dict (weights to write instead of the model's own) and is_main_process are
        `transformers.Trainer`'s arguments; the weights are always safetensors."""
        if unsupported:
            raise _one_line_kwargs("save_pretrained()", unsupported, "tokenizer, format, state_dict, is_main_process")
        if not safe_serialization:
            raise LMForgeError("save_pretrained() writes safetensors only (safe_serialization=False is not supported)")
        if format not in ("lmforge", "hf"):
            raise LMForgeError(f"save_pretrained() format must be 'lmforge' or 'hf', got {format!r}")
        out = Path(save_directory)
        if not is_main_process:
            return out
        if out.exists() and not out.is_dir():
            raise LMForgeError(f"cannot save to {out}: it is a file")
        vocab = self.config.vocab_size  # type: ignore[attr-defined]
        if tokenizer is not None and tokenizer.vocab_size > vocab:
            raise LMForgeError(
                f"cannot save a tokenizer of {tokenizer.vocab_size} tokens with a model of vocab_size {vocab}"
            )
        if format == "hf":
            if state_dict is not None:
                raise LMForgeError("save_pretrained(format='hf') converts the model itself: state_dict= does not apply")
            export_hf(self, out, tokenizer)
        else:
            _save_lmforge(self, out, tokenizer, state_dict)
        config = own_generation_config(self)  # set, read or given ids: the values generate uses travel with the model
        if config is not None:
            config.save_pretrained(out)
        return out

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        **unsupported: Any,
    ):
        """The model of a local lmforge run dir of a pretrained model, checkpoint dir (`save_pretrained`'s) or
        Hugging Face model dir, in eval mode as `transformers` returns it (`lmforge.load` without the tokenizer:
        `Tokenizer.from_pretrained`). A fine-tuned run is refused: `lmforge.load(path)` reads it, as the fine-tuned
        model that also predicts with the run's task head. dtype: a torch dtype or its name ("bfloat16");
        torch_dtype is its `transformers` alias."""
        if "torch_dtype" in unsupported and dtype is None:
            dtype = unsupported.pop("torch_dtype")
        if unsupported:
            raise _one_line_kwargs("from_pretrained()", unsupported, "path, device, dtype (torch_dtype)")
        path = Path(pretrained_model_name_or_path)
        if not path.exists():
            raise LMForgeError(f"{path} does not exist (from_pretrained reads local lmforge and Hugging Face dirs)")
        c, cfg = find_pretrained(path)
        if cfg is not None and is_finetuned(cfg):
            raise LMForgeError(
                f"{path} is a fine-tuned run: read it with lmforge.load(path), which returns the fine-tuned model "
                "that predicts (from_pretrained reads pretrained models)"
            )
        model = read_pretrained(c, cfg, cls)
        if not isinstance(model, cls):
            raise LMForgeError(f"{path} holds a {type(model).__name__}, not a {cls.__name__}")
        model = model.to(device).eval()
        read_generation_config(model, c)
        return model if dtype is None else model.to(_dtype(dtype))


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise LMForgeError(f"unknown floating-point dtype {dtype!r} (e.g. float32, bfloat16, float16)")
    return value


def _save_lmforge(model, out: Path, tokenizer, state_dict: dict[str, Tensor] | None) -> Path:
    """Write a complete checkpoint in a scratch dir beside `out`, then move its files into `out` (the manifest
    last, so a save cut short leaves no manifest that lists missing files); other files in `out` stay."""
    config = {"model": dataclasses.asdict(model.config)}
    scratch = out.with_name(f".tmp-save-{out.name}-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        write_model_files(scratch, state_dict if state_dict is not None else model.state_dict(), config, tokenizer)
        out.mkdir(exist_ok=True)
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        names = sorted(p.name for p in scratch.iterdir() if p.name != MANIFEST_FILE) + [MANIFEST_FILE]
        for name in names:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            os.replace(scratch / name, out / name)
    except Exception as e:
        failure = write_failure(f"save to {out}", e)
        if failure is None:
            raise
        raise failure from e
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
