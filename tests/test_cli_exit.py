"""How the `lmforge` console script ends (`lmforge.cli.entry`): after main, the threading exit hooks and every
non-daemon thread, then the atexit handlers, then the process exits with main's status without tearing the
interpreter down."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, concurrent.futures, threading, time
    from lmforge import cli

    pool = concurrent.futures.ThreadPoolExecutor(1)  # as torch.compile keeps one: idle workers wait for their hook
    pool.submit(lambda: None).result()
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished", flush=True))).start()
    atexit.register(lambda: print("atexit ran", flush=True))
    cli.main = lambda argv=None: 3
    cli.entry()
    """
)


def test_entry_waits_for_threads_runs_exit_handlers_and_keeps_the_status():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    assert out.stdout.splitlines() == ["thread finished", "atexit ran"]


def test_ctrl_c_before_a_command_runs_is_one_line_and_exit_130():
    # The command line is read before torch is imported, so an early Ctrl-C lands in lmforge's own code.
    script = (
        "import sys, lmforge.cli as cli\n"
        "cli.build_parser()\n"
        "assert 'torch' not in sys.modules, 'the CLI imported torch before reading its command line'\n"
        "def interrupted(): raise KeyboardInterrupt\n"
        "cli.main = interrupted\n"
        "cli.entry()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 130, out.stderr
    assert out.stderr == "error: interrupted\n"
