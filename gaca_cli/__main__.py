"""`python -m gaca_cli` and the `gaca` executable (also under torchrun / accelerate launch)."""

import sys


def main() -> None:
    """Load the command line and run it. A Ctrl-C while it loads (typer, rich: the first
    ~0.1 s) exits 130 without a traceback, as one during a command does."""
    try:
        from gaca_cli.cli import main as run
    except KeyboardInterrupt:
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
