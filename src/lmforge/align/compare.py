"""Aligned policies side by side on the same held-out prompts: the reward model's score of their responses, their KL
to the reference (the SFT policy) and a few samples — for PPO, DPO and best-of-n against the SFT policy.

Every policy samples one response per prompt at the same temperature from the same random numbers (common random
numbers: row i of every method is driven by the same noise, so what differs between methods' responses to a prompt
comes from the policies, not from sampling luck). KL(π‖π_ref) per response is estimated from those samples as
Σ_t log π(y_t|·) − log π_ref(y_t|·). Best-of-n draws n responses per prompt from the reference — the first is the
reference row's own sample, so best-of-n never scores a prompt below it — and keeps the one the reward model
scores highest; its KL is given as log n − (n − 1)/n, the value commonly quoted since Stiennon et al. 2020 and an
upper bound on the true KL (Beirami et al. 2024), not an estimate."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from lmforge.align.rollout import Samples, score_samples
from lmforge.errors import LMForgeError


@dataclass
class Row:
    """One method's results on the held-out prompts."""

    method: str
    reward: float
    """Mean reward-model score."""
    reward_se: float
    """Its standard error over prompts."""
    kl: float
    """KL to the reference per response (nats): a sample mean, or best-of-n's analytic bound."""
    kl_se: float | None
    gain: float
    """Mean over prompts of (this method's score − the reference's score on the same prompt)."""
    gain_se: float
    """Its standard error (paired: the spread of the per-prompt differences)."""
    response_len: float
    eos_rate: float
    samples: list[str] = field(default_factory=list)


def _se(x: torch.Tensor) -> float:
    return float(x.std(correction=1) / math.sqrt(len(x))) if len(x) > 1 else float("nan")


def row(method: str, s: Samples, ref: Samples, decode, kl: float | None = None) -> Row:
    """The row of a method's samples, against the reference's samples `ref` of the same prompts (`kl`: a known KL
    in place of the samples' estimate)."""
    gain = s.scores - ref.scores
    return Row(
        method, float(s.scores.mean()), _se(s.scores), float(s.kl.mean()) if kl is None else kl,
        _se(s.kl) if kl is None else None, float(gain.mean()), _se(gain), float(s.response_len.float().mean()),
        float(s.ended.float().mean()), [decode(r) for r in s.responses],
    )  # fmt: skip


def best_of(draws: list[Samples]) -> Samples:
    """For each prompt, the highest-scored of its samples in the n draws (each draw: one sample per prompt)."""
    scores = torch.stack([d.scores for d in draws])  # (n, P)
    pick = scores.argmax(0).tolist()
    rows = [(draws[k], i) for i, k in enumerate(pick)]
    return Samples(
        torch.stack([d.scores[i] for d, i in rows]), torch.stack([d.kl[i] for d, i in rows]),
        torch.stack([d.response_len[i] for d, i in rows]), torch.stack([d.ended[i] for d, i in rows]),
        [d.responses[i] for d, i in rows],
    )  # fmt: skip


def bon_kl(n: int) -> float:
    """log n − (n − 1)/n: an upper bound on the KL of best-of-n sampling to the sampled policy."""
    return math.log(n) - (n - 1) / n


def _policy_name(run: str, name: str | None) -> tuple[str, str]:
    if name is not None:
        return name, run
    from lmforge.checkpoint.read import read_config
    from lmforge.checkpoint.verify import model_checkpoint

    raw = read_config(model_checkpoint(Path(run)))
    return str(((raw.get("align") or {}).get("method")) or Path(run).name), run


def parse_policies(specs: list[str]) -> list[tuple[str, str]]:
    """`NAME=RUN` or `RUN` (named by the run's alignment method) → [(name, run)]."""
    out = []
    for spec in specs:
        name, sep, run = spec.partition("=")
        out.append(_policy_name(run, name) if sep else _policy_name(spec, None))
    return out


