"""Instruction and preference sets built from the project's own data (no network beyond `lmforge data fetch`).

Instruction sources:

- "sentiment": the bundled Rotten Tomatoes snippets (`load_bundled("sentiment")`): an instruction asking whether
  the review is positive or negative (one of three phrasings, picked by a hash of the text), the snippet as
  input, the label word ("positive" / "negative") as the response.
- "debian": `lmforge data fetch debian-descriptions` (Debian's English package descriptions): "Summarise ..." with
  the long description (its first `max_words` words) as input and the one-line synopsis as the response.
- "continuation": the prompts of the "continuation" preference source below with their true continuation (the
  chosen response) as the demonstration — the SFT step before a reward model, DPO or PPO on those prompts.

Preference sources:

- "sentiment": the sentiment instruction, chosen = the correct label word, rejected = the other one.
- "continuation": passages of the bundled Austen + Shakespeare corpus: prompt = "Continue the passage." with
  `prompt_words` words of a document, chosen = its next `response_words` words, rejected = as many consecutive
  words from another document of the same split ("other_document"), or from a document of the other author
  ("other_author": an easier, style-level contrast; with `prompts_from="austen"` a reward model only has to tell
  Austen's prose from Shakespeare's verse). Documents are split 80/10/10 by a SHA-256 of their source
  name, so held-out pairs come from unseen chapters and plays.

Every builder is deterministic (fixed seeds, hashes), so the same call gives the same set."""

from __future__ import annotations

import hashlib
import random
from functools import cache
from pathlib import Path
from typing import Literal

from lmforge.align.data import PreferencePair, conversation_record, preference_record, write_jsonl
from lmforge.align.templates import Conversation
from lmforge.errors import LMForgeError

