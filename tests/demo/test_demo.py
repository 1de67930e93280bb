"""`gaca demo` end to end at its smallest size: every stage runs and reports."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("textworld", reason="the optional `textworld` package is not installed")

from gaca_cli.cli import app  # noqa: E402
from gaca_cli.demo.run import DemoConfig  # noqa: E402


def test_demo_config_rejects_bad_values(tmp_path):
    with pytest.raises(ValueError, match="methods"):
        DemoConfig(out=tmp_path, methods=("ppo",))
    with pytest.raises(ValueError, match="rollouts"):
        DemoConfig(out=tmp_path, rollouts=1)


@pytest.mark.slow  # ~40 s on 2 cores: run with `make test-slow`; each stage has its own fast tests
def test_demo_runs_every_stage(tmp_path):
    """One game, 4 rollouts, a few behaviour-cloning steps, one update of gigpo and gaca:
    the files of every stage exist, the success rates are probabilities, the quality table has
    a row per estimator, and the report ends with the inspect view and the tables."""
    out = tmp_path / "demo"
    result = CliRunner().invoke(
        app,
        [
            "demo",
            "-o",
            str(out),
            "--games",
            "1",
            "--rollouts",
            "4",
            "--bc-steps",
            "60",
            "--methods",
            "gigpo,gaca",
            "--iterations",
            "1",
        ],
        env={"NO_COLOR": "1", "COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "demo.json").read_text())
    assert set(summary["success"]) == {"gigpo", "gaca"} and summary["rollouts"] == 4
    for curve in summary["success"].values():
        assert len(curve) == 2 and all(0.0 <= x <= 1.0 for x in curve)
    assert (out / "start-model" / "config.json").exists()
    assert (out / "iter0.parquet").exists()
    assert (out / "gaca" / "iter0" / "scored.parquet").exists()
    assert (out / "gaca" / "iter0" / "gaca.parquet").exists()
    labels = [row["label"] for row in summary["quality"]]
    assert labels[:2] == ["grpo", "gigpo"] and any(label.startswith("gaca") for label in labels)
    text = result.stdout
    assert "overview" in text and "TextWorld success rate" in text and "grad cos" in text
    assert "of 4 rollouts each [95 % Wilson interval]" in " ".join(text.split())  # wrapped at 100 columns
    assert "\x1b[" not in text
