"""The row index: the rows of each trajectory in step order.

Every command computes on it. `gaca_cli.log.checks` builds it while checking a log (in
O(N), without sorting: a row's place is its trajectory's start plus its step), and the
estimators, the step groups, the run summary and `gaca inspect` walk it. numpy only, so that
the maths can use it without importing pyarrow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TrajectoryIndex:  # noqa: PLR0902
    """The rows of a log grouped by trajectory, steps ascending within each trajectory.

    A *position* is a place in that layout; a *row* is a row of the file. In canonical order
    (`prepare_log`'s default) the trajectories follow sorted (group_id, traj_id); in file order
    (`prepare_log` without `CheckOptions.CANONICAL_ORDER`) they follow their first appearance in the file, which
    keeps walks through `order` local in memory. Numbering that must not depend on the order
    of rows uses `canonical_start` either way.

    order:           int64 [N]  the file row at each position
    traj_start:      int64 [T]  position of each trajectory's first step
    traj_len:        int64 [T]  its number of steps (≥ 1)
    traj_group:      int64 [T]  episode-group code of each trajectory, 0..G-1 (in canonical
                                order by sorted group_id, so non-decreasing)
    n_groups:        G
    canonical_start: int64 [T]  where each trajectory's first step lies in canonical order
    row_traj:        int64 [N]  trajectory code of each file row
    """

    order: np.ndarray
    traj_start: np.ndarray
    traj_len: np.ndarray
    traj_group: np.ndarray
    n_groups: int
    canonical_start: np.ndarray
    row_traj: np.ndarray

    @property
    def n_rows(self) -> int:
        return len(self.order)

    @property
    def n_traj(self) -> int:
        return len(self.traj_start)

    @functools.cached_property
    def traj(self) -> np.ndarray:
        """int64 [N] trajectory code of each position (0..T-1, non-decreasing)."""
        return np.repeat(np.arange(self.n_traj, dtype=np.int64), self.traj_len)

    @property
    def step(self) -> np.ndarray:
        """int64 [N] step of each position (0..T-1 within its trajectory)."""
        return np.arange(self.n_rows, dtype=np.int64) - self.traj_start[self.traj]

    @property
    def group(self) -> np.ndarray:
        """int64 [N] episode-group code of each position."""
        return self.traj_group[self.traj]

    @functools.cached_property
    def is_identity(self) -> bool:
        """Position i is file row i (the file is already in this order): no gathers."""
        return bool(np.array_equal(self.order, np.arange(self.n_rows, dtype=np.int64)))

    @property
    def rows_or_empty(self) -> np.ndarray:
        """`order`, or an empty array when it is the identity (as the compiled kernels take it)."""
        return np.zeros(0, dtype=np.int64) if self.is_identity else self.order

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The file rows at the given positions."""
        return positions if self.is_identity else self.order[positions]

    def in_step_order(self, per_row: np.ndarray) -> np.ndarray:
        """Per-row values (file order) laid out by position: [N] -> [N]."""
        return per_row if self.is_identity else per_row[self.order]

    def in_file_order(self, per_position: np.ndarray) -> np.ndarray:
        """Per-position values put back on their file rows: [N] -> [N]."""
        if self.is_identity:
            return per_position
        out = np.empty_like(per_position)
        out[self.order] = per_position
        return out

    @functools.cached_property
    def canonical_traj_order(self) -> np.ndarray:
        """int64 [T] the trajectories in canonical (group_id, traj_id) order."""
        return np.argsort(self.canonical_start)

    @functools.cached_property
    def canonical_row_position(self) -> np.ndarray:
        """int64 [N] each file row's place in canonical (group_id, traj_id, step_idx) order."""
        shift = np.repeat(self.canonical_start - self.traj_start, self.traj_len)
        return self.in_file_order(shift + np.arange(self.n_rows, dtype=np.int64))

    @functools.cached_property
    def group_walk(self) -> tuple[np.ndarray, np.ndarray]:
        """The order in which the compiled kernels visit trajectories: grouped by episode group,
        the groups in the order of their first trajectory (the file's order, so rows visited
        one after the other lie close together), each group's trajectories in canonical order;
        and each group's place in canonical order. Returns (walk int64 [T], group_rank int64 [G])."""
        canon_rank = np.empty(self.n_traj, dtype=np.int64)
        canon_rank[self.canonical_traj_order] = np.arange(self.n_traj, dtype=np.int64)
        _, first = np.unique(self.traj_group, return_index=True)
        walk = np.lexsort((canon_rank, first[self.traj_group])).astype(np.int64, copy=False)
        group_by_canon = self.traj_group[self.canonical_traj_order]
        heads = np.flatnonzero(np.r_[True, group_by_canon[1:] != group_by_canon[:-1]])
        group_rank = np.empty(len(first), dtype=np.int64)
        group_rank[group_by_canon[heads]] = np.arange(len(heads), dtype=np.int64)
        return walk, group_rank

    def sorted_column(self, table: pa.Table, name: str) -> pa.Array:
        """A column of the table laid out by position."""
        import pyarrow as pa  # imported on use: the maths reads the index without pyarrow

        from gaca_cli.log.grouping import contiguous_decoded

        column = contiguous_decoded(table.column(name))
        return column if self.is_identity else column.take(pa.array(self.order))
