"""compute_gaca_outcome_advantage, GACA inside verl-agent's trainer (docs/verl-agent.md).

- β = 0 with verl-agent's conventions: the output equals verl-agent's GiGPO
  (tests/integrations/verl_agent_reference.py, written from its source) on batches built as
  its rollout loop builds them, to float32 precision.
- β > 0: the per-row advantages equal `gaca advantages` on the same rows written as a log.
- What a drop-in owes the trainer: the input's dtype and device, zeros off the response mask,
  the same tensor twice, errors for batches it cannot read.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from gaca_cli.config import ConfigError  # noqa: E402
from gaca_cli.credit.config import AdvantagesConfig  # noqa: E402
from gaca_cli.credit.reading import read_for_advantages  # noqa: E402
from gaca_cli.credit.run import compute_advantages  # noqa: E402
from gaca_cli.errors import GacaError  # noqa: E402
from gaca_cli.integrations.verl_agent import compute_gaca_outcome_advantage  # noqa: E402
from tests.integrations.verl_agent_reference import Batch, gigpo_reference, make_batch  # noqa: E402

VERL = {"episode_stats": "steps", "singleton_groups": "raw", "similarity_metric": "difflib", "similarity_order": "rows"}


def take_rows(batch: Batch, rows: np.ndarray) -> Batch:
    """The batch with its rows taken in the order `rows` gives (repeats allowed)."""
    return Batch(**{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)})


def gaca_on(batch: Batch, **kwargs):
    return compute_gaca_outcome_advantage(**batch.gigpo_args(), old_log_prob=batch.old_log_prob, **kwargs)


def assert_close_f32(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = max(1.0, float(want.abs().max()))
    assert torch.allclose(got, want, rtol=1e-5, atol=2e-6 * scale), float((got - want).abs().max())


# --------------------------------------------------------------------------- β = 0: verl-agent's GiGPO


CASES = [
    # (seed, batch options, GiGPO options)
    (0, {}, {}),
    (1, {"penalty": 0.1}, {}),  # invalid-action penalty: a trajectory's rows score differently
    (2, {"penalty": 0.25}, {"mode": "mean_std_norm"}),
    (3, {}, {"mode": "mean_std_norm", "step_advantage_w": 0.5}),
    (4, {"shuffle": False}, {"epsilon": 1e-3, "mode": "mean_std_norm"}),
    (5, {}, {"enable_similarity": True, "similarity_thresh": 0.9}),
    (6, {"penalty": 0.1}, {"enable_similarity": True, "similarity_thresh": 0.75, "step_advantage_w": 2.0}),
    (7, {"text_anchors": False}, {}),  # array anchors, grouped by value
    (8, {"rollouts": 1, "max_steps": 3}, {"mode": "mean_std_norm"}),  # every group a single trajectory
    (9, {"n_groups": 6, "rollouts": 8, "max_steps": 8, "length": 16}, {"enable_similarity": True}),
]


@pytest.mark.parametrize("seed,batch_options,options", CASES, ids=[str(c[0]) for c in CASES])
def test_beta_zero_is_verl_agents_gigpo(seed, batch_options, options):
    batch = make_batch(seed, **batch_options)
    want, want_again = gigpo_reference(**batch.gigpo_args(), **options)
    got, got_again = gaca_on(batch, beta=0.0, **options)
    assert got is got_again and want is want_again
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    assert_close_f32(got, want)


def test_the_batches_have_what_the_comparison_needs():
    """Padding, empty responses, single-trajectory groups (one and several rows), rows of one
    trajectory apart, step groups larger than one and singletons, penalties."""
    batch = make_batch(1, penalty=0.1)
    mask = batch.response_mask
    assert (mask.sum(-1) == 0).any() and ((mask.sum(-1) > 0) & (mask.sum(-1) < mask.shape[1])).any()
    trajs_of = {g: set(batch.traj_index[batch.index == g]) for g in set(batch.index)}
    rows_of = {g: int(np.sum(batch.index == g)) for g in set(batch.index)}
    assert any(len(t) == 1 and rows_of[g] == 1 for g, t in trajs_of.items())
    assert any(len(t) == 1 and rows_of[g] > 1 for g, t in trajs_of.items())
    apart = [np.diff(np.flatnonzero(batch.traj_index == t)) for t in set(batch.traj_index)]
    assert any(len(gaps) and gaps.max() > 1 for gaps in apart)
    score = batch.token_level_rewards.sum(-1).numpy()
    assert any(len(set(score[batch.traj_index == t])) > 1 for t in set(batch.traj_index))
    _, counts = np.unique([f"{g}|{a}" for g, a in zip(batch.index, batch.anchor_obs)], return_counts=True)
    assert (counts > 1).any() and (counts == 1).any()


def test_gaca_defaults_differ_from_verl_agents_conventions_on_such_batches():
    """The conventions matter on these batches (so the β = 0 match above is not trivial)."""
    batch = make_batch(1, penalty=0.1)
    want, _ = gigpo_reference(**batch.gigpo_args(), enable_similarity=True, similarity_thresh=0.75)
    gaca_defaults = {"episode_stats": "trajectories", "singleton_groups": "zero", "similarity_metric": "lcs"}
    with pytest.raises(GacaError, match="one score per trajectory"):
        gaca_on(batch, beta=0.0, enable_similarity=True, similarity_thresh=0.75, **gaca_defaults)
    clean = make_batch(1)
    want, _ = gigpo_reference(**clean.gigpo_args(), enable_similarity=True, similarity_thresh=0.75)
    for name, value in gaca_defaults.items():
        got, _ = gaca_on(clean, beta=0.0, enable_similarity=True, similarity_thresh=0.75, **{name: value})
        assert (got - want).abs().max() > 1e-3, name


# --------------------------------------------------------------------------- β > 0: `gaca advantages`


def write_log(batch: Batch, path) -> None:
    """The batch's rows as a gaca log, in batch order: the true steps and rewards, R(τ), the
    anchors, and nll_mean from the same log-probabilities (null for an empty response)."""
    mask = batch.response_mask.numpy().astype(bool)
    lp = batch.old_log_prob.numpy().astype(np.float64)
    n_tokens = mask.sum(-1)
    nll = np.array([-lp[i][mask[i]].sum() / n_tokens[i] if n_tokens[i] else np.nan for i in range(len(mask))])
    table = pa.table(
        {
            "group_id": list(batch.index),
            "traj_id": list(batch.traj_index),
            "step_idx": batch.step,
            "reward": batch.reward,
            "episode_reward": batch.episode_reward,
            "anchor_obs": list(batch.anchor_obs),
            "nll_mean": pa.array(nll, from_pandas=True),
        }
    )
    pq.write_table(table, path)


OFFLINE = [
    ({}, {}),  # gaca's own defaults on both sides
    (VERL, {"enable_similarity": True, "similarity_thresh": 0.8}),
    ({"episode_stats": "steps", "nll_scope": "group", "nll_reduce": "mean"}, {"mode": "mean_std_norm"}),
    (
        {"nll_scope": "batch", "lambda_min": 0.2, "lambda_max": 0.9, "singleton_groups": "raw"},
        {"step_advantage_w": 0.5},
    ),
]
GACA_DEFAULTS = {"episode_stats": "trajectories", "singleton_groups": "zero", "similarity_metric": "lcs"}


@pytest.mark.parametrize("beta", [0.25, 0.7])
@pytest.mark.parametrize("case", range(len(OFFLINE)))
def test_beta_positive_is_gaca_advantages_on_the_same_rows(tmp_path, case, beta):
    gaca_options, gigpo_options = OFFLINE[case]
    gamma = 0.9
    batch = make_batch(10 + case, gamma=gamma, dtype=torch.float64)
    path = tmp_path / "batch.parquet"
    write_log(batch, path)
    adapter_options = {**GACA_DEFAULTS, "similarity_order": "sorted", **gaca_options}
    got, _ = gaca_on(batch, beta=beta, **gigpo_options, **adapter_options)

    mode = gigpo_options.get("mode", "mean_norm")
    similarity = gigpo_options.get("similarity_thresh") if gigpo_options.get("enable_similarity") else None
    config = AdvantagesConfig(
        method="gaca",
        gamma=gamma,
        beta=beta,
        norm="std" if mode == "mean_std_norm" else "mean",
        step_weight=gigpo_options.get("step_advantage_w", 1.0),
        anchor_similarity=similarity,
        **adapter_options,
    )
    run = compute_advantages(read_for_advantages([str(path)], {}, config), config)
    want = run.result.advantage
    assert np.abs(want).max() > 0.1 and np.any(run.result.gaca_weight != config.lambda_bar)  # GACA at work

    mask = batch.response_mask.numpy().astype(bool)
    assert got.dtype == torch.float64
    per_row = got.numpy()[np.arange(len(mask)), np.argmax(mask, axis=1)]
    filled = mask.any(axis=1)
    np.testing.assert_allclose(per_row[filled], want[filled], rtol=1e-12, atol=1e-12)
    assert np.all(got.numpy()[~mask] == 0.0)
    assert np.all(got.numpy()[mask] == np.repeat(per_row, mask.sum(1)))


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_the_documented_offline_recipe_on_a_padded_batch(tmp_path, mode):
    """docs/verl-agent.md's recipe on a batch that adjust_batch padded with copies of rows (a
    copy keeps its original's step, so step_idx is the rank in batch order) at γ = 0.9: reward =
    step_rewards with --gamma 0 and episode_reward = the row's score give the function's
    advantage, with verl-agent's conventions and similarity grouping."""
    batch = make_batch(40, gamma=0.9, dtype=torch.float64)
    copies = np.random.default_rng(40).choice(len(batch.index), 7)  # the padding copies, appended
    padded = take_rows(batch, np.concatenate([np.arange(len(batch.index)), copies]))
    options = {**VERL, "nll_scope": "trajectory", "nll_reduce": "mean"}
    got, _ = gaca_on(padded, beta=0.1, mode=mode, enable_similarity=True, similarity_thresh=0.95, **options)
    mask = padded.response_mask.numpy().astype(bool)
    lp = padded.old_log_prob.numpy()
    n_tokens = mask.sum(-1)
    traj = list(padded.traj_index)
    table = pa.table(
        {
            "group_id": list(padded.index),
            "traj_id": traj,
            "step_idx": [traj[:i].count(t) for i, t in enumerate(traj)],  # the rank in batch order
            "reward": padded.step_rewards.numpy(),
            "episode_reward": padded.token_level_rewards.sum(-1).numpy(),
            "anchor_obs": list(padded.anchor_obs),
            "nll_mean": pa.array(
                [-lp[i][mask[i]].sum() / n_tokens[i] if n_tokens[i] else np.nan for i in range(len(mask))],
                from_pandas=True,
            ),
        }
    )
    path = tmp_path / "batch.parquet"
    pq.write_table(table, path)
    config = AdvantagesConfig(
        method="gaca",
        gamma=0.0,
        beta=0.1,
        norm="std" if mode == "mean_std_norm" else "mean",
        anchor_similarity=0.95,
        **options,
    )
    want = compute_advantages(read_for_advantages([str(path)], {}, config), config).result.advantage
    per_row = got.numpy()[np.arange(len(mask)), np.argmax(mask, axis=1)]
    filled = mask.any(axis=1)
    np.testing.assert_allclose(per_row[filled], want[filled], rtol=1e-9, atol=1e-9)


