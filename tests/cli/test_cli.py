"""The command line as a user meets it: help text, README coverage, `--json`, usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from gaca_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def command_names() -> list[str]:
    """Every command registered on the app (whatever the command modules register)."""
    group = typer.main.get_command(app)
    return sorted(group.commands)  # a click-style group (typer vendors click)


def test_core_commands_registered():
    assert {"validate", "advantages"} <= set(command_names())


def test_top_level_help_lists_every_command():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for name in command_names():
        assert name in res.stdout
    assert "Exit status" in res.stdout


@pytest.mark.parametrize("name", command_names())
def test_command_help(name):
    """`gaca NAME --help` exits 0, has a summary and an `Example:` running that command."""
    res = runner.invoke(app, [name, "--help"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert f"gaca {name}" in text
    assert "Example" in text, f"`gaca {name} --help` shows no Example"
    example = text[text.index("Example") :]
    assert f"gaca {name}" in example, f"the Example of {name} does not run `gaca {name}`"
    short = typer.main.get_command(app).commands[name].get_short_help_str(limit=200)
    assert short.strip(), f"{name} has no summary"


def test_python_m_help():
    proc = subprocess.run([sys.executable, "-m", "gaca_cli", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "advantages" in proc.stdout


def test_readme_mentions_every_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [n for n in command_names() if f"gaca {n}" not in readme]
    assert not missing, f"README does not mention: {missing}"


# --------------------------------------------------------------------------- --json


def test_advantages_json(tmp_path, example_log):
    out = tmp_path / "adv.parquet"
    res = runner.invoke(app, ["advantages", str(example_log), "--method", "gaca", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)  # stdout holds exactly one JSON document
    table = pq.read_table(example_log)
    assert summary["output"] == str(out)
    assert summary["method"] == "gaca"
    assert summary["rows"] == table.num_rows
    assert summary["trajectories"] == len(pc.unique(table["traj_id"]))
    assert summary["groups"] == len(pc.unique(table["group_id"]))
    assert 0.0 <= summary["step_signal_share"] <= 1.0
    lam = summary["lambda"]
    for key in ("mean", "min", "max", "corr_with_nll"):
        assert key in lam
    assert lam["min"] <= lam["mean"] <= lam["max"]
    assert summary["mean_abs_adv_episode"] >= 0
    assert summary["mean_abs_weighted_adv_step"] >= 0
    assert sum(summary["steps_by_step_group_size"].values()) == table.num_rows
    # the annotated column agrees with the summary
    weights = pq.read_table(out)["gaca_weight"]
    assert pc.min(weights).as_py() == pytest.approx(lam["min"])
    assert pc.max(weights).as_py() == pytest.approx(lam["max"])


def test_advantages_json_grpo_has_no_lambda(tmp_path, example_log):
    res = runner.invoke(
        app, ["advantages", str(example_log), "--method", "grpo", "-o", str(tmp_path / "a.parquet"), "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["step_signal_share"] == 0.0
    assert not summary.get("lambda")


def test_advantages_human_summary_goes_to_stderr(tmp_path, example_log):
    res = runner.invoke(app, ["advantages", str(example_log), "--method", "gaca", "-o", str(tmp_path / "a.parquet")])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # stdout is for data only
    for label in ("rows", "trajectories", "λ"):
        assert label in res.stderr


def test_validate_json(example_log):
    res = runner.invoke(app, ["validate", str(example_log), "--json"])
    assert res.exit_code == 0
    report = json.loads(res.stdout)
    assert report["ok"] is True
    assert report["rows"] == pq.read_metadata(example_log).num_rows


# --------------------------------------------------------------------------- usage errors

# Every option's invalid values (flag named, value quoted, exit 2): tests/cli/test_options.py.


def test_usage_error_unknown_option(tmp_path, example_log):
    res = runner.invoke(app, ["advantages", str(example_log), "--bogus", "-o", str(tmp_path / "a.parquet")])
    assert res.exit_code == 2
    assert "--bogus" in res.stderr


def test_validate_unknown_for(example_log):
    res = runner.invoke(app, ["validate", str(example_log), "--for", "nonsense"])
    assert res.exit_code == 2
    assert "--for" in res.stderr


def test_several_inputs_need_o(tmp_path, example_log):
    res = runner.invoke(app, ["advantages", str(example_log), str(example_log)])
    assert res.exit_code == 2
    assert "-o" in res.stderr


def test_a_bug_exits_3_with_its_traceback_and_data_errors_exit_1(tmp_path):
    """The `gaca` executable tells a bug from bad data: an unexpected exception keeps its
    traceback and exits 3; a data error stays one `Error:` line with exit 1."""
    import subprocess
    import sys

    from tests.conftest import EXAMPLE_LOG

    out = tmp_path / "out.parquet"
    code = (
        "import sys\nimport gaca_cli.credit.run as run\n"
        "def broken(*a, **k):\n    raise RuntimeError('a bug in the estimator')\n"
        "run.compute_advantages = broken\n"
        f"sys.argv = ['gaca', 'advantages', {str(EXAMPLE_LOG)!r}, '-o', {str(out)!r}]\n"
        "from gaca_cli.cli import main\nmain()\n"
    )
    bug = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert bug.returncode == 3, bug.stderr
    assert "Traceback" in bug.stderr and "a bug in the estimator" in bug.stderr and "please report it" in bug.stderr
    assert not out.exists()
    missing = subprocess.run(
        [sys.executable, "-m", "gaca_cli", "advantages", str(tmp_path / "missing.parquet"), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 1 and missing.stderr.startswith("Error:"), missing.stderr
    assert "Traceback" not in missing.stderr


def test_ctrl_c_while_the_command_line_loads_exits_130_quietly():
    """The executable's entry point catches a Ctrl-C that lands while typer and rich load."""
    code = (
        "import sys\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'gaca_cli.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
        "from gaca_cli.__main__ import main\nmain()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and done.stderr == "", done.stderr


INTERRUPT_ADVANTAGES = """
import ctypes, os, signal, sys, time
import gaca_cli.credit.run as run

how = sys.argv.pop()
# Ctrl-C on, as in a terminal (a shell's background job starts Python with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)


@ctypes.CFUNCTYPE(None)
def llvmlite_callback():  # ctypes prints an exception raised here and drops it
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)


def ctrl_c(*args, **kwargs):  # a real Ctrl-C, now
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)


if how == "ctrl-c-before-the-command":  # while typer builds the command line
    import typer.main

    typer.main.get_command = ctrl_c
if how == "ctrl-c-in-its-imports":  # the command's own imports, before it handles errors
    import gaca_cli.cli.cmd_advantages as cmd

    cmd.column_map = ctrl_c


def interrupted(*args, **kwargs):
    if how == "ctrl-c-swallowed":  # as in llvmlite's object-cache callback, while numba compiles
        llvmlite_callback()
        raise RuntimeError("no compiled object yet for <Library 'trajectory_index'>")
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        if how == "ctrl-c":
            raise
        if how == "ctrl-c-in-numba":  # what numba raises when a Ctrl-C lands while it loads a kernel
            raise SystemError("CPUDispatcher(...) returned a result with an exception set") from exc
    raise SystemError("a bug")

run.compute_advantages = interrupted
sys.argv[:1] = ["gaca"]
from gaca_cli.cli import main
main()
"""


@pytest.mark.parametrize(
    "how,status,stderr",
    [
        ("ctrl-c", 130, "interrupted; nothing was written\n"),
        ("ctrl-c-in-numba", 130, "interrupted; nothing was written\n"),
        ("ctrl-c-swallowed", 130, "interrupted; nothing was written\n"),
        ("ctrl-c-before-the-command", 130, "interrupted; nothing was written\n"),
        ("ctrl-c-in-its-imports", 130, "interrupted; nothing was written\n"),
        ("bug", 3, "gaca: an unexpected error"),
    ],
)
def test_ctrl_c_during_a_command_is_one_line_and_status_130(tmp_path, how, status, stderr):
    """A Ctrl-C while advantages computes: one line saying nothing was written, exit 130,
    no output. numba turns one that lands while it loads a compiled kernel into a SystemError
    raised from the KeyboardInterrupt, and one that lands in llvmlite's ctypes callback while
    it compiles is printed and dropped, numba then failing on its own: both are a Ctrl-C too
    (they were tracebacks and exit 3), while a SystemError without a Ctrl-C stays a bug. One
    while typer builds the command line was a traceback, and one in the command's imports
    before its error handling exited 130 without a word."""
    from tests.conftest import EXAMPLE_LOG

    out = tmp_path / "out.parquet"
    argv = ["advantages", str(EXAMPLE_LOG), "-o", str(out), how]
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_ADVANTAGES, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == status, done.stderr
    if status == 130:
        assert done.stderr == stderr
    else:
        assert stderr in done.stderr and "Traceback" in done.stderr
    assert os.listdir(tmp_path) == []


def test_ctrl_c_after_the_command_finished_is_ignored(tmp_path):
    """A Ctrl-C while the interpreter shuts down (libraries' finalizers, after the output is
    in place) neither prints a traceback nor changes the exit status."""
    from tests.conftest import EXAMPLE_LOG

    out = tmp_path / "out.parquet"
    code = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        f"sys.argv = ['gaca', 'advantages', {str(EXAMPLE_LOG)!r}, '-o', {str(out)!r}]\n"
        "from gaca_cli.cli import main\nmain()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert out.exists()


@pytest.mark.parametrize("command", ["advantages", "score", "train-offline"])
@pytest.mark.parametrize("where", ["existing-directory", "under-a-file", "read-only-directory", "fifo"])
def test_an_unwritable_output_is_one_error_line_before_any_work(command, where, tmp_path, tiny_llama):
    """-o naming an existing directory (a file, for train-offline), a path under a regular file,
    a read-only directory or a FIFO (as /dev/null is a device: never replaced): one Error line
    naming -o, exit 1, before the model is loaded or anything is read, and nothing is written."""
    import os
    import stat

    from tests.conftest import EXAMPLE_LOG

    blocker = tmp_path / "blocker"
    if where == "existing-directory":
        out = tmp_path / "exists"
        if command == "train-offline":
            out.write_text("a file where the run's directory should go")
        else:
            out.mkdir()
    elif where == "fifo":
        out = tmp_path / "pipe"
        os.mkfifo(out)
    elif where == "under-a-file":
        blocker.write_text("a regular file")
        out = blocker / "sub" / "out.parquet"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        out = locked / "out.parquet"
    args = [command, str(EXAMPLE_LOG), "-o", str(out)]
    if command != "advantages":
        args += ["--model", str(tmp_path / "no-such-model"), "--device", "cpu"]  # never reached
    before = sorted(p.name for p in tmp_path.rglob("*"))
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: -o"), res.stderr
    assert "no-such-model" not in lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_demo_output_naming_a_file_is_one_error_line(tmp_path):
    """-o must be a directory that can be made: a file there is refused before any work,
    with the flag named, and left as it was."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    res = runner.invoke(app, ["demo", "-o", str(blocker)])
    assert res.exit_code == 1, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: -o {blocker}: "), res.stderr
    assert blocker.read_text() == "keep me" and os.listdir(tmp_path) == ["notes.txt"]
