"""The two ways a run is computed give the same bits: the numpy definitions (small logs) and
their compiled twins (large logs), chosen by gaca_cli.credit._compiled and forced here
with GACA_KERNELS. test_kernels.py compares them function by function; these tests compare
whole runs (every output column bit for bit, the summary, the row index), and check that a
small log is computed without importing numba."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from gaca_cli.credit import _compiled
from gaca_cli.credit._compiled import ENV
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages
from gaca_cli.log.reading import Log
from tests.conftest import EXAMPLE_LOG
from tests.credit.reference import random_rows, rows_to_table


def memory_log(table: pa.Table) -> Log:
    return Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))


def rollout_table(seed: int, n_groups: int, shuffle: bool) -> pa.Table:
    """A log shaped like a training batch: groups of 8 rollouts of 1..40 steps, anchors shared
    within a group (step groups of every size, some above the compiled sort's insertion
    threshold), sparse and dense rewards, NLL null on a few steps; rows shuffled or not."""
    rng = np.random.default_rng(seed)
    n_traj = n_groups * 8
    length = rng.integers(1, 41, size=n_traj)
    traj = np.repeat(np.arange(n_traj), length)
    step = np.concatenate([np.arange(k) for k in length])
    group = traj // 8
    n = len(traj)
    state = np.where(rng.random(n) < 0.5, rng.integers(0, 6, size=n), 100 + np.arange(n))
    state[step == 0] = -1
    reward = np.where(step == length[traj] - 1, rng.integers(0, 2, size=n), 0.0) + rng.normal(size=n) * (seed % 2)
    nll = rng.gamma(2.0, 0.3, size=n)
    order = rng.permutation(n) if shuffle else np.arange(n)
    return pa.table(
        {
            "group_id": pa.array([f"g{g:04d}" for g in group[order]]),
            "traj_id": pa.array([f"t{t:05d}" for t in traj[order]]),
            "step_idx": pa.array(step[order]),
            "reward": pa.array(reward[order].astype(np.float64)),
            "anchor_obs": pa.array([f"room {g} state {s}" for g, s in zip(group[order], state[order])]),
            "nll_mean": pa.array(nll[order], mask=rng.random(n) < 0.03),
        }
    )


def run_both(monkeypatch, table: pa.Table, config: AdvantagesConfig):
    runs = []
    for forced in ("0", "1"):
        monkeypatch.setenv(ENV, forced)
        runs.append(compute_advantages(memory_log(table), config))
    return runs


def assert_same_run(numpy_run, compiled_run) -> None:
    """Every output column bit for bit (NaN, -0.0 and all), the summary, the row index."""
    a, b = numpy_run.new_columns, compiled_run.new_columns
    assert a.column_names == b.column_names
    for name in a.column_names:
        x, y = a.column(name).to_numpy(zero_copy_only=False), b.column(name).to_numpy(zero_copy_only=False)
        assert x.dtype == y.dtype, name
        if x.dtype.kind == "f":
            x, y = x.view(np.int64), y.view(np.int64)
        np.testing.assert_array_equal(x, y, err_msg=name, strict=True)
    assert json.dumps(numpy_run.summary, sort_keys=True) == json.dumps(compiled_run.summary, sort_keys=True)
    for name in ("order", "traj_start", "traj_len", "traj_group", "canonical_start", "row_traj"):
        np.testing.assert_array_equal(getattr(numpy_run.index, name), getattr(compiled_run.index, name), strict=True)


CONFIGS = [
    {"method": "grpo"},
    {"method": "grpo", "norm": "mean", "episode_stats": "steps"},
    {"method": "gigpo"},
    {"method": "gigpo", "norm": "std", "gamma": 1.0},
    {"method": "gaca"},
    {"method": "gaca", "nll_scope": "group", "beta": 0.7, "lambda_min": 0.2, "lambda_max": 0.9},
    {"method": "gaca", "nll_scope": "batch", "norm": "std", "step_weight": 2.5},
]


@pytest.mark.parametrize("params", CONFIGS, ids=lambda p: "-".join(f"{v}" for v in p.values()))
@pytest.mark.parametrize("seed,shuffle", [(0, True), (1, False), (2, True)])
def test_a_batch_through_both_paths(monkeypatch, params, seed, shuffle):
    table = rollout_table(seed, n_groups=40, shuffle=shuffle)
    assert_same_run(*run_both(monkeypatch, table, AdvantagesConfig(**params)))


def test_a_huge_beta_clips_without_warnings(monkeypatch):
    """β = 1e308 is a valid (finite) β: β·z overflows to ±inf, which the clip takes to λ_min
    or λ_max, with no numpy overflow warning, and both paths give the same bits."""
    import warnings

    table = rollout_table(3, n_groups=40, shuffle=True)
    config = AdvantagesConfig(method="gaca", beta=1e308, lambda_min=0.1, lambda_max=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runs = run_both(monkeypatch, table, config)
    assert_same_run(*runs)
    lam = runs[0].new_columns.column("gaca_weight").to_numpy()
    assert set(np.unique(lam)) <= {0.1, 0.5, 0.8} and {0.1, 0.8} <= set(np.unique(lam))


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
def test_random_logs_through_both_paths(monkeypatch, seed, method):
    """The reference tests' random logs (ties, near-constant returns, episode_reward, int ids,
    behavior_logprobs, singleton groups, anchor_key, one-step trajectories), some options."""
    rows = random_rows(seed, max_groups=8, max_trajs=6, max_steps=30)
    rng = np.random.default_rng(seed)
    params = {
        "method": method,
        "norm": str(rng.choice(["std", "mean"])),
        "episode_stats": str(rng.choice(["trajectories", "steps"])),
        "gamma": float(rng.choice([0.0, 0.9, 1.0])),
    }
    if method == "gaca":
        params["nll_scope"] = str(rng.choice(["trajectory", "group", "batch"]))
        params["nll_reduce"] = str(rng.choice(["mean", "sum"]))
    if seed % 4 == 0 and method != "grpo":
        params["anchor_similarity"] = 0.6
    assert_same_run(*run_both(monkeypatch, rows_to_table(rows), AdvantagesConfig(**params)))


def test_the_number_of_rows_chooses_the_path(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert not _compiled.wanted(_compiled.COMPILED_FROM_ROWS - 1)
    assert _compiled.wanted(_compiled.COMPILED_FROM_ROWS)
    assert _compiled.usable(10) is None
    monkeypatch.setenv(ENV, "1")
    assert _compiled.wanted(10) and _compiled.usable(10) is not None
    monkeypatch.setenv(ENV, "0")
    assert not _compiled.wanted(10**9)
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(ValueError, match="GACA_KERNELS='yes'"):
        _compiled.wanted(10)


def test_the_path_is_chosen_once_per_run(monkeypatch):
    """Inside a run the building blocks see the path chosen for it, whatever their inputs'
    size; outside one they compute with numpy."""
    monkeypatch.setenv(ENV, "1")
    assert _compiled.kernels() is None
    with _compiled.chosen(10) as kernels:
        assert kernels is not None and _compiled.kernels() is kernels
        with _compiled.chosen(10**9) as inner:  # a nested run (the library called again)
            assert inner is kernels
        monkeypatch.setenv(ENV, "0")
        with _compiled.chosen(10**9) as inner:
            assert inner is None and _compiled.kernels() is None
        assert _compiled.kernels() is kernels
    assert _compiled.kernels() is None


COLD_CACHE = """
import subprocess, sys
from gaca_cli.credit import _compiled
assert _compiled.usable(10**7) is None  # cold: numpy for this run, the cache filled meanwhile
assert "numba" not in sys.modules  # (the files told it, without numba's start-up)
from gaca_cli.credit import _kernels
assert not _kernels.cached()
assert _compiled.usable(10**7) is None and len(_compiled._filling) == 1  # started once
other_run = "from gaca_cli.credit import _compiled; print(_compiled.usable(10**7), len(_compiled._filling))"
assert subprocess.run([sys.executable, "-c", other_run], capture_output=True, text=True).stdout.split() == ["None", "0"]
fill = _compiled._filling[0]
if sys.argv[1] == "stop":
    fill.kill()
