"""Temporary output files never outlive the run that follows (issue 17, item 15).

`atomic_path` names its temporary file (and `temporary_dir` the scratch directory of
`gaca import`) after the writing process; the next run writing the same output removes those
whose process is gone (kill -9 here, for real), and keeps those of a process that still runs
and files that are not its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from gaca_cli.files import atomic_path, remove_stale_temporaries
from gaca_cli.log.writing import write_parquet_atomic

HOLD = """
import sys, time
from gaca_cli.files import atomic_path
with atomic_path(sys.argv[1]) as tmp:
    print(tmp, flush=True)
    time.sleep(600)
"""


def start_writer(out: Path) -> tuple[subprocess.Popen, Path]:
    """A process inside `atomic_path(out)`, and its temporary file."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    tmp = Path(proc.stdout.readline().strip())
    assert tmp.exists() and tmp.parent == out.parent
    return proc, tmp


def test_a_killed_writers_temporary_is_removed_by_the_next_run(tmp_path):
    out = tmp_path / "annotated.parquet"
    proc, tmp = start_writer(out)
    assert f".{out.name}.{proc.pid}." in tmp.name
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert tmp.exists()  # kill -9: nothing cleans up
    write_parquet_atomic(pa.table({"x": [1]}), out, {})
    assert sorted(os.listdir(tmp_path)) == ["annotated.parquet"]


HOLD_IMPORT = """
import sys, time
from gaca_cli.integrations.imports import core
def stop(*args, **kwargs):
    print(next(p for p in core.Path(sys.argv[1]).parent.iterdir() if p.is_dir()), flush=True)
    time.sleep(600)
core._merge = stop  # the parts are written: hold here, inside the scratch directory
core.run_import("chat-jsonl", [sys.argv[2]], core.Path(sys.argv[1]), core.ImportOptions())
"""


