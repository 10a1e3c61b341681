"""Text extraction of the wikitext, DocBook HTML and fortune-file sources (Wikipedia sample, Debian handbook,
fortunes, Lee news) on small hand-made inputs in the packages' layouts."""

from __future__ import annotations

import bz2
import io
import tarfile
from pathlib import Path

from lmforge.data.fetch.corpora import GENSIM_DATA, WIKI_MEMBER, lee_records, wikipedia_records
from lmforge.data.fetch.debian_text import fortune_records, handbook_records, html_paragraphs
from lmforge.data.fetch.sources import source_records
from lmforge.data.fetch.wikitext import dump_articles, wikitext_to_text

WIKITEXT = (
    "{{Redirect|X}}{{Infobox|a={{nested|b}}}}\n"
    "'''Anarchism''' is a [[political philosophy]] that advocates [[self-governance|self-governed]] societies."
    "<ref>Woodcock, ''Anarchism''</ref> See [http://example.org the library].<!-- hidden -->\n"
    "[[File:Flag.svg|thumb|A [[flag]] of the movement]]\n"
    '{| class="wikitable"\n| cell || cell\n|}\n'
    "== History ==\n"
    "* Early ''anarchist'' thought appears in [[Taoism]] &amp; elsewhere.\n\n"
    "== See also ==\n* [[Libertarianism]]\n"
)


def _dump(pages: str) -> bytes:
    return bz2.compress(f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{pages}</mediawiki>'.encode())


def test_wikitext_to_text() -> None:
    assert wikitext_to_text(WIKITEXT) == (
        "Anarchism is a political philosophy that advocates self-governed societies. See the library.\n\n"
        "History\n\nEarly anarchist thought appears in Taoism & elsewhere."
    )


def test_dump_reader_skips_redirects_and_other_namespaces(tmp_path: Path) -> None:
    pages = (
        "<page><title>A</title><ns>0</ns><revision><text>Body of [[A]].</text></revision></page>"
        '<page><title>B</title><ns>0</ns><redirect title="A"/><revision><text>#REDIRECT [[A]]</text></revision></page>'
        "<page><title>Talk:A</title><ns>1</ns><revision><text>talk</text></revision></page>"
    )
    assert list(dump_articles(_dump(pages))) == [("A", "Body of [[A]].")]
    long = " ".join(["word"] * 60)
    pages = f"<page><title>Long</title><ns>0</ns><revision><text>{long} [[x]].</text></revision></page>"
    pages += "<page><title>Stub</title><ns>0</ns><revision><text>Too short.</text></revision></page>"
    sdist = tmp_path / "gensim-4.4.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, data in {
            f"gensim-4.4.0/{WIKI_MEMBER}": _dump(pages),
            f"gensim-4.4.0/{GENSIM_DATA}lee_background.cor": b"Story one.\n\nStory  two.\n",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert list(wikipedia_records(sdist)) == [{"text": f"{long} x.", "source": "wikipedia/Long"}]
    assert [r["text"] for r in lee_records(sdist)] == ["Story one.", "Story two."]


PAGE = (
    '<html><head><title>6.3. apt-cache</title></head><body><div class="navheader"><p>Prev Next</p></div>'
    '<h2 class="title">6.3. The <code>apt-cache</code> Command</h2><div class="para">The <code>apt-cache</code>'
    '\n\t\tcommand<br/> shows the <a id="x" class="indexterm"></a>cache.</div><pre class="screen">$ apt-cache'
    '</pre><div class="para">Second <em>paragraph</em>.</div><div class="navfooter"><p>Home</p></div></body></html>'
)


def test_debian_handbook_prose(tmp_path: Path) -> None:
    assert html_paragraphs(PAGE) == [
        "6.3. The apt-cache Command",
        "The apt-cache command shows the cache.",
        "Second paragraph.",
    ]
    root = tmp_path / "hb" / "usr/share/doc/debian-handbook/html/en-US"
    root.mkdir(parents=True)
    (root / "sect.apt-cache.html").write_text(PAGE.replace("Second", "word " * 30))
    (root / "index.html").write_text("<p>Index</p>")  # too short: left out
    assert [r["source"] for r in handbook_records(tmp_path / "hb")] == ["debian-handbook/sect.apt-cache"]


def test_fortunes(tmp_path: Path) -> None:
    games = tmp_path / "fo" / "usr/share/games/fortunes"
    games.mkdir(parents=True)
    (games / "wisdom.u8").write_text("A penny saved.\n\n\t-- Ben\n%\nSecond  fortune.\n%\n")
    (games / "ascii-art.u8").write_text("  /\\_/\\\n%\n")
    (games / "wisdom").write_text("the latin-1 copy is not read")
    assert list(fortune_records(tmp_path / "fo")) == [
        {"text": "A penny saved.\n\t-- Ben\n\nSecond  fortune.", "source": "fortunes/wisdom"}
    ]


def test_source_files_keep_indentation(tmp_path: Path) -> None:
    root = tmp_path / "lib"
    (root / "pkg" / "tests").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def f():  \r\n    return 1\n\n\n\n\nx = f()\n")
    (root / "pkg" / "tests" / "test_mod.py").write_text("assert True\n")  # a test suite: left out
    (root / "empty.py").write_text("\n")
    (root / "gone.py").symlink_to(root / "missing.py")  # a dangling link, as Debian ships some
    assert list(source_records(root, "src", ".py", exclude=("tests",))) == [
        {"text": "def f():\n    return 1\n\nx = f()", "source": "src/pkg/mod.py"}
    ]
