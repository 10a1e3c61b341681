"""bible-paraphrase: the SWORD zText reader on a hand-built module, `bible -f` output parsing, pair construction."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from lmforge.data.fetch.bible import (
    KJV_BOOKS,
    MAX_LENGTH_RATIO,
    chapter_records,
    kjv_verses,
    osis_text,
    read_sword_conf,
    sword_verses,
    verse_pairs,
)
from lmforge.errors import LMForgeError

ZTEXT = {"ModDrv": "zText", "CompressType": "ZIP"}
# Book abbreviations in the order `bible -f` prints them.
BRS_BOOKS = (
    "Ge Exo Lev Num Deu Josh Jdgs Ruth 1Sm 2Sm 1Ki 2Ki 1Chr 2Chr Ezra Neh Est Job Psa Prv Eccl SSol Isa Jer Lam "
    "Eze Dan Hos Joel Amos Obad Jonah Mic Nahum Hab Zep Hag Zec Mal Mat Mark Luke John Acts Rom 1Cor 2Cor Gal Eph "
    "Phi Col 1Th 2Th 1Tim 2Tim Titus Phmn Heb Jas 1Pet 2Pet 1Jn 2Jn 3Jn Jude Rev"
).split()


def _write_ztext(root: Path, testament: str, slots: list[str], per_block: int = 4) -> None:
    """A zText testament: slots packed `per_block` to a zlib block; index entries point into the blocks."""
    bzs, bzv, bzz = b"", b"", b""
    for b in range(0, len(slots), per_block):
        block = b""
        for s in slots[b : b + per_block]:
            data = s.encode()
            bzv += struct.pack("<IIH", b // per_block, len(block), len(data))
            block += data
        comp = zlib.compress(block)
        bzs += struct.pack("<III", len(bzz), len(comp), len(block))
        bzz += comp
    for ext, data in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
        (root / f"{testament}.{ext}").write_bytes(data)


OT = [
    "",
    '<milestone type="x-importer"/>',
    '<div osisID="Gen" type="book"/><title type="main">Preface to the Bible</title> Front matter.',
    '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>',
    'In the beginning<note placement="foot">Hebrew: Elohim.</note> God created.',
    '<title type="x-preverse">The Creation</title><w lemma="strong:H1">The</w> earth was formless.',
    "",
    '<div sID="p1"/><chapter osisID="Gen.2" n="2" sID="Gen.2"/>',
    'Thus the heavens were finished. <chapter eID="Gen.2"/> <div eID="b1" osisID="Gen" type="book"/>',
    '<div osisID="Exod" sID="b2" type="book"/> <title>EXODUS</title>',
    '<chapter n="1" osisID="Exod.1" sID="Exod.1"/>',
    "Now these are the names &amp; the tribes.",
]
NT = [
    "",
    "",
    '<div osisID="Matt" type="book"/>',
    '<chapter osisID="Matt.1" sID="Matt.1"/>',
    'The book of the genealogy. <chapter eID="Matt.1"/><div type="glossary"/><title>Glossary</title> Abba means',
]


def test_sword_ztext_reader(tmp_path: Path) -> None:
    _write_ztext(tmp_path, "ot", OT, per_block=5)
    _write_ztext(tmp_path, "nt", NT)
    verses = sword_verses(tmp_path, ZTEXT)
    assert verses == {
        ("Gen", 1, 1): "In the beginning God created.",
        ("Gen", 1, 2): "The earth was formless.",
        ("Gen", 2, 1): "Thus the heavens were finished.",
        ("Exod", 1, 1): "Now these are the names & the tribes.",
        ("Matt", 1, 1): "The book of the genealogy.",
    }  # Gen 1:3 is empty; the Exodus heading slot (after Gen 2:1) is not a verse; the glossary is cut
    with pytest.raises(LMForgeError, match=r"only zText modules with ZIP compression are supported$"):
        sword_verses(tmp_path, {"ModDrv": "RawText"})
    empty = tmp_path / "empty"
    empty.mkdir()
    _write_ztext(empty, "ot", ["", "no chapters here"])
    with pytest.raises(LMForgeError, match=r"no verses found \(no OSIS chapter milestones\?\)$"):
        sword_verses(empty, ZTEXT)


def test_osis_text_and_conf(tmp_path: Path) -> None:
    assert osis_text('<q who="Jesus">“Follow me,”</q> he said.<note n="a">fn</note>') == "“Follow me,” he said."
    conf = tmp_path / "web.conf"
    conf.write_text(
        "[engWEB]\n# comment\nDataPath=./modules/texts/ztext/engweb/\nModDrv=zText\nObsoletes=A\nObsoletes=B\n"
    )
    assert read_sword_conf(conf) == {"DataPath": "./modules/texts/ztext/engweb/", "ModDrv": "zText", "Obsoletes": "A"}


def test_kjv_output_parser() -> None:
    lines = [f"{abbr}1:1 Verse of {abbr}." for abbr in BRS_BOOKS]
    lines[0] = "Ge1:1 In the beginning God created the heaven and the earth."
    lines.insert(1, "Ge1:2 And the earth was   without form.")
    lines.append("3Jn1:14 But I trust I shall shortly see thee.")
    verses = kjv_verses("\n".join(lines) + "\n")
    assert len(verses) == 68 and len(KJV_BOOKS) == 66
    assert verses["Gen", 1, 2] == "And the earth was without form."
    assert verses["3John", 1, 14] == "But I trust I shall shortly see thee."
    assert verses["Rev", 1, 1] == "Verse of Rev." and verses["Phlm", 1, 1] == "Verse of Phmn."
    with pytest.raises(LMForgeError, match=r"^bible output has 2 books, expected 66$"):
        kjv_verses("Ge1:1 a\nExo1:1 b\n")
    with pytest.raises(LMForgeError, match=r"^bible output line 2: expected 'Book<chapter>:<verse> text', got 'oops'$"):
        kjv_verses("Ge1:1 a\noops\n")


def test_verse_pairs() -> None:
    kjv = {
        ("Gen", 1, 1): "In the beginning God created the heaven and the earth.",
        ("Gen", 1, 2): "And the earth was without form, and void.",
        ("Gen", 1, 3): "And God said, Let there be light: and there was light.",
        ("Gen", 2, 1): "Thus the heavens and the earth were finished.",
        ("Gen", 2, 2): "And on the seventh day God ended his work.",
        ("Exod", 1, 1): "Now these are the names of the children of Israel.",
        ("Exod", 1, 2): "Reuben, Simeon, Levi, and Judah,",
    }
    web = {
        ("Gen", 1, 1): "In the beginning, God created the heavens and the earth.",
        ("Gen", 1, 2): "The earth was formless and empty.",
        ("Gen", 1, 3): "God said, “Let there be light,” and there was light.",
        ("Gen", 2, 1): "The heavens, the earth, and all their vast array were finished.",
        ("Gen", 2, 2): "On the seventh day God finished his work.",
        ("Gen", 2, 3): "God blessed the seventh day.",  # numbered differently: Gen 2 is left out
        ("Exod", 1, 1): "Now these are the names of the sons of Israel.",
        ("Exod", 1, 2): "Reuben, Simeon, Levi, and Judah, " + "with a long added passage " * 5,  # > 3x longer
        ("Tob", 1, 1): "The book of the words of Tobit.",  # not in the KJV
    }
    lset = verse_pairs(web, kjv)
    ids = [e.id for e in lset.examples]
    assert [i for i in ids if "~" not in i] == ["Gen.1.1", "Gen.1.2", "Gen.1.3", "Exod.1.1"]
    assert [e.label for e in lset.examples] == ["paraphrase", "not_paraphrase"] * 4
    for pos, neg in zip(lset.examples[::2], lset.examples[1::2]):
        assert neg.text == pos.text and neg.text_pair != pos.text_pair
        book, chapter, _ = pos.meta["kjv"].split(".")
        assert neg.meta["kjv"].startswith(f"{book}.{chapter}.") and neg.meta["kjv"] != pos.meta["kjv"]
        assert neg.text_pair == kjv[tuple(int(x) if x.isdigit() else x for x in neg.meta["kjv"].split("."))]
    assert lset.examples[-1].meta == {"web": "Exod.1.1", "kjv": "Exod.1.2"}  # the only other verse of Exod 1
    assert lset.keys == ["Gen.1"] * 6 + ["Exod.1"] * 2
    assert verse_pairs(web, kjv).examples == lset.examples  # the negative draw is seeded
    assert lset.labels == ["not_paraphrase", "paraphrase"] and MAX_LENGTH_RATIO == 3.0


def test_chapter_records_follow_canon_order() -> None:
    verses = {("Exod", 1, 2): "b", ("Gen", 2, 1): "c", ("Exod", 1, 1): "a", ("Gen", 10, 1): "d", ("Wis", 1, 1): "w"}
    assert list(chapter_records(verses, "kjv")) == [
        {"text": "c", "source": "kjv/Gen.2"},
        {"text": "d", "source": "kjv/Gen.10"},
        {"text": "a\nb", "source": "kjv/Exod.1"},
        {"text": "w", "source": "kjv/Wis.1"},  # a book outside the 66 comes last
    ]
