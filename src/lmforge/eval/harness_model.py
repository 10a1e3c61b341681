"""The lm-evaluation-harness model `lmforge`: an `lm_eval.api.model.LM` over lmforge's scoring LM (eval/lm.py).

Importing this module registers the class under the name `lmforge` (it needs `pip install 'lmforge[harness]'`);
lm-eval's entry-point discovery imports it (pyproject.toml, group `lm_eval.models`), and `lmforge.eval.harness` is
the command line. The harness's three request types map onto `eval.lm.LM`:

- loglikelihood: Instance.args = (context, continuation) → (log P(continuation | context), is_greedy);
- loglikelihood_rolling: (text,) → log P(text), in windows that predict every token once;
- generate_until: (context, gen_kwargs) → the continuation cut before the first `until` string; requests with
  the same gen_kwargs run together (greedy unless do_sample, then temperature / top_k / top_p sampling).

Decoders and encoder-decoders with an LM head are supported; encoder-decoders encode the context and score or
generate the continuation with the decoder."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from typing import Any

import torch
from lm_eval.api.model import LM as HarnessLM
from lm_eval.api.registry import register_model

from lmforge.errors import LMForgeError
from lmforge.eval.lm import LM

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GEN_KEYS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p"}


def _batch_size(value: int | str | None) -> int:
    """The harness passes ints, digit strings, or "auto"/"auto:N" (batches here are fixed: 16 then)."""
    if value is None or str(value).startswith("auto"):
        return 16
    try:
        size = int(value)
    except ValueError:
        raise LMForgeError(f"batch_size must be an integer or 'auto', got {value!r}") from None
    if size < 1:
        raise LMForgeError(f"batch_size must be >= 1, got {size}")
    return size


@register_model("lmforge")
class LMForgeLM(HarnessLM):
    """`--model lmforge --model_args pretrained=RUN[,dtype=bfloat16,max_gen_toks=256]`: an lmforge run dir,
    checkpoint dir or Hugging Face model dir; or, from Python, `LMForgeLM(model=model, tokenizer=tokenizer)`."""

    def __init__(
        self,
        pretrained: str | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        batch_size: int | str | None = 16,
        max_batch_size: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_gen_toks: int | str = 256,
    ) -> None:
        super().__init__()
        from lmforge.loading import load

        if not device or (str(device).startswith("cuda") and not torch.cuda.is_available()):
            if device:  # lm_eval's command line asks for cuda by default
                log.warning("lmforge harness model: %s is not available, using the CPU", device)
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if model is None:
            if not pretrained:
                raise LMForgeError("the lmforge model needs model_args pretrained=RUN_OR_CHECKPOINT_DIR")
            model, tokenizer = load(pretrained, device=device)
        if tokenizer is None:
            raise LMForgeError(f"{pretrained or 'the model'} has no tokenizer to encode requests with")
        if dtype is not None and dtype != "auto":
            if dtype not in DTYPES:
                raise LMForgeError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
            model = model.to(DTYPES[dtype])
        self.name = str(pretrained) if pretrained else model.config.name
        self.lm = LM(model.to(device), tokenizer, batch_size=_batch_size(batch_size), device=device)
        self._device = torch.device(device)
        self.max_gen_toks = int(max_gen_toks)

    @property
    def tokenizer_name(self) -> str:
        return self.name

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = self.lm.loglikelihood([req.args for req in requests])
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = self.lm.loglikelihood_rolling([req.args[0] for req in requests])
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[json.dumps(req.args[1] if len(req.args) > 1 else {}, sort_keys=True, default=str)].append(i)
        out: list[str] = [""] * len(requests)
        for key, idx in groups.items():
            until, max_toks, sampling = self._gen_options(json.loads(key))
            texts = self.lm.generate_until([(requests[i].args[0], until, max_toks) for i in idx], **sampling)
            for i, text in zip(idx, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _gen_options(self, kw: dict) -> tuple[list[str], int, dict]:
        """(until, max_gen_toks, sampling keywords) of a request's gen_kwargs, with HF generate()'s meaning."""
        ignored = sorted(set(kw) - GEN_KEYS - {"num_beams"})
        if ignored or kw.get("num_beams", 1) != 1:
            log.warning("lmforge harness model: ignoring generation options %s", ignored or ["num_beams"])
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_toks = int(kw.get("max_gen_toks", self.max_gen_toks))
        if not kw.get("do_sample", False):  # HF generate()'s default: greedy whatever the temperature
            return until, max_toks, {}
        sampling = {
            "temperature": float(kw.get("temperature", 1.0)),
            "top_k": kw.get("top_k"),
            "top_p": kw.get("top_p"),
        }
        return until, max_toks, sampling
