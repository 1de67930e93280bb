"""Which code computes a run: the numpy definitions, or their compiled twins for large logs.

estimators.py, step_groups.py, summary.py and gaca_cli.log.checks define every number in
numpy. _kernels.py and gaca_cli.log._kernels redo the passes over every row as compiled
loops (numba, no fastmath) that do the same float operations in the same order, so both
paths give the same bits (tests/credit/test_kernels.py compares them function by
function, tests/credit/test_paths.py whole runs). The loops cost numba's start-up, about
half a second to import it and load the cached machine code (overlapped with reading the
log, on a second core), which a small log never earns back. `python bench/advantages.py
--paths` times both paths side by side; on 2 cores (gaca, synthetic logs): at 300k rows the
numpy code is faster end to end (0.48 s against 0.57 s), at 500k and 700k rows the two tie
while the compiled compute phase is 1.6x, then 2x, faster, and at 1M rows the compiled run
is faster (0.8-0.9 s against 1.0 s; its compute phase 2.4-2.8x). Hence `COMPILED_FROM_ROWS`.

The environment variable GACA_KERNELS forces one path for tests and benchmarks: 0 the numpy
code, 1 the compiled loops; unset, the number of rows decides.
"""

from __future__ import annotations

import os
from types import ModuleType

COMPILED_FROM_ROWS = 750_000

ENV = "GACA_KERNELS"


def wanted(n_rows: int) -> bool:
    """Whether a log of `n_rows` rows is computed by the compiled loops."""
    forced = os.environ.get(ENV, "")
    if forced not in ("", "0", "1"):
        raise ValueError(f"{ENV}={forced!r}: use 0 (numpy), 1 (compiled) or leave it unset")
    if forced:
        return forced == "1"
    return n_rows >= COMPILED_FROM_ROWS


def kernels(n_rows: int) -> ModuleType | None:
    """The compiled loops (gaca_cli.credit._kernels, importing numba) when they compute a
    log of `n_rows` rows, else None."""
    if not wanted(n_rows):
        return None
    from gaca_cli.credit import _kernels

    return _kernels


def warm_up(n_rows: int) -> None:
    """Import numba and load the compiled loops' machine code, when a log of `n_rows` rows will
    use them (see _kernels.warm_up); nothing otherwise."""
    compiled = kernels(n_rows)
    if compiled is not None:
        compiled.warm_up()
