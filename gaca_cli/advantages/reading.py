"""Reading a log for `gaca advantages`: only the columns the method uses, the anchor column
grouped without holding its text where the files allow it."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

import pyarrow as pa

from gaca_cli.advantages.config import AdvantagesConfig
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import ScannedAnchors
from gaca_cli.log.io import Log, expand_inputs, read_log


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
    dictionary-encoded (cheap to rank). The anchor text of plain Parquet files is never held
    in memory: gaca_cli.log._anchor_scan hashes it page by page, and compares the candidates for
    equal anchors the same way later (`ScannedAnchors`). Layouts the scan does not know, and
    directories, have the anchor read by polars (hashed and compared there)."""
    threading.Thread(target=_warm_up_kernels, name="gaca-kernels", daemon=True).start()
    scanning = not any(is_dir for _, is_dir in expand_inputs(paths))
    deferred: list[str] = []  # the anchor column, left to the scan

    def choose(names: list[str]) -> list[str]:
        wanted = columns_read(config, names)
        if scanning:
            deferred[:] = [n for n in wanted if n in (C.ANCHOR_KEY, C.ANCHOR_OBS)]
        return [n for n in wanted if n not in deferred]

    log = read_log(paths, column_map, columns=choose, dictionary=(C.GROUP_ID, C.TRAJ_ID),
                   via_polars=(C.ANCHOR_OBS, C.ANCHOR_KEY))
    if deferred:
        scanned = _scan_anchors(log, deferred[0])
        if scanned is None:
            return log.with_columns(deferred, via_polars=deferred)
        log.cache[("anchors", deferred[0])] = ScannedAnchors(scanned)
    return log


def _scan_anchors(log: Log, name: str):
    """The anchor column's hashes, streamed from the files' pages (gaca_cli.log._anchor_scan), or
    None when it is not text or the scan does not know the files' layout."""
    t = log.file_schema.field(name).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    from gaca_cli.log._anchor_scan import scan_anchors

    return scan_anchors(log.files, log.original_name(name))


def _warm_up_kernels() -> None:
    """Import and load the compiled kernels while the main thread reads (pyarrow and polars
    release the GIL). Errors are left to the real calls, which report them properly."""
    try:
        from gaca_cli.log import _anchor_scan as anchor_scan
        from gaca_cli.advantages import _kernels as kernels

        kernels.warm_up()
        anchor_scan.warm_up()
    except Exception:  # noqa: BLE001 - the computation itself will raise it with context
        pass

