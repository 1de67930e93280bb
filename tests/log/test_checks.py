"""Each input rule of log-schema.md ("What is checked on input") with a malformed file.

For every rule, through the command line (`gaca advantages` and `gaca validate`):
- exit status 1;
- exactly one `Error:` line on stderr, naming the file, the column, the rule and the
  offending rows as `(traj_id, step_idx)`; no traceback;
- no output file is created, and a pre-existing output file is unchanged byte for byte.

The base log is small enough to read by eye (see `base_rows`); each case changes one thing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app

runner = CliRunner()

PREVIOUS_OUTPUT = b"previous output, must survive\n"


# --------------------------------------------------------------------------- the base log

BASE_TYPES = {
    "group_id": pa.string(),
    "traj_id": pa.string(),
    "step_idx": pa.int64(),
    "reward": pa.float64(),
    "anchor_obs": pa.large_string(),
    "done": pa.bool_(),
    "episode_reward": pa.float64(),
    "action_token_ids": pa.list_(pa.int32()),
    "behavior_logprobs": pa.list_(pa.float32()),
    "prompt": pa.large_string(),
    "action": pa.large_string(),
}


def base_rows() -> dict[str, list]:
    """Two episode groups, four trajectories, ten steps; every rule holds.

    g0: t0 (steps 0,1,2), t1 (steps 0,1,2);  g1: t2 (steps 0,1), t3 (steps 0,1).
    """
    trajs = [("g0", "t0", 3, 1.0), ("g0", "t1", 3, 0.0), ("g1", "t2", 2, 1.0), ("g1", "t3", 2, 0.0)]
    rows: dict[str, list] = {k: [] for k in BASE_TYPES}
    for group, traj, length, ret in trajs:
        for step in range(length):
            last = step == length - 1
            rows["group_id"].append(group)
            rows["traj_id"].append(traj)
            rows["step_idx"].append(step)
            rows["reward"].append(ret if last else 0.0)
            rows["anchor_obs"].append(f"room {step}")
            rows["done"].append(last)
            rows["episode_reward"].append(ret)
            rows["action_token_ids"].append([1, 2][: 1 + step % 2])
            rows["behavior_logprobs"].append([-0.5, -0.25][: 1 + step % 2])
            rows["prompt"].append(f"obs {step}")
            rows["action"].append("go")
    return rows


def row_of(rows: dict[str, list], traj: str, step: int) -> int:
    for i, (t, s) in enumerate(zip(rows["traj_id"], rows["step_idx"])):
        if t == traj and s == step:
            return i
    raise KeyError((traj, step))


def to_table(rows: dict[str, list], types: dict[str, pa.DataType] | None = None) -> pa.Table:
    types = {**BASE_TYPES, **(types or {})}
    return pa.table({k: pa.array(v, type=types.get(k)) for k, v in rows.items()})


def write_log(path: Path, rows: dict[str, list], types: dict[str, pa.DataType] | None = None) -> Path:
    pq.write_table(to_table(rows, types), path)
    return path


# --------------------------------------------------------------------------- the cases


def _drop(*names: str) -> Callable[[dict], dict]:
    def mutate(rows: dict) -> dict:
        for n in names:
            rows.pop(n)
        return rows

    return mutate


def _set(column: str, traj: str, step: int, value) -> Callable[[dict], dict]:
    def mutate(rows: dict) -> dict:
        rows[column][row_of(rows, traj, step)] = value
        return rows

    return mutate


def _steps(traj: str, steps: list[int]) -> Callable[[dict], dict]:
    def mutate(rows: dict) -> dict:
        idx = [i for i, t in enumerate(rows["traj_id"]) if t == traj]
        for i, s in zip(idx, steps):
            rows["step_idx"][i] = s
        return rows

    return mutate


def _done(traj: str, flags: list[bool]) -> Callable[[dict], dict]:
    def mutate(rows: dict) -> dict:
        idx = [i for i, t in enumerate(rows["traj_id"]) if t == traj]
        for i, f in zip(idx, flags):
            rows["done"][i] = f
        return rows

    return mutate


def _stringify(column: str) -> Callable[[dict], dict]:
    def mutate(rows: dict) -> dict:
        rows[column] = [str(v) for v in rows[column]]
        return rows

    return mutate


# (id, mutation, extra types, method, column, rule fragment, offending rows)
CASES = [
    ("missing-group_id", _drop("group_id"), {}, "grpo", "group_id", "required column is missing", []),
    ("missing-traj_id", _drop("traj_id"), {}, "grpo", "traj_id", "required column is missing", []),
    ("missing-step_idx", _drop("step_idx"), {}, "grpo", "step_idx", "required column is missing", []),
    ("missing-reward", _drop("reward"), {}, "grpo", "reward", "required column is missing", []),
    ("type-reward-string", _stringify("reward"), {"reward": pa.string()}, "grpo", "reward", "not usable", []),
    ("type-step_idx-float", lambda r: r, {"step_idx": pa.float64()}, "grpo", "step_idx", "not usable", []),
    ("type-done-string", _stringify("done"), {"done": pa.string()}, "grpo", "done", "not usable", []),
    (
        "type-episode_reward-string",
        _stringify("episode_reward"),
        {"episode_reward": pa.string()},
        "grpo",
        "episode_reward",
        "not usable",
        [],
    ),
    (
        "type-behavior_logprobs-string",
        _stringify("behavior_logprobs"),
        {"behavior_logprobs": pa.string()},
        "grpo",
        "behavior_logprobs",
        "not usable",
        [],
    ),
    (
        "type-action_token_ids-string",
        _stringify("action_token_ids"),
        {"action_token_ids": pa.string()},
        "grpo",
        "action_token_ids",
        "not usable",
        [],
    ),
    (
        "type-anchor_obs-int",
        lambda r: {**r, "anchor_obs": list(range(10))},
        {"anchor_obs": pa.int64()},
        "gigpo",
        "anchor_obs",
        "not usable",
        [],
    ),
    ("null-reward", _set("reward", "t1", 1, None), {}, "grpo", "reward", "null", ["(t1, 1)"]),
    ("null-group_id", _set("group_id", "t2", 0, None), {}, "grpo", "group_id", "null", ["(t2, 0)"]),
    ("null-anchor_obs", _set("anchor_obs", "t1", 1, None), {}, "gigpo", "anchor_obs", "null", ["(t1, 1)"]),
    ("null-step_idx", _set("step_idx", "t3", 1, None), {}, "grpo", "step_idx", "null", ["(t3, None)"]),
    ("nan-reward", _set("reward", "t0", 2, float("nan")), {}, "grpo", "reward", "finite", ["(t0, 2)"]),
    ("inf-reward", _set("reward", "t3", 0, float("-inf")), {}, "grpo", "reward", "finite", ["(t3, 0)"]),
    (
        "inf-episode_reward",
        lambda r: _set("episode_reward", "t3", 1, float("inf"))(_set("episode_reward", "t3", 0, float("inf"))(r)),
        {},
        "grpo",
        "episode_reward",
        "finite",
        ["(t3, 0)", "(t3, 1)"],
    ),
    (
        "nan-episode_reward",
        _set("episode_reward", "t2", 1, float("nan")),
        {},
        "grpo",
        "episode_reward",
        "finite",
        ["(t2, 1)"],
    ),
    ("duplicate-step", _steps("t0", [0, 1, 1]), {}, "grpo", "step_idx", "unique", ["(t0, 1)"]),
    ("gap", _steps("t1", [0, 1, 3]), {}, "grpo", "step_idx", "no gap", ["(t1, 3)"]),
    ("negative-step", _steps("t2", [-1, 0]), {}, "grpo", "step_idx", "0..T-1", ["(t2, -1)"]),
    (
        "two-groups",
        _set("group_id", "t1", 2, "g1"),
        {},
        "grpo",
        "group_id",
        "exactly one group_id",
        ["(t1, 0)", "(t1, 1)", "(t1, 2)"],
    ),
    (
        "episode_reward-varies",
        _set("episode_reward", "t0", 1, 0.5),
        {},
        "grpo",
        "episode_reward",
        "constant",
        ["(t0, 1)"],
    ),
    ("done-twice", _done("t0", [False, True, True]), {}, "grpo", "done", "last step", ["(t0, 1)"]),
    ("done-not-last", _done("t1", [True, False, False]), {}, "grpo", "done", "last step", ["(t1, 0)"]),
    (
        "logprobs-length",
        _set("behavior_logprobs", "t2", 1, [-0.1, -0.2, -0.3]),
        {},
        "grpo",
        "behavior_logprobs",
        "len(behavior_logprobs)",
        ["(t2, 1)"],
    ),
    (
        "nonfinite-behavior_logprobs",
        _set("behavior_logprobs", "t1", 0, [float("nan")]),
        {},
        "gaca",
        "behavior_logprobs",
        "finite",
        ["(t1, 0)"],
    ),
    ("gigpo-needs-anchor", _drop("anchor_obs"), {}, "gigpo", "anchor", "needs a column", []),
    ("gaca-needs-anchor", _drop("anchor_obs"), {}, "gaca", "anchor", "needs a column", []),
    ("gaca-needs-nll", _drop("behavior_logprobs"), {}, "gaca", "nll", "gaca score", []),
]


def assert_one_error_line(stderr: str, *fragments: str) -> str:
    """Exactly one line of stderr starts with `Error:`, it holds every fragment, and there is
    no traceback. Returns the line."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, stderr
    line = lines[0]
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def assert_no_output(out_dir: Path, existing: Path | None) -> None:
    """Nothing new in `out_dir` (no output, no temporary file); `existing` unchanged."""
    names = sorted(os.listdir(out_dir))
    assert names == ([existing.name] if existing else []), names
    if existing is not None:
        assert existing.read_bytes() == PREVIOUS_OUTPUT


