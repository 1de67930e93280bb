"""The experiment's pieces: methods, config validation, the advantage columns of an update,
and the summary statistics on hand-made per-seed numbers."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.harness import key_quests as kq
from bench.harness.experiment import (
    ExperimentConfig,
    ExperimentResult,
    Method,
    estimator_advantages,
    has_signal,
    parse_method,
    quick,
    success_advantages,
    summarise,
)
from gaca_cli.demo import textworld_games as tw


def test_parse_method():
    assert parse_method("start") == Method("start", None)
    assert parse_method("filtered-bc") == Method("filtered-bc", None)
    assert parse_method("gigpo") == Method("gigpo", "gigpo")
    assert parse_method(" gaca:1 ") == Method("gaca:1", "gaca", 1.0)
    assert parse_method("gaca:0.30") == Method("gaca:0.3", "gaca", 0.3)
    for bad in ("ppo", "gaca:-1", "gaca:x", "grpo:1", "start:2", ""):
        with pytest.raises(ValueError, match="is not valid"):
            parse_method(bad)


def test_config_validation(tmp_path):
    assert [m.label for m in ExperimentConfig(out=tmp_path).arms] == [
        "start", "filtered-bc", "grpo", "gigpo", "gaca", "gaca:1",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="rollouts"):
        ExperimentConfig(out=tmp_path, rollouts=1)
    with pytest.raises(ValueError, match="seeds"):
        ExperimentConfig(out=tmp_path, seeds=(1, 1))
    with pytest.raises(ValueError, match="methods"):
        ExperimentConfig(out=tmp_path, methods=("gaca:1", "gaca:1.0"))
    with pytest.raises(ValueError, match="iterations"):
        ExperimentConfig(out=tmp_path, iterations=0)
    small = quick(ExperimentConfig(out=tmp_path))
    assert len(small.seeds) == 3 and small.train_games * small.rollouts < 100


def test_games_split_into_training_bc_and_heldout(tmp_path):
    config = ExperimentConfig(out=tmp_path, train_games=4, bc_games=6, heldout_games=3)
    train, bc, held = config.games("train"), config.games("bc"), config.games("heldout")
    assert [n for n, _ in bc][:4] == [n for n, _ in train] and len(bc) == 6
    assert not {n for n, _ in held} & {n for n, _ in bc}
    assert all(spec.rooms == config.rooms for _, spec in train + held)


@pytest.fixture(scope="module")
def scripted_log(tmp_path_factory):
    """A key-quest log from the scripted policy (ε = 0.6: wins and losses in most groups)."""
    games = [(s.name, s) for s in kq.quest_specs(4, 0, rooms=4)]
    table = tw.collect_lockstep(games, tw.ScriptedPolicy(epsilon=0.6, seed=0), n_rollouts=6, max_steps=12, seed=1)
    path = tmp_path_factory.mktemp("log") / "log.parquet"
    pq.write_table(table, path)
    return path


def test_filtered_bc_advantage_is_the_success_flag(scripted_log, tmp_path):
    out = tmp_path / "fbc.parquet"
    success_advantages(scripted_log, out)
    table = pq.read_table(out)
    adv = table["advantage"].to_numpy()
    won = table["success"].to_numpy(zero_copy_only=False)
    assert set(np.unique(adv)) <= {0.0, 1.0} and np.array_equal(adv == 1.0, won)
    assert 0 < won.mean() < 1 and has_signal(out)


def test_estimator_advantages_write_the_gaca_columns(scripted_log, tmp_path):
    config = ExperimentConfig(out=tmp_path)
    out = tmp_path / "gaca.parquet"
    estimator_advantages(scripted_log, Method("gaca:1", "gaca", 1.0), config, out)
    table = pq.read_table(out)
    assert {"advantage", "gaca_weight"} <= set(table.column_names)
    assert table.num_rows == pq.read_metadata(scripted_log).num_rows and has_signal(out)
    grpo = tmp_path / "grpo.parquet"
    estimator_advantages(scripted_log, parse_method("grpo"), config, grpo)
    assert not np.array_equal(pq.read_table(grpo)["advantage"].to_numpy(), table["advantage"].to_numpy())


def _result(tmp_path) -> ExperimentResult:
    """3 seeds, K = 1; held-out measured at iterations 0 and 1 only (K = 1)."""
    config = ExperimentConfig(out=tmp_path, seeds=(0, 1, 2), methods=("start", "gigpo", "gaca"), iterations=1)
    start = {0: 0.30, 1: 0.20, 2: 0.25}
    gigpo = {0: 0.35, 1: 0.30, 2: 0.25}  # − start: 0.05, 0.10, 0.00
    gaca = {0: 0.40, 1: 0.30, 2: 0.35}  # − gigpo: 0.05, 0.00, 0.10
    per_seed = {}
    for s in config.seeds:
        curves = {
            "start": {"train": [start[s], start[s]], "heldout": [0.1, 0.1]},
            "gigpo": {"train": [start[s], gigpo[s]], "heldout": [0.1, 0.2]},
            "gaca": {"train": [start[s], gaca[s]], "heldout": [0.1, 0.1 + s / 10]},
        }
        per_seed[s] = {"success": curves, "updated": {"gigpo": [True], "gaca": [s != 2]}, "seconds": 1.0}
    return ExperimentResult(config, per_seed, 3.0)


def test_summary_on_known_numbers(tmp_path):
    """gigpo − start = 0.05, 0.10, 0.00: mean 0.05, s = 0.05, half-width t_{0.975,2} · 0.05/√3
    = 4.3027 · 0.028868 = 0.12421; gaca − gigpo has the same spread."""
    summary = summarise(_result(tmp_path))
    train = summary["splits"]["train"]
    assert train["success"]["start"][0]["mean"] == pytest.approx(0.25)
    d = train["vs_start"]["gigpo"][1]
    assert d["mean"] == pytest.approx(0.05) and d["half_width"] == pytest.approx(0.12421, abs=1e-5)
    assert train["vs_gigpo"]["gaca"][1]["mean"] == pytest.approx(0.05)
    assert train["vs_start"]["gigpo"][0]["mean"] == 0.0 and train["vs_start"]["gigpo"][0]["half_width"] == 0.0
    assert "start" not in train["vs_start"] and "gigpo" not in train["vs_gigpo"]
    assert summary["updated"] == {"gigpo": [True], "gaca": [False]}
    held = summary["splits"]["heldout"]
    assert held["vs_start"]["gaca"][1]["mean"] == pytest.approx(0.1)  # 0.0, 0.1, 0.2
    power = summary["power"]["train"]
    assert power["sd_start_over_seeds"] == pytest.approx(0.05)
    assert math.isfinite(power["detectable_effect"]) and power["seeds_for_5_points"] >= 2


def test_summary_leaves_unmeasured_iterations_empty(tmp_path):
    result = _result(tmp_path)
    for s in result.per_seed.values():
        s["success"]["gaca"]["heldout"][0] = math.nan
    cell = summarise(result)["splits"]["heldout"]["success"]["gaca"][0]
    assert cell["mean"] is None and cell["n"] == 0