def test_sum_reduction_reads_the_summed_log_probabilities(tmp_path):
    """nll_reduce='sum': u_t is Σ −log π over the response, as `gaca advantages --nll-reduce sum`
    computes it from behavior_logprobs."""
    batch = make_batch(20, dtype=torch.float64)
    mask = batch.response_mask.numpy().astype(bool)
    lp = batch.old_log_prob.numpy()
    table = pa.table(
        {
            "group_id": list(batch.index),
            "traj_id": list(batch.traj_index),
            "step_idx": batch.step,
            "reward": batch.reward,
            "episode_reward": batch.episode_reward,
            "anchor_obs": list(batch.anchor_obs),
            "behavior_logprobs": [lp[i][mask[i]].tolist() for i in range(len(mask))],
        }
    )
    path = tmp_path / "batch.parquet"
    pq.write_table(table, path)
    config = AdvantagesConfig(method="gaca", gamma=0.95, beta=0.5, nll_reduce="sum")
    want = compute_advantages(read_for_advantages([str(path)], {}, config), config).result.advantage
    got, _ = gaca_on(batch, beta=0.5, nll_reduce="sum", **GACA_DEFAULTS, similarity_order="sorted")
    per_row = got.numpy()[np.arange(len(mask)), np.argmax(mask, axis=1)]
    filled = mask.any(axis=1)
    np.testing.assert_allclose(per_row[filled], want[filled], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- what a drop-in owes


def test_output_follows_the_input_dtype_and_device():
    batch = make_batch(30, dtype=torch.bfloat16)
    got, _ = gaca_on(batch, beta=0.3)
    assert got.dtype == torch.bfloat16 and got.device == batch.token_level_rewards.device
    want, _ = gaca_on(
        make_batch(30, dtype=torch.float64), beta=0.3
    )  # same batch, same rng draws, finer dtype: close to bf16 rounding
    assert torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2)


