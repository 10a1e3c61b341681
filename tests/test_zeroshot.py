"""Zero/few-shot: the harness-style LM interface against log-probs computed by hand on tiny models, GPT-1's zero-shot
heuristics, few-shot prompt construction, prompted-evaluation recipes."""

import pytest
import tasks_testing as T
import torch

from lmforge.data.labelled.examples import Dataset, Example
from lmforge.errors import LMForgeError
from lmforge.eval.fewshot import PromptClassify, PromptGenerate, PromptOptions, build_prompt, sample_demos
from lmforge.eval.lm import LM, rolling_windows, split_trailing_space
from lmforge.eval.zeroshot import (
    Acceptability,
    AcceptabilityOptions,
    Choice,
    ChoiceOptions,
    Winograd,
    WinogradOptions,
    best_threshold,
    load_prompt_config,
)

CTX = "It is a truth universally acknowledged, that a single"
CONT = " man in possession"


@pytest.fixture(scope="module")
def gpt():
    tok = T.tokenizer("gpt")
    return T.model("gpt-tiny", tok, seed=3).eval(), tok


@torch.no_grad()
def by_hand(model, tok, context: str, continuation: str) -> tuple[float, bool, int]:
    """Sum of log P(continuation tokens | context) from one unpadded forward, greedy flag, token count."""
    ctx, cont = tok.encode(context) or [tok.eos_id], tok.encode(continuation)
    ids = torch.tensor([ctx + cont])
    logp = model(ids).logits[0, :-1].log_softmax(-1)[len(ctx) - 1 :]
    tgt = torch.tensor(cont)
    lp = logp.gather(-1, tgt[:, None]).squeeze(-1)
    return float(lp.sum()), bool((logp.argmax(-1) == tgt).all()), len(cont)


def test_loglikelihood_equals_hand_computed_logprobs(gpt):
    model, tok = gpt
    reqs = [(CTX, CONT), ("Four score and seven", " years ago"), ("", "Now we are engaged"), ("A", " b")]
    lm = LM(model, tok, batch_size=3)  # mixed lengths in one padded batch
    for (c, x), (lp, greedy) in zip(reqs, lm.loglikelihood(reqs)):
        want, want_greedy, _ = by_hand(model, tok, c, x)
        assert lp == pytest.approx(want, abs=1e-4) and greedy == want_greedy
    assert all(lp < 0 for lp, _ in lm.loglikelihood(reqs))


def test_is_greedy_is_true_for_the_models_own_argmax(gpt):
    model, tok = gpt
    ids = tok.encode(CTX)
    with torch.no_grad():
        nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    [(_, greedy)] = LM(model, tok).loglikelihood([(CTX, tok.decode([nxt]))])
    assert greedy


def test_trailing_space_moves_to_the_continuation(gpt):
    model, tok = gpt
    assert split_trailing_space("very ", "good") == ("very", " good")
    lm = LM(model, tok)
    assert lm.loglikelihood([("a truth ", "universally")]) == lm.loglikelihood([("a truth", " universally")])


def test_encoder_decoder_loglikelihood_by_hand():
    tok = T.tokenizer("t5")
    model = T.model("t5-tiny", tok, seed=2).eval()
    [(lp, _)] = LM(model, tok).loglikelihood([(CTX, "man")])
    src, cont = tok.encode(CTX) + [tok.eos_id], tok.encode("man")
    with torch.no_grad():
        out = model(torch.tensor([src]), decoder_input_ids=torch.tensor([[0, *cont[:-1]]]))
    want = out.logits[0].log_softmax(-1).gather(-1, torch.tensor(cont)[:, None]).sum()
    assert lp == pytest.approx(float(want), abs=1e-4)


