"""`python -m lmforge.cli`: the `lmforge` command."""

from lmforge.cli import entry

if __name__ == "__main__":
    entry()
