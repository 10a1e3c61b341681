"""What a pretraining run needs before its first step: its inputs checked, its tokenizer and its prepared token
shards, and the lines it says about the model and the warmup."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import refuse_link, write_atomic
from lmforge.pretraining.config import Config
from lmforge.tokenizers.specials import FAMILY_BY_ARCH
from lmforge.train.distributed import DistInfo, barrier


def _input_paths(cfg: Config) -> list | None:
    """data.inputs resolved (fetched corpora by name, `~`), each checked to exist; `hf:NAME` and `datasets` objects
    as given (they are checked when read)."""
    if not cfg.data.inputs:
        return None
    from lmforge.data.corpus.readers import input_path
    from lmforge.data.hf_datasets import HF_PREFIX, is_dataset

    paths = [p if is_dataset(p) or str(p).startswith(HF_PREFIX) else input_path(p) for p in cfg.data.inputs]
    for p in paths:
        if isinstance(p, Path) and not p.exists():
            raise LMForgeError(f"corpus path not found: {p}")
    return paths


def check_inputs(cfg: Config) -> None:
    """Refuse missing inputs before any work is done."""
    _input_paths(cfg)
    if cfg.data.prepared and not (Path(cfg.data.prepared) / "meta.json").is_file():
        raise LMForgeError(f"data.prepared: {cfg.data.prepared} is not a prepared data dir (no meta.json)")


class _Documents:
    """The documents of some inputs, read anew on each pass (the tokenizer cache hashes them, then training reads
    them), so a corpus larger than memory can train a tokenizer."""

    def __init__(self, paths: list, text_field: str) -> None:
        self.paths, self.text_field = paths, text_field

    def __iter__(self):
        from lmforge.data.corpus.readers import read_documents

        return read_documents(self.paths, self.text_field)


def _training_texts(paths: list | None, text_field: str = "text"):
    from lmforge.data.corpus.bundled import load_default_corpus

    return load_default_corpus() if paths is None else _Documents(paths, text_field)


def model_summary(cfg: Config, n: int) -> str:
    """What a run built (`n` parameters), in one line: preset, size and shape."""
    m = cfg.model
    stacks = f"{m.n_layers}+{m.decoder_layers} layers" if m.is_encoder_decoder else f"{m.n_layers} layers"
    return (
        f"model {m.name}: {n / 1e6:.2f}M parameters ({m.arch}, d_model {m.d_model}, {stacks}, {m.n_heads} heads, "
        f"vocab {m.vocab_size}, context {m.max_seq_len}); training on sequences of {cfg.train.seq_len} tokens"
    )


def warmup_note(cfg: Config) -> str | None:
    """A note when the warmup does not end before the run does: the learning rate then never reaches train.lr."""
    from lmforge.train.optim import warmup_steps

    t = cfg.train
    warm = warmup_steps(t, t.max_steps)
    if warm <= t.max_steps:
        return None
    return (
        f"note: the warmup ({warm} steps) is longer than the run (train.max_steps={t.max_steps}): the learning rate "
        f"rises for the whole run and peaks at {t.max_steps / warm:.0%} of train.lr (lower train.warmup_steps)"
    )


def apply_init(cfg: Config) -> Path | None:
    """run.init's checkpoint, its tokenizer put into cfg unless data.tokenizer is set. The model config is the
    one `load_config` resolved: run.init's own, with the model.* keys the user gave on top."""
    from lmforge.checkpoint.verify import model_checkpoint

    if not cfg.run.init:
        return None
    path = Path(cfg.run.init)
    if not path.exists():
        raise LMForgeError(f"run.init: {path} does not exist")
    c = model_checkpoint(path)
    if not cfg.data.tokenizer:
        if not (c / "tokenizer.json").is_file():
            raise LMForgeError(f"run.init: {c} holds no tokenizer.json; pass --data.tokenizer")
        cfg.data.tokenizer = str(c)
    return c


