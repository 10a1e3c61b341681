"""What int8 dynamic quantisation does to one model (`lmforge compress quantize`): state-dict size, CPU latency and
the relative error of its logits, beside the float32 model's."""

from __future__ import annotations

from lmforge.errors import LMForgeError


def quantize_benchmark(path: str, seq_len: int = 64, runs: int = 10, threads: int = 1) -> dict[str, float]:
    """Int8-quantise a model (run / checkpoint / Hugging Face dir) in memory → its state-dict size, CPU latency at
    batch 1 and 8 (median of `runs`, on `threads` threads) and the relative error of its logits on `seq_len` tokens
    of bundled-corpus text, beside the float32 model's."""
    import torch

    from lmforge.compress.quantize import quantize_int8
    from lmforge.compress.report import state_dict_bytes
    from lmforge.data.corpus.bundled import load_default_corpus
    from lmforge.loading import load

    model, tok = load(path)
    if tok is None:
        raise LMForgeError(f"{path} has no tokenizer to encode the benchmark text with")
    if not model.config.lm_head:
        raise LMForgeError(f"{path}: the model has no LM head to compare logits of")
    ids = tok.encode(load_default_corpus()[0])[:seq_len]
    if len(ids) < seq_len:
        raise LMForgeError(f"the benchmark text has only {len(ids)} tokens")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q = quantize_int8(model)
        out = {"fp32_mb": state_dict_bytes(model) / 1e6, "int8_mb": state_dict_bytes(q) / 1e6}
        for bs in (1, 8):
            x = torch.tensor([ids] * bs)
            out[f"fp32_b{bs}_ms"] = _latency(model, x, runs)
            out[f"int8_b{bs}_ms"] = _latency(q, x, runs)
        x = torch.tensor([ids])
        with torch.no_grad():
            a, b = _logits(model, x), _logits(q, x)
        out["relative_error"] = float((a - b).norm() / a.norm())
    finally:
        torch.set_num_threads(old)
    return out


def _logits(model, x):
    kw = {"decoder_input_ids": x} if model.config.is_encoder_decoder else {}
    return model(x, **kw).logits


def _latency(model, x, runs: int) -> float:
    from lmforge.compress.report import cpu_latency_ms

    model.eval()
    return cpu_latency_ms(lambda: _logits(model, x), runs)