def test_rolling_windows_are_the_harness_windows():
    # lm-eval-harness's docstring example: tokens 0..9 after BOS, context 4. Indices are into [BOS] + tokens.
    assert rolling_windows(10, 4) == [(0, 0, 4), (4, 4, 8), (6, 8, 10)]  # the last window keeps a full context
    # Hugging Face's perplexity guide: stride 2 predicts 2 new tokens per window after 2 of context.
    assert rolling_windows(10, 4, stride=2) == [(0, 0, 4), (2, 4, 6), (4, 6, 8), (6, 8, 10)]
    assert rolling_windows(3, 4) == [(0, 0, 3)] and rolling_windows(0, 4) == []
    with pytest.raises(LMForgeError, match="stride must be between 1 and the context length 4, got 5"):
        rolling_windows(10, 4, stride=5)


@torch.no_grad()
def rolling_by_hand(model, ids: list[int], max_len: int, stride: int) -> float:
    """Each token predicted once: windows of `stride` new predictions, each after the max_len tokens before it."""
    want, n = 0.0, len(ids) - 1  # ids[0] is the EOS prefix
    first, end = 0, min(max_len, n)
    while first < n:
        window = torch.tensor([ids[max(0, end - max_len) : end + 1]])
        logp = model(window[:, :-1]).logits[0].log_softmax(-1)
        lp = logp.gather(-1, window[0, 1:, None]).squeeze(-1)
        want += float(lp[-(end - first) :].sum())
        first, end = end, min(end + stride, n)
    return want


@pytest.mark.parametrize("stride", [16, 5])
def test_loglikelihood_rolling_windows_by_hand(stride):
    tok = T.tokenizer("gpt")
    model = T.model("gpt-tiny", tok, seed=1, max_seq_len=16).eval()
    text = T.TEXTS[0]
    ids = [tok.eos_id] + tok.encode(text)
    assert len(ids) > 40 and (len(ids) - 1) % 16  # several windows of 16 predictions, a shorter last one
    want = rolling_by_hand(model, ids, 16, stride)
    lm = LM(model, tok, batch_size=2)
    [parts] = lm.score_rolling([text], stride=stride)
    assert sum(p.total for p in parts) == pytest.approx(want, abs=1e-3)
    assert sum(len(p.logprobs) for p in parts) == len(ids) - 1  # every token scored once
    if stride == 16:
        assert lm.loglikelihood_rolling([text]) == [pytest.approx(want, abs=1e-3)]


