"""`gaca inspect` on the command line: stdout holds the data (plain text when piped, or JSON),
errors are one `Error:` line on stderr with exit 1, usage errors exit 2, `--plot` writes a
real PNG, and the command never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.errors import GacaError
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import load_annotated
from gaca_cli.inspect.plot import plot_data
from gaca_cli.log import columns as C
from tests.conftest import EXAMPLE_LOG, ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    return CliRunner().invoke(app, ["inspect", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("inspect-cli") / "annotated.parquet"
    result = CliRunner().invoke(app, ["advantages", str(EXAMPLE_LOG), "--method", "gaca", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return str(out)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--traj", "task-00/r0"],
        ["--group", "task-03", "--wide"],
        ["--top", "5", "--by", "weight"],
        ["--compare", "grpo,gigpo,gaca"],
    ],
    ids=["overview", "traj", "group-wide", "top", "compare"],
)
def test_piped_output_is_plain_text(annotated, args, monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    result = invoke(annotated, *args)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "gaca inspect" in result.stdout
    assert result.stderr == ""


def test_wide_shows_actions_and_anchors_in_full(annotated):
    narrow = invoke(annotated, "--group", "task-03").stdout
    wide = invoke(annotated, "--group", "task-03", "--wide").stdout
    assert "The garden door is locked. You carry a brass key." not in narrow
    assert "The garden door is locked. You carry a brass key." in " ".join(wide.split())


def test_json_is_the_same_data(annotated):
    result = invoke(annotated, "--traj", "task-02/r4", "--json")
    data = json.loads(result.stdout)
    assert data["view"] == "steps" and data["selection"]["traj"] == "task-02/r4"
    rows = pq.read_table(annotated).filter(pc.field("traj_id") == "task-02/r4").sort_by("step_idx").to_pylist()
    steps = data["trajectories"][0]["steps"]
    assert [s["advantage"] for s in steps] == [r["advantage"] for r in rows]
    assert [s["anchor"] for s in steps] == [r["anchor_obs"] for r in rows]  # full text, not truncated


def test_unknown_id_is_an_error_with_suggestions(annotated):
    result = invoke(annotated, "--traj", "task-00/r9")
    assert result.exit_code == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "'task-00/r9'" in line and "closest: 'task-00/r" in line
    result = invoke(annotated, "--group", "task-8")
    assert result.exit_code == 1 and "closest: 'task-0" in result.stderr


def test_a_log_without_advantages_says_what_to_run(tmp_path):
    """A log that went through `gaca score` (NLL columns) but not `gaca advantages`."""
    table = pq.read_table(EXAMPLE_LOG)
    nll = [-float(np.mean(lp)) for lp in table.column(C.BEHAVIOR_LOGPROBS).to_pylist()]
    table = table.append_column(C.NLL_MEAN, pa.array(nll, pa.float64()))
    scored = tmp_path / "scored.parquet"
    pq.write_table(table, scored)
    result = invoke(str(scored))
    assert result.exit_code == 1
    assert "'advantage'" in result.stderr and "run `gaca advantages` first" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--traj", "a", "--group", "b"],
        ["--top", "0"],
        ["--by", "reward"],
        ["--compare", "gaca"],
        ["--compare", "grpo,ppo"],
        ["--compare", "grpo,gaca", "--by", "nll"],
    ],
)
def test_usage_errors_exit_2(annotated, args):
    result = CliRunner().invoke(app, ["inspect", annotated, *args])
    assert result.exit_code == 2, result.output


def test_help_has_an_example():
    result = CliRunner().invoke(app, ["inspect", "--help"])
    assert result.exit_code == 0 and "Example: gaca inspect" in result.stdout


def test_plot_writes_a_png(annotated, tmp_path):
    out = tmp_path / "figures.png"
    result = invoke(annotated, "--traj", "task-01/r2", "--plot", str(out), "--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout stays pure JSON; the note goes to stderr
    assert f"wrote {out}" in result.stderr
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 20_000
    from matplotlib.image import imread

    pixels = imread(out)
    assert pixels.shape[:2] == (850, 1200)
    # four panels of drawings, not a blank canvas: many distinct colours, plenty of ink
    rgb = (pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(rgb, axis=0)) > 50
    assert np.mean(rgb.sum(axis=1) < 600) > 0.03


def test_plot_data_follows_the_selection(annotated):
    a = load_annotated([annotated])
    data = plot_data(a, InspectConfig(group="task-05"))
    assert data.traj_id == "task-05/r0" and list(data.advantages) == ["grpo", "gigpo", "gaca", "hgpo"]
    np.testing.assert_array_equal(data.advantages["gaca"], a.values[C.ADVANTAGE])
    assert not data.weight_recomputed
    data = plot_data(a, InspectConfig(compare=("gigpo", "gaca")))
    assert list(data.advantages) == ["gigpo", "gaca"]


def test_plot_data_of_a_grpo_file_recomputes_lambda(tmp_path):
    out = tmp_path / "grpo.parquet"
    assert CliRunner().invoke(app, ["advantages", str(EXAMPLE_LOG), "-m", "grpo", "-o", str(out)]).exit_code == 0
    data = plot_data(load_annotated([str(out)]), InspectConfig())
    assert data.weight_recomputed and data.lambda_bar == 0.5
    assert data.weight is not None and np.all((data.weight >= 0) & (data.weight <= 1))


def test_plot_without_matplotlib_names_the_extra(annotated, tmp_path, monkeypatch):
    from gaca_cli.inspect.plot import save_figure

    data = plot_data(load_annotated([annotated]), InspectConfig())
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # `import` now raises ImportError
    with pytest.raises(GacaError, match=r"pip install 'gaca-cli\[plot\]'"):
        save_figure(data, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_inspect_does_not_import_torch(annotated):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from gaca_cli.cli import app\n"
        f"r = CliRunner().invoke(app, ['inspect', {annotated!r}, '--compare', 'grpo,gaca', '--traj', 'task-00/r0'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'matplotlib')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("rule", ["done", "behavior_logprobs"])
def test_inspect_enforces_every_schema_rule(tmp_path, rule):
    """`done` on a step that is not the last, and behaviour log-probs whose length differs from
    the action's token ids, stop inspect as they stop every other command: one Error line, exit 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    annotated = tmp_path / "annotated.parquet"
    assert CliRunner().invoke(app, ["advantages", str(EXAMPLE_LOG), "-o", str(annotated)]).exit_code == 0
    table = pq.read_table(annotated)
    if rule == "done":
        done = [False] * table.num_rows
        first = table.column("step_idx").to_pylist().index(0)
        done[first] = True  # step 0 of a trajectory with more steps
        table = table.set_column(table.column_names.index("done"), "done", pa.array(done))
    else:
        lengths = [len(x) for x in table.column("behavior_logprobs").to_pylist()]
        ids = [list(range(n)) for n in lengths]
        ids[0] = ids[0] + [7]
        table = table.append_column("action_token_ids", pa.array(ids, pa.list_(pa.int32())))
    bad = tmp_path / "bad.parquet"
    pq.write_table(table, bad)
    res = CliRunner().invoke(app, ["inspect", str(bad), "--no-pager"])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and rule in lines[0], res.stderr


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("advantage", None, "must not be null"),
        ("advantage", float("nan"), "must be finite (no NaN, no ±inf)"),
        ("nll_z", float("inf"), "must be finite (no NaN, no ±inf)"),
        ("adv_step", float("-inf"), "must be finite (no NaN, no ±inf)"),
        ("gaca_weight", 7.5, "must be a weight in [0, 1]"),
        ("advantage", "0.5", "type large_string is not usable here; expected a number"),
    ],
)
def test_an_edited_output_column_is_refused_not_shown_as_a_dash(annotated, tmp_path, column, value, rule):
    """gaca advantages never writes these; a file edited by hand that holds them stops inspect
    (as train-offline stops on the advantage) rather than showing '–' and leaving the rows out
    of the statistics."""
    table = pq.read_table(annotated)
    values = table.column(column).to_pylist()
    values[3] = value
    if isinstance(value, str):
        array = pa.array([str(v) for v in values])
    else:
        array = pa.array(values, pa.float64())
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(table.column_names.index(column), column, array), bad)
    res = CliRunner().invoke(app, ["inspect", str(bad), "--no-pager"])
    assert res.exit_code == 1, res.output
    (line,) = [line for line in res.stderr.splitlines() if line.strip()]
    assert line.startswith(f"Error: {bad}: column '{column}': {rule}"), line
    if not isinstance(value, str):
        assert "(task-00/r0, 3)" in line or "offending rows" in line


