"""The row index (gaca_cli.log.index.TrajectoryIndex) that `prepare_log` builds: its layout
against a plain sort of the rows by (group_id, traj_id, step_idx), in canonical and in file
order, on shuffled random logs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gaca_cli.log.checks import CheckOptions, prepare_log
from gaca_cli.log.reading import Log
from tests.credit.reference import random_rows, rows_to_table


def index_of(seed: int, canonical: bool, shuffle: bool = True):
    rows = random_rows(seed, max_groups=6, max_trajs=5, max_steps=7, shuffle=shuffle)
    table = rows_to_table(rows)
    log = Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))
    index, _ = prepare_log(log, "validate", CheckOptions.DEFAULT if canonical else CheckOptions.ANCHOR_WARNINGS)
    return rows, table, index


def canonical_rows(rows: list[dict]) -> list[int]:
    """The file rows sorted by (group_id, traj_id, step_idx), ids compared as the log holds them."""
    return sorted(range(len(rows)), key=lambda i: (rows[i]["group_id"], rows[i]["traj_id"], rows[i]["step_idx"]))


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("canonical", [True, False])
def test_positions_hold_each_trajectory_in_step_order(seed, canonical):
    rows, _, index = index_of(seed, canonical)
    n = len(rows)
    assert index.n_rows == n and sorted(index.order.tolist()) == list(range(n))
    traj_ids = [rows[r]["traj_id"] for r in index.order.tolist()]
    for t in range(index.n_traj):
        a, k = int(index.traj_start[t]), int(index.traj_len[t])
        assert k >= 1 and len({traj_ids[p] for p in range(a, a + k)}) == 1
        assert [rows[int(index.order[p])]["step_idx"] for p in range(a, a + k)] == list(range(k))
        assert index.row_traj[index.order[a]] == t
    np.testing.assert_array_equal(index.traj, index.row_traj[index.order])
    np.testing.assert_array_equal(index.step, [rows[r]["step_idx"] for r in index.order.tolist()])
    groups = [rows[r]["group_id"] for r in index.order[index.traj_start].tolist()]
    assert len(set(zip(groups, index.traj_group.tolist()))) == len(set(groups)) == index.n_groups
    if canonical:  # trajectories by sorted (group_id, traj_id): the positions are the sorted rows
        assert index.order.tolist() == canonical_rows(rows)
        assert np.all(np.diff(index.traj_group) >= 0)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("canonical", [True, False])
def test_canonical_numbering_does_not_depend_on_the_layout(seed, canonical):
    rows, _, index = index_of(seed, canonical)
    expected = np.empty(len(rows), dtype=np.int64)
    expected[canonical_rows(rows)] = np.arange(len(rows))
    np.testing.assert_array_equal(index.canonical_row_position, expected, strict=True)
    first_rows = index.order[index.traj_start[index.canonical_traj_order]]
    assert [rows[r]["traj_id"] for r in first_rows.tolist()] == [
        rows[i]["traj_id"] for i in canonical_rows(rows) if rows[i]["step_idx"] == 0
    ]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("canonical", [True, False])
def test_gathers_between_rows_and_positions(seed, canonical):
    rows, table, index = index_of(seed, canonical)
    values = np.random.default_rng(seed).normal(size=len(rows))
    steps = index.in_step_order(values)
    np.testing.assert_array_equal(steps, values[index.order])
    np.testing.assert_array_equal(index.in_file_order(steps), values)
    positions = np.arange(len(rows))[::3]
    np.testing.assert_array_equal(index.rows(positions), index.order[positions])
    assert index.sorted_column(table, "traj_id").to_pylist() == [rows[r]["traj_id"] for r in index.order.tolist()]
    assert index.rows_or_empty.tolist() == ([] if index.is_identity else index.order.tolist())


def test_a_file_in_canonical_order_is_the_identity():
    rows, _, index = index_of(3, canonical=True, shuffle=False)
    rows = [rows[i] for i in canonical_rows(rows)]
    table = rows_to_table(rows)
    log = Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))
    for canonical in (True, False):
        index, _ = prepare_log(log, "validate", CheckOptions.DEFAULT if canonical else CheckOptions.ANCHOR_WARNINGS)
        assert index.is_identity and len(index.rows_or_empty) == 0
        x = np.arange(len(rows), dtype=np.float64)
        assert index.in_step_order(x) is x and index.in_file_order(x) is x


@pytest.mark.parametrize("seed", range(20))
def test_group_walk(seed):
    """Trajectories grouped by episode group, the groups in the order of their first trajectory,
    each group's trajectories in canonical order; and each group's rank in canonical order."""
    _, _, index = index_of(seed, canonical=False)
    walk, group_rank = index.group_walk
    assert sorted(walk.tolist()) == list(range(index.n_traj))
    groups = index.traj_group[walk]
    heads = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    assert len(heads) == index.n_groups  # each group once, contiguous
    first_traj = [int(np.flatnonzero(index.traj_group == g).min()) for g in groups[heads].tolist()]
    assert first_traj == sorted(first_traj)
    canon_rank = np.argsort(index.canonical_traj_order)
    for a, b in zip(heads.tolist(), [*heads[1:].tolist(), index.n_traj]):
        assert np.all(np.diff(canon_rank[walk[a:b]]) > 0)
    by_canon = index.traj_group[index.canonical_traj_order]
    canon_heads = by_canon[np.flatnonzero(np.r_[True, by_canon[1:] != by_canon[:-1]])]
    np.testing.assert_array_equal(group_rank[canon_heads], np.arange(index.n_groups))


def test_a_one_row_log():
    index = prepare_log(
        Log(
            table=pa.table({"group_id": ["g"], "traj_id": ["t"], "step_idx": [0], "reward": [1.0]}),
            files=("<memory>",),
            file_row_ends=np.array([1], dtype=np.int64),
        ),
        "validate",
    )[0]
    assert index.n_rows == 1 and index.n_traj == 1 and index.is_identity
    assert index.group_walk[0].tolist() == [0] and index.group_walk[1].tolist() == [0]