def test_a_killed_imports_scratch_directory_is_removed_by_the_next_run(tmp_path):
    """`gaca import` streams its parts into a directory beside OUT: named as atomic_path
    names its files, so the next import writing OUT removes a killed one's."""
    from gaca_cli.integrations.imports import core
    from gaca_cli.integrations.imports.base import ImportOptions
    from tests.integrations.test_import_chat_jsonl import write_jsonl
    from tests.integrations.test_import_core import records

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "log.parquet"
    src = write_jsonl(tmp_path / "r.jsonl", records(4))
    proc = subprocess.Popen([sys.executable, "-c", HOLD_IMPORT, str(out), str(src)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    scratch = Path(proc.stdout.readline().strip())
    assert scratch.name.startswith(f".{out.name}.{proc.pid}.") and any(scratch.iterdir())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert scratch.exists()  # kill -9: nothing cleans up
    core.run_import("chat-jsonl", [src], out, ImportOptions())
    assert sorted(os.listdir(out_dir)) == ["log.parquet"]


HOLD_DISCARD = """
import sys, time
from gaca_cli import files as io
def hold(path, **kwargs):
    print(path, flush=True)
    time.sleep(600)
io.shutil.rmtree = hold  # renamed, now deleting: hold here
io.discard_dir(sys.argv[1], sys.argv[2])
"""


def test_a_work_directory_killed_while_deleted_is_removed_by_the_next_run(tmp_path):
    """`gaca score` deletes OUT.parts/ once OUT is written: renamed first to a temporary name
    of OUT, so a kill while deleting leaves no half-deleted OUT.parts/ (which a later run
    would refuse as not its own), and the next run writing OUT removes the rest."""
    from gaca_cli.files import discard_dir

    out = tmp_path / "scored.parquet"
    parts = tmp_path / "scored.parquet.parts"
    parts.mkdir()
    for i in range(3):
        (parts / f"rank00000-of-00001.chunk{i:06d}.parquet").write_bytes(b"x")
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_DISCARD, str(parts), str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    doomed = Path(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not parts.exists() and doomed.name.startswith(f".{out.name}.{proc.pid}.") and doomed.is_dir()
    write_parquet_atomic(pa.table({"x": [1]}), out, {})
    assert sorted(os.listdir(tmp_path)) == ["scored.parquet"]
    discard_dir(tmp_path / "nothing", out)  # nothing to remove: nothing happens


IGNORE_CTRL_C = """
import os, signal, time
from gaca_cli.interrupts import ctrl_c_ignored
# Ctrl-C on, as in a terminal (a shell's background job starts Python with SIGINT ignored)
signal.signal(signal.SIGINT, signal.default_int_handler)
with ctrl_c_ignored():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
print("after the block", flush=True)
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    print("Ctrl-C works again", flush=True)
"""


def test_ctrl_c_is_ignored_inside_the_block_and_works_after_it():
    done = subprocess.run([sys.executable, "-c", IGNORE_CTRL_C], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["after the block", "Ctrl-C works again"]


def test_a_running_writers_temporary_and_other_files_are_kept(tmp_path):
    out = tmp_path / "annotated.parquet"
    proc, tmp = start_writer(out)
    try:
        others = [tmp_path / ".annotated.parquet.notes.tmp", tmp_path / ".annotated.parquet.5.x.abcdefgh.tmp"]
        for other in others:
            other.write_bytes(b"")
        assert remove_stale_temporaries(out) == []
        assert tmp.exists() and all(o.exists() for o in others)
        with atomic_path(out) as mine:
            assert Path(mine) != tmp
            Path(mine).write_bytes(b"new")
        assert out.read_bytes() == b"new" and tmp.exists()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    # the process is gone now: the next run removes its file
    assert remove_stale_temporaries(out) == [str(tmp)]


def test_an_interrupted_block_leaves_nothing(tmp_path):
    out = tmp_path / "o.parquet"
    try:
        with atomic_path(out) as tmp:
            Path(tmp).write_bytes(b"half")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- score and train-offline


def test_a_score_work_directory_killed_while_created_is_started_again(tmp_path):
    """`gaca score` killed between creating OUT.parts/ and renaming its manifest into place
    leaves the directory empty or holding only the manifest's temporary file: the next run
    starts it again instead of refusing it as someone else's directory."""
    from gaca_cli.lm.shards import check_work_dir, prepare_work_dir

    run_fingerprint = {"tool": "gaca score", "rows": 3}
    for leftover in ([], ["manifest.tmp"]):
        work = tmp_path / f"out{len(leftover)}.parquet.parts"
        work.mkdir()
        for name in leftover:
            (work / name).write_text("{")
        assert prepare_work_dir(work, run_fingerprint, resume=False) == 0
        assert sorted(os.listdir(work)) == ["manifest.json"]
        assert check_work_dir(work, run_fingerprint, resume=True) == 0


def test_a_score_work_directory_with_chunks_is_kept(tmp_path):
    from gaca_cli.errors import GacaError
    from gaca_cli.lm.shards import prepare_work_dir

    work = tmp_path / "out.parquet.parts"
    work.mkdir()
    (work / "manifest.tmp").write_text("{")
    (work / "notes.txt").write_text("mine")
    with pytest.raises(GacaError, match="not a gaca score work directory"):
        prepare_work_dir(work, {"tool": "gaca score"}, resume=False)
    assert sorted(os.listdir(work)) == ["manifest.tmp", "notes.txt"]


def test_partial_checkpoints_are_removed(tmp_path):
    """train-offline killed while saving a checkpoint leaves `step-N.tmp`; a resumed run
    removes it (complete checkpoints stay)."""
    from gaca_cli.lm.checkpoints import CHECKPOINTS_DIR, remove_partial_checkpoints

    root = tmp_path / CHECKPOINTS_DIR
    (root / "step-00000002").mkdir(parents=True)
    (root / "step-00000004.tmp" / "model").mkdir(parents=True)
    remove_partial_checkpoints(tmp_path)
    assert sorted(os.listdir(root)) == ["step-00000002"]
    remove_partial_checkpoints(tmp_path / "no-run-here")  # nothing to do


def test_an_output_that_cannot_be_created_is_one_gaca_error(tmp_path):
    """Where no file can be created (/proc refuses even root, whom permission bits do not
    stop), the write is a GacaError naming the output, not an OSError's traceback."""
    from gaca_cli.errors import GacaError

    for out in ("/proc/gaca-no-such-dir/out.parquet", "/proc/out.parquet"):
        with pytest.raises(GacaError, match=f"cannot write {out}"), atomic_path(out):
            raise AssertionError("the block must not run")


def test_a_device_or_pipe_is_never_replaced(tmp_path):
    """-o naming a FIFO (as /dev/null is a device) is refused; the FIFO stays."""
    import stat

    from gaca_cli.errors import GacaError

    fifo = tmp_path / "out.parquet"
    os.mkfifo(fifo)
    with pytest.raises(GacaError, match="not a regular file"), atomic_path(fifo):
        raise AssertionError("the block must not run")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["out.parquet"]
