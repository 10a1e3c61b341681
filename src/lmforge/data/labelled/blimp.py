"""Reader of grammatical minimal pairs in BLiMP's published layout (Warstadt et al. 2020,
https://github.com/alexwarstadt/blimp): a directory with one `<paradigm>.jsonl` per paradigm (67 upstream, 1,000
pairs each), each line a JSON object with at least `sentence_good` and `sentence_bad`, and usually `field`
(syntax, morphology, semantics, syntax_semantics), `linguistics_term` (the phenomenon: anaphor_agreement,
island_effects, ...), `UID` (the paradigm) and `pairID` (a string "0".."999"; `pair_id` is read too). BabyLM's
filtered copies and BLiMP-style sets of one's own (the BLiMP supplement, other languages' minimal pairs) use the
same layout.

Each pair becomes one `Example`: `text` the acceptable sentence, `text_pair` the unacceptable one, `id`
"<paradigm>/<pairID>", `meta` the paradigm (the file's name), field, phenomenon, file and line."""

from __future__ import annotations

from pathlib import Path

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.data.labelled.readers import fail, read_jsonl
from lmforge.errors import LMForgeError

SENTENCES = ("sentence_good", "sentence_bad")


def paradigm_files(root: Path | str) -> list[Path]:
    """The `*.jsonl` files of a BLiMP-style directory, sorted by name (one error line when there are none)."""
    root = Path(root)
    if not root.exists():
        raise LMForgeError(f"minimal-pair directory not found: {root}")
    if not root.is_dir():
        raise LMForgeError(f"{root}: not a directory (give the directory holding one <paradigm>.jsonl per paradigm)")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(".jsonl"))
    if not files:
        raise LMForgeError(f"{root}: no .jsonl files (expected one <paradigm>.jsonl per paradigm, as BLiMP's data/)")
    return files


def _text_field(obj: dict, key: str, path: Path, line: int) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise fail(path, line, f"'{key}' must be a string, got {type(value).__name__}")
    return value


def read_paradigm(path: Path) -> list[Example]:
    """The pairs of one `<paradigm>.jsonl` (at least one)."""
    out = []
    for n, obj in read_jsonl(path):
        good, bad = (_text_field(obj, k, path, n) for k in SENTENCES)
        missing = [k for k, v in zip(SENTENCES, (good, bad)) if v is None]
        if missing:
            raise fail(path, n, f"missing '{missing[0]}' (each line needs sentence_good and sentence_bad)")
        if not good.strip() or not bad.strip():
            raise fail(path, n, f"empty {'sentence_good' if not good.strip() else 'sentence_bad'}")
        meta = {"paradigm": path.stem, "file": str(path), "line": n}
        for key, name in (("field", "field"), ("linguistics_term", "phenomenon"), ("UID", "uid")):
            value = _text_field(obj, key, path, n)
            if value:
                meta[name] = value
        pair_id = obj.get("pairID", obj.get("pair_id", len(out)))
        out.append(Example(text=good, text_pair=bad, id=f"{path.stem}/{pair_id}", meta=meta))
    if not out:
        raise LMForgeError(f"{path}: no minimal pairs (an empty file)")
    return out


def read_minimal_pairs(root: Path | str) -> Dataset:
    """Every pair of every paradigm file of `root`, paradigm by paradigm (files sorted by name)."""
    examples = [e for p in paradigm_files(root) for e in read_paradigm(p)]
    return Dataset(examples, source=str(root), task_type="minimal_pairs")