def test_generate_until_cuts_at_the_stop_string(gpt):
    model, tok = gpt
    lm = LM(model, tok)
    [full] = lm.generate_until([(CTX, [], 12)])
    assert full
    stop = full[len(full) // 2 :][:2]
    [cut] = lm.generate_until([(CTX, [stop], 12)])
    assert cut == full[: full.index(stop)]


def test_generate_until_batches_by_length_and_keeps_request_order(gpt):
    model, tok = gpt
    reqs = [("A", [], 5), (CTX, ["\n"], 9), ("Four score and seven years", [], 3), ("", [], 4)]
    alone = [LM(model, tok, batch_size=1).generate_until([r])[0] for r in reqs]
    assert LM(model, tok, batch_size=3).generate_until(reqs) == alone  # left-padded batches, original order
    assert all(len(tok.encode(o)) <= r[2] for o, r in zip(alone, reqs))


def test_generate_until_stops_a_batch_at_its_stop_strings(gpt):
    model, tok = gpt
    lm = LM(model, tok, batch_size=2)
    [full] = lm.generate_until([(CTX, [], 40)])
    stop = full[:2]
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert lm.generate_until([(CTX, [stop], 40), (CTX, [stop], 40)]) == ["", ""]
    finally:
        hook.remove()
    assert len(calls) < 5  # not 40 decoding steps: both rows met the stop string at once


def test_encode_pair_follows_the_harness_tokenization(gpt):
    model, tok = gpt
    lm = LM(model, tok)
    ctx, cont = lm.encode_pair("Answer:\n", "yes")  # trailing whitespace (not only spaces) moves over
    assert ctx == tok.encode("Answer:") and ctx + cont == tok.encode("Answer:\nyes")
    assert lm.encode_pair("", " man") == ([], tok.encode(" man"))


def test_best_threshold_maximises_mcc():
    assert best_threshold([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == pytest.approx(0.5)
    # anti-correlated scores: every cut has MCC <= 0, the first (nothing predicted positive) is kept
    assert best_threshold([0.9, 0.8, 0.2, 0.1], [False, False, True, True]) == pytest.approx(0.9)
    t = best_threshold([-3.0, -2.0, -2.5, -1.0, -1.5], [False, True, False, True, True])
    assert -2.5 < t < -2.0


def splits_of(*examples_by_split):
    return {name: Dataset(list(exs)) for name, exs in examples_by_split}


def test_acceptability_thresholds_the_mean_token_logprob(gpt):
    model, tok = gpt
    lm = LM(model, tok)
    sents = [s for t in T.TEXTS for s in t.split(". ") if len(tok.encode(s)) < 100][:16]
    train = [Example(text=s, label=str(i % 2)) for i, s in enumerate(sents[:10])]
    dev = [Example(text=s, label=str(i % 2)) for i, s in enumerate(sents[10:])]
    method = Acceptability(AcceptabilityOptions(positive_label="1", metrics=["accuracy"]))
    res = method.run(lm, splits_of(("train", train), ("dev", dev)), "dev")

    def mean_lp(s):
        lp, _, n = by_hand(model, tok, "", s)
        return lp / n

    thr = best_threshold([mean_lp(e.text) for e in train], [e.label == "1" for e in train])
    preds = [int(mean_lp(e.text) > thr) for e in dev]
    assert res["accuracy"] == pytest.approx(sum(p == int(e.label) for p, e in zip(preds, dev)) / len(dev))


def test_sst2_style_label_words_pick_the_more_likely_word(gpt):
    model, tok = gpt
    exs = [Example(text=s, label=lab) for s, lab in [(CTX, "positive"), ("Four score and seven", "negative")]]
    opts = PromptOptions(template="{text} very", label_words=[" negative", " positive"])
    method = PromptClassify(opts)
    preds = method.predict(LM(model, tok), splits_of(("dev", exs)), "dev")
    for ex, p in zip(exs, preds):
        scores = [by_hand(model, tok, ex.text + " very", w)[0] for w in opts.label_words]
        assert p == max(range(2), key=lambda j: scores[j])


def test_fewshot_prompt_construction_is_exact_and_seeded():
    train = [Example(text=f"review {i}", label=["negative", "positive"][i % 2]) for i in range(6)]
    query = Example(text="the query", label="positive")
    opts = PromptOptions(template="Review: {text}\nSentiment:", label_words=[" bad", " good"], k=2, seed=7)
    prompts = PromptClassify(opts).prompts({"train": Dataset(train), "dev": Dataset([query])}, "dev")
    import random

    demos = sample_demos(Dataset(train), 2, random.Random(7), query)
    words = {"negative": " bad", "positive": " good"}
    expected = "\n\n".join([f"Review: {d.text}\nSentiment:{words[d.label]}" for d in demos])
    assert prompts == [expected + "\n\nReview: the query\nSentiment:"]
    assert prompts == PromptClassify(opts).prompts({"train": Dataset(train), "dev": Dataset([query])}, "dev")
    other = PromptOptions(template=opts.template, label_words=opts.label_words, k=2, seed=8)
    assert PromptClassify(other).prompts({"train": Dataset(train), "dev": Dataset([query])}, "dev") != prompts
    assert build_prompt("{text} =", [(train[0], " x")], query, " | ") == "review 0 = x | the query ="


def test_fewshot_never_shows_the_query_and_needs_k_examples():
    import random

    train = Dataset([Example(text=str(i)) for i in range(3)])
    for seed in range(20):
        assert train.examples[0] not in sample_demos(train, 2, random.Random(seed), train.examples[0])
    with pytest.raises(LMForgeError, match="few-shot k=4 needs at least 4 training examples"):
        sample_demos(train, 4, random.Random(0))


def test_tldr_prompt_for_summaries():
    ex = Example(text="A long passage.", target="short")
    demo = Example(text="Another passage.", target="its summary")
    method = PromptGenerate(PromptGenerate.Options(k=1))
    assert method.prompts({"train": Dataset([demo]), "dev": Dataset([ex])}, "dev") == [
        "Another passage.\nTL;DR: its summary\n\nA long passage.\nTL;DR:"
    ]


def test_choice_picks_the_highest_mean_answer_logprob(gpt):
    model, tok = gpt
    ex = Example(text=CTX, choices=[" man in possession of a good fortune", " woman", " cat sat"], label=0)
    res = Choice(ChoiceOptions(choice_prefix="")).run(LM(model, tok), splits_of(("dev", [ex])), "dev")
    means = []
    for c in ex.choices:
        lp, _, n = by_hand(model, tok, CTX, c)
        means.append(lp / n)
    assert res == {"accuracy": float(max(range(3), key=lambda j: means[j]) == 0)}


def test_winograd_substitutes_each_referent(gpt):
    model, tok = gpt
    texts = [
        ("The trophy did not fit in the suitcase because _ was too big.", ["the trophy", "the suitcase"]),
        ("Jane thanked Lizzy for the letter that _ had written.", ["Jane", "Lizzy", "Mary"]),
    ]
    full, partial = [], []
    for text, choices in texts:
        totals = [by_hand(model, tok, "", text.replace("_", c))[0] for c in choices]
        head, tail = text.split("_")
        parts = [by_hand(model, tok, head + c, tail)[0] for c in choices]
        full.append(Example(text=text, choices=choices, label=max(range(len(choices)), key=totals.__getitem__)))
        partial.append(Example(text=text, choices=choices, label=max(range(len(choices)), key=parts.__getitem__)))
    lm = LM(model, tok)
    assert Winograd(WinogradOptions()).run(lm, splits_of(("dev", full)), "dev") == {"accuracy": 1.0}
    assert Winograd(WinogradOptions(scoring="partial")).run(lm, splits_of(("dev", partial)), "dev") == {"accuracy": 1.0}
    wrong = [Example(text=e.text, choices=e.choices, label=(e.label + 1) % len(e.choices)) for e in full]
    assert Winograd(WinogradOptions()).run(lm, splits_of(("dev", wrong)), "dev") == {"accuracy": 0.0}
    with pytest.raises(LMForgeError, match="needs a '_' and choices"):
        Winograd(WinogradOptions()).run(lm, splits_of(("dev", [Example(text="no blank", choices=["a"])])), "dev")


def test_prompt_recipes_load_with_overrides_and_reject_unknown_keys():
    cfg = load_prompt_config("sst2-zeroshot", ["--data.dir=/data/glue", "--eval.k=4"])
    assert cfg.name == "SST-2" and cfg.data.source == "glue" and cfg.data.dir == "/data/glue"
    assert cfg.eval.method == "prompt_classify" and cfg.eval.options.k == 4
    assert cfg.eval.options.label_words == [" negative", " positive"]
    with pytest.raises(LMForgeError, match="unknown config key 'eval.label_word' — did you mean 'eval.label_words'"):
        load_prompt_config("sst2-zeroshot", ["--eval.label_word=[x]"])
    with pytest.raises(LMForgeError, match="unknown eval 'prompt_clasify' — did you mean 'prompt_classify'"):
        load_prompt_config("sst2-zeroshot", ["--eval.method=prompt_clasify"])


def test_lm_refuses_encoders():
    tok = T.tokenizer("bert")
    with pytest.raises(LMForgeError, match="cannot score text"):
        LM(T.model("electra-tiny", tok), tok)
