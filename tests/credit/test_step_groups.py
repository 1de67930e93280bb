"""Step groups and the step-0 anchor warning never depend on the anchors' hashes.

Hashes only find candidate equal anchors; every candidate is compared exactly, and codes
that mix anchors are split. These tests force collisions (anchors whose hashes are folded
into a few buckets) and check that the codes, the written step_group_id and every output and
warning stay exactly what the honest hashes give, and what the reference loop gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gaca_cli.credit._compiled import ENV
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages
from gaca_cli.credit.step_groups import first_appearance_codes, step_group_codes
from gaca_cli.log.anchors import PolarsAnchors, anchors_of, initial_anchors_differ
from gaca_cli.log.checks import CheckOptions, prepare_log
from gaca_cli.log.reading import Log
from tests.credit.reference import random_rows, reference_advantages, rows_to_table, same_partition


@dataclass(frozen=True)
class CollidingAnchors(PolarsAnchors):
    """The same anchors, their hashes folded into `buckets` values (many collisions)."""

    buckets: int = 1

    def file_hashes(self) -> np.ndarray:
        return super().file_hashes() % np.uint64(self.buckets)


def memory_log(rows: list[dict]) -> Log:
    table = rows_to_table(rows)
    return Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))


def anchor_name(log: Log) -> str:
    return "anchor_key" if "anchor_key" in log.table.column_names else "anchor_obs"


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("buckets", [1, 2, 7])
@pytest.mark.parametrize("kernels", ["0", "1"])
def test_codes_do_not_depend_on_the_hash(seed, buckets, kernels, monkeypatch):
    """Through the numpy definition (step_groups.hash_codes) and its compiled twin."""
    monkeypatch.setenv(ENV, kernels)
    rows = random_rows(seed, max_groups=5, max_trajs=5, max_steps=6)
    log = memory_log(rows)
    index, _ = prepare_log(log, "advantages:gigpo", CheckOptions.ANCHOR_WARNINGS)
    honest = anchors_of(log, anchor_name(log))
    colliding = CollidingAnchors(honest.series, buckets)
    codes = step_group_codes(index, honest)
    np.testing.assert_array_equal(step_group_codes(index, colliding), codes, strict=True)
    # dense and numbered by first appearance in canonical order
    np.testing.assert_array_equal(first_appearance_codes(codes, index.canonical_row_position), codes)
    # the partition of the reference: same episode group and same anchor text
    name = anchor_name(log)
    keys = [(row["group_id"], row[name]) for row in rows]
    assert same_partition(codes.tolist(), keys)
    differ = initial_anchors_differ(index, index.n_groups, honest)
    assert initial_anchors_differ(index, index.n_groups, colliding) == differ
    assert initial_anchors_differ(index, index.n_groups, colliding, codes) == differ
    expected = {
        g
        for g in {row["group_id"] for row in rows}
        if len({row[name] for row in rows if row["group_id"] == g and row["step_idx"] == 0}) > 1
    }
    assert differ == len(expected)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
@pytest.mark.parametrize("similarity", [None, 0.6])
@pytest.mark.parametrize("kernels", ["0", "1"])
def test_outputs_and_warnings_do_not_depend_on_the_hash(seed, method, similarity, kernels, monkeypatch):
    monkeypatch.setenv(ENV, kernels)
    rows = random_rows(seed, max_groups=5, max_trajs=5, max_steps=6)
    config = AdvantagesConfig(method=method, anchor_similarity=similarity)
    honest = compute_advantages(memory_log(rows), config)
    log = memory_log(rows)
    name = anchor_name(log)
    log.cache[("anchors", name)] = CollidingAnchors(anchors_of(memory_log(rows), name).series, 1)
    colliding = compute_advantages(log, config)
    assert colliding.new_columns.equals(honest.new_columns)
    assert colliding.summary == honest.summary
    if method != "grpo":
        ref = reference_advantages(rows, method=method, anchor_similarity=similarity)
        assert same_partition(colliding.new_columns.column("step_group_id").to_pylist(), ref["step_group_id"])


def loop_first_appearance(codes: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Walk the rows by ascending position; a code gets the next number when first seen."""
    row_at = {int(p): i for i, p in enumerate(position.tolist())}
    new: dict[int, int] = {}
    for pos in range(len(codes)):
        c = int(codes[row_at[pos]])
        if c not in new:
            new[c] = len(new)
    return np.array([new[int(c)] for c in codes.tolist()], dtype=np.int64)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,n_codes", [(0, 3), (1, 1), (1, 5), (20, 3), (20, 40), (300, 50)])
def test_first_appearance_codes(seed, n, n_codes):
    """Renumbered by first position, unused codes skipped: as the plain loop does."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, n_codes, size=n).astype(np.int64)
    position = rng.permutation(n).astype(np.int64) if seed % 3 else np.arange(n, dtype=np.int64)
    got = first_appearance_codes(codes, position)
    np.testing.assert_array_equal(got, loop_first_appearance(codes, position), strict=True)
    assert sorted(set(got.tolist())) == list(range(len(set(codes.tolist()))))
    if seed % 3 == 0:
        np.testing.assert_array_equal(first_appearance_codes(codes), got, strict=True)