def test_output_dtype_is_promoted_as_verl_agents_sum_is():
    """bf16 token rewards with float32 step_rewards (what compute_step_discounted_returns
    returns): verl-agent's A^E + ω·A^S is float32 by torch's promotion, and so is ours."""
    batch = make_batch(32, dtype=torch.bfloat16)
    batch = dataclasses.replace(batch, step_rewards=batch.step_rewards.float())
    got, _ = gaca_on(batch, beta=0.0)
    assert got.dtype == torch.float32


def test_beta_moves_weight_and_masked_log_probs_do_not_count():
    batch = make_batch(31)
    base, _ = gaca_on(batch, beta=0.0)
    moved, _ = gaca_on(batch, beta=0.5)
    assert (moved - base).abs().max() > 1e-3
    poisoned = batch.old_log_prob.clone()
    poisoned[batch.response_mask == 0] = float("nan")
    same, _ = compute_gaca_outcome_advantage(**batch.gigpo_args(), old_log_prob=poisoned, beta=0.5)
    assert torch.equal(same, moved)


def test_row_order_does_not_matter_without_similarity():
    batch = make_batch(32, penalty=0.1)
    got, _ = gaca_on(batch, beta=0.4)
    perm = np.random.default_rng(0).permutation(len(batch.index))
    shuffled, _ = gaca_on(take_rows(batch, perm), beta=0.4)
    assert torch.allclose(shuffled, got[torch.from_numpy(perm)], rtol=1e-6, atol=1e-6)