Split = Literal["train", "dev", "test"]
SENTIMENT_PROMPTS = (
    "Is this review positive or negative?",
    "Classify the sentiment of this movie review as positive or negative.",
    "Does the critic like the film? Answer positive or negative.",
)
SUMMARY_PROMPT = "Summarise this Debian package description in one line."
CONTINUE_PROMPT = "Continue the passage."
INSTRUCTION_SOURCES = ("sentiment", "debian", "continuation")
PREFERENCE_SOURCES = ("sentiment", "continuation")


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _cap(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


def sentiment_instructions(split: Split = "train", limit: int | None = None) -> list[Conversation]:
    """Bundled sentiment snippets as instructions; the response is the label word."""
    from lmforge.data.labelled.readers import load_bundled

    ds = load_bundled("sentiment")[split]
    out = []
    for i, ex in enumerate(_cap(ds.examples, limit)):
        prompt = SENTIMENT_PROMPTS[_hash(ex.text) % len(SENTIMENT_PROMPTS)]
        conv = Conversation.instruction(prompt, str(ex.label), ex.text, id=f"sentiment-{split}-{i}")
        conv.meta["choices"] = list(ds.labels or ["negative", "positive"])
        out.append(conv)
    return out


def debian_instructions(
    split: Split = "train", limit: int | None = None, max_words: int = 120, cache_dir: Path | None = None
) -> list[Conversation]:
    """Debian long descriptions → synopsis (needs `lmforge data fetch debian-descriptions` first)."""
    from lmforge.data.labelled.readers import load_fetched

    ds = load_fetched("debian-descriptions", cache_dir)[split]
    out = []
    for ex in _cap(ds.examples, limit):
        words = ex.text.split()
        text = ex.text if len(words) <= max_words else " ".join(words[:max_words]) + " ..."
        out.append(Conversation.instruction(SUMMARY_PROMPT, ex.target or "", text, id=f"debian-{ex.id}"))
    return out


def instruction_set(
    sources: list[str], split: Split = "train", limit: int | None = None, cache_dir: Path | None = None, **kw
) -> list[Conversation]:
    """The conversations of several sources, interleaved by a fixed shuffle (`limit` per source; `kw`: the
    continuation source's options, as for `continuation_preferences`)."""
    out: list[Conversation] = []
    for name in sources:
        if name == "sentiment":
            out += sentiment_instructions(split, limit)
        elif name == "debian":
            out += debian_instructions(split, limit, cache_dir=cache_dir)
        elif name == "continuation":
            out += [p.conversation("chosen") for p in continuation_preferences(split, limit, **kw)]
        else:
            raise LMForgeError(f"unknown instruction source '{name}' (known: {', '.join(INSTRUCTION_SOURCES)})")
    random.Random(0).shuffle(out)
    return out


def sentiment_preferences(split: Split = "train", limit: int | None = None) -> list[PreferencePair]:
    """chosen = the correct label word, rejected = the other label word."""
    other = {"positive": "negative", "negative": "positive"}
    return [
        PreferencePair(c.prompt(), c.response or "", other[c.response or "positive"], c.id)
        for c in sentiment_instructions(split, limit)
    ]


@cache
def _corpus() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(source, words) of every bundled corpus document (read once per process)."""
    from lmforge.data.corpus.bundled import load_default_records

    return tuple((r["source"], tuple(r["text"].split())) for r in load_default_records())


def _doc_split(source: str) -> str:
    r = _hash(source) % 10
    return "train" if r < 8 else "dev" if r == 8 else "test"


def continuation_preferences(
    split: Split = "train",
    limit: int | None = None,
    prompt_words: int = 48,
    response_words: int = 16,
    negatives: Literal["other_document", "other_author"] = "other_document",
    prompts_from: Literal["austen", "shakespeare"] | None = None,
    seed: int = 0,
) -> list[PreferencePair]:
    """True continuations of corpus passages vs continuations taken from another document; `prompts_from`
    keeps the prompts of one author only (with other_author negatives: a style-level contrast, the easiest)."""
    docs = [(s, w) for s, w in _corpus() if _doc_split(s) == split]
    docs = [(s, w) for s, w in docs if len(w) >= prompt_words + response_words]
    if len(docs) < 2:
        raise LMForgeError(f"the corpus has fewer than two usable documents in split '{split}'")
    rng = random.Random(seed)
    span = prompt_words + response_words
    out = []
    for di, (source, words) in enumerate(docs):
        author = source.split("/")[0]
        if prompts_from is not None and author != prompts_from:
            continue
        pool = [
            j for j, (s, _) in enumerate(docs) if j != di and (negatives != "other_author" or s.split("/")[0] != author)
        ]
        if not pool:
            continue
        for start in range(0, len(words) - span + 1, span * 8):  # passages far apart within a document
            other = docs[rng.choice(pool)][1]
            at = rng.randrange(0, len(other) - response_words + 1)
            prompt = Conversation.instruction(CONTINUE_PROMPT, None, " ".join(words[start : start + prompt_words]))
            chosen = " ".join(words[start + prompt_words : start + span])
            rejected = " ".join(other[at : at + response_words])
            if chosen != rejected:
                out.append(PreferencePair(prompt, chosen, rejected, f"{source}@{start}"))
    rng.shuffle(out)
    return _cap(out, limit)


def preference_set(source: str, split: Split = "train", limit: int | None = None, **kw) -> list[PreferencePair]:
    if source == "sentiment":
        return sentiment_preferences(split, limit)
    if source == "continuation":
        return continuation_preferences(split, limit, **kw)
    raise LMForgeError(f"unknown preference source '{source}' (known: {', '.join(PREFERENCE_SOURCES)})")


def write_instruction_set(
    out_dir: str | Path, sources: list[str], limits: dict[str, int | None] | None = None,
    cache_dir: Path | None = None,
) -> dict[str, int]:  # fmt: skip
    """Write train/dev/test.jsonl of the instruction sources into out_dir; returns the record counts."""
    limits = limits or {"train": 2000, "dev": 200, "test": 200}
    counts = {}
    for split in ("train", "dev", "test"):
        convs = instruction_set(sources, split, limits.get(split), cache_dir)  # type: ignore[arg-type]
        write_jsonl(Path(out_dir) / f"{split}.jsonl", [conversation_record(c) for c in convs])
        counts[split] = len(convs)
    return counts


def write_preference_set(
    out_dir: str | Path, source: str, limits: dict[str, int | None] | None = None, **kw
) -> dict[str, int]:
    """Write train/dev/test.jsonl of a preference source into out_dir; returns the record counts."""
    limits = limits or {"train": 2000, "dev": 200, "test": 200}
    counts = {}
    for split in ("train", "dev", "test"):
        pairs = preference_set(source, split, limits.get(split), **kw)  # type: ignore[arg-type]
        write_jsonl(Path(out_dir) / f"{split}.jsonl", [preference_record(p) for p in pairs])
        counts[split] = len(pairs)
    return counts
