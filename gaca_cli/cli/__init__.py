"""The `gaca` command line: a thin shell around the library.

This package is the only place that knows argv, exit codes and `--json`. Each `cmd_*.py`
module registers one command on `app`, its options made from the command's config dataclass
(`options.py`); heavy libraries (numpy, pyarrow, polars, torch, transformers, rich) are imported
inside the command bodies, so `gaca --help` stays fast.
"""

from __future__ import annotations

from gaca_cli.cli.app import app

# Importing a command module registers its command. Order = order in `gaca --help`.
# isort: off
from gaca_cli.cli import cmd_import as _cmd_import  # noqa: F401
from gaca_cli.cli import cmd_validate as _cmd_validate  # noqa: F401
from gaca_cli.cli import cmd_advantages as _cmd_advantages  # noqa: F401
from gaca_cli.cli import cmd_score as _cmd_score  # noqa: F401
from gaca_cli.cli import cmd_train as _cmd_train  # noqa: F401
from gaca_cli.cli import cmd_inspect as _cmd_inspect  # noqa: F401
from gaca_cli.cli import cmd_demo as _cmd_demo  # noqa: F401
# isort: on

__all__ = ["app", "main"]

#: the exit status of an unexpected exception (a bug in gaca, not bad data): 0 success,
#: 1 a data or model error (one `Error:` line), 2 a usage error, 3 a bug (with its traceback)
BUG_EXIT_STATUS = 3


def _warning_line(message, category, filename, lineno, line=None) -> str:
    return f"Warning: {message}\n"


def main() -> None:
    """The `gaca` executable: warnings as one `Warning:` line each on stderr, and an unexpected
    exception keeps its traceback but exits with its own status, so a script can tell a bug
    from bad data (exit 1)."""
    import sys
    import warnings

    from gaca_cli.interrupts import NOTHING_WRITTEN, ignore_ctrl_c, is_interruption, remember_ctrl_c, unreported_ctrl_c

    warnings.formatwarning = _warning_line
    remember_ctrl_c()
    interrupted = f"interrupted; {NOTHING_WRITTEN}"  # a Ctrl-C before a command can say more
    try:
        app()
    except SystemExit as exc:
        # a Ctrl-C outside a command's own handling (while typer parses, or the command's
        # imports before `user_errors`): typer exits 130 without a word
        if exc.code == 130 and unreported_ctrl_c():
            print(interrupted, file=sys.stderr)
        raise
    except (KeyboardInterrupt, Exception) as exc:  # typer turns usage errors and Error lines into SystemExit
        if is_interruption(exc):  # before typer's own handling (while it builds the command line)
            print(interrupted, file=sys.stderr)
            sys.exit(130)
        import traceback

        traceback.print_exc()
        print(
            f"gaca: an unexpected error (a bug, exit status {BUG_EXIT_STATUS}); please report it with the traceback above",
            file=sys.stderr,
        )
        sys.exit(BUG_EXIT_STATUS)
    finally:
        ignore_ctrl_c()