def compare(
    reference: str, reward: str, policies: list[tuple[str, str]], best_of_n: list[int], prompts_from: str,
    *, split: str = "test", max_prompts: int = 128, max_new_tokens: int | None = None, temperature: float = 1.0,
    seed: int = 0,
) -> tuple[list[Row], list[str]]:  # fmt: skip
    """Rows of the reference, each policy and each best-of-n, and the prompt texts they answered."""
    from lmforge.align.config import build_align_config
    from lmforge.align.run import load_reward_model, prompt_data, reward_scorer
    from lmforge.align.templates import get_template
    from lmforge.checkpoint.read import read_config
    from lmforge.checkpoint.verify import model_checkpoint
    from lmforge.loading import load

    raw = read_config(model_checkpoint(Path(prompts_from)))
    if not isinstance(raw.get("align"), dict):
        raise LMForgeError(f"{prompts_from} is not an alignment run: its data cannot give the held-out prompts")
    cfg = build_align_config(raw["align"])
    prompts = prompt_data(cfg, split, held_out=max_prompts)[1]
    if not prompts:
        raise LMForgeError(f"no held-out prompts in {prompts_from}'s data ({split})")
    new = max_new_tokens or (cfg.ppo.max_new_tokens if cfg.method == "ppo" else 32)
    ref, tok = load(reference)
    rm, rm_tok = load_reward_model(reward)
    if tok is None or rm_tok.vocab_size != tok.vocab_size:
        raise LMForgeError("the reference and the reward model use different tokenizers")
    template = get_template(cfg.model.template, tok)
    ids = [template.prompt_ids(c, cfg.model.max_len - new) for c in prompts]
    pad = tok.pad_id if tok.pad_id is not None else template.eos
    kw = dict(max_new_tokens=new, temperature=temperature, eos_id=template.eos, pad_id=pad)
    scorer = reward_scorer(rm)
    decode = tok.decode
    first = score_samples(ref, ref, scorer, ids, seed=seed, desc="sft", **kw)
    rows = [row("sft (reference)", first, first, decode)]
    for name, run in policies:
        model, other = load(run)
        if other is None or other.vocab_size != tok.vocab_size:
            raise LMForgeError(f"{run} does not use the reference's tokenizer")
        rows.append(row(name, score_samples(model, ref, scorer, ids, seed=seed, desc=name, **kw), first, decode))
    for n in best_of_n:
        if n < 2:
            raise LMForgeError(f"--best-of-n needs n >= 2, got {n}")
        more = [score_samples(ref, ref, scorer, ids, seed=seed + k, desc=f"best-of-{n} ({k + 1}/{n})", **kw)
                for k in range(1, n)]  # fmt: skip
        rows.append(row(f"best-of-{n}", best_of([first, *more]), first, decode, kl=bon_kl(n)))
    texts = [(c.input or c.messages[-1].content) for c in prompts]
    return rows, texts


def markdown(rows: list[Row], prompts: list[str], n_samples: int = 3, title: str = "") -> str:
    """The comparison table and the first n_samples prompts' responses, in Markdown."""
    lines = [f"{title}\n" if title else ""]
    header = "| method | reward-model score | gain over SFT (paired) | KL to SFT (nats) | response tokens | EOS rate |"
    lines += [header, "|---" * 6 + "|"]
    for r in rows:
        kl = f"{r.kl:.3f} ± {r.kl_se:.3f}" if r.kl_se is not None else f"≤ {r.kl:.3f} (bound)"
        lines.append(f"| {r.method} | {r.reward:.3f} ± {r.reward_se:.3f} | {r.gain:+.3f} ± {r.gain_se:.3f} | {kl} | "
                     f"{r.response_len:.1f} | {r.eos_rate:.2f} |")  # fmt: skip
    for i, prompt in enumerate(prompts[:n_samples]):
        lines += ["", f"Prompt {i + 1}: {_clip(prompt, 200)}", ""]
        lines += [f"- **{r.method}**: {_clip(r.samples[i], 200)}" for r in rows]
    return "\n".join(lines).lstrip("\n") + "\n"


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def write_results(rows: list[Row], prompts: list[str], out: str | Path, n_samples: int = 3, title: str = "") -> None:
    """OUT.md (the table and samples) and OUT.json (every row with all its samples)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(rows, prompts, n_samples, title), encoding="utf-8")
    data = {"prompts": prompts, "rows": [asdict(r) for r in rows]}
    out.with_suffix(".json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
