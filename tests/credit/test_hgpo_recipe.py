"""`gaca advantages --method hgpo` against verl-agent's HGPO recipe, run as upstream wrote it.

tests/credit/verl_agent_hgpo/core_hgpo.py is an unmodified copy of the recipe's
recipe/hgpo/core_hgpo.py (verl_agent_hgpo/PROVENANCE.md). Each test builds a batch as verl-agent's
rollout loop does (rows appended step by step, each trajectory's rows in step order, the
episode reward on the last response token of every row of the trajectory), computes its
`step_rewards` with the recipe's own `compute_step_discounted_returns`, runs the recipe's
`hgpo_advantage_estimate`, and compares every row's advantage with `gaca advantages` on the
same rows written as a log, within float32 rounding (the recipe computes in float32).

The recipe's base group is GiGPO's episode advantage with its statistics over step rows and a
group of one row kept raw (mean 0, std 1): gaca's `--episode-stats steps --singleton-groups
raw`.

Rewards are multiples of 1/4 and γ is 1 or 1/2, so every return, sum and tied mean is exact
in float32 as in float64: the recipe's rule "items equal to 0 are left out" then sees the same
zeros on both sides. (With returns such as 0.95^k, float32 can leave the mean of tied values a
hair off them, and the recipe then counts a tie's deviation, ~1e-8, as an item; gaca's
statistics give ties exactly 0. `test_continuous_rewards_at_the_recipes_discount` covers
γ = 0.95 where no two returns tie.)
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from gaca_cli.credit.config import AdvantagesConfig  # noqa: E402
from gaca_cli.credit.run import compute_advantages  # noqa: E402
from gaca_cli.log.reading import Log  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "verl_agent_hgpo" / "core_hgpo.py"
FIXTURE_SHA256 = "cc8bdb17d04c47b8514f9d2539f49f00074df729ceeea72eb45bde775c7c0200"
RECIPE_CONVENTIONS = {"episode_stats": "steps", "singleton_groups": "raw"}


def load_recipe() -> types.ModuleType:
    """The fixture as a module. It imports `verl.DataProto` for an annotation only: a stand-in
    module named `verl` is in sys.modules while it loads."""
    saved = sys.modules.get("verl")
    stand_in = types.ModuleType("verl")
    stand_in.DataProto = object  # type: ignore[attr-defined]
    sys.modules["verl"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("verl_agent_core_hgpo", FIXTURE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["verl"]
        else:
            sys.modules["verl"] = saved
    return module


RECIPE = load_recipe()


def make_batch(seed: int, gamma: float, dyadic: bool = True, length: int = 6) -> dict:
    """A batch of 4 episode groups of 2-5 trajectories of 1-9 steps, plus a group of one
    one-step trajectory and a group of one four-step trajectory. Anchors come from a pool of
    three (or two) per group, so histories repeat within and across trajectories, and each
    group's second trajectory starts with the first's 5 anchors; rows are appended step by
    step over all trajectories, as the rollout loop appends them."""
    rng = np.random.default_rng(seed)
    trajs = []
    plan = [(f"g{g}", int(rng.integers(2, 6))) for g in range(4)] + [("alone1", 1), ("alone4", 1)]
    for uid, n in plan:
        pool = [f"{uid}: room {i}" for i in range(3)]
        for k in range(n):
            steps = {"alone1": 1, "alone4": 4}.get(uid, int(rng.integers(5 if k < 2 else 1, 10)))
            if dyadic:
                rewards = rng.integers(0, 5, steps) / 4.0 * (rng.random(steps) < 0.5)
            else:
                rewards = rng.random(steps).astype(np.float32).astype(np.float64)
            anchors = [pool[int(i)] for i in rng.integers(0, 2 if k % 2 else 3, steps)]
            if k == 1:  # the group's second trajectory starts as its first: long windows shared
                anchors[:5] = trajs[-1]["anchors"][:5]
            trajs.append({"uid": uid, "traj": f"{uid}-t{k}", "rewards": rewards, "anchors": anchors})
    rows = [
        {"uid": t["uid"], "traj": t["traj"], "step": s, "reward": t["rewards"][s], "anchor": t["anchors"][s],
         "R": float(t["rewards"].sum())}
        for s in range(9)
        for t in trajs
        if s < len(t["rewards"])
    ]  # fmt: skip
    n = len(rows)
    valid = rng.integers(1, length + 1, n)
    mask = (np.arange(length)[None, :] < valid[:, None]).astype(np.int64)
    scores = np.zeros((n, length), dtype=np.float32)
    scores[np.arange(n), valid - 1] = [r["R"] for r in rows]
    anchors = np.empty(n, dtype=object)
    anchors[:] = [r["anchor"] for r in rows]
    uid = np.array([r["uid"] for r in rows], dtype=object)
    traj = np.array([r["traj"] for r in rows], dtype=object)
    reward = np.array([r["reward"] for r in rows])
    collected = types.SimpleNamespace(
        non_tensor_batch={"rewards": reward, "traj_uid": traj, "active_masks": np.ones(n, dtype=bool)},
        batch={"input_ids": torch.zeros(n, 1, dtype=torch.long)},
    )
    return {
        "token_level_rewards": torch.from_numpy(scores),
        "step_rewards": RECIPE.compute_step_discounted_returns(collected, gamma),
        "response_mask": torch.from_numpy(mask),
        "anchor_obs": anchors,
        "index": uid,
        "traj_index": traj,
        "log": pa.table(
            {
                "group_id": list(uid),
                "traj_id": list(traj),
                "step_idx": [r["step"] for r in rows],
                "reward": reward,
                "anchor_obs": list(anchors),
            }
        ),
    }


def recipe_advantage(batch: dict, **options) -> np.ndarray:
    """The recipe's per-row advantage (it writes one value over the row's response tokens)."""
    args = {k: v for k, v in batch.items() if k != "log"}
    scores = RECIPE.hgpo_advantage_estimate(**args, **options)
    assert scores.dtype == torch.float32
    return scores[:, 0].numpy().astype(np.float64)  # every response has a first token


def gaca_run(batch: dict, **params):
    table = batch["log"]
    log = Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))
    return compute_advantages(log, AdvantagesConfig(method="hgpo", **params))


def assert_close_f32(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-5, atol=2e-6 * scale))
    assert bad.size == 0, f"{what}: rows {bad[:5].tolist()}: gaca {got[bad[:5]]} vs recipe {want[bad[:5]]}"


CONFIGURATIONS = [
    (mode, k, alpha, base)
    for mode in ("mean_norm", "mean_std_norm")
    for k in (1, 2, 3, 4)
    for alpha in (0.0, 1.0, 2.0)
    for base in (False, True)
]


@pytest.mark.parametrize("mode,history_length,alpha,base_group", CONFIGURATIONS, ids=lambda v: str(v))
def test_gaca_is_the_recipe(mode, history_length, alpha, base_group):
    seed = CONFIGURATIONS.index((mode, history_length, alpha, base_group))
    gamma = (0.5, 1.0)[seed % 2]
    batch = make_batch(seed, gamma)
    want = recipe_advantage(
        batch, history_length=history_length, mode=mode, length_weight_alpha=alpha, base_group=base_group
    )
    run = gaca_run(
        batch,
        gamma=gamma,
        norm="mean" if mode == "mean_norm" else "std",
        history_length=history_length,
        length_weight_alpha=alpha,
        base_group=base_group,
        **RECIPE_CONVENTIONS,
    )
    assert_close_f32(run.result.advantage, want, f"{mode}, K = {history_length}, α = {alpha}, base {base_group}")
    joined = run.result.history_groups
    assert joined is not None and joined.max() == history_length + 1  # the longest window is used
    assert np.abs(want).max() > 0.5 and (base_group or (want == 0).any())  # steps without a non-zero item


def test_the_defaults_are_the_recipes():
    """`--method hgpo` alone (but γ): K = 2, α = 1, no base group, mean_std_norm, ε = 1e-6."""
    batch = make_batch(99, 0.5)
    want = recipe_advantage(batch, history_length=2)  # the trainer's default (its function has none)
    assert_close_f32(gaca_run(batch, gamma=0.5).result.advantage, want, "defaults")
    config = AdvantagesConfig(method="hgpo")
    assert (config.history_length, config.length_weight_alpha, config.base_group) == (2, 1.0, False)
    assert config.normalize_by_std and config.epsilon == 1e-6


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_continuous_rewards_at_the_recipes_discount(mode):
    """γ = 0.95 and rewards drawn from [0, 1): returns are rounded differently in float32 and
    float64, and no two tie."""
    batch = make_batch(7, 0.95, dyadic=False)
    norm = "mean" if mode == "mean_norm" else "std"
    for base in (False, True):
        want = recipe_advantage(batch, history_length=3, mode=mode, base_group=base)
        got = gaca_run(batch, gamma=0.95, norm=norm, history_length=3, base_group=base, **RECIPE_CONVENTIONS)
        assert_close_f32(got.result.advantage, want, f"{mode}, base {base}")


def test_the_batches_have_what_the_comparison_needs():
    """Windows at every length joined and not, ties (items of 0 left out), groups of one
    trajectory (one row, and several rows), anchors revisited within a trajectory."""
    batch = make_batch(3, 0.5)
    run = gaca_run(batch, gamma=0.5, history_length=2)
    joined = run.result.history_groups
    assert set(np.unique(joined)) == {0, 1, 2, 3}
    g = batch["step_rewards"].numpy()
    assert len(set(g.tolist())) < len(g)  # tied returns
    assert {"alone1", "alone4"} <= set(batch["index"])
    revisits = [
        len(set(a)) for a in batch["log"].group_by("traj_id").aggregate([("anchor_obs", "list")])[1].to_pylist()
    ]
    lengths = batch["log"].group_by("traj_id").aggregate([("anchor_obs", "count")])[1].to_pylist()
    assert any(r < n for r, n in zip(revisits, lengths))


def test_the_fixture_is_upstreams_file():
    assert hashlib.sha256(FIXTURE.read_bytes()).hexdigest() == FIXTURE_SHA256
