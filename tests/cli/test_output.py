"""What commands print: one progress display (gaca_cli/cli/progress.py) drawn on stderr only on
a terminal; one summary helper that prints JSON data on stdout or the rendered summary on
stderr; NO_COLOR honoured."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.cli.common import show_summary
from gaca_cli.cli.progress import ProgressBar, ScoreProgress, train_event
from gaca_cli.render import score_summary, train_summary

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;[0-9;]+)m")  # a foreground colour escape


def console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=100, color_system="standard" if terminal else None), out


def drive(bar: ProgressBar) -> None:
    with bar:
        bar.update("games", 0, 2, "compiling game 0")
        bar.update("games", 2, 2, "2 games ready")
        bar.update("loop", 1, 4, "collecting")


def test_no_bar_when_stderr_is_not_a_terminal():
    con, out = console(terminal=False)
    drive(ProgressBar(con))
    assert out.getvalue() == ""


def test_no_bar_on_other_ranks():
    con, out = console(terminal=True)
    drive(ProgressBar(con, enabled=False))
    assert out.getvalue() == ""


def test_bar_on_a_terminal_is_drawn_then_removed():
    con, out = console(terminal=True)
    drive(ProgressBar(con))
    text = out.getvalue()
    assert "games" in text and "loop" in text and "2/2" in text
    assert text.endswith("\x1b[1A\x1b[2K" * 2)  # at the end both bars' lines are erased


def test_echo_when_hidden_writes_one_line_per_update():
    con, out = console(terminal=False)
    drive(ProgressBar(con, echo_when_hidden=True))
    assert out.getvalue().splitlines() == ["games: compiling game 0", "games: 2 games ready", "loop: collecting"]
    con, out = console(terminal=True)  # on a terminal the bar replaces the lines
    drive(ProgressBar(con, echo_when_hidden=True))
    assert "games: compiling game 0" not in out.getvalue()


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def update(self, stage: str, done: int, total: int | None = None, info: str = "") -> None:
        self.calls.append((stage, done, total, info))


def test_score_hooks_count_rows_and_tokens():
    bar = Recorder()
    hooks = ScoreProgress(bar)  # type: ignore[arg-type]
    hooks.start(10)
    hooks.advance(4, 0)  # a resumed chunk: rows, no tokens
    hooks.advance(3, 500)
    assert [c[:3] for c in bar.calls] == [("scoring", 0, 10), ("scoring", 4, 10), ("scoring", 7, 10)]
    assert bar.calls[1][3] == "rows" and re.fullmatch(r"rows  [\d,]+ tok/s", bar.calls[2][3])


def test_train_events_show_the_reference_pass_then_steps():
    bar = Recorder()
    on_event = train_event(bar)  # type: ignore[arg-type]
    on_event("reference", {"done": 2, "total": 5})
    on_event("start", {"start_step": 3, "total_steps": 20})
    on_event("step", {"step": 4, "loss": 0.5, "kl": 0.01, "clip_frac": None, "ratio_max": 1.25, "tokens_per_s": 1234.0})
    on_event("checkpoint", {"step": 4})  # other events draw nothing
    assert bar.calls == [
        ("reference log-probs", 2, 5, ""),
        ("training", 3, 20, ""),
        ("training", 4, None, "loss 0.5000  kl 0.01  r_max 1.25  1,234 tok/s"),
    ]


# --------------------------------------------------------------------------- summaries

SCORE = {
    "output": "scored.parquet",
    "rows": 1200,
    "action_tokens": 34567,
    "model": "tiny",
    "dtype": "fp32",
    "temperature": 1.0,
    "device": "cpu",
    "trajectories": 40,
    "packed_trajectories": 38,
    "unique_sequences": 45,
    "duplicate_sequences": 2,
    "tokens": 99999,
    "forwards": 12,
    "forwarded_tokens": 45678,
    "shared_prefixes": 5,
    "wall_s": 3.25,
    "tokens_per_s": 30769.0,
    "resumed_chunks": 1,
    "chunks": 3,
    "mean_nll_per_token": 1.23456,
    "empty_actions": 2,
    "prefix_mismatch_rows": 1,
    "prefix_mismatch_examples": ["(g0/r0, 1)"],
    "oom_backoffs": 0,
    "warnings": {"singleton_groups": 3},
}
TRAIN = {
    "output": "runs/ppo",
    "mode": "LoRA",
    "loss": "ppo",
    "steps": 7,
    "sequences": 640,
    "resumed_from_step": 4,
    "rows": {"rows": 700, "trained": 640, "no_gradient": 60, "empty_action": 0, "too_long": 2, "prefix_mismatch": 0},
    "behavior_source": "behavior_logprobs",
    "final": {"loss": 0.1, "policy_loss": 0.09, "kl": None, "ratio_mean": 1.0, "clip_frac": 0.0, "grad_norm": 0.5},
    "tokens": 5000,
    "wall_s": 2.0,
    "tokens_per_s": 2500.0,
    "processes": 1,
    "device": "cpu",
    "mixed_precision": "no",
    "warnings": {},
}


def as_text(renderable) -> str:
    con = Console(file=io.StringIO(), width=400, color_system=None)
    con.print(renderable)
    return con.file.getvalue()


def test_score_summary_lines():
    text = as_text(score_summary(SCORE))
    assert text.startswith("wrote scored.parquet: 1,200 rows, 34,567 action tokens scored with tiny (fp32, T=1) on cpu")
    for expected in (
        "38 packed into one forward",
        "30,769 tokens/s",
        "resumed 1 of 3 chunks",
        "mean NLL 1.2346",
        "2 empty actions",
        "rows (g0/r0, 1)",
        "warning: 3 singleton groups",
    ):
        assert expected in text, expected
    assert "out-of-memory" not in text


def test_train_summary_lines():
    text = as_text(train_summary(TRAIN))
    assert text.startswith("wrote runs/ppo: LoRA fine-tuning with --loss ppo, 7 optimiser steps over 640 steps")
    for expected in (
        "(resumed at step 4)",
        "640 trained on, 60 carry no gradient, 2 longer than --max-length",
        "KL –",
        "2,500 tokens/s",
        "metrics: runs/ppo/metrics.jsonl",
    ):
        assert expected in text, expected
    assert "warning" not in text and "empty actions" not in text


def test_show_summary_puts_json_on_stdout_and_people_text_on_stderr(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    show_summary(SCORE, score_summary, as_json=True)
    out, err = capsys.readouterr()
    assert json.loads(out) == SCORE and err == ""
    show_summary(SCORE, score_summary, as_json=False)
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("wrote scored.parquet")


# --------------------------------------------------------------------------- colour


@pytest.mark.parametrize("no_color", [False, True])
def test_no_color_is_honoured(example_log, no_color):
    env = {"FORCE_COLOR": "1", "NO_COLOR": "1" if no_color else ""}
    res = CliRunner().invoke(app, ["validate", str(example_log)], env=env)
    assert res.exit_code == 0, res.output
    assert res.stdout == "" and "OK" in res.stderr
    assert bool(COLOUR.search(res.stderr)) is not no_color, repr(res.stderr)


def test_json_writes_non_finite_numbers_as_null(capsys):
    """JSON has no inf or NaN: print_json writes them as null, wherever they are nested."""
    from gaca_cli.cli.common import print_json

    print_json({"a": float("inf"), "b": [1.5, float("nan"), {"c": -float("inf")}], "d": (2.0,), "e": "inf"})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [1.5, None, {"c": None}], "d": [2.0], "e": "inf"}