def load_or_train_tokenizer(cfg: Config, run_dir: Path, dist: DistInfo):
    """The run's tokenizer: data.tokenizer (a path or a published name) if given, else one trained on the inputs
    (rank 0) and saved in the run. A tokenizer an earlier attempt trained with other settings is trained anew."""
    from lmforge.progress import status
    from lmforge.tokenizers import Tokenizer, train_tokenizer
    from lmforge.tokenizers.published import load_tokenizer

    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    tok_dir = run_dir / "tokenizer"
    family = cfg.data.tokenizer_family or FAMILY_BY_ARCH[cfg.model.arch]
    recipe = _tokenizer_recipe(cfg)
    if dist.is_main and _stale(tok_dir, recipe):
        texts = _training_texts(_input_paths(cfg), cfg.data.text_field)
        status(f"training a {cfg.data.tokenizer_kind} tokenizer of {cfg.data.vocab_size} tokens")
        tok = train_tokenizer(texts, cfg.data.tokenizer_kind, cfg.data.vocab_size, family=family,
                              size_key="data.vocab_size", frequency_key=None,
                              sample_chars=cfg.data.tokenizer_sample_chars, cache=True)  # fmt: skip
        _save_atomically(tok, tok_dir, recipe)
    barrier(dist)
    return Tokenizer.load(tok_dir)


_RECIPE_FILE = "lmforge_made_with.json"
_TOKENIZER_KEYS = {"inputs": "data.inputs", "kind": "data.tokenizer_kind", "family": "data.tokenizer_family",
                   "vocab_size": "data.vocab_size", "text_field": "data.text_field",
                   "sample_chars": "data.tokenizer_sample_chars"}  # fmt: skip
"""The settings a run's tokenizer is trained with (as its lmforge_made_with.json records them) and their keys."""


def _tokenizer_recipe(cfg: Config) -> dict:
    """What the tokenizer a run trains depends on."""
    d = cfg.data
    family = d.tokenizer_family or FAMILY_BY_ARCH[cfg.model.arch]
    recipe = {"inputs": d.inputs, "kind": d.tokenizer_kind, "family": family, "vocab_size": d.vocab_size}
    if d.text_field != "text" or d.tokenizer_sample_chars is not None:  # older runs' recipes stay valid
        recipe |= {"text_field": d.text_field, "sample_chars": d.tokenizer_sample_chars}
    return recipe