def test_a_file_with_only_an_advantage_column_says_so(tmp_path):
    """An advantage from elsewhere (no gaca metadata, no adv_method): the overview says the
    file has no step groups, not "method None"."""
    table = pq.read_table(EXAMPLE_LOG)
    log = tmp_path / "adv.parquet"
    pq.write_table(table.append_column("advantage", pa.array(np.linspace(-1, 1, table.num_rows))), log)
    text = " ".join(invoke(str(log)).stdout.split())
    assert "(no step groups in the file: episode-level credit only)" in text and "None" not in text
    pq.write_table(pq.read_table(log).drop_columns(["behavior_logprobs"]), log)  # no NLL at all
    for args in (["--traj", "task-00/r0"], ["--top", "3"]):
        assert "critical" not in invoke(str(log), *args).stdout  # no step can be marked critical


def test_numbers_are_never_cut_on_a_narrow_console(tmp_path, monkeypatch):
    """Rewards ×12345 make the number columns wide: on an 80-column pipe (and COLUMNS=40)
    the text columns shrink, and a line too long for the console grows instead of cutting a
    number with …"""
    table = pq.read_table(EXAMPLE_LOG)
    i = table.schema.get_field_index("reward")
    raw = tmp_path / "big.parquet"
    pq.write_table(table.set_column(i, "reward", pc.multiply(table["reward"], 12345.0)), raw)
    out = tmp_path / "annotated.parquet"
    assert CliRunner().invoke(app, ["advantages", str(raw), "-o", str(out)]).exit_code == 0
    from gaca_cli.inspect.terminal import fmt

    steps = json.loads(invoke(str(out), "--traj", "task-00/r0", "--json").stdout)["trajectories"][0]["steps"]
    overview = json.loads(invoke(str(out), "--json").stdout)
    for columns in ("80", "60", "40"):
        monkeypatch.setenv("COLUMNS", columns)
        text = invoke(str(out), "--traj", "task-00/r0").stdout
        for step in steps:
            assert f"{step['advantage']:+.2f}" in text and f"{step['adv_episode']:+.2f}" in text, (columns, text)
        text = invoke(str(out)).stdout  # the overview's tables
        for name in ("advantage", "adv_episode"):
            for key in ("min", "median", "mean", "max"):
                assert fmt(overview["distributions"][name][key], sign="+") in text, (columns, name, key, text)
        assert f"{overview['rows']:,}" in text and "episode groups" in text and "step-group size" in text, text


