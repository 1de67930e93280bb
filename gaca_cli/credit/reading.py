"""Reading a log for `gaca advantages`: only the columns the method uses, and a large anchor
column left on disk (its hashes kept, its text read again only where candidates are compared)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping, Sequence

import pyarrow.parquet as pq

from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import StreamedAnchors
from gaca_cli.log.reading import READ_ERRORS, Log, expand_inputs, read_log

#: An anchor column estimated to take more memory than this (as polars holds it) is left on
#: disk; a smaller one is read and held. Holding is faster (one read instead of two) but costs
#: the column's size: on the benchmark's logs (~200 bytes per anchor) 1M rows (~200 MB) are
#: held, 3M (~600 MB) would take the peak from 1.2x to 1.8x the log's in-memory size.
HOLD_ANCHOR_BYTES = 256 * 2**20


def columns_read(config: AdvantagesConfig, names: Sequence[str]) -> list[str]:
    """The input columns `gaca advantages` reads: the required ones, every column with a value
    rule of log-schema.md (done, episode_reward, behavior_logprobs and action_token_ids, the
    NLL columns) and the anchor (used by gigpo and gaca; the anchor warnings for every method).
    Text it does not use (prompts, actions, observations) stays on disk: its type is checked
    from the files' footers and its nulls from their null counts (see checks._column_checks),
    and it is carried to the output as it is."""
    wanted = [C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.REWARD, C.DONE, C.EPISODE_REWARD]
    wanted += [C.BEHAVIOR_LOGPROBS, C.ACTION_TOKEN_IDS, C.NLL_MEAN, C.NLL_SUM]
    wanted.append(C.ANCHOR_KEY if C.ANCHOR_KEY in names else C.ANCHOR_OBS)  # grpo too: its warnings
    return [n for n in wanted if n in names]


def read_for_advantages(
    paths: Sequence[str | os.PathLike], column_map: Mapping[str, str], config: AdvantagesConfig
) -> Log:
    """The columns of the log that `config`'s method reads (`columns_read`), ids read
    dictionary-encoded (cheap to rank). An anchor column of plain Parquet files that would
    take more than `HOLD_ANCHOR_BYTES` in memory stays on disk (`StreamedAnchors`: its hashes,
    from one pass in batches, and the text of candidate pairs read again to compare them);
    a smaller one, one of directories, or one that is not text, is read and held (polars
    hashes it). The libraries the compute phase starts with are imported meanwhile (`_warm_up`)."""
    inputs = expand_inputs(paths)
    plain_files = not any(is_dir for _, is_dir in inputs)
    # the footers tell whether the compiled loops will run and whether polars will hash anchors
    # (directories: assume a large log with anchors); importing them overlaps the read
    anchor_names = [column_map.get(n, n) for n in (C.ANCHOR_KEY, C.ANCHOR_OBS)]
    n_rows, has_anchors = _footer_facts([p for p, _ in inputs], anchor_names) if plain_files else (sys.maxsize, True)
    kernels_too = _numba_import_leaves_streams_alone()
    threading.Thread(target=_warm_up, args=(n_rows, has_anchors, kernels_too), name="gaca-kernels", daemon=True).start()
    deferred: list[str] = []  # the anchor column, read after the others if it is held

    def choose(names: list[str]) -> list[str]:
        wanted = columns_read(config, names)
        if plain_files:
            deferred[:] = [n for n in wanted if n in (C.ANCHOR_KEY, C.ANCHOR_OBS)]
        return [n for n in wanted if n not in deferred]

    log = read_log(
        paths, column_map, columns=choose, dictionary=(C.GROUP_ID, C.TRAJ_ID), via_polars=(C.ANCHOR_OBS, C.ANCHOR_KEY)
    )
    if deferred:
        anchors = StreamedAnchors.from_files(log.files, log.original_name(deferred[0]))
        if anchors is None or anchors.nbytes <= HOLD_ANCHOR_BYTES:
            return log.with_columns(deferred, via_polars=deferred)
        if anchors.n_rows != log.table.num_rows:
            raise GacaError("the input changed while it was being read; run again", file=log.source)
        log.cache[("anchors", deferred[0])] = anchors
    return log


def _footer_facts(files: list[str], anchor_names: Sequence[str]) -> tuple[int, bool]:
    """From the files' footers: their row count, and whether one has a column named in
    `anchor_names` (the names in the files); a large log with anchors when a footer cannot be
    read (the read that follows reports that file properly)."""
    try:
        metas = [pq.read_metadata(f) for f in files]
    except (*READ_ERRORS, ValueError):
        return sys.maxsize, True
    anchors = any(set(anchor_names).intersection(m.schema.to_arrow_schema().names) for m in metas)
    return sum(m.num_rows for m in metas), anchors


def _numba_import_leaves_streams_alone() -> bool:
    """Whether numba can be imported and loaded on the warm-up thread. Loading formats an error
    message (numba.cpython.listobj) and, where numba found colorama at its import (in any
    process that imported ray), wraps that in colorama's init and deinit, which assign
    sys.stdout and sys.stderr: on a second thread that undoes what the main thread assigned
    meanwhile (a notebook's or a test runner's capture, which then finds its stream closed).
    numba's default colour scheme, "no_color", makes that highlighting a no-op, so it is turned
    off before numba's import (NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING, read then). numba
    imported already with colorama at hand, or a colour scheme the user chose: numba stays on
    the main thread, loaded when the run needs it."""
    if "numba" in sys.modules:
        return "colorama" not in sys.modules
    if os.environ.get("NUMBA_COLOR_SCHEME"):
        return False
    os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
    return True


def _warm_up(n_rows: int, anchors: bool, kernels: bool) -> None:
    """While the main thread reads (pyarrow releases the GIL), run the imports the compute
    phase would otherwise make, in the order it needs them:

    - pyarrow's first conversion between Arrow and numpy (`to_numpy`, `pa.array`; the log
      checks make the first) imports pandas where it is installed, ~0.2 s, although no
      pandas object is ever made: one tiny conversion runs it here;
    - the compiled kernels a log of `n_rows` rows will use (numba's start-up); nothing for a
      log the numpy code computes, nor without `kernels` (`_numba_import_leaves_streams_alone`);
    - polars, which hashes the anchors (`anchors`: the log has an anchor column), ~0.1 s.

    Errors are left to the real calls, which report them properly."""
    try:
        import numpy as np
        import pyarrow as pa

        pa.array(np.zeros(1)).to_numpy()

        from gaca_cli.credit.run import warm_up_kernels

        if kernels:
            warm_up_kernels(n_rows)
        if anchors:
            import polars  # noqa: F401
    except Exception:  # noqa: BLE001 - the computation itself will raise it with context
        pass