def keep_run_tokenizer(cfg: Config, run_dir: Path) -> None:
    """A run started again with --resume (it has no config to continue with yet) keeps the tokenizer it trained: one
    line when `cfg` would train another in its place (another recipe, other data settings)."""
    if cfg.data.tokenizer or cfg.run.init:  # the run does not use RUN/tokenizer
        return
    try:
        made = json.loads((Path(run_dir) / "tokenizer" / _RECIPE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # none yet: it is trained as usual
    want = _tokenizer_recipe(cfg)
    if not isinstance(made, dict) or made == want:
        return
    keys = [*want, *(k for k in made if k not in want)]
    changes = ", ".join(f"{_TOKENIZER_KEYS.get(k, k)} {made.get(k)!r} → {want.get(k)!r}" for k in keys
                        if made.get(k) != want.get(k))  # fmt: skip
    raise LMForgeError(
        f"cannot resume {run_dir}: its tokenizer was trained with other settings ({changes}), and a resumed run keeps "
        "its tokenizer: name the recipe and options the run was started with, or start a new run with another "
        "--run.dir"
    )


def _stale(directory: Path, recipe: dict) -> bool:
    """Whether `directory` lacks what `recipe` describes (missing, or made with other settings)."""
    try:
        return json.loads((directory / _RECIPE_FILE).read_text(encoding="utf-8")) != recipe
    except (OSError, ValueError):
        return True


def _save_atomically(tokenizer, directory: Path, recipe: dict) -> None:
    """Write the tokenizer to a scratch dir renamed into place: a run killed mid-save leaves no torn files."""
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    refuse_link(tmp)  # rmtree leaves a link in place, and the save would write through it
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer.save(tmp)
        write_atomic(tmp / _RECIPE_FILE, json.dumps(recipe) + "\n")
        shutil.rmtree(directory, ignore_errors=True)  # an earlier attempt's incomplete dir
        os.replace(tmp, directory)
    except OSError as e:
        raise LMForgeError(f"could not save the tokenizer to {directory}: {e.strerror or e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_data(cfg: Config, run_dir: Path, tokenizer, dist: DistInfo) -> Path:
    """Token shards for the run: data.prepared if given, else prepared once into RUN/data (rank 0), again when an
    earlier attempt prepared them with other settings or another tokenizer."""
    from lmforge.data.corpus import prepared_cache
    from lmforge.data.corpus.loader import check_token_ids, read_meta
    from lmforge.data.corpus.prepare import prepare, tokenizer_fingerprint
    from lmforge.progress import status

    prepared_here = False
    if cfg.data.prepared:
        data_dir = Path(cfg.data.prepared)
        if not (data_dir / "meta.json").is_file():
            raise LMForgeError(f"data.prepared: {data_dir} is not a prepared data dir (no meta.json)")
    else:
        data_dir = run_dir / "data"
        recipe = {"inputs": cfg.data.inputs, "val_fraction": cfg.data.val_fraction, "clean": cfg.data.clean,
                  "seed": cfg.run.seed, "tokenizer": tokenizer_fingerprint(tokenizer)}  # fmt: skip
        if cfg.data.text_field != "text":
            recipe["text_field"] = cfg.data.text_field
        if cfg.data.decontaminate:
            recipe["decontaminate"] = list(cfg.data.decontaminate)
            recipe["decontaminate_n"] = cfg.data.decontaminate_n
        prepared_here = _stale(data_dir, recipe)
        if dist.is_main and prepared_here:
            inputs = _input_paths(cfg)
            key = prepared_cache.cache_key(inputs, {k: v for k, v in recipe.items() if k != "inputs"})
            if prepared_cache.restore(key, data_dir):
                status(f"reusing the token shards prepared before from the same text and settings ({key})")
            else:
                status(f"preparing token shards in {data_dir}")
                prepare(
                    inputs,
                    data_dir,
                    tokenizer,
                    val_fraction=cfg.data.val_fraction,
                    clean=cfg.data.clean,
                    seed=cfg.run.seed,
                    text_field=cfg.data.text_field,
                    decontaminate=cfg.data.decontaminate,
                    decontaminate_n=cfg.data.decontaminate_n,
                )
                prepared_cache.store(key, data_dir)
            write_atomic(data_dir / _RECIPE_FILE, json.dumps(recipe) + "\n")
        barrier(dist)
    meta = read_meta(data_dir)
    if prepared_here and meta.get("replaced_bytes") and dist.is_main:
        print(
            f"warning: {meta['replaced_bytes']} bytes of the input are not valid UTF-8 and were replaced with U+FFFD",
            file=sys.stderr,
        )
    if meta.get("vocab_size", 0) > tokenizer.vocab_size:
        raise LMForgeError(
            f"prepared data in {data_dir} was tokenized with {meta['vocab_size']} tokens, "
            f"but the tokenizer has {tokenizer.vocab_size}"
        )
    recorded = meta.get("tokenizer_fingerprint")
    if recorded and recorded != tokenizer_fingerprint(tokenizer):  # same size, other tokens: ids would mean nothing
        named = f" ({meta['tokenizer']})" if meta.get("tokenizer") else ""
        raise LMForgeError(
            f"prepared data in {data_dir} was tokenized with another tokenizer{named} than data.tokenizer "
            f"{cfg.data.tokenizer}: give the one it was prepared with"
        )
    # An id past the embedding table fails inside the first step (an IndexError; on a GPU a device-side assert).
    check_token_ids(data_dir, cfg.model.vocab_size, f"model.vocab_size={cfg.model.vocab_size}", meta)
    return data_dir


def check_vocab(cfg: Config, tokenizer) -> None:
    """The model's embedding table must hold every id of the tokenizer (the config resolved the sizes already)."""
    if cfg.model.vocab_size < tokenizer.vocab_size:
        raise LMForgeError(
            f"tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size is {cfg.model.vocab_size}: "
            f"set --model.vocab_size={tokenizer.vocab_size} or use a matching tokenizer"
        )