def test_huge_advantages_stay_finite_and_readable(annotated, tmp_path):
    """Rewards × 1e200 pass every input rule and give finite advantages; inspect's statistics
    must not overflow to inf (invalid JSON) or leak numpy warnings, equal the unscaled file's
    × 1e200, and print in scientific notation rather than 200-digit numbers."""
    scaled_log = tmp_path / "scaled.parquet"
    table = pq.read_table(EXAMPLE_LOG)
    i = table.schema.get_field_index(C.REWARD)
    pq.write_table(table.set_column(i, C.REWARD, pc.multiply(table[C.REWARD].cast(pa.float64()), 1e200)), scaled_log)
    scaled = tmp_path / "annotated.parquet"
    runner = CliRunner()
    assert runner.invoke(app, ["advantages", str(scaled_log), "--method", "gaca", "-o", str(scaled)]).exit_code == 0
    for args in ([], ["--compare", "grpo,gaca"]):
        big, small = invoke(str(scaled), "--json", *args), invoke(annotated, "--json", *args)
        assert big.exit_code == 0 and big.stderr == "", big.stderr
        got, want = json.loads(big.stdout), json.loads(small.stdout)
        if not args:
            for key in ("mean", "std", "min", "max"):
                assert got["distributions"]["advantage"][key] == pytest.approx(
                    want["distributions"]["advantage"][key] * 1e200, rel=1e-9
                )
        else:
            for g, w in zip(got["summary"], want["summary"]):
                assert g["std"] == pytest.approx(w["std"] * 1e200, rel=1e-9)
                corr = w.get("corr_with_baseline")  # the baseline's own row has none
                assert g.get("corr_with_baseline") == (None if corr is None else pytest.approx(corr, rel=1e-9))
        text = invoke(str(scaled), *args)
        assert text.exit_code == 0 and "Warning" not in text.stderr
        assert "e+200" in text.stdout and "0000000000" not in text.stdout


