"""Anchor states: the anchor column of a log, its hashes and exact comparisons, and the
anchor warnings (empty anchors, episode groups whose step-0 anchors differ).

Hashes only find candidates for equal anchors; every match is confirmed exactly, so a hash
collision can never merge two different anchors.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from gaca_cli.log import columns as C
from gaca_cli.log.grouping import Trajectories, plain
from gaca_cli.log.io import Log

if TYPE_CHECKING:
    import polars as pl

    from gaca_cli.log.checks import StepIndex


def anchor_series(column: pa.ChunkedArray) -> pl.Series:
    """An anchor column as one polars Series in file order (string views: gathers move
    16-byte views, not the text)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    # one chunk: polars gathers from a many-chunk series ~30x slower
    import polars as pl  # imported on use: a scanned anchor column never needs it

    return pl.from_arrow(column).rechunk()


class Anchors:
    """An anchor column, addressed by file row. `PolarsAnchors` holds it as a polars Series;
    `ScannedAnchors` (gaca_cli.log._anchor_scan) streams it from the files' pages without keeping
    it. Hashes only find candidates; `equal_rows` decides, exactly."""

    def file_hashes(self) -> np.ndarray:
        """uint64 [N] hash of each row's anchor (equal anchors, equal hashes)."""
        raise NotImplementedError

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        """bool [len(rows_a)]: anchor of row rows_a[i] == anchor of row rows_b[i], exactly."""
        raise NotImplementedError

    def values(self, rows: np.ndarray) -> pa.Array:
        """The anchors of the given rows, as one plain array."""
        raise NotImplementedError

    def empty_count(self) -> int | None:
        """Rows whose anchor is the empty string (None for integer anchors)."""
        raise NotImplementedError


@dataclass(frozen=True)
class PolarsAnchors(Anchors):
    """An anchor column held as one polars Series in file order (see `anchor_series`)."""

    series: pl.Series

    def file_hashes(self) -> np.ndarray:
        return self.series.hash(seed=0).to_numpy().astype(np.uint64, copy=False)

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        return (self.series.gather(rows_a) == self.series.gather(rows_b)).to_numpy()

    def values(self, rows: np.ndarray) -> pa.Array:
        return plain(self.series.gather(rows).to_arrow())

    def empty_count(self) -> int | None:
        import polars as pl

        if self.series.dtype != pl.String:
            return None
        return int((self.series.str.len_bytes() == 0).sum())


@dataclass(frozen=True)
class ScannedAnchors(Anchors):
    """An anchor column that stays on disk: hashes from one streaming pass over the files'
    pages, and exact comparisons and values from further passes (gaca_cli.log._anchor_scan)."""

    scan: object  # gaca_cli.log._anchor_scan.AnchorScan (imported only where it is used)

    def file_hashes(self) -> np.ndarray:
        return self.scan.hashes

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        return self.scan.equal(rows_a, rows_b)

    def values(self, rows: np.ndarray) -> pa.Array:
        return self.scan.values(rows)

    def empty_count(self) -> int | None:
        return int(self.scan.empty)


def initial_anchors_differ(trajs: Trajectories, n_groups: int, anchors: Anchors, codes: np.ndarray | None = None) -> int:
    """Episode groups whose trajectories do not all start from the same anchor. From the step
    groups' `codes` (per row) when they are known (exact), else from hashes with every
    equality confirmed by `anchors.equal_rows`."""
    first_rows = trajs.rows(trajs.traj_start)
    first = codes[first_rows] if codes is not None else anchors.file_hashes()[first_rows]
    # the first trajectory of each group in canonical order (groups are contiguous there)
    # stands for the group
    group_by_canon = trajs.traj_group[trajs.canonical_traj_order]
    heads = np.flatnonzero(np.r_[True, group_by_canon[1:] != group_by_canon[:-1]])
    lead = np.zeros(n_groups, dtype=np.int64)
    lead[group_by_canon[heads]] = trajs.canonical_traj_order[heads]
    rep = lead[trajs.traj_group]
    differs = first != first[rep]
    if codes is None:  # equal hashes: confirm the text
        check = np.flatnonzero(~differs & (rep != np.arange(len(rep))))
        if len(check):
            same = anchors.equal_rows(first_rows[check], first_rows[rep[check]])
            differs[check[~same]] = True
    return int(len(np.unique(trajs.traj_group[differs])))



def anchor_column(names: Collection[str]) -> str | None:
    """`anchor_key` wins over `anchor_obs` (log-schema.md); `names`: the log's columns."""
    for name in (C.ANCHOR_KEY, C.ANCHOR_OBS):
        if name in names:
            return name
    return None


def anchors_of(log: Log, name: str) -> Anchors:
    """The anchor column, built once per log: the anchors a reader left in the log's cache
    (gaca_cli.advantages.run streams them from the files), else the column of the table as a
    polars Series."""
    return log.cached(("anchors", name), lambda: PolarsAnchors(anchor_series(log.table.column(name))))


def anchor_warnings(log: Log, index: StepIndex, step_codes: np.ndarray | None = None) -> dict[str, int]:
    """The anchor warnings' counts (empty anchors, groups whose step-0 anchors differ); from
    the step groups' codes when the caller has them."""
    name = anchor_column(log.file_schema.names)
    if name is None:
        return {}
    anchors = anchors_of(log, name)
    warnings = {}
    empty = anchors.empty_count()
    if empty is not None:
        warnings["empty_anchors"] = empty
    warnings["differing_initial_anchors"] = initial_anchors_differ(
        index.trajectories, index.n_groups, anchors, step_codes
    )
    return warnings

