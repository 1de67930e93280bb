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
from gaca_cli.cli import cmd_validate as _cmd_validate  # noqa: F401
from gaca_cli.cli import cmd_advantages as _cmd_advantages  # noqa: F401
from gaca_cli.cli import cmd_score as _cmd_score  # noqa: F401
from gaca_cli.cli import cmd_train as _cmd_train  # noqa: F401
from gaca_cli.cli import cmd_inspect as _cmd_inspect  # noqa: F401
from gaca_cli.cli import cmd_demo as _cmd_demo  # noqa: F401
# isort: on

__all__ = ["app", "main"]


def main() -> None:
    app()