def test_control_characters_in_the_log_never_reach_the_terminal(annotated, tmp_path):
    """An action, an anchor or an id holding ESC, an OSC title, BEL or a C1 CSI is shown with
    those characters escaped (\\x1b …) in every view; --json keeps the text as it is."""
    table = pq.read_table(annotated)
    evil = "\x1b[2J\x1b]0;owned\x07\x9b31m"
    ids = pc.if_else(pc.equal(table["traj_id"], "task-00/r0"), f"task-00/r0{evil}", table["traj_id"])
    table = table.set_column(table.schema.get_field_index("traj_id"), "traj_id", ids)
    for name in ("action", "anchor_obs"):
        texts = pa.array([f"{text}{evil}" for text in table[name].to_pylist()])
        table = table.set_column(table.schema.get_field_index(name), name, texts)
    log = tmp_path / "evil.parquet"
    pq.write_table(table, log)
    views = ([], ["--traj", f"task-00/r0{evil}"], ["--group", "task-00", "--wide"], ["--top", "5"])
    for args in (*views, ["--compare", "grpo,gaca", "--traj", f"task-00/r0{evil}"]):
        out = invoke(str(log), *args).stdout
        assert not any(c in out for c in "\x1b\x07\x9b"), args
        if "--wide" in args:  # shown in full
            assert "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m" in out, args
    steps = json.loads(invoke(str(log), "--traj", f"task-00/r0{evil}", "--json").stdout)["trajectories"][0]["steps"]
    assert steps[0]["action"].endswith(evil)


def test_the_criticality_shown_is_the_one_the_file_records(annotated, tmp_path):
    """The README's loop scores an annotated file afterwards (`gaca score --token-logprobs`),
    adding nll_mean: inspect still shows, sorts by and recomputes with the criticality that
    `gaca advantages` recorded (behavior_logprobs here), not the later column."""
    table = pq.read_table(annotated)
    assert json.loads(table.schema.metadata[b"gaca.advantages"])["criticality_column"] == C.BEHAVIOR_LOGPROBS
    rescored = tmp_path / "rescored.parquet"
    later = np.random.default_rng(0).uniform(0.1, 3.0, table.num_rows)  # another model's NLL
    pq.write_table(table.append_column(C.NLL_MEAN, pa.array(later)), rescored)
    for args in ([], ["--traj", "task-00/r0"], ["--top", "5", "--by", "nll"], ["--compare", "grpo,gaca"]):
        want = json.loads(invoke(annotated, *args, "--json").stdout)
        got = json.loads(invoke(str(rescored), *args, "--json").stdout)
        want.pop("source"), got.pop("source")
        assert got == want, args


def test_a_figure_that_cannot_be_written_names_plot(annotated, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "no-such-dir" / "figure.png"
    result = CliRunner().invoke(app, ["inspect", annotated, "--plot", str(target)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {target}: --plot cannot write"), result.stderr
    assert not target.exists()
    # a suffix matplotlib does not write: a usage error, before any work (tests/cli/test_options.py)
    result = CliRunner().invoke(app, ["inspect", annotated, "--plot", str(tmp_path / "figure.txt")])
    assert result.exit_code == 2 and not (tmp_path / "figure.txt").exists()
    # no suffix at all: a PNG, named as matplotlib names it
    result = CliRunner().invoke(app, ["inspect", annotated, "--plot", str(tmp_path / "figure"), "--no-pager"])
    assert result.exit_code == 0 and f"wrote {tmp_path / 'figure.png'}" in result.stderr
    assert (tmp_path / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "drop,suggested",
    [
        ((), "grpo,gigpo,gaca,hgpo"),
        (("behavior_logprobs",), "grpo,gigpo,hgpo"),  # no NLL: gaca cannot be recomputed
        (("anchor_obs",), None),  # grpo alone: nothing to compare with
    ],
    ids=["all", "no-nll", "no-anchors"],
)
def test_the_overview_suggests_only_a_compare_that_runs(tmp_path, drop, suggested):
    """The overview's closing hint names --compare with the methods this file's columns allow,
    and the suggestion runs (it used to offer grpo,gigpo,gaca on a log without anchors, which
    then failed: 'advantages --method gigpo needs a column anchor_key or anchor_obs')."""
    log = tmp_path / "log.parquet"
    pq.write_table(pq.read_table(EXAMPLE_LOG).drop_columns(list(drop)), log)
    out = tmp_path / "grpo.parquet"
    assert CliRunner().invoke(app, ["advantages", str(log), "-m", "grpo", "-o", str(out)]).exit_code == 0
    overview = invoke(str(out))
    assert overview.exit_code == 0, overview.output
    hint = " ".join(overview.stdout.split()[-12:])
    assert json.loads(invoke(str(out), "--json").stdout)["comparable_methods"] == (
        suggested.split(",") if suggested else ["grpo"]
    )
    if suggested is None:
        assert "--compare" not in hint, hint
        return
    assert hint.endswith(f"--compare {suggested}"), hint
    compared = invoke(str(out), "--compare", suggested)
    assert compared.exit_code == 0, compared.output
