"""`--method hgpo` wherever the other methods go: `gaca advantages` (its columns, summary,
metadata and help), `validate --for advantages:hgpo`, `inspect` (overview, --traj, --compare)
and `train-offline` on its output. The numbers themselves: tests/credit (the recipe twin,
the slow twin, golden files, invariants)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.log import columns as C

runner = CliRunner()


@pytest.fixture(scope="module")
def hgpo_log(tmp_path_factory, example_log):
    out = tmp_path_factory.mktemp("hgpo") / "hgpo.parquet"
    res = runner.invoke(
        app, ["advantages", str(example_log), "-m", "hgpo", "--base-group", "--history-length", "3", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    return out


def test_advantages_writes_hgpo_columns_summary_and_metadata(tmp_path, example_log):
    out = tmp_path / "a.parquet"
    res = runner.invoke(app, ["advantages", str(example_log), "-m", "hgpo", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    table = pq.read_table(out)
    new = set(table.column_names) - set(pq.read_schema(example_log).names)
    assert new == {C.RETURN_TO_GO, C.HISTORY_GROUPS, C.ADVANTAGE, C.ADV_METHOD}  # no A^E without --base-group
    joined = table.column(C.HISTORY_GROUPS).to_numpy()
    assert summary["method"] == "hgpo" and joined.max() == 3  # K = 2: windows of 1..3 anchors
    assert summary["steps_by_history_groups"] == {str(k): int(np.sum(joined == k)) for k in range(4)}
    assert summary["step_signal_share"] == pytest.approx(np.mean(joined > 0))
    params = json.loads(pq.read_metadata(out).metadata[C.META_ADVANTAGES.encode()])["params"]
    assert (params["history_length"], params["length_weight_alpha"], params["base_group"]) == (2, 1.0, False)
    assert params["norm"] == "std"  # the recipe's mean_std_norm

    res = runner.invoke(app, ["advantages", str(example_log), "-m", "hgpo", "--base-group", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert C.ADV_EPISODE in pq.read_schema(out).names and "mean |A^E|" in res.stderr


def test_hgpo_options_act_only_with_hgpo(tmp_path, example_log):
    for option in (["--history-length", "3"], ["--length-weight-alpha", "2"], ["--base-group"]):
        res = runner.invoke(app, ["advantages", str(example_log), "-m", "gigpo", *option, "-o", str(tmp_path / "x")])
        assert res.exit_code == 2 and "--method hgpo" in res.stderr, option
    res = runner.invoke(app, ["advantages", str(example_log), "-m", "hgpo", "--step-weight", "2", "-o", str(tmp_path)])
    assert res.exit_code == 2 and "--step-weight" in res.stderr
    res = runner.invoke(app, ["advantages", "--help"], env={"COLUMNS": "120"})
    text = " ".join(res.stdout.split())
    assert "--base-group / --no-base-group" in text and "[default: (std (grpo, hgpo), mean (gigpo, gaca))]" in text


def test_validate_for_hgpo(tmp_path, example_log):
    assert runner.invoke(app, ["validate", str(example_log), "--for", "advantages:hgpo"]).exit_code == 0
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(example_log).drop_columns(["anchor_obs"]), bare)
    res = runner.invoke(app, ["validate", str(bare), "--for", "advantages:hgpo"])
    assert res.exit_code == 1 and "anchor_obs" in res.output


def test_inspect_an_hgpo_file(hgpo_log):
    res = runner.invoke(app, ["inspect", str(hgpo_log), "--json"])
    assert res.exit_code == 0, res.output
    overview = json.loads(res.stdout)
    assert overview["method"] == "hgpo" and "hgpo" in overview["comparable_methods"]
    assert sum(overview["history_groups"].values()) == overview["rows"]
    assert "adv_step" not in overview["distributions"]
    traj = overview["example_ids"]["traj"]
    res = runner.invoke(app, ["inspect", str(hgpo_log), "--traj", traj, "--json"])
    steps = json.loads(res.stdout)["trajectories"][0]["steps"]
    assert all(s["history_groups"] is not None and s["adv_step"] is None for s in steps)
    res = runner.invoke(app, ["inspect", str(hgpo_log), "--traj", traj], env={"COLUMNS": "160"})
    assert res.exit_code == 0 and "|H|" in res.stdout and "K 3" in res.stdout


def test_inspect_compares_hgpo_with_the_others(hgpo_log, tmp_path, example_log):
    gaca_log = tmp_path / "gaca.parquet"
    assert runner.invoke(app, ["advantages", str(example_log), "-o", str(gaca_log)]).exit_code == 0
    res = runner.invoke(app, ["inspect", str(gaca_log), "--compare", "grpo,gigpo,gaca,hgpo", "--json"])
    assert res.exit_code == 0, res.output
    view = json.loads(res.stdout)
    assert [m["method"] for m in view["summary"]] == ["grpo", "gigpo", "gaca", "hgpo"]
    assert view["summary"][3]["mean_abs_diff_from_baseline"] > 0
    res = runner.invoke(app, ["inspect", str(hgpo_log), "--compare", "gigpo,hgpo", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["file_check"] == {"method": "hgpo", "max_abs_diff": 0.0, "matches": True}


def test_train_offline_on_hgpo_output(hgpo_log, tiny_llama, tmp_path):
    out = tmp_path / "run"
    args = ["train-offline", str(hgpo_log), "-M", str(tiny_llama), "--loss", "pg", "-o", str(out)]
    res = runner.invoke(app, [*args, "--max-steps", "1", "--warmup-ratio", "0", "--save-every", "0", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert (out / "metrics.jsonl").is_file()
