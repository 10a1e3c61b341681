"""The `lmforge` command line. Every user error ends as one line on stderr and a non-zero exit code.

One module per command (`lmforge.cli.pretrain`, ...), each with `add_parser(subparsers, name)`, which registers
its subparser and sets `fn`, the function that runs it, and, for a command whose extra arguments are config
overrides, `overrides(args, argv, extra)`; `COMMANDS` lists them in the order of `lmforge --help`. Shared argument
helpers: args.py; the --help epilogs: help.py; the resolved config: config_show.py."""

from __future__ import annotations

import atexit
import os
import sys
import threading

from lmforge.cli import (
    align,
    compress,
    config,
    convert,
    data,
    experiment,
    finetune,
    generate,
    model,
    predict,
    pretrain,
    probe,
    scaling,
    tokenizer,
)
from lmforge.cli import eval as eval_command
from lmforge.cli.args import Parser
from lmforge.errors import LMForgeError

COMMANDS = [
    ("pretrain", pretrain),
    ("finetune", finetune),
    ("eval", eval_command),
    ("align", align),
    ("compress", compress),
    ("config", config),
    ("generate", generate),
    ("data", data),
    ("tokenizer", tokenizer),
    ("model", model),
    ("convert", convert),
    ("predict", predict),
    ("scaling", scaling),
    ("experiment", experiment),
    ("probe", probe),
]
"""(name, module) of every subcommand, in the order `lmforge --help` lists them."""


def build_parser() -> Parser:
    p = Parser(prog="lmforge", description="Pretrain, adapt and evaluate transformer LMs.")
    p.add_argument("--debug", action="store_true", help="show full tracebacks (accepted anywhere)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or status lines (accepted anywhere)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, module in COMMANDS:
        module.add_parser(sub, name)
    return p


def main(argv: list[str] | None = None) -> int:
    """The `lmforge` command → its exit code. --debug and --quiet are accepted anywhere on the line."""
    from lmforge.progress import is_quiet, set_quiet
    from lmforge.train.signals import stop_with_starter

    stop_with_starter()  # an experiment's arm stops when its runner dies
    argv = list(sys.argv[1:] if argv is None else argv)
    was_quiet = is_quiet()
    set_quiet(was_quiet or "--quiet" in argv)
    try:
        return _run(argv)
    finally:
        set_quiet(was_quiet)


def _parse_and_run(argv: list[str], debug: bool) -> int:
    """Parse the command line and run its command (`lmforge eval [RUN] --harness ARGS`: lm_eval's command line).
    A command's extra arguments are its overrides when its module takes them, else an error."""
    if argv[:1] == ["eval"] and "--harness" in argv:
        return eval_command.harness(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.debug = debug
    take = getattr(dict(COMMANDS)[args.command], "overrides", None)
    overrides = take(args, argv, extra) if take is not None else None
    if overrides is not None:
        args.overrides = overrides
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "print_config", False):
        config.show(args)
    else:
        args.fn(args)
    return 0


def _run(argv: list[str]) -> int:
    debug = "--debug" in argv
    argv = [a for a in argv if a not in ("--debug", "--quiet")]
    try:
        return _parse_and_run(argv, debug)
    except LMForgeError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`lmforge model info all | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # an internal bug: still one line unless --debug
        if debug:
            raise
        print(
            f"error: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def entry() -> None:
    """The console script: `main()`, then the library exit handlers, then the process ends without tearing the
    interpreter down object by object (after a GPU run that teardown — the CUDA caching allocator, pinned buffers,
    compiled graphs — takes seconds; the operating system frees it all at once)."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before a command ran (its imports, the parser): as during one
        print("error: interrupted", file=sys.stderr)
        code = 130
    shutdown = getattr(threading, "_shutdown", None)  # what interpreter shutdown runs first (CPython)
    if shutdown is None:
        sys.exit(code)
    # The threading exit hooks, then every non-daemon thread joined: a ThreadPoolExecutor's workers (torch.compile
    # keeps one) wait for their hook, so joining them before it would never return. Then the atexit handlers.
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)
