"""Train BPE (GPT-2 style), WordPiece (BERT style) and Unigram (SentencePiece/T5 style) tokenizers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import tokenizers

from lmforge.errors import LMForgeError
from lmforge.progress import progress, status
from lmforge.tokenizers.cache import cache_dir, cache_key, load_cached, store
from lmforge.tokenizers.core import Tokenizer
from lmforge.tokenizers.sample import TextSample, default_sample_chars, sample_texts
from lmforge.tokenizers.specials import DEFAULT_FAMILY, FAMILIES, KINDS, SPECS, Family, FamilySpec, Kind

N_BYTES = 256
UNIGRAM_OPTIONS = {"shrinking_factor": 0.75, "n_sub_iterations": 2, "max_piece_length": 16}
"""SentencePiece's defaults (Kudo 2018's unigram EM, pruning 25% of the pieces per round), stated so a cached or saved
tokenizer records them; the speed comes from training on a sample (`lmforge.tokenizers.sample`)."""


def train_tokenizer(
    texts: Iterable[str],
    kind: Kind,
    vocab_size: int,
    family: Family | None = None,
    min_frequency: int = 2,
    show_progress: bool | None = None,
    size_key: str = "vocab_size",
    frequency_key: str | None = "min_frequency",
    *,
    sample_chars: int | None = None,
    cache: bool = False,
) -> Tokenizer:
    """Learn a ``vocab_size``-token vocabulary (special tokens included) from ``texts``.

    ``family`` picks the special tokens and their ids; None means the kind's usual family
    (bpe -> gpt, wordpiece -> bert, unigram -> t5). ``min_frequency`` is the least count a merge
    needs (BPE and WordPiece; Unigram prunes by likelihood instead). ``size_key`` and ``frequency_key`` name the
    options an error tells the user to change (``model.vocab_size``; None: min_frequency is not theirs to set).
    ``sample_chars`` bounds the text trained on to a deterministic sample of that many characters
    (`lmforge.tokenizers.sample`; None: the kind's default, a bounded sample for unigram; 0: all of it).
    ``cache`` reuses a tokenizer trained before on the same text with the same settings (`lmforge.tokenizers.cache`;
    needs ``texts`` to be readable twice, e.g. a list, unless a sample is taken).
    """
    if show_progress is None:  # the trainer's own bar, on a terminal unless quiet
        from lmforge.progress import terminal_progress

        show_progress = terminal_progress()
    family = family or DEFAULT_FAMILY.get(kind)  # type: ignore[assignment]
    _check_args(kind, vocab_size, family, min_frequency, size_key)
    spec = SPECS[family] if kind == "bpe" else SPECS[family].with_unk()
    learned = vocab_size - len(spec.trailing)  # trailing specials are appended after training
    if kind == "bpe" and learned < len(spec.leading) + N_BYTES:
        raise LMForgeError(
            f"{size_key} {vocab_size} is too small for a bpe tokenizer of family {family}: the "
            f"{N_BYTES} byte tokens and {_plural(len(spec.tokens), 'special token')} need at least "
            f"{N_BYTES + len(spec.tokens)}"
        )
    budget = default_sample_chars(kind, vocab_size) if sample_chars is None else sample_chars
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise LMForgeError(f"the tokenizer's sample_chars must be an integer >= 0 (0: all the text), got {budget!r}")
    training: dict = {"trainer": _options(kind, min_frequency)}
    sampled_note = None
    if budget:
        sample = _read_sample(texts, budget)
        texts = sample.texts
        training.update(sample.info())
        if sample.sampled:  # said once the cache has no tokenizer to reuse: a reused one is not trained
            sampled_note = (
                f"training the {kind} tokenizer on a sample of {_chars(sample.chars_used)} of the "
                f"{_chars(sample.chars_seen)} characters (sample_chars={budget:,}; 0 trains on all)"
            )
    key = None
    if cache and iter(texts) is not texts:  # a sample or a list: the text can be hashed, then trained on
        key = cache_key(texts, {"kind": kind, "family": family, "vocab_size": vocab_size, **training})
        cached = load_cached(key)
        if cached is not None:
            status(f"reusing the {kind} tokenizer of {vocab_size} tokens trained before on the same text and "
                   f"settings ({cache_dir()}/{key})")  # fmt: skip
            return cached
    if sampled_note:
        status(sampled_note)
    started = time.monotonic()
    sampled = bool(training.get("sampled"))
    backend = _fit(
        texts, kind, learned, spec, min_frequency, show_progress, size_key, frequency_key, vocab_size, sampled
    )
    # Added in increasing id order after the learned vocab (T5: <extra_id_99> ... <extra_id_0>).
    backend.add_special_tokens([_added(t, spec) for t in spec.trailing])
    backend.post_processor = _post_processor(kind, spec, backend)
    tok = Tokenizer(backend, spec.roles, family)
    tok.training = training
    where = store(key, tok) if key else None
    cached_in = f" (cached in {where})" if where else ""
    status(f"trained the {kind} tokenizer in {time.monotonic() - started:.1f} s{cached_in}")
    # The cached copy, as a later run will load it: its scores went through JSON, and both runs must tokenize alike.
    return (load_cached(key) or tok) if where else tok


def _read_sample(texts: Iterable[str], budget: int) -> TextSample:
    """The bounded sample of `texts`, with a progress bar over the characters read."""
    bar = progress(desc="sampling text", unit="char", unit_scale=True)
    sample = sample_texts(texts, budget, on_text=bar.update)
    bar.close()
    return sample


def _fit(texts, kind, learned, spec, min_frequency, show_progress, size_key, frequency_key, vocab_size, sampled):
    """The trained `tokenizers.Tokenizer` (learned vocabulary only), with one-line errors."""
    backend = _pipeline(kind, spec)
    trainer = _trainer(kind, learned, spec, min_frequency, show_progress)
    counter = _CharCounter(texts)
    try:
        with _heartbeat(f"training the {kind} tokenizer", quiet=show_progress):
            backend.train_from_iterator(counter, trainer)
    except LMForgeError:
        raise
    except Exception as e:
        if "not large enough" in str(e):  # UnigramTrainer: fewer slots than distinct characters
            raise LMForgeError(
                f"{size_key} {vocab_size} is too small: the training text has more distinct characters"
            ) from e
        raise LMForgeError(f"tokenizer training failed: {str(e).strip().splitlines()[0]}") from e
    if counter.chars == 0:
        raise LMForgeError("no training text: every input text is empty")
    if kind == "wordpiece":
        _number_by_text(backend, spec)
    _check_size(backend.get_vocab_size(with_added_tokens=True), learned, vocab_size, kind, size_key, frequency_key,
                sampled)  # fmt: skip
    return backend


def _number_by_text(backend: tokenizers.Tokenizer, spec: FamilySpec) -> None:
    """Give WordPiece's learned tokens ids in the order of their text, after the special tokens.

    Its trainer numbers its alphabet in the order of a hash set seeded per process, and breaks ties between pieces
    of equal count the same way, so the same text gave the same tokens under other ids in every training, hence
    another initialisation of the model (a tiny BERT's validation loss after 40 steps ranged over 0.2 nats).
    WordPiece tokenizes by longest match, so the ids' order means nothing else."""
    vocab = backend.get_vocab(with_added_tokens=False)
    by_id = sorted(vocab, key=vocab.__getitem__)
    n_special = len(spec.leading)
    order = by_id[:n_special] + sorted(by_id[n_special:], key=lambda t: (t.startswith("##"), t))
    old = backend.model
    backend.model = tokenizers.models.WordPiece(
        vocab={t: i for i, t in enumerate(order)}, unk_token=old.unk_token,
        continuing_subword_prefix=old.continuing_subword_prefix, max_input_chars_per_word=old.max_input_chars_per_word,
    )  # fmt: skip


@contextmanager
def _heartbeat(what: str, quiet: bool, every: float = 30.0) -> Iterator[None]:
    """A status line every `every` seconds while the (GIL-releasing) Rust trainer runs, for logs, where its own
    bar does not show; nothing when `quiet` (the trainer's bar is on a terminal) or --quiet."""
    from lmforge.progress import is_quiet

    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every):
            status(f"{what}: {time.monotonic() - started:.0f} s so far")

    thread = None if quiet or is_quiet() else threading.Thread(target=beat, daemon=True)
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()


def _check_args(kind: str, vocab_size: int, family: str | None, min_frequency: int, size_key: str) -> None:
    if kind not in KINDS:
        raise LMForgeError(f"unknown tokenizer kind '{kind}' (known: {', '.join(KINDS)})")
    if family not in FAMILIES:
        raise LMForgeError(f"unknown tokenizer family '{family}' (known: {', '.join(FAMILIES)})")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        raise LMForgeError(f"{size_key} must be a positive integer, got {vocab_size!r}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise LMForgeError(f"min_frequency must be an integer >= 1, got {min_frequency!r}")
    if vocab_size <= len(SPECS[family].tokens) + 1:
        raise LMForgeError(
            f"{size_key} {vocab_size} is too small: family {family} alone has "
            f"{_plural(len(SPECS[family].tokens), 'special token')}"
        )


def _check_size(
    got: int, learned: int, vocab_size: int, kind: str, size_key: str, frequency_key: str | None, sampled: bool = False
) -> None:
    """Fail unless training produced exactly the requested number of learned tokens."""
    if got > learned:
        raise LMForgeError(
            f"{size_key} {vocab_size} is too small: the characters of the training text and the special "
            f"tokens alone need {got + vocab_size - learned} entries"
        )
    if got < learned:
        knobs = size_key if kind == "unigram" or frequency_key is None else f"{size_key} or {frequency_key}"
        raise LMForgeError(
            f"the training text supports only {got + vocab_size - learned} tokens for a {kind} vocabulary, "
            f"fewer than {size_key} {vocab_size}: lower {knobs}, or add text"
            + (" (it trained on a sample: raise sample_chars)" if sampled else "")
        )


def _chars(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 100_000 else f"{n:,}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class _CharCounter:
    """Passes texts through to the trainer while counting characters (to detect an empty corpus)."""

    def __init__(self, texts: Iterable[str]) -> None:
        self._texts = texts
        self.chars = 0

    def __iter__(self) -> Iterator[str]:
        for text in self._texts:
            self.chars += len(text)
            yield text


def _added(token: str, spec: FamilySpec) -> tokenizers.AddedToken:
    # normalized=False: "[MASK]" must match before BERT's lowercasing would turn it into "[mask]".
    return tokenizers.AddedToken(token, special=True, normalized=False, lstrip=token in spec.lstrip)


def _pipeline(kind: str, spec: FamilySpec) -> tokenizers.Tokenizer:
    """An untrained tokenizer with the normalizer, pre-tokenizer and decoder of ``kind``."""
    if kind == "bpe":
        # GPT-2 (Radford et al. 2019 §2.2): BPE over bytes, so every string is encodable without unk.
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
    elif kind == "wordpiece":
        # BERT (Devlin et al. 2019): lowercased, split on whitespace and punctuation, "##" continuations.
        tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token=spec.roles["unk"]))
        tok.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
        tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    else:
        # SentencePiece unigram LM (Kudo 2018) as in T5: spaces become "▁", prepended to the first word.
        tok = tokenizers.Tokenizer(tokenizers.models.Unigram())
        tok.normalizer = tokenizers.normalizers.NFKC()
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _trainer(kind: str, learned: int, spec: FamilySpec, min_frequency: int, show_progress: bool):
    specials = [_added(t, spec) for t in spec.leading]
    if kind == "bpe":
        return tokenizers.trainers.BpeTrainer(
            vocab_size=learned,
            min_frequency=min_frequency,
            special_tokens=specials,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
            show_progress=show_progress,
        )
    if kind == "wordpiece":
        return tokenizers.trainers.WordPieceTrainer(
            vocab_size=learned,
            min_frequency=min_frequency,
            special_tokens=specials,
            continuing_subword_prefix="##",
            show_progress=show_progress,
        )
    return tokenizers.trainers.UnigramTrainer(
        vocab_size=learned,
        special_tokens=specials,
        unk_token=spec.roles["unk"],
        show_progress=show_progress,
        **UNIGRAM_OPTIONS,
    )


def _options(kind: str, min_frequency: int) -> dict:
    """The trainer options that shape the vocabulary, as recorded with it."""
    if kind == "unigram":
        return dict(UNIGRAM_OPTIONS)
    # WordPiece's ids are numbered by text (`_number_by_text`): a tokenizer cached before was numbered otherwise.
    return {"min_frequency": min_frequency, **({"ids": "by text"} if kind == "wordpiece" else {})}


def _post_processor(
    kind: str, spec: FamilySpec, backend: tokenizers.Tokenizer
) -> tokenizers.processors.PostProcessor | None:
    """What a Hugging Face tokenizer adds around sequences when asked for special tokens."""
    steps: list[tokenizers.processors.PostProcessor] = []
    if kind == "bpe":
        steps.append(tokenizers.processors.ByteLevel(add_prefix_space=False, trim_offsets=False))
    if spec.template is not None:
        single, pair = spec.template
        names = {w.split(":")[0] for w in f"{single} {pair}".split() if not w.startswith("$")}
        steps.append(
            tokenizers.processors.TemplateProcessing(
                single=single, pair=pair, special_tokens=[(t, backend.token_to_id(t)) for t in sorted(names)]
            )
        )
    if len(steps) <= 1:
        return steps[0] if steps else None
    return tokenizers.processors.Sequence(steps)
