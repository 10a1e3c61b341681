"""Token shards cached by content: a run that would prepare the same input files again with the same tokenizer and
settings copies the shards prepared before into its data dir instead of tokenizing again.

The key is the SHA-256 of the settings (the tokenizer's fingerprint among them) and of every input file's path and
bytes, files as the readers expand them. Shards live in ``$LMFORGE_CACHE/prepared/<key>/`` (default
``~/.cache/lmforge/prepared``); ``LMFORGE_PREPARED_CACHE`` moves the directory, or turns the cache off with ``off``.
Inputs that are not files (`datasets` objects, ``hf:NAME``) are not cached.

A run's data dir holds its own copies, never links into the cache: a run whose shards are changed changes no other
run's. An entry records each file's size and sha256 (``manifest.json``, written last) when it is made, and every
copy out of it is checked against them as it is read: an entry whose bytes changed since is never reused, but
prepared again (with a warning) and stored anew. An entry without a manifest (an older lmforge's) is prepared again
too."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from lmforge.files import cache_root

ENV_VAR = "LMFORGE_PREPARED_CACHE"
KEY_VERSION = 1  # bump when prepare's output changes in a way the settings do not show
_OFF = ("off", "0", "none", "false")
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


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
    from lmforge.data.corpus.bundled import default_corpus_paths
    from lmforge.data.corpus.readers import resolve_sources

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
    """Copy the shards cached under `key` into `out` (absent, empty or prepared data, which they replace), each file
    checked against the entry's manifest; False when there are none, or none that check (the entry is removed)."""
    root = cache_dir()
    if key is None or root is None or not (root / key / "meta.json").is_file():
        return False
    if out.is_dir() and any(out.iterdir()) and not (out / "meta.json").is_file():
        return False  # not prepared data: prepare refuses to overwrite it, with its own message
    entry = root / key
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        damage = _copy_checked(entry, tmp)
        if damage is not None:
            if damage:  # not said for an entry without a manifest: an older lmforge's, not a damaged one
                print(f"warning: the cached token shards in {entry} are damaged ({damage}): preparing them again",
                      file=sys.stderr)  # fmt: skip
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(entry, ignore_errors=True)  # `store` puts the shards prepared now in its place
            return False
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False  # an unreadable cache entry: prepare again
    return True


def store(key: str | None, prepared: Path) -> None:
    """Keep a copy of the shards prepared in `prepared` under `key`, with their sizes and sha256 (best effort: a full
    disk only skips it)."""
    root = cache_dir()
    if key is None or root is None or (root / key / "meta.json").is_file():
        return
    tmp = root / f".tmp-{key}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        files = {}
        for f in sorted(prepared.iterdir()):
            if f.is_file() and not f.is_symlink():
                size, digest = _copy(f, tmp / f.name)
                files[f.name] = {"size": size, "sha256": digest}
                os.chmod(tmp / f.name, 0o444)  # nothing writes a cached shard
        (tmp / MANIFEST).write_text(json.dumps({"files": files}, indent=1) + "\n", encoding="utf-8")
        if not (root / key / "meta.json").is_file():  # an entry that lost its meta.json is never read: replace it
            shutil.rmtree(root / key, ignore_errors=True)
        os.replace(tmp, root / key)  # fails, harmlessly, when another process stored the same shards meanwhile
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _copy_checked(entry: Path, dst: Path) -> str | None:
    """Copy the files `entry`'s manifest lists into a new dir `dst`, hashing them as they are read: None when every
    one has the size and sha256 recorded, else what differs ("" when the entry has no manifest)."""
    try:
        files = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return ""
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable: {e}"
    if not isinstance(files, dict) or "meta.json" not in files:
        return f"{MANIFEST} lists no meta.json"
    dst.mkdir(parents=True)
    for name, want in files.items():
        src = entry / str(name)
        if src.parent != entry or src.is_symlink() or not src.is_file():
            return f"{name} is missing"
        size, digest = _copy(src, dst / src.name)
        if not isinstance(want, dict) or size != want.get("size"):
            return f"{name}: {size} bytes, not the size recorded when it was cached"
        if digest != want.get("sha256"):
            return f"{name}: its sha256 is not the one recorded when it was cached"
    return None


def _copy(src: Path, dst: Path) -> tuple[int, str]:
    """Copy `src` to a new file `dst` in one pass; its size and sha256, of the bytes copied."""
    h, size = hashlib.sha256(), 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return size, h.hexdigest()
