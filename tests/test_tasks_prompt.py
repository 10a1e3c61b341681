"""`task.format: prompt` (PET / LM-BFF): the text inside a template with one mask token, each label scored by the
encoder's own LM head at the mask, the template kept whole when the text is cut, and every bad template, label word
or model refused in one line."""

import dataclasses

import pytest
import tasks_testing as T
import torch
import torch.nn.functional as F

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.registry import TASKS
from lmforge.tasks.inputs import collate
from lmforge.tasks.prompt import build_prompt

LABELS = ["negative", "positive"]
LONG = " ".join(T.TEXTS)[:2000]


def one_token_words(tok, n: int = 2) -> list[str]:
    """The first n of some frequent words that the tiny tokenizer holds as one token after a space."""
    found = [w for w in ("the", "and", "of", "to", "a", "great", "in") if len(tok.encode(" " + w)) == 1]
    assert len(found) >= n, found
    return found[:n]


def prompt_task(preset: str = "roberta-tiny", family: str = "bart", **options):
    tok = T.tokenizer(family)
    words = one_token_words(tok)
    options.setdefault("verbalizer", [f"{label}={w}" for label, w in zip(LABELS, words)])
    cls = TASKS.get("classification")
    task = cls(cls.Options(format="prompt", **options), tok, LABELS)
    return task, task.build(T.model(preset, tok)).eval(), tok, words


def test_a_label_logit_is_the_lm_heads_logit_of_its_word_at_the_mask():
    task, model, tok, words = prompt_task()
    examples = [Example(text=t, label=LABELS[i % 2]) for i, t in enumerate(T.TEXTS[:3])]
    feats = task.features(Dataset(examples))
    batch = collate(feats, task.pad_id)
    assert all(f["input_ids"][f["mask_pos"]] == tok.mask_id for f in feats)
    assert all(f["input_ids"].count(tok.mask_id) == 1 for f in feats)
    full = model.backbone(batch["input_ids"], batch["attention_mask"]).logits  # (B, T, V)
    at = full[torch.arange(3), batch["mask_pos"]]
    word_ids = [tok.encode(" " + w)[0] for w in words]
    expected = at[:, word_ids]
    torch.testing.assert_close(model(batch).logits, expected)
    loss = task.loss(model, batch).metrics["task_loss"]
    assert loss == pytest.approx(float(F.cross_entropy(expected, batch["label"])), rel=1e-5)
    assert task.predict(model, batch, feats) == expected.argmax(-1).tolist()


def test_the_template_stays_whole_when_the_text_is_cut():
    task, _, tok, _ = prompt_task(max_len=24, template="{text} It was {mask}.")
    (f,) = task.features(Dataset([Example(text=LONG, label="positive")]))
    ids = f["input_ids"]
    assert len(ids) == 24 and task.n_truncated == 1
    tail = tok.encode(" It was") + [tok.mask_id] + tok.encode(".") + [tok.eos_id]
    assert ids[0] == tok.bos_id and ids[-len(tail) :] == tail
    assert f["mask_pos"] == 24 - 3
    assert ids[1 : 24 - len(tail)] == tok.encode(LONG)[: 24 - len(tail) - 1]  # the text's first tokens


def test_a_mask_before_the_text_and_the_spaces_around_the_slots():
    tok = T.tokenizer("bart")
    words = one_token_words(tok)
    p = build_prompt("so {mask} : {text}", LABELS, [f"negative={words[0]}", f"positive={words[1]}"], tok)
    so = tok.encode("so")
    assert p.before == so + [tok.mask_id] + tok.encode(" :") and p.after == [] and p.mask_at == len(so)
    assert p.text_prefix == " "  # the text is tokenised as running text after the colon
    ids, at = p.frame([7, 8, 9])
    assert ids == p.before + [7, 8, 9] and at == len(so)
    spaced = build_prompt("{text} so {mask}!", LABELS, [f"negative={words[0]}", f"positive={words[1]}"], tok)
    assert spaced.word_ids == [tok.encode(" " + w)[0] for w in words]  # " the": the space belongs to the word
    n = len(tok.encode(" so"))
    assert spaced.after == tok.encode(" so") + [tok.mask_id] + tok.encode("!") and spaced.mask_at == n
    assert spaced.frame([5, 6]) == ([5, 6, *spaced.after], 2 + n)