def _malformed(tmp_path: Path, mutate, types) -> Path:
    return write_log(tmp_path / "bad.parquet", mutate(base_rows()), types)


def test_base_log_is_clean(tmp_path):
    """The base log passes every check (so each case below breaks exactly its own rule)."""
    log = write_log(tmp_path / "ok.parquet", base_rows())
    for method in ("grpo", "gigpo", "gaca"):
        res = runner.invoke(
            app, ["advantages", str(log), "--method", method, "-o", str(tmp_path / f"{method}.parquet")]
        )
        assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["validate", str(log), "--for", "advantages:gaca"])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("column", ["done", "nll_sum", "nll_mean", "action_token_ids", "behavior_logprobs"])
def test_an_optional_column_of_arrow_type_null_reads_as_all_null(tmp_path, column):
    """pandas and polars write a column of None as Arrow type null: for a column whose nulls
    are allowed it reads as that column with every value null, for every method and validate."""
    rows = base_rows()
    n = len(rows["step_idx"])
    typed = pa.table({k: pa.array(v, type=BASE_TYPES[k]) for k, v in rows.items()})
    if column not in ("nll_sum", "nll_mean"):  # GACA's criticality: from nll_mean then
        typed = typed.append_column("nll_mean", pa.array([0.5 + i / 7 for i in range(n)]))
    if column in typed.column_names:
        typed = typed.drop_columns([column])
    log = tmp_path / "nulls.parquet"
    pq.write_table(typed.append_column(column, pa.nulls(n)), log)
    res = runner.invoke(app, ["validate", str(log)])
    assert res.exit_code == 0, res.output
    for method in ("grpo", "gigpo", "gaca"):
        out = tmp_path / f"{method}.parquet"
        args = ["advantages", str(log), "--method", method, "-o", str(out)]
        if method == "gaca" and column == "nll_sum":
            args += ["--nll-reduce", "sum"]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, (method, res.output)
        assert pq.read_table(out).num_rows == n
        if method == "gaca" and column in ("nll_sum", "nll_mean"):  # null NLL everywhere: z = 0, λ = λ̄
            assert set(pq.read_table(out).column("nll_z").to_pylist()) == {0.0}