def test_bad_arguments_are_refused():
    batch = make_batch(33)
    with pytest.raises(ValueError, match="mode"):
        gaca_on(batch, mode="median_norm")
    with pytest.raises(ConfigError, match="beta"):
        gaca_on(batch, beta=-1.0)
    with pytest.raises(ConfigError, match="similarity_metric"):
        gaca_on(batch, enable_similarity=True, similarity_metric="jaro")
    with pytest.raises(ValueError, match="old_log_prob"):
        compute_gaca_outcome_advantage(**batch.gigpo_args(), old_log_prob=batch.old_log_prob[:, :3])
    with pytest.raises(ValueError, match="index has"):
        compute_gaca_outcome_advantage(
            **{**batch.gigpo_args(), "index": batch.index[:-1]}, old_log_prob=batch.old_log_prob
        )
    arrays = make_batch(34, text_anchors=False)
    with pytest.raises(GacaError, match="text anchors"):
        gaca_on(arrays, enable_similarity=True)
    other = int(np.flatnonzero(batch.index != batch.index[0])[0])
    traj = batch.traj_index.copy()
    traj[other] = traj[0]  # one trajectory in two episode groups
    with pytest.raises(GacaError, match="group_id"):
        compute_gaca_outcome_advantage(**{**batch.gigpo_args(), "traj_index": traj}, old_log_prob=batch.old_log_prob)