def test_the_label_names_are_the_words_by_default():
    tok = T.tokenizer("bart")
    a, b = one_token_words(tok)
    p = build_prompt("{text} {mask}", [a, b], None, tok)
    assert p.word_ids == [tok.encode(" " + a)[0], tok.encode(" " + b)[0]]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"template": "{text} It was."}, "task.template: must hold {mask} exactly once"),
        ({"template": "{text} {text} {mask}"}, "task.template: must hold {text} exactly once"),
        ({"verbalizer": ["negative=the", "neutral=and"]}, "task.verbalizer: 'neutral' is not a label"),
        ({"verbalizer": ["negative=the"]}, "task.verbalizer: no word for label 'positive'"),
        ({"verbalizer": ["negative=the", "negative=and"]}, "task.verbalizer: label 'negative' is given twice"),
        ({"verbalizer": ["negative:the"]}, "task.verbalizer: expected LABEL=WORD items"),
        ({"verbalizer": ["negative=the", "positive=the"]}, "task.verbalizer: two labels share a word"),
        ({"verbalizer": ["negative=the", "positive=antidisestablishment"]}, "each label word must be one token"),
        ({"verbalizer": None}, "label 'negative' has the word 'negative', which is"),
    ],
)
def test_bad_templates_and_words_are_one_clear_error(options, message):
    with pytest.raises(LMForgeError, match=message.replace("{", r"\{").replace("}", r"\}")):
        prompt_task(**options)


def test_a_comma_separated_verbalizer_is_split():
    tok = T.tokenizer("bart")
    a, b = one_token_words(tok)
    p = build_prompt("{text} {mask}", LABELS, [f"negative={a}, positive={b}"], tok)
    assert p.word_ids == [tok.encode(" " + a)[0], tok.encode(" " + b)[0]]


def test_too_short_a_max_len_and_the_wrong_model_or_task_are_refused():
    task, _, _, _ = prompt_task(max_len=6, template="{text} it was so very {mask}.")
    with pytest.raises(LMForgeError, match="leaves no room for the text"):
        task.features(Dataset([Example(text="fine", label="positive")]))
    with pytest.raises(LMForgeError, match="task.format 'prompt' needs a model of arch encoder"):
        prompt_task("gpt-tiny", "gpt")
    tok = T.tokenizer("bart")
    pair = TASKS.get("pair_classification")
    with pytest.raises(LMForgeError, match="task type 'pair_classification' has no prompt form"):
        pair(pair.Options(format="prompt"), tok, LABELS).build(T.model("roberta-tiny", tok))
    cls = TASKS.get("classification")
    headless = T.model("roberta-tiny", tok, lm_head=False)
    with pytest.raises(LMForgeError, match="scores label words with the model's LM head; this model has none"):
        cls(cls.Options(format="prompt"), tok, LABELS).build(headless)


def test_a_prompt_fine_tune_saves_reloads_and_predicts(tmp_path):
    """A pretrained-encoder checkpoint fine-tuned in the prompt format through the CLI's FineTuner; the run reloads
    with its template and words and predicts as it evaluated."""
    import lmforge
    from lmforge.checkpoint.write import write_checkpoint_dir
    from lmforge.finetuning.run import FineTuner
    from lmforge.models import Transformer, get_preset
    from lmforge.tasks.config import load_finetune_config

    tok = T.tokenizer("bart")
    words = one_token_words(tok)
    torch.manual_seed(0)
    cfg = get_preset("encoder-fast-tiny", vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    pre = write_checkpoint_dir(tmp_path / "pre", Transformer(cfg), config={"model": dataclasses.asdict(cfg)},
                               tokenizer=tok)  # fmt: skip
    data = T.write_labelled_dir(tmp_path / "set", {"train": T.sentiment(32), "dev": T.sentiment(8, seed=1)})
    run = tmp_path / "ft"
    over = [f"--run.dir={run}", "--data.source=dir", f"--data.dir={data}", "--task.format=prompt",
            "--task.template={text} It was {mask}.", f"--task.verbalizer=negative={words[0]},positive={words[1]}",
            "--train.epochs=2", "--train.lr=1e-3"]  # fmt: skip
    tuner = FineTuner(load_finetune_config("sst2-bert", over, init=str(pre)))
    tuner.fit()
    model, _ = lmforge.load(run)
    texts = [e.text for e in T.sentiment(8, seed=1).examples]
    out = model.predict(texts)
    assert [set(o["scores"]) for o in out] == [set(LABELS)] * 8
    assert all(abs(sum(o["scores"].values()) - 1) < 1e-5 for o in out)
    task, tuned = model.task, model.__dict__["_head"]
    assert task.fmt == "prompt" and tuned.word_ids.tolist() == [tok.encode(" " + w)[0] for w in words]
    dev = Dataset(T.sentiment(8, seed=1).examples, LABELS)
    batch = collate(task.features(dev), task.pad_id)
    from lmforge.tasks.model import TaskModel

    logits = TaskModel(model, tuned, "prompt")(batch).logits.softmax(-1)
    assert [o["prediction"] for o in out] == [LABELS[i] for i in logits.argmax(-1).tolist()]


def test_one_batch_is_overfit_through_the_label_words():
    task, model, _, _ = prompt_task(head_dropout=0.0)
    batch = collate(task.features(T.sentiment(8, seed=3), train=True), task.pad_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(60):
        out = task.loss(model, batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.metrics["task_loss"])
    assert losses[-1] < 0.25 * losses[0], losses
