"""Bible verse pairs: paraphrase detection (World English Bible vs King James Version) and English → Spanish
translation (WEB → Reina-Valera 1909).

WEB comes from the Debian package `sword-text-web`, a SWORD module in the zText format read here directly:
`ot.bzs`/`nt.bzs` list compressed blocks (uint32 offset, compressed size, uncompressed size; little-endian),
`ot.bzv`/`nt.bzv` list verse slots (uint32 block, uint32 offset in the block, uint16 size) in versification
order, `ot.bzz`/`nt.bzz` hold the zlib blocks. Slots include book and chapter headings; chapter headings carry
the OSIS `<chapter osisID="Gen.2" sID=...>` milestone, which is how verses are numbered here without a
versification table. KJV comes from Debian `bible-kjv-text` (Chip Chapin's compressed format) printed by the
`bible` program of Debian `bible-kjv` (`bible -f`: one `Ge1:1 text` line per verse).
"""

from __future__ import annotations

import html
import random
import re
import struct
import subprocess
import zlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from lmforge.data.fetch.labelled_sets import LabelledSet
from lmforge.data.labelled.examples import Example
from lmforge.errors import LMForgeError

Ref = tuple[str, int, int]  # (OSIS book, chapter, verse)

KJV_BOOKS = (
    "Gen Exod Lev Num Deut Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth Job Ps Prov Eccl Song Isa Jer "
    "Lam Ezek Dan Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag Zech Mal Matt Mark Luke John Acts Rom 1Cor 2Cor Gal "
    "Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev"
).split()
PARAPHRASE_LABELS = ["not_paraphrase", "paraphrase"]
MAX_LENGTH_RATIO = 3.0


def read_sword_conf(path: Path) -> dict[str, str]:
    """Key → value of a SWORD module .conf (first value of repeated keys)."""
    conf: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            conf.setdefault(key.strip(), value.strip())
    return conf


def osis_text(fragment: str) -> str:
    """Plain text of an OSIS verse fragment: notes and headings dropped, tags removed, entities decoded."""
    end = re.search(r"<chapter\b[^>]*\beID=", fragment)
    if end:  # after the chapter's end milestone come book ends and back matter (WEB's glossary), not verse text
        fragment = fragment[: end.start()]
    fragment = re.sub(r"(?s)<note\b[^>]*>.*?</note>", " ", fragment)
    fragment = re.sub(r"(?s)<title\b[^>]*>.*?</title>", " ", fragment)
    return " ".join(html.unescape(re.sub(r"<[^>]*>", "", fragment)).split())


def _chapter_start(slot: str) -> tuple[str, int] | None:
    for tag in re.findall(r"<chapter\b[^>]*>", slot):
        attrs = dict(re.findall(r'(\w+)="([^"]*)"', tag))
        if "sID" in attrs and "." in attrs.get("osisID", ""):
            book, _, chapter = attrs["osisID"].rpartition(".")
            if chapter.isdigit():
                return book, int(chapter)
    return None


def _ztext_slots(root: Path, testament: str) -> list[str]:
    bzs, bzv, bzz = ((root / f"{testament}.{ext}").read_bytes() for ext in ("bzs", "bzv", "bzz"))
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs) - 11, 12)]
    cache: dict[int, bytes] = {}
    slots = []
    for i in range(0, len(bzv) - 9, 10):
        block, offset, size = struct.unpack_from("<IIH", bzv, i)
        if size == 0:
            slots.append("")
            continue
        if block not in cache:
            start, csize, _ = blocks[block]
            cache = {block: zlib.decompress(bzz[start : start + csize])}  # slots come in block order
        slots.append(cache[block][offset : offset + size].decode("utf-8", errors="replace"))
    return slots


def sword_verses(module_dir: Path, conf: dict[str, str]) -> dict[Ref, str]:
    """Non-empty verses of a zText SWORD module (`module_dir` holds ot.* and nt.*), numbered from the chapter
    milestones: the slots after chapter c's heading are verses 1, 2, ...; the slot just before a new book's
    first chapter is that book's heading and is dropped."""
    if conf.get("ModDrv", "").lower() != "ztext" or conf.get("CompressType", "ZIP").upper() != "ZIP":
        raise LMForgeError(f"{module_dir}: only zText modules with ZIP compression are supported")
    verses: dict[Ref, str] = {}
    for testament in ("ot", "nt"):
        if not (module_dir / f"{testament}.bzv").is_file():
            continue
        current: tuple[str, int] | None = None
        verse, last = 0, None
        for slot in _ztext_slots(module_dir, testament):
            start = _chapter_start(slot)
            if start:
                if current and start[0] != current[0] and last:
                    verses.pop(last, None)  # the new book's heading, not a verse
                current, verse = start, 0
                continue
            if current is None:  # module and testament headings
                continue
            verse += 1
            last = (current[0], current[1], verse)
            text = osis_text(slot)
            if text:
                verses[last] = text
    if not verses:
        raise LMForgeError(f"{module_dir}: no verses found (no OSIS chapter milestones?)")
    return verses


