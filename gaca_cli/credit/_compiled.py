"""Which code computes a run: the numpy definitions, or their compiled twins for large logs.

estimators.py, step_groups.py, summary.py and gaca_cli.log.checks define every number in
numpy. _kernels.py and gaca_cli.log._kernels redo the passes over every row as compiled
loops (numba, no fastmath) that do the same float operations in the same order, so both
paths give the same bits (tests/credit/test_kernels.py compares them function by
function, tests/credit/test_paths.py whole runs). `chosen` picks one path for a whole run.

The loops cost numba's start-up, about half a second to import it and load the cached
machine code (overlapped with reading the log, on a second core), which a small log never
earns back: `python bench/advantages.py --paths` times both paths side by side, and the
compiled path pays from about `COMPILED_FROM_ROWS` rows. Compiling them takes far longer
(~15 CPU seconds), so a run never waits for it: while the cache is cold the run computes
with numpy and a background process compiles the loops for the runs that follow
(`python bench/advantages.py --first-run` times that first run).

The environment variable GACA_KERNELS forces one path for tests and benchmarks: 0 the numpy
code, 1 the compiled loops (compiled in the run if need be); unset, the number of rows and
the cache decide.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType

COMPILED_FROM_ROWS = 1_000_000  # CPU seconds tie at 1M rows, compiled 1.3x ahead at 3M (bench --paths)

ENV = "GACA_KERNELS"

_ACTIVE: ContextVar[ModuleType | None] = ContextVar("gaca_kernels", default=None)
_LOCK = threading.Lock()
_filling: list[subprocess.Popen] = []  # the background compilations this process started


def wanted(n_rows: int) -> bool:
    """Whether a log of `n_rows` rows is worth the compiled loops."""
    forced = os.environ.get(ENV, "")
    if forced not in ("", "0", "1"):
        raise ValueError(f"{ENV}={forced!r}: use 0 (numpy), 1 (compiled) or leave it unset")
    if forced:
        return forced == "1"
    return n_rows >= COMPILED_FROM_ROWS


def usable(n_rows: int) -> ModuleType | None:
    """The compiled loops (gaca_cli.credit._kernels, importing numba) for a log of `n_rows`
    rows when it is worth them and their machine code is cached (or GACA_KERNELS=1); else
    None. A cold cache is filled by a background process for the next run."""
    if not wanted(n_rows):
        return None
    forced = os.environ.get(ENV) == "1"
    with _LOCK:
        folder = None if forced else _cold_cache()  # (then numba is not needed)
        if folder is None:
            from gaca_cli.credit import _kernels

            if forced or _kernels.cached():
                return _kernels
            folder = Path(_kernels.ENTRY_POINTS[0].stats.cache_path)
        _fill_cache(folder / "gaca-compiling")
    return None


def _cold_cache() -> Path | None:
    """numba's cache folder when it surely lacks the kernels (~0.2 s less than numba's start-up): no index (.nbi)
    for this Python, newer than a kernel source, where numba puts it (NUMBA_CACHE_DIR, else `__pycache__`)."""
    root = os.environ.get("NUMBA_CACHE_DIR")
    tag = f".py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}.nbi"
    for src in (Path(os.path.abspath(__file__)).parents[1] / p / "_kernels.py" for p in ("credit", "log")):
        sha = hashlib.sha1(str(src.parent).encode()).hexdigest()  # noqa: S324 - numba's folder name
        folder = Path(root, f"{src.parent.name}_{sha}") if root else src.parent / "__pycache__"
        if os.environ.get("NUMBA_CACHE_LOCATOR_CLASSES") or not (root or os.access(src.parent, os.W_OK)):
            return None  # another locator
        if not any(f.stat().st_mtime >= src.stat().st_mtime for f in folder.glob(f"_kernels.*{tag}")):
            return folder
    return None


def _fill_cache(marker: Path) -> None:
    """Start a process that compiles the kernels into numba's cache once this run is over (at
    the lowest priority), unless one started in the last ten minutes (this run's or another's:
    `marker`, beside the cache)."""
    with contextlib.suppress(OSError):
        if time.time() - marker.stat().st_mtime < 600:
            return
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    code = "import os, sys; sys.stdin.read(); hasattr(os, 'nice') and os.nice(19); import gaca_cli.credit._kernels as k; k.warm_up()"
    path = os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    _filling.append(
        subprocess.Popen(  # noqa: S603 - this interpreter, a fixed program
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": path},
            stdin=subprocess.PIPE,  # closed when the run is over (`chosen`), or this process ends
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives this run; a Ctrl-C in the terminal spares it
        )
    )


@contextlib.contextmanager
def chosen(n_rows: int) -> Iterator[ModuleType | None]:
    """The path of one run on `n_rows` rows, chosen once (`usable`): inside the block
    `kernels()` gives the compiled loops, or None for the numpy code."""
    token = _ACTIVE.set(usable(n_rows))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)
        for fill in _filling:  # the run is over: compile now
            fill.stdin.close()  # type: ignore[union-attr]


def kernels() -> ModuleType | None:
    """The compiled loops when the current run uses them (`chosen`), else None."""
    return _ACTIVE.get()


def warm_up(n_rows: int) -> None:
    """Load the compiled loops' machine code when a run on `n_rows` rows will use them."""
    if (compiled := usable(n_rows)) is not None:
        compiled.warm_up()
