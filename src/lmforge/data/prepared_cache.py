"""Token shards cached by content: a run that would prepare the same input files again with the same tokenizer and
settings links the shards prepared before into its data dir instead of tokenizing again.

The key is the SHA-256 of the settings (the tokenizer's fingerprint among them) and of every input file's path and
bytes, files as the readers expand them. Shards live in ``$LMFORGE_CACHE/prepared/<key>/`` (default
``~/.cache/lmforge/prepared``); ``LMFORGE_PREPARED_CACHE`` moves the directory, or turns the cache off with ``off``.
Inputs that are not files (`datasets` objects, ``hf:NAME``) are not cached. Shards are read-only once written (a
prepare writes a new directory and renames it into place), so a run's data dir holds hard links to the cached files
where the file system allows, copies elsewhere."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from lmforge.files import cache_root

ENV_VAR = "LMFORGE_PREPARED_CACHE"
KEY_VERSION = 1  # bump when prepare's output changes in a way the settings do not show
_OFF = ("off", "0", "none", "false")


def cache_dir() -> Path | None:
    """Where prepared shards are cached, or None when the cache is off."""
    env = os.environ.get(ENV_VAR, "")
    if env.lower() in _OFF:
        return None
    return Path(env).expanduser() if env else cache_root() / "prepared"


def cache_key(inputs: Sequence | None, settings: dict) -> str | None:
    """The key of `inputs` (None: the bundled corpus) prepared with `settings`; None when an input is not a file, or
    when the cache is off (the inputs are then not read for it)."""
    if cache_dir() is None:
        return None
    from lmforge.data.corpus import default_corpus_paths
    from lmforge.data.readers import resolve_sources

    files = resolve_sources(default_corpus_paths() if inputs is None else inputs)
    if not all(isinstance(f, Path) for f in files):
        return None
    h = hashlib.sha256(json.dumps({"key_version": KEY_VERSION, **settings}, sort_keys=True).encode())
    for path in files:
        name = str(path.resolve()).encode("utf-8", "surrogatepass")  # meta.json names the sources
        h.update(len(name).to_bytes(8, "little") + name + path.stat().st_size.to_bytes(8, "little"))
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()[:32]


def restore(key: str | None, out: Path) -> bool:
    """Put the shards cached under `key` into `out` (absent, empty or prepared data, which they replace); False when
    there are none."""
    root = cache_dir()
    if key is None or root is None or not (root / key / "meta.json").is_file():
        return False
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").is_file():
        return False  # not prepared data: prepare refuses to overwrite it, with its own message
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        _link_tree(root / key, tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False  # an unreadable cache entry: prepare again
    return True


def store(key: str | None, prepared: Path) -> None:
    """Keep a copy of the shards prepared in `prepared` under `key` (best effort: a full disk only skips it)."""
    root = cache_dir()
    if key is None or root is None or (root / key / "meta.json").is_file():
        return
    tmp = root / f".tmp-{key}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        _link_tree(prepared, tmp)
        if not (root / key / "meta.json").is_file():  # an entry that lost its meta.json is never read: replace it
            shutil.rmtree(root / key, ignore_errors=True)
        os.replace(tmp, root / key)  # fails, harmlessly, when another process stored the same shards meanwhile
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links to the plain files of `src` in a new dir `dst` (copies where links are not possible)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if not f.is_file() or f.is_symlink():
            continue
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)
