"""Progress bars in a log file (stderr not a terminal): ASCII, and a final line of their own with count and rate."""

from __future__ import annotations

import sys

from lmforge.progress import progress, set_quiet


def test_a_bar_in_a_log_ends_on_its_own_line_in_ascii(capsys, monkeypatch):
    monkeypatch.delenv("LMFORGE_QUIET", raising=False)
    with progress(total=1000, desc="tokenizing", unit="char") as bar:
        bar.update(1000)
    print("next line", file=sys.stderr)
    err = capsys.readouterr().err
    final, nxt = err.split("\r")[-1].splitlines()
    assert final.startswith("tokenizing: 100%|##########| 1000/1000") and nxt == "next line"
    assert err.isascii()
    set_quiet(True)
    try:
        with progress(total=10, desc="silent") as bar:
            bar.update(10)
        assert capsys.readouterr().err == ""
    finally:
        set_quiet(False)