@pytest.mark.parametrize(
    "mutate,types,method,column,rule,rows",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rule_stops_advantages(tmp_path, mutate, types, method, column, rule, rows):
    log = _malformed(tmp_path, mutate, types)

    # 1. a new output file is not created
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    res = runner.invoke(app, ["advantages", str(log), "--method", method, "-o", str(fresh_dir / "out.parquet")])
    assert res.exit_code == 1, res.output
    assert res.stdout == ""
    line = assert_one_error_line(res.stderr, str(log), f"column '{column}", rule, *rows)
    if rows:
        assert "(traj_id, step_idx)" in line
    assert_no_output(fresh_dir, None)

    # 2. a pre-existing output file is left alone
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    old = old_dir / "out.parquet"
    old.write_bytes(PREVIOUS_OUTPUT)
    res = runner.invoke(app, ["advantages", str(log), "--method", method, "-o", str(old)])
    assert res.exit_code == 1, res.output
    assert_one_error_line(res.stderr, str(log), rule)
    assert_no_output(old_dir, old)


@pytest.mark.parametrize(
    "mutate,types,method,column,rule,rows",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_rule_fails_validate(tmp_path, mutate, types, method, column, rule, rows):
    """`gaca validate --for advantages:METHOD` exits 1 and reports the same rule and rows."""
    log = _malformed(tmp_path, mutate, types)
    res = runner.invoke(app, ["validate", str(log), "--for", f"advantages:{method}", "--json"])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    report = json.loads(res.stdout)
    assert report["ok"] is False
    hits = [v for v in report["violations"] if column in v["column"] and rule in v["rule"]]
    assert hits, report["violations"]
    for r in rows:
        assert r in hits[0]["rows"]
    # and the human report names it on stderr
    res = runner.invoke(app, ["validate", str(log), "--for", f"advantages:{method}"])
    assert res.exit_code == 1
    text = " ".join(res.stderr.split())  # the console wraps long lines where the path ends
    assert rule in text and column in text


def test_gaca_hint_names_score_and_columns(tmp_path):
    """gaca without NLL columns or behavior_logprobs: the message lists what would do and
    says how to get it."""
    log = _malformed(tmp_path, _drop("behavior_logprobs"), {})
    res = runner.invoke(app, ["advantages", str(log), "--method", "gaca", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 1
    assert_one_error_line(res.stderr, "nll_mean", "nll_sum", "behavior_logprobs", "gaca score")


@pytest.mark.parametrize("present,reduce,hint", [("nll_sum", "mean", "sum"), ("nll_mean", "sum", "mean")])
def test_the_other_nll_column_is_suggested(tmp_path, present, reduce, hint):
    """A log scored with only one NLL column, asked for the other reduction: the error names
    the column wanted, the one the log has, and the option value that uses it."""
    rows = base_rows()
    rows[present] = [1.0 + i for i in range(len(rows["traj_id"]))]
    log = write_log(tmp_path / "log.parquet", rows, {"nll_sum": pa.float64(), "nll_mean": pa.float64()})
    args = ["advantages", str(log), "--method", "gaca", "--nll-reduce", reduce, "-o", str(tmp_path / "o.parquet")]
    res = runner.invoke(app, args)
    assert res.exit_code == 1
    wanted = "nll_mean" if present == "nll_sum" else "nll_sum"
    assert_one_error_line(res.stderr, f"needs column '{wanted}'", f"this log has '{present}'", f"--nll-reduce {hint}")
    assert runner.invoke(app, [*args[:5], hint, *args[6:]]).exit_code == 0


def test_anchor_hint_names_both_columns(tmp_path):
    log = _malformed(tmp_path, _drop("anchor_obs"), {})
    res = runner.invoke(app, ["advantages", str(log), "--method", "gigpo", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 1
    assert_one_error_line(res.stderr, "anchor_obs", "anchor_key", "gigpo")


def test_at_most_five_rows_are_listed(tmp_path):
    """Eight NaN rewards: five are shown, and the message says how many more."""
    rows = base_rows()
    rows["reward"] = [float("nan")] * 8 + rows["reward"][8:]
    log = write_log(tmp_path / "bad.parquet", rows)
    res = runner.invoke(app, ["advantages", str(log), "--method", "grpo", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 1
    line = assert_one_error_line(res.stderr, "reward", "3 more")
    assert len(re.findall(r"\(t\d, \d\)", line)) == 5


def test_integer_ids_in_offending_rows(tmp_path):
    rows = base_rows()
    rows["traj_id"] = [int(t[1:]) + 10 for t in rows["traj_id"]]
    rows["group_id"] = [int(g[1:]) for g in rows["group_id"]]
    rows = _set("reward", 11, 1, float("nan"))(rows)
    log = write_log(tmp_path / "bad.parquet", rows, {"traj_id": pa.int64(), "group_id": pa.int32()})
    res = runner.invoke(app, ["advantages", str(log), "--method", "grpo", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 1
    assert_one_error_line(res.stderr, "(11, 1)")


def test_rows_name_the_file_that_holds_them(tmp_path):
    """With several input files, the message names the file that holds the bad rows."""
    rows = base_rows()
    table = to_table(rows)
    good = tmp_path / "a.parquet"
    pq.write_table(table.filter(pa.compute.equal(table["group_id"], "g0")), good)
    bad_rows = _set("reward", "t3", 1, float("nan"))(rows)
    bad_table = to_table(bad_rows)
    bad = tmp_path / "b.parquet"
    pq.write_table(bad_table.filter(pa.compute.equal(bad_table["group_id"], "g1")), bad)
    res = runner.invoke(app, ["advantages", str(good), str(bad), "--method", "grpo", "-o", str(tmp_path / "o.parquet")])
    assert res.exit_code == 1
    line = assert_one_error_line(res.stderr, str(bad), "(t3, 1)")
    assert str(good) not in line


# --------------------------------------------------------------------------- unreadable inputs


def _text_file(tmp_path: Path) -> list[str]:
    p = tmp_path / "notes.parquet"
    p.write_text("group_id,traj_id\nthis is not parquet\n")
    return [str(p)]


def _empty_log(tmp_path: Path) -> list[str]:
    p = tmp_path / "empty.parquet"
    pq.write_table(to_table(base_rows()).slice(0, 0), p)
    return [str(p)]


def _empty_dir(tmp_path: Path) -> list[str]:
    d = tmp_path / "logs"
    d.mkdir()
    return [str(d)]


def _dir_without_parquet(tmp_path: Path) -> list[str]:
    d = tmp_path / "logs"
    d.mkdir()
    (d / "README.txt").write_text("rollouts go here\n")
    return [str(d)]


def _glob_nothing(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "run-*.parquet")]


def _missing_file(tmp_path: Path) -> list[str]:
    return [str(tmp_path / "nope.parquet")]


UNREADABLE = [
    ("text-file", _text_file, "Parquet"),
    ("empty-log", _empty_log, "no rows"),
    ("empty-dir", _empty_dir, "no Parquet file"),
    ("dir-without-parquet", _dir_without_parquet, "Parquet"),
    ("glob-nothing", _glob_nothing, "no file matches"),
    ("missing-file", _missing_file, "no such file"),
]


@pytest.mark.parametrize("make,rule", [u[1:] for u in UNREADABLE], ids=[u[0] for u in UNREADABLE])
@pytest.mark.parametrize("command", ["advantages", "validate"])
def test_unreadable_input(tmp_path, make, rule, command):
    args = make(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old = out_dir / "out.parquet"
    old.write_bytes(PREVIOUS_OUTPUT)
    extra = ["--method", "grpo", "-o", str(old)] if command == "advantages" else []
    res = runner.invoke(app, [command, *args, *extra])
    assert res.exit_code == 1, res.output
    assert res.stdout == ""
    assert_one_error_line(res.stderr, args[0], rule)
    assert_no_output(out_dir, old)


# --------------------------------------------------------------------------- a real process


def gaca_command() -> list[str]:
    exe = Path(sys.executable).with_name("gaca")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gaca_cli"]


def test_real_process_reports_one_error_line(tmp_path):
    """The installed `gaca` script: exit 1, one Error line, no traceback, output untouched."""
    log = _malformed(tmp_path, _steps("t0", [0, 1, 1]), {})
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old = out_dir / "annotated.parquet"
    old.write_bytes(PREVIOUS_OUTPUT)
    proc = subprocess.run(
        [*gaca_command(), "advantages", str(log), "--method", "gaca", "-o", str(old)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert_one_error_line(proc.stderr, str(log), "column 'step_idx'", "unique", "(t0, 1)")
    assert proc.stderr.strip().startswith("Error:")  # nothing else on stderr
    assert_no_output(out_dir, old)


# --------------------------------------------------------------------------- warnings


def warning_rows() -> dict[str, list]:
    """g0: t0 starts in "hall", t1 in "cellar", t3 in "room 0" (differing step-0 anchors);
    g1: t2 alone (a singleton group), and its two anchors are empty.

    Expected: singleton_groups 1, differing_initial_anchors 1, empty_anchors 2.
    """
    rows = base_rows()
    rows["anchor_obs"] = ["hall", "room 1", "room 2", "cellar", "room 1", "room 2", "", "", "room 0", "room 1"]
    rows["group_id"] = ["g0"] * 6 + ["g1"] * 2 + ["g0"] * 2
    return rows


EXPECTED_WARNINGS = {"singleton_groups": 1, "differing_initial_anchors": 1, "empty_anchors": 2}


def test_validate_reports_warning_counts(tmp_path):
    log = write_log(tmp_path / "warn.parquet", warning_rows())
    res = runner.invoke(app, ["validate", str(log), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True and report["violations"] == []
    assert report["warnings"] == EXPECTED_WARNINGS

    res = runner.invoke(app, ["validate", str(log)])
    assert res.exit_code == 0
    text = " ".join(res.stderr.split())
    assert "OK" in text
    assert "1 episode groups with a single trajectory" in text
    assert "1 groups whose step-0 anchors differ" in text
    assert "2 steps with an empty anchor" in text


def test_advantages_reports_warning_counts(tmp_path):
    log = write_log(tmp_path / "warn.parquet", warning_rows())
    out = tmp_path / "out.parquet"
    res = runner.invoke(app, ["advantages", str(log), "--method", "gigpo", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["warnings"] == EXPECTED_WARNINGS
    assert summary["singleton_groups"] == 1
    assert out.exists()
    res = runner.invoke(app, ["advantages", str(log), "--method", "gigpo", "-o", str(out)])
    assert res.exit_code == 0
    assert "steps with an empty anchor" in res.stderr


def test_clean_log_has_zero_warnings(tmp_path):
    log = write_log(tmp_path / "ok.parquet", base_rows())
    res = runner.invoke(app, ["validate", str(log), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["warnings"] == {k: 0 for k in EXPECTED_WARNINGS}


# --------------------------------------------------------------------------- validate lists every rule


def test_validate_lists_every_broken_rule(tmp_path):
    """Four independent rules broken at once: validate names all four, with their rows."""
    rows = base_rows()
    rows = _set("episode_reward", "t0", 1, 0.5)(rows)  # not constant
    rows = _done("t1", [True, False, False])(rows)  # done not on the last step
    rows = _set("behavior_logprobs", "t2", 1, [-0.1, -0.2, -0.3])(rows)  # length mismatch
    rows = _set("prompt", "t3", 1, None)(rows)  # null in a non-nullable column
    log = write_log(tmp_path / "bad.parquet", rows)
    res = runner.invoke(app, ["validate", str(log), "--json"])
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    found = {(v["column"], tuple(v["rows"])) for v in report["violations"]}
    assert ("episode_reward", ("(t0, 1)",)) in found
    assert ("done", ("(t1, 0)",)) in found
    assert ("behavior_logprobs", ("(t2, 1)",)) in found
    assert ("prompt", ("(t3, 1)",)) in found
    assert len(report["violations"]) == 4

    res = runner.invoke(app, ["validate", str(log)])
    assert res.exit_code == 1
    assert "4 rule(s) broken" in res.stderr
    for column in ("episode_reward", "done", "behavior_logprobs", "prompt"):
        assert f"column '{column}'" in res.stderr


def test_validate_lists_needs_with_other_rules(tmp_path):
    """A missing command column and a broken value rule are both listed."""
    rows = _drop("anchor_obs")(base_rows())
    rows = _set("episode_reward", "t0", 1, 0.5)(rows)
    log = write_log(tmp_path / "bad.parquet", rows)
    res = runner.invoke(app, ["validate", str(log), "--for", "advantages:gigpo", "--json"])
    assert res.exit_code == 1
    columns = {v["column"] for v in json.loads(res.stdout)["violations"]}
    assert "episode_reward" in columns
    assert columns & {"anchor_key", "anchor_obs"}


def test_validate_nan_reward_does_not_hide_structure_rules(tmp_path):
    """A NaN reward is a value problem: the (traj_id, step_idx) checks can and should still run,
    so validate lists both the NaN and the duplicate step."""
    rows = _set("reward", "t2", 0, float("nan"))(base_rows())
    rows = _steps("t0", [0, 1, 1])(rows)
    log = write_log(tmp_path / "bad.parquet", rows)
    res = runner.invoke(app, ["validate", str(log), "--json"])
    assert res.exit_code == 1
    rules = [(v["column"], v["rule"]) for v in json.loads(res.stdout)["violations"]]
    assert any(c == "reward" and "finite" in r for c, r in rules), rules
    assert any(c == "step_idx" and "unique" in r for c, r in rules), rules


def test_validate_clean_exit_zero(example_log):
    res = runner.invoke(app, ["validate", str(example_log), "--for", "advantages:gaca"])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    assert "OK" in res.stderr


def test_validate_map_reports_original_names(tmp_path):
    """With --map, messages name the column as the user's file calls it."""
    rows = _set("reward", "t0", 0, float("nan"))(base_rows())
    rows["r"] = rows.pop("reward")
    log = write_log(tmp_path / "bad.parquet", rows, {"r": pa.float64()})
    res = runner.invoke(
        app, ["advantages", str(log), "--map", "reward=r", "--method", "grpo", "-o", str(tmp_path / "o.parquet")]
    )
    assert res.exit_code == 1
    assert_one_error_line(res.stderr, "column 'r'", "(t0, 0)")


# --------------------------------------------------------------------------- compiled index


def _memory_log(table: pa.Table):
    import numpy as np

    from gaca_cli.log.reading import Log

    return Log(table=table, files=("<memory>",), file_row_ends=np.array([table.num_rows], dtype=np.int64))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("canonical", [True, False])
def test_compiled_index_matches_numpy(seed, canonical):
    """`gaca advantages` builds the row index with a compiled kernel (the steps valid) and
    falls back to the numpy code to report; both give the same index, violations, warnings."""
    import random

    import numpy as np

    from gaca_cli.log.checks import CheckOptions, check_log
    from tests.credit.reference import random_rows, rows_to_table

    rows = random_rows(seed, max_groups=5, max_trajs=5, max_steps=6)
    rng = random.Random(seed)
    kind = seed % 3  # 0: clean, 1: a duplicate step, 2: a gap
    if kind and len(rows) > 1:
        victim = rng.choice([r for r in rows if r["step_idx"] > 0] or rows)
        victim["step_idx"] = 0 if kind == 1 else victim["step_idx"] + 7
    table = rows_to_table(rows)
    options = CheckOptions.DEFAULT if canonical else CheckOptions.ANCHOR_WARNINGS
    plain_run = check_log(_memory_log(table), "advantages:gigpo", options)
    compiled_run = check_log(_memory_log(table), "advantages:gigpo", options | CheckOptions.COMPILED)
    assert [str(v) for v in compiled_run.violations] == [str(v) for v in plain_run.violations]
    assert compiled_run.warnings == plain_run.warnings
    assert (compiled_run.index is None) == (plain_run.index is None)
    if plain_run.index is not None:
        for name in ("order", "traj", "traj_start", "traj_len", "traj_group", "canonical_start"):
            np.testing.assert_array_equal(
                getattr(compiled_run.index, name), getattr(plain_run.index, name), strict=True
            )


@pytest.mark.parametrize(
    "values,types,rule",
    [
        ([0.5, None], None, "must not be null"),
        ([0.5, float("nan")], None, "must be finite"),
        ([0.5, float("inf")], None, "must be finite"),
        ([0.5, -1e306], None, "must fit in float32 (|value| ≤ 3.4e38)"),  # finite, inf in the float32 loss
        (["0.5", "1"], {"advantage": pa.string()}, "is not usable here"),
    ],
    ids=["null", "nan", "inf", "beyond-float32", "string"],
)
def test_validate_for_train_offline_refuses_what_train_offline_refuses(tmp_path, tiny_llama, values, types, rule):
    """`validate --for train-offline` applies train-offline's rules for the advantage column:
    the same one error line, where it used to say the log was fine."""
    rows = base_rows()
    rows["advantage"] = [values[0]] * (len(rows["traj_id"]) - 1) + [values[1]]
    log = write_log(tmp_path / "log.parquet", rows, types)
    checked = runner.invoke(app, ["validate", str(log), "--for", "train-offline"])
    trained = runner.invoke(
        app, ["train-offline", str(log), "--model", str(tiny_llama), "--loss", "pg", "-o", str(tmp_path / "run")]
    )
    assert checked.exit_code == trained.exit_code == 1, (checked.output, trained.output)
    row = [] if types else ["(t3, 1)"]
    assert_one_error_line(trained.stderr, "column 'advantage'", rule, *row)
    report = " ".join(checked.output.split())
    assert "1 rule(s) broken" in report and all(x in report for x in ("column 'advantage'", rule, *row)), report


@pytest.mark.parametrize("layout", ["files", "directory"])
def test_a_file_lacking_a_required_column_is_named(tmp_path, layout):
    """Two files, the second without `reward`: its rows read as nulls, and the error names
    that file and says the column is missing from it (not 'must not be null' on its rows)."""
    table = to_table(base_rows())
    logs = tmp_path / "logs"
    logs.mkdir()
    pq.write_table(table.slice(0, 6), logs / "a.parquet")
    pq.write_table(table.slice(6).drop_columns(["reward"]), logs / "b.parquet")
    given = [str(logs)] if layout == "directory" else [str(logs / "a.parquet"), str(logs / "b.parquet")]
    for command in (["validate"], ["advantages", "-o", str(tmp_path / "out.parquet")]):
        res = runner.invoke(app, [command[0], *given, *command[1:]])
        assert res.exit_code == 1, res.output
        text = "".join(res.output.split())  # the report wraps long paths
        assert "".join(f"{logs / 'b.parquet'}: column 'reward': the column is missing from this file".split()) in text
        assert "mustnotbenull" not in text
    assert not (tmp_path / "out.parquet").exists()