def run_kjv(bible_root: Path, text_root: Path) -> str:
    """Every KJV verse as printed by Debian bible-kjv's `bible -f` from bible-kjv-text's data."""
    exe, data = bible_root / "usr/bin/bible", text_root / "usr/lib"
    cmd = [str(exe), "-f", "-p", str(data), "-d", "bible.data", "Gen1:1-Rev22:21"]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, errors="replace", timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise LMForgeError(f"running bible-kjv's 'bible' failed ({e}); it needs libreadline8") from None
    return out.stdout


def kjv_verses(output: str) -> dict[Ref, str]:
    """Parse `bible -f` output ("Ge1:1 In the beginning ..."); book abbreviations map to OSIS names by order."""
    verses: dict[Ref, str] = {}
    abbrevs: list[str] = []
    for n, line in enumerate(output.splitlines(), 1):
        if not line.strip():
            continue
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            raise LMForgeError(f"bible output line {n}: expected 'Book<chapter>:<verse> text', got {line[:40]!r}")
        if m.group(1) not in abbrevs:
            abbrevs.append(m.group(1))
        if len(abbrevs) > len(KJV_BOOKS):
            raise LMForgeError(f"bible output line {n}: more than {len(KJV_BOOKS)} books")
        ref = (KJV_BOOKS[abbrevs.index(m.group(1))], int(m.group(2)), int(m.group(3)))
        verses[ref] = " ".join(m.group(4).split())
    if len(abbrevs) != len(KJV_BOOKS):
        raise LMForgeError(f"bible output has {len(abbrevs)} books, expected {len(KJV_BOOKS)}")
    return verses


def _chapter_sizes(verses: dict[Ref, str]) -> dict[tuple[str, int], int]:
    sizes: dict[tuple[str, int], int] = defaultdict(int)
    for book, chapter, verse in verses:
        sizes[book, chapter] = max(sizes[book, chapter], verse)
    return sizes


def osis_ref(ref: Ref) -> str:
    return f"{ref[0]}.{ref[1]}.{ref[2]}"


def verse_pairs(web: dict[Ref, str], kjv: dict[Ref, str], seed: str = "bible-paraphrase") -> LabelledSet:
    """Balanced paraphrase pairs: (WEB v, KJV v) positives and (WEB v, KJV u) negatives, u another verse of the
    same chapter with different text. Only chapters numbered alike in both (same last verse) are used, and
    pairs whose lengths differ more than MAX_LENGTH_RATIO× (text-critical additions) are dropped."""
    web_sizes, kjv_sizes = _chapter_sizes(web), _chapter_sizes(kjv)
    order = {b: i for i, b in enumerate(KJV_BOOKS)}
    refs = sorted((r for r in kjv if r in web and r[0] in order), key=lambda r: (order[r[0]], r[1], r[2]))
    by_chapter: dict[tuple[str, int], list[Ref]] = defaultdict(list)
    for r in kjv:
        by_chapter[r[0], r[1]].append(r)
    examples, keys = [], []
    for ref in refs:
        chapter = (ref[0], ref[1])
        a, b = web[ref], kjv[ref]
        if web_sizes[chapter] != kjv_sizes[chapter] or max(len(a), len(b)) > MAX_LENGTH_RATIO * min(len(a), len(b)):
            continue
        others = sorted(r for r in by_chapter[chapter] if r != ref and kjv[r] != b)
        if not others:
            continue
        other = random.Random(f"{seed}/{osis_ref(ref)}").choice(others)
        meta = {"web": osis_ref(ref), "kjv": osis_ref(ref)}
        examples.append(Example(text=a, text_pair=b, label="paraphrase", id=osis_ref(ref), meta=meta))
        neg_meta = {"web": osis_ref(ref), "kjv": osis_ref(other)}
        neg_id = f"{osis_ref(ref)}~{osis_ref(other)}"
        examples.append(Example(text=a, text_pair=kjv[other], label="not_paraphrase", id=neg_id, meta=neg_meta))
        keys += [f"{chapter[0]}.{chapter[1]}"] * 2
    construction = (
        "Verse pairs of the World English Bible (Debian `sword-text-web`, SWORD module engWEB2015eb, read "
        "directly from its zText files; footnotes and section headings removed) and the King James Version "
        "(Debian `bible-kjv-text`, printed by Debian `bible-kjv`'s `bible` program). Positives (paraphrase): the "
        "same verse in both translations. Negatives (not_paraphrase): the WEB verse with a KJV verse drawn, "
        "with a per-verse seed, from the other verses of the same chapter (same topic and style, so surface "
        "similarity alone does not decide), one per positive. Only the 66 books of the KJV, only chapters "
        "whose last verse number agrees in both, and only pairs whose character lengths are within "
        f"{MAX_LENGTH_RATIO:g}x of each other (this drops text-critical differences such as 1 John 5:7) are "
        "used. Splits by chapter, so a chapter's positives and negatives share a split."
    )
    fields = {"text": "WEB verse", "text_pair": "KJV verse", "label": "paraphrase / not_paraphrase"}
    fields["meta.web / meta.kjv"] = "OSIS references of the two verses"
    lic = "Both translations are in the public domain."
    return LabelledSet(examples, keys, "classification", list(PARAPHRASE_LABELS), construction, fields, lic)


