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
from lmforge.tokenizers.kinds import KINDS, TOKENIZER_KINDS, Kind, TokenizerKind
from lmforge.tokenizers.sample import TextSample, sample_texts
from lmforge.tokenizers.specials import FAMILIES, SPECS, Family, FamilySpec

N_BYTES = 256


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
    if kind not in KINDS:
        raise LMForgeError(f"unknown tokenizer kind '{kind}' (known: {', '.join(KINDS)})")
    entry = TOKENIZER_KINDS[kind]
    family = family or entry.family
    _check_args(vocab_size, family, min_frequency, size_key)
    spec = SPECS[family].with_unk() if entry.needs_unk else SPECS[family]
    learned = vocab_size - len(spec.trailing)  # trailing specials are appended after training
    if entry.byte_level and learned < len(spec.leading) + N_BYTES:
        raise LMForgeError(
            f"{size_key} {vocab_size} is too small for a {kind} tokenizer of family {family}: the "
            f"{N_BYTES} byte tokens and {_plural(len(spec.tokens), 'special token')} need at least "
            f"{N_BYTES + len(spec.tokens)}"
        )
    budget = entry.default_sample_chars(vocab_size) if sample_chars is None else sample_chars
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise LMForgeError(f"the tokenizer's sample_chars must be an integer >= 0 (0: all the text), got {budget!r}")
    training: dict = {"trainer": entry.options(min_frequency)}
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
    backend.post_processor = _post_processor(entry, spec, backend)
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
    entry = TOKENIZER_KINDS[kind]
    backend = entry.pipeline(spec)
    trainer = entry.trainer(learned, [_added(t, spec) for t in spec.leading], spec, min_frequency, show_progress)
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
    if entry.ids_by_text:
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


def _check_args(vocab_size: int, family: str | None, min_frequency: int, size_key: str) -> None:
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
        frequency = TOKENIZER_KINDS[kind].frequency_knob and frequency_key is not None
        knobs = f"{size_key} or {frequency_key}" if frequency else size_key
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


def _post_processor(
    entry: TokenizerKind, spec: FamilySpec, backend: tokenizers.Tokenizer
) -> tokenizers.processors.PostProcessor | None:
    """What a Hugging Face tokenizer adds around sequences when asked for special tokens."""
    steps: list[tokenizers.processors.PostProcessor] = []
    if entry.byte_level:
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
