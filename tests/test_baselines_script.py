"""scripts/baselines.py: the majority class and tf-idf + LR chosen on dev, on a labelled-set directory."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import baselines  # noqa: E402

import lmforge.eval.baselines as eval_baselines  # noqa: E402
from lmforge.eval.baselines import _FITTED as fitted  # noqa: E402
from lmforge.eval.baselines import CS, NGRAMS, _fits, classification_baselines, many_baselines  # noqa: E402


def _write_set(root: Path, pairs: bool = False, flip: float = 0.0, seed: int = 0) -> Path:
    """Two classes told apart by one word each (the other class's word in a `flip` share of them), among shared
    filler; 3:1 more 'neg' than 'pos' in train."""
    rng = random.Random(seed)
    filler = "the a of film plot actor scene story".split()
    root.mkdir()
    for split, n in (("train", 200), ("dev", 40), ("test", 40)):
        rows = []
        for i in range(n):
            label = "pos" if i % 4 == 0 else "neg"
            words = rng.choices(filler, k=6) + ["superb" if (label == "pos") != (rng.random() < flip) else "dull"]
            rng.shuffle(words)
            row = {"text": " ".join(words), "label": label}
            if pairs:
                row["text_pair"] = "x"
            rows.append(json.dumps(row))
        (root / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    meta = {
        "name": root.name,
        "task_type": "classification",
        "labels": ["neg", "pos"],
        "splits": ["train", "dev", "test"],
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return root


def test_baselines_of_a_labelled_dir(tmp_path, capsys):
    root = _write_set(tmp_path / "words")
    out = tmp_path / "b.json"
    baselines.main([str(root), "--sizes", "40", "0", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["train"] for r in rows] == [40, 200]
    for r in rows:
        assert r["majority"]["label"] == "neg" and r["majority"]["test"] == pytest.approx(0.75)
        assert r["tfidf_lr"]["test"] == 1.0 and r["tfidf_lr"]["dev"] == 1.0
        assert tuple(r["tfidf_lr"]["ngrams"]) in NGRAMS and r["tfidf_lr"]["C"] in CS
    assert "majority dev 75.0 test 75.0; tf-idf + LR dev 100.0 test 100.0" in capsys.readouterr().out


def test_pairs_and_unknown_sets_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match="holds text pairs"):
        baselines.main([str(_write_set(tmp_path / "pairs", pairs=True))])
    with pytest.raises(SystemExit, match="^error: .*no-such-set"):
        baselines.main(["no-such-set"])


def test_sets_fitted_in_parallel_choose_as_one_at_a_time(tmp_path):
    """Noisy sets, so that dev accuracy ties and differs between fits: spawned processes, one per (set, n-gram
    range), give each set the choice its own sequential fit makes (the first fit with the best dev accuracy)."""
    sets = {f"s{k}": baselines.training_prefix(str(_write_set(tmp_path / f"s{k}", flip=0.3, seed=k))) for k in (1, 2)}
    fitted.clear()
    together = many_baselines(sets, workers=3)
    for name, xy in sets.items():
        fitted.clear()  # fitted again, one at a time in this process
        assert together[name] == classification_baselines(xy)
        fits = [f for ngrams in NGRAMS for f in _fits(xy["train"], xy["dev"], xy["test"], ngrams)]
        top = max(f["dev"] for f in fits)
        best = next(f for f in fits if f["dev"] == top)
        assert top < 1.0 and together[name]["tfidf_lr"] == {k: best[k] for k in ("dev", "test", "ngrams", "C")}
    assert together["s1"]["tfidf_lr"] != together["s2"]["tfidf_lr"]  # each set got its own fits back


def test_a_set_is_fitted_once_per_process_and_its_probabilities_are_the_chosen_fits(tmp_path, monkeypatch):
    """The report's baseline rows and the ensembles that stack tf-idf ask for the same sets: the second ask reuses the
    first's fits. With probs, the chosen fit's labels and per-split probabilities come too; they make its choices."""
    xy = baselines.training_prefix(str(_write_set(tmp_path / "s", flip=0.3, seed=1)))
    calls = []
    real = eval_baselines._fits
    monkeypatch.setattr(eval_baselines, "_fits", lambda *a: calls.append(a[3]) or real(*a))
    fitted.clear()
    first = many_baselines({"s": xy}, workers=1, probs=True)["s"]
    assert calls == list(NGRAMS)
    again = many_baselines({"t": xy}, workers=1)["t"]
    assert calls == list(NGRAMS) and again["majority"] == first["majority"]
    assert again["tfidf_lr"] == {k: first["tfidf_lr"][k] for k in ("dev", "test", "ngrams", "C")}
    fit = first["tfidf_lr"]
    for split in ("dev", "test"):
        texts, gold = xy[split]
        chosen = [fit["labels"][max(range(len(p)), key=p.__getitem__)] for p in fit["probs"][split]]
        assert len(chosen) == len(texts) and sum(a == b for a, b in zip(chosen, gold)) / len(gold) == fit[split]