def sword_module(package_root: Path) -> dict[Ref, str]:
    """The verses of the (first) SWORD module of an unpacked Debian sword-text-* package."""
    confs = sorted((package_root / "usr/share/sword/mods.d").glob("*.conf"))
    if not confs:
        raise LMForgeError(f"{package_root}: no SWORD module .conf under usr/share/sword/mods.d")
    conf = read_sword_conf(confs[0])
    module_dir = package_root / "usr/share/sword" / conf.get("DataPath", "").lstrip("./")
    return sword_verses(module_dir, conf)


def chapter_records(verses: dict[Ref, str], prefix: str) -> Iterator[dict[str, str]]:
    """One corpus record per chapter, its verses in order, one verse a line."""
    chapters: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for (book, chapter, verse), text in verses.items():
        chapters[book, chapter].append((verse, text))
    order = {b: i for i, b in enumerate(KJV_BOOKS)}
    for book, chapter in sorted(chapters, key=lambda bc: (order.get(bc[0], len(order)), bc[0], bc[1])):
        lines = [text for _, text in sorted(chapters[book, chapter])]
        yield {"text": "\n".join(lines), "source": f"{prefix}/{book}.{chapter}"}


def bible_paraphrase_set(web_root: Path, bible_root: Path, text_root: Path) -> LabelledSet:
    """The bible-paraphrase set from unpacked sword-text-web, bible-kjv and bible-kjv-text packages."""
    return verse_pairs(sword_module(web_root), kjv_verses(run_kjv(bible_root, text_root)))


def translation_pairs(source: dict[Ref, str], target: dict[Ref, str], construction: str, lic: str) -> LabelledSet:
    """(source verse → target verse) pairs of the same reference, for machine translation. Only the 66 books of
    the KJV canon, only chapters whose last verse number agrees in both (the translations' versifications
    differ in a few places) and only pairs whose lengths are within MAX_LENGTH_RATIO× are kept. Split by
    chapter."""
    src_sizes, tgt_sizes = _chapter_sizes(source), _chapter_sizes(target)
    order = {b: i for i, b in enumerate(KJV_BOOKS)}
    refs = sorted((r for r in source if r in target and r[0] in order), key=lambda r: (order[r[0]], r[1], r[2]))
    examples, keys = [], []
    for ref in refs:
        a, b = source[ref], target[ref]
        if src_sizes[ref[:2]] != tgt_sizes[ref[:2]] or max(len(a), len(b)) > MAX_LENGTH_RATIO * min(len(a), len(b)):
            continue
        examples.append(Example(text=a, target=b, id=osis_ref(ref)))
        keys.append(f"{ref[0]}.{ref[1]}")
    fields = {"text": "English verse (WEB)", "target": "Spanish verse (Reina-Valera 1909)", "id": "OSIS reference"}
    return LabelledSet(examples, keys, "text_to_text", None, construction, fields, lic)


def bible_translation_set(web_root: Path, sparv_root: Path) -> LabelledSet:
    """English → Spanish verse pairs from unpacked sword-text-web and sword-text-sparv packages."""
    construction = (
        "English → Spanish verse pairs: the World English Bible (Debian `sword-text-web`, SWORD module "
        "engWEB2015eb) and the Reina-Valera 1909 (Debian `sword-text-sparv`, module spaRV1909eb), both read "
        "directly from their zText files with footnotes and section headings removed. One example per verse "
        "present in both, within the 66 books of the Protestant canon, in chapters whose last verse number "
        "agrees in both translations (WEB follows the NRSVA versification, RV1909 the KJV one; chapters that "
        f"number differently are left out), and whose lengths are within {MAX_LENGTH_RATIO:g}x of each other. "
        "Splits by chapter, so neighbouring verses never straddle splits."
    )
    lic = "Both translations are in the public domain."
    return translation_pairs(sword_module(web_root), sword_module(sparv_root), construction, lic)
