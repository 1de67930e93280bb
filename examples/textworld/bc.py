"""Behaviour-cloning warm start: a tiny causal LM fitted to TextWorld walkthroughs.

    python examples/textworld/bc.py -o /tmp/tw-bc --games 8 --steps 150

The code lives in `gaca_cli/demo/textworld_bc.py` (`gaca demo` uses it too); see its
docstring for what the warm start does.
"""

from gaca_cli.demo.textworld_bc import main

if __name__ == "__main__":
    raise SystemExit(main())
