"""The planning half of `gaca score` (no model): packing runs, dedupe, batches, shards, chunks.

Small hand-made token sequences whose right answers can be read off by eye, plus seeded
random cases checked against the invariants (every step served exactly once, budgets held,
every trajectory on exactly one rank).
"""

from __future__ import annotations

import numpy as np
import pytest

from gaca_cli.lm.scoring import build_plan, plan_batches
from gaca_cli.lm.shards import chunk_trajectories, shard_trajectories


def arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int32)


def test_append_only_trajectory_is_one_sequence():
    """ctx0=[1,2] act0=[3]; ctx1=[1,2,3,4] act1=[5,6]; ctx2=[1,2,3,4,5,6,7] act2=[8]
    -> one sequence [1..8] with spans (2,3), (4,6), (7,8)."""
    ctx = [arr(1, 2), arr(1, 2, 3, 4), arr(1, 2, 3, 4, 5, 6, 7)]
    act = [arr(3), arr(5, 6), arr(8)]
    plan = build_plan(ctx, act, [3], pack=True)
    assert len(plan.seqs) == 1 and plan.seqs[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert plan.spans[0].tolist() == [[2, 3], [4, 6], [7, 8]]
    assert plan.step_seq.tolist() == [0, 0, 0] and plan.step_span.tolist() == [0, 1, 2]
    assert plan.packed_trajectories == 1 and plan.segments == 1


def test_rewritten_step_starts_a_new_run_and_no_pack_splits_all():
    """Step 2's context drops token 1 (a rewritten history): runs {0, 1} and {2}."""
    ctx = [arr(1, 2), arr(1, 2, 3, 4), arr(2, 3, 4, 5, 6)]
    act = [arr(3), arr(5, 6), arr(9)]
    plan = build_plan(ctx, act, [3], pack=True)
    assert [s.tolist() for s in plan.seqs] == [[1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 9]]
    assert plan.step_seq.tolist() == [0, 0, 1] and plan.packed_trajectories == 0 and plan.segments == 2
    unpacked = build_plan(ctx, act, [3], pack=False)
    assert [s.tolist() for s in unpacked.seqs] == [[1, 2, 3], [1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 9]]
    assert unpacked.spans[1].tolist() == [[4, 6]]


def test_action_merged_differently_is_not_packed():
    """ctx1 holds act0's tokens differently ([3] logged, [33] in the next prompt): not a prefix."""
    ctx = [arr(1, 2), arr(1, 2, 33, 4)]
    act = [arr(3), arr(5)]
    assert len(build_plan(ctx, act, [2], pack=True).seqs) == 2


def test_identical_sequences_are_scored_once():
    """Trajectories A and B are identical; C shares A's first step only. Empty action kept."""
    a = ([arr(1, 2), arr(1, 2, 3, 4)], [arr(3), arr(5)])
    c = ([arr(1, 2), arr(1, 2, 3, 9)], [arr(3), arr()])
    ctx = a[0] + a[0] + c[0]
    act = a[1] + a[1] + c[1]
    plan = build_plan(ctx, act, [2, 2, 2], pack=True)
    assert len(plan.seqs) == 2 and plan.segments == 3
    assert plan.step_seq.tolist() == [0, 0, 0, 0, 1, 1]
    assert plan.spans[1].tolist() == [[2, 3], [4, 4]]
    single = build_plan(ctx, act, [2, 2, 2], pack=False)
    assert len(single.seqs) == 3  # [1,2,3] once for A, B and C; [1,2,3,4,5]; [1,2,3,9]


@pytest.mark.parametrize("seed", range(5))
def test_random_plans_serve_every_step_with_its_own_tokens(seed):
    rng = np.random.default_rng(seed)
    ctx, act, lengths = [], [], []
    for _ in range(rng.integers(1, 6)):
        T = int(rng.integers(1, 6))
        lengths.append(T)
        history = list(rng.integers(0, 5, size=rng.integers(1, 4)))
        for _ in range(T):
            if rng.random() < 0.3:  # rewrite the history
                history = list(rng.integers(0, 5, size=rng.integers(1, 4)))
            a = list(rng.integers(0, 5, size=rng.integers(0, 3)))
            ctx.append(np.array(history, np.int32))
            act.append(np.array(a, np.int32))
            history = history + a + list(rng.integers(0, 5, size=rng.integers(0, 2)))
    for pack in (True, False):
        plan = build_plan(ctx, act, lengths, pack)
        for i in range(len(ctx)):
            seq, (s, e) = plan.seqs[plan.step_seq[i]], plan.spans[plan.step_seq[i]][plan.step_span[i]]
            assert seq[:s].tolist() == ctx[i].tolist() and seq[s:e].tolist() == act[i].tolist()


@pytest.mark.parametrize("budget", [1, 7, 20, 1000])
def test_batches_hold_the_budget_and_every_sequence_once(budget):
    lengths = np.array([5, 9, 1, 9, 3, 12, 4, 4])
    batches = plan_batches(lengths, budget)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b].max() <= budget
    assert lengths[batches[0][0]] == 12  # longest first: out-of-memory shows up at once


def test_shards_are_balanced_deterministic_and_complete():
    rng = np.random.default_rng(0)
    costs = rng.integers(1, 1000, size=200).astype(float)
    for world in (1, 2, 3, 8):
        rank = shard_trajectories(costs, world)
        assert np.array_equal(rank, shard_trajectories(costs, world))
        load = np.bincount(rank, costs, minlength=world)
        assert set(rank.tolist()) <= set(range(world))
        assert load.max() <= costs.sum() / world + costs.max()  # greedy bound


def test_chunks_keep_trajectories_whole():
    trajs = np.array([0, 2, 3, 5])
    traj_len = np.array([4, 1, 2, 5, 1, 3])
    chunks = chunk_trajectories(trajs, traj_len, 4)
    assert [c.tolist() for c in chunks] == [[0], [2, 3], [5]]