else:
    with _compiled.chosen(10):  # a run ends: the compilation starts
        pass
    assert fill.wait(timeout=600) == 0
    assert _kernels.cached() and _compiled.usable(10**7) is _kernels
print("ok")
"""


def cold_cache_run(tmp_path, how: str) -> None:
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", COLD_CACHE, how], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_cold_cache_runs_numpy_and_is_filled_in_the_background(tmp_path):
    """Without the kernels' machine code in numba's cache a large log is computed with numpy
    (compiling would cost far more than it saves) and one background process is started to
    compile them, one for all the runs meanwhile; stopped here at once (the slow test below
    lets it finish)."""
    cold_cache_run(tmp_path, "stop")


@pytest.mark.slow  # compiles every kernel: ~15 CPU seconds
def test_the_background_process_fills_the_cache(tmp_path):
    """Once the background compilation is done the next run uses the compiled loops."""
    cold_cache_run(tmp_path, "wait")


def test_a_small_log_is_computed_without_numba():
    """Reading, checking and computing a small log, and the warm-up for it, never import numba
    (~0.5 s of start-up that a small log never earns back); a large log's warm-up does."""
    code = f"""
import os, sys
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages, warm_up_kernels
from gaca_cli.log.reading import read_log
warm_up_kernels(1000)
for method in ("grpo", "gigpo", "gaca"):
    compute_advantages(read_log([{str(EXAMPLE_LOG)!r}]), AdvantagesConfig(method=method))
print("numba" in sys.modules)
os.environ[{ENV!r}] = "1"  # (unforced, a cold cache would start a background compilation)
warm_up_kernels(10**7)
print("numba" in sys.modules)
"""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
