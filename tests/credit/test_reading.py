"""What `gaca advantages` reads: only the columns the method uses (type and null rules still apply
to every column, from the footers), and the anchor column, grouped exactly."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.credit import reading
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.reading import read_for_advantages
from gaca_cli.credit.run import compute_advantages
from gaca_cli.errors import GacaError
from gaca_cli.log import anchors as anchors_module
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import StreamedAnchors
from tests.credit.conftest import (
    METHODS,
    assert_same_file_content,
    error_lines,
    invoke,
    library_run,
    run_ok,
)

# --------------------------------------------------------------------------- 7. unused columns


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("anchors", ["held", "streamed"])
def test_columns_read_by_each_method(rich_log, monkeypatch, method, anchors):
    if anchors == "streamed":
        stream_anchors(monkeypatch)
    log = read_for_advantages([str(rich_log)], {}, AdvantagesConfig(method=method))
    names = set(log.table.column_names)
    assert {C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.REWARD, C.DONE, C.BEHAVIOR_LOGPROBS} <= names
    assert not names & {C.PROMPT, C.ACTION, "info", "tag"}
    # the anchor (gigpo/gaca group by it; every method reports its warnings): a small column
    # is read and held, a large one left on disk, its hashes kept
    assert (C.ANCHOR_OBS in names) == (anchors == "held")
    assert isinstance(log.cache.get(("anchors", C.ANCHOR_OBS)), StreamedAnchors) == (anchors == "streamed")
    assert set(log.file_schema.names) == set(pq.read_schema(rich_log).names)  # every column's type known


def stream_anchors(monkeypatch, batch_bytes: int = 300) -> None:
    """Leave every anchor column on disk (as a large one is), read in batches of a few rows."""
    monkeypatch.setattr(reading, "HOLD_ANCHOR_BYTES", 0)
    monkeypatch.setattr(anchors_module, "BATCH_BYTES", batch_bytes)


def run_of(path: Path, config: AdvantagesConfig):
    """What `gaca advantages` computes for one file (no output written)."""
    return compute_advantages(read_for_advantages([str(path)], {}, config), config)


def streamed_then_held(path: Path, config: AdvantagesConfig, anchor: str, monkeypatch):
    """The run with the anchor column left on disk (checked to be), and the run with it held."""
    with monkeypatch.context() as m:
        stream_anchors(m)
        log = read_for_advantages([str(path)], {}, config)
        assert isinstance(log.cache[("anchors", anchor)], StreamedAnchors)
        assert len(log.cache[("anchors", anchor)]._batch_file) > 3
        streamed = compute_advantages(log, config)
    log = read_for_advantages([str(path)], {}, config)
    assert anchor in log.table.column_names
    return streamed, compute_advantages(log, config)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("similarity", [None, 0.5])
@pytest.mark.parametrize("layout", ["plain", "dictionary", "pages"])
def test_streamed_anchors_give_the_outputs_of_held_anchors(tmp_path, rich_log, monkeypatch, method, similarity, layout):
    """The anchors left on disk (hashes kept, texts read again to confirm) and the anchors
    held in memory by polars give the same file, summary included, whatever the anchor
    column's encoding."""
    table = pq.read_table(rich_log)
    path = tmp_path / "log.parquet"
    options = {
        "plain": {"use_dictionary": False},
        "dictionary": {"use_dictionary": True},
        "pages": {"use_dictionary": False, "data_page_size": 64, "data_page_version": "2.0"},
    }[layout]
    pq.write_table(table, path, row_group_size=9, **options)
    params = {} if similarity is None else {"anchor_similarity": similarity}
    config = AdvantagesConfig(method=method, **params)
    streamed, held = streamed_then_held(path, config, C.ANCHOR_OBS, monkeypatch)
    assert streamed.new_columns.equals(held.new_columns)
    assert streamed.summary == held.summary
    assert streamed.summary["warnings"]["empty_anchors"] == 1
    assert streamed.summary["warnings"]["differing_initial_anchors"] == 1


@pytest.mark.parametrize("method", ["gigpo", "gaca"])
def test_streamed_anchor_key_wins_and_matches_the_held_key(tmp_path, rich_log, monkeypatch, method):
    """A string `anchor_key` (coarser than the text here) is the column streamed, and gives
    what holding it gives."""
    table = pq.read_table(rich_log)
    key = pa.array([f"k{len(t)}" for t in table[C.ANCHOR_OBS].to_pylist()], pa.string())
    path = tmp_path / "keyed.parquet"
    pq.write_table(table.append_column(C.ANCHOR_KEY, key), path, row_group_size=9)
    config = AdvantagesConfig(method=method)
    streamed, held = streamed_then_held(path, config, C.ANCHOR_KEY, monkeypatch)
    assert streamed.new_columns.equals(held.new_columns)
    assert streamed.summary == held.summary
    groups = streamed.new_columns.column(C.STEP_GROUP_ID).to_numpy()
    plain = run_of(rich_log, config)
    assert len(np.unique(groups)) < len(np.unique(plain.new_columns.column(C.STEP_GROUP_ID).to_numpy()))


@pytest.mark.parametrize("method", ["grpo", "gigpo", "gaca"])
@pytest.mark.parametrize("modulus", [1, 3])
def test_streamed_anchors_with_colliding_hashes(tmp_path, rich_log, monkeypatch, method, modulus):
    """Hashes of the streamed anchors folded into `modulus` values (collisions everywhere,
    inside and across batches and row groups): the exact comparisons split them again, and
    outputs and warnings are those of the honest hashes."""
    config = AdvantagesConfig(method=method)
    honest = run_of(rich_log, config)
    stream_anchors(monkeypatch)
    real = StreamedAnchors.file_hashes
    monkeypatch.setattr(StreamedAnchors, "file_hashes", lambda self: real(self) % np.uint64(modulus))
    log = read_for_advantages([str(rich_log)], {}, config)
    assert isinstance(log.cache[("anchors", C.ANCHOR_OBS)], StreamedAnchors)
    folded = compute_advantages(log, config)
    assert folded.new_columns.equals(honest.new_columns)
    assert folded.summary == honest.summary


def test_held_and_streamed_anchors_write_the_same_file(tmp_path, rich_log, monkeypatch):
    """Whether the anchor column is held (read after the others, only it) or left on disk,
    the output file is the same."""
    held_out, streamed_out = tmp_path / "held.parquet", tmp_path / "streamed.parquet"
    assert library_run([rich_log], "gaca", held_out) == "spliced"
    stream_anchors(monkeypatch)
    assert library_run([rich_log], "gaca", streamed_out) == "spliced"
    assert_same_file_content(held_out, streamed_out)


def test_large_anchor_columns_are_left_on_disk(tmp_path, rich_log, monkeypatch):
    """The choice follows the column's estimated size in memory (from the footers): above
    HOLD_ANCHOR_BYTES it stays on disk; integer keys and directories are always held."""
    size = StreamedAnchors.from_files([str(rich_log)], C.ANCHOR_OBS).nbytes
    for limit, streamed in ((size, False), (size - 1, True)):
        monkeypatch.setattr(reading, "HOLD_ANCHOR_BYTES", limit)
        log = read_for_advantages([str(rich_log)], {}, AdvantagesConfig(method="gigpo"))
        assert isinstance(log.cache.get(("anchors", C.ANCHOR_OBS)), StreamedAnchors) == streamed
    monkeypatch.setattr(reading, "HOLD_ANCHOR_BYTES", 0)
    table = pq.read_table(rich_log)
    keys = pa.array([len(t) for t in table[C.ANCHOR_OBS].to_pylist()], pa.int64())
    keyed = tmp_path / "int-key.parquet"
    pq.write_table(table.append_column(C.ANCHOR_KEY, keys), keyed)
    log = read_for_advantages([str(keyed)], {}, AdvantagesConfig(method="gigpo"))
    assert C.ANCHOR_KEY in log.table.column_names and not log.cache
    directory = tmp_path / "dir"
    directory.mkdir()
    pq.write_table(table, directory / "part-0.parquet")
    log = read_for_advantages([str(directory)], {}, AdvantagesConfig(method="gigpo"))
    assert C.ANCHOR_OBS in log.table.column_names and not log.cache


def test_streamed_anchor_under_a_mapped_name(tmp_path, rich_log, monkeypatch):
    """`--map anchor_obs=obs`: the column streamed is the file's `obs`."""
    table = pq.read_table(rich_log)
    path = tmp_path / "mapped.parquet"
    pq.write_table(
        table.rename_columns(["obs" if n == C.ANCHOR_OBS else n for n in table.column_names]), path, row_group_size=9
    )
    config = AdvantagesConfig(method="gigpo")
    stream_anchors(monkeypatch)
    log = read_for_advantages([str(path)], {C.ANCHOR_OBS: "obs"}, config)
    assert log.cache[("anchors", C.ANCHOR_OBS)].column == "obs"
    got = compute_advantages(log, config)
    assert got.new_columns.equals(run_of(rich_log, config).new_columns)


@pytest.mark.parametrize("statistics", [True, False])
def test_null_prompt_is_an_error_without_reading_the_prompts(
    tmp_path, example_table, write_paths, statistics, monkeypatch
):
    """advantages does not read the prompts, yet runs the same null check as validate: from
    the footer's null counts when the file has statistics (the column is then never read),
    else by reading that column alone. One Error line naming the rows, no output."""
    prompts = example_table[C.PROMPT].to_pylist()
    prompts[3] = prompts[10] = None
    table = example_table.set_column(
        example_table.schema.get_field_index(C.PROMPT), C.PROMPT, pa.array(prompts, pa.large_string())
    )
    src = tmp_path / "nulls.parquet"
    pq.write_table(table, src, write_statistics=statistics)
    clean = tmp_path / "clean.parquet"
    pq.write_table(example_table, clean, write_statistics=statistics)
    for method in METHODS:
        out = tmp_path / f"{method}.parquet"
        res = invoke("advantages", src, "--method", method, "-o", out)
        assert res.exit_code == 1, res.output
        lines = error_lines(res)
        assert len(lines) == 1 and "'prompt'" in lines[0] and "null" in lines[0], res.stderr
        assert not out.exists()
    res = invoke("validate", src)
    assert res.exit_code == 1, res.output
    assert "prompt" in res.output and "null" in res.output
    # with statistics a clean log's prompts are never read
    from gaca_cli.log.reading import Log

    reads = []
    original, nulls = Log.read_column, Log.null_rows
    monkeypatch.setattr(Log, "read_column", lambda self, column: reads.append(column) or original(self, column))
    monkeypatch.setattr(Log, "null_rows", lambda self, column: reads.append(column) or nulls(self, column))
    run_ok("advantages", clean, "--method", "gaca", "-o", tmp_path / "clean-out.parquet")
    assert (C.PROMPT in reads) == (not statistics)


@pytest.mark.parametrize("method", METHODS)
def test_prompt_of_unusable_type_is_an_error(tmp_path, example_table, write_paths, method):
    table = example_table.set_column(
        example_table.schema.get_field_index(C.PROMPT), C.PROMPT, pa.array(np.arange(example_table.num_rows))
    )
    src, out = tmp_path / "int-prompt.parquet", tmp_path / "out.parquet"
    pq.write_table(table, src)
    res = invoke("advantages", src, "--method", method, "-o", out)
    assert res.exit_code == 1, res.output
    lines = error_lines(res)
    assert len(lines) == 1, res.stderr
    assert "'prompt'" in lines[0] and "int64" in lines[0], lines[0]
    assert not out.exists()
    assert write_paths == []


# --------------------------------------------------------------------------- 8. anchors


def test_grpo_needs_no_anchor(tmp_path, example_table, write_paths):
    src, out = tmp_path / "no-anchor.parquet", tmp_path / "out.parquet"
    pq.write_table(example_table.drop_columns([C.ANCHOR_OBS]), src)
    run_ok("advantages", src, "--method", "grpo", "-o", out)
    assert write_paths == ["spliced"]
    assert C.ANCHOR_OBS not in pq.read_table(out).column_names
    res = invoke("advantages", src, "--method", "gigpo", "-o", tmp_path / "gigpo.parquet")
    assert res.exit_code == 1, res.output
    assert len(error_lines(res)) == 1 and "anchor" in error_lines(res)[0], res.stderr


def test_null_anchor_is_an_error_for_every_method(tmp_path, example_table, write_paths):
    anchors = example_table[C.ANCHOR_OBS].to_pylist()
    anchors[5] = None
    table = example_table.set_column(
        example_table.schema.get_field_index(C.ANCHOR_OBS), C.ANCHOR_OBS, pa.array(anchors, pa.large_string())
    )
    src = tmp_path / "null-anchor.parquet"
    pq.write_table(table, src)
    for method in METHODS:
        bad_out = tmp_path / f"{method}.parquet"
        res = invoke("advantages", src, "--method", method, "-o", bad_out)
        assert res.exit_code == 1, res.output
        lines = error_lines(res)
        assert len(lines) == 1 and "'anchor_obs'" in lines[0], res.stderr
        assert not bad_out.exists()
    assert write_paths == []


def test_a_log_changed_while_it_is_read_is_an_error(tmp_path, rich_log, monkeypatch):
    """The file rewritten (more rows) between reading the other columns and the anchor's
    footers: one Error, not anchors misaligned with the rows."""
    stream_anchors(monkeypatch)
    real = StreamedAnchors.from_files.__func__

    def rewritten_first(cls, files, column, batch_bytes=None):
        table = pq.read_table(rich_log)
        pq.write_table(pa.concat_tables([table, table]), rich_log)
        return real(cls, files, column, batch_bytes)

    monkeypatch.setattr(StreamedAnchors, "from_files", classmethod(rewritten_first))
    with pytest.raises(GacaError, match="changed"):
        read_for_advantages([str(rich_log)], {}, AdvantagesConfig(method="gigpo"))


def test_a_batch_sized_log_never_loads_numba(tmp_path):
    """`gaca advantages` on the example log (a few hundred rows) runs the numpy code: the
    background warm-up, which reads the row count from the footers, leaves numba unloaded."""
    import subprocess
    import sys

    from tests.conftest import EXAMPLE_LOG

    code = (
        "import sys, threading\nfrom gaca_cli.cli import app\n"
        f"try:\n    app(args=['advantages', {str(EXAMPLE_LOG)!r}, '--method', 'gaca', '-o', {str(tmp_path / 'o.parquet')!r}],"
        " prog_name='gaca')\nexcept SystemExit:\n    pass\n"
        "[t.join() for t in threading.enumerate() if t.name == 'gaca-kernels']\n"
        "print('numba' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout


_ASSIGNMENTS_OFF_THE_MAIN_THREAD = """
import os, sys, threading, types

seen = []

class Watched(types.ModuleType):
    def __setattr__(self, name, value):
        if name in ("stdout", "stderr") and threading.current_thread() is not threading.main_thread():
            seen.append(name)
        super().__setattr__(name, value)

sys.__class__ = Watched
if {guard}:
    from gaca_cli.credit.reading import _numba_import_leaves_streams_alone
    print(_numba_import_leaves_streams_alone())


def load():  # what the warm-up does: import the kernels (numba), and load them (numba's targets)
    import gaca_cli.credit._kernels
    from numba.core.registry import cpu_target

    cpu_target.target_context.refresh()


thread = threading.Thread(target=load, name="gaca-kernels")
thread.start()
thread.join()
print(sorted(set(seen)), os.environ.get("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING"))
"""


def test_numba_imported_on_the_warm_up_thread_leaves_sys_stdout_and_stderr_alone():
    """numba's import wraps an error message of its own in colorama's init and deinit where
    colorama is importable (in any process that imported ray), and they assign sys.stdout and
    sys.stderr. On the warm-up thread that undid what the main thread assigned meanwhile: a
    test runner's capture found its stream closed. Unguarded (the first run) the assignments
    happen on the thread; guarded, none does, and the highlighting numba's default colour
    scheme makes a no-op is off."""
    import subprocess

    pytest.importorskip("colorama")

    def run(guard: bool) -> list[str]:
        code = _ASSIGNMENTS_OFF_THE_MAIN_THREAD.format(guard=guard)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("\n")[:-1]

    assert run(guard=False) == ["['stderr', 'stdout'] None"]
    assert run(guard=True) == ["True", "[] 1"]


@pytest.mark.parametrize(
    "numba,colorama,scheme,thread",
    [(False, False, "dark_bg", False), (True, True, "", False), (True, False, "", True)],
    ids=["a-chosen-colour-scheme", "numba-imported-with-colorama", "numba-imported-without-colorama"],
)
def test_where_numba_stays_off_the_warm_up_thread(monkeypatch, numba, colorama, scheme, thread):
    """A user who set NUMBA_COLOR_SCHEME keeps numba's highlighting, and numba already imported
    with colorama at hand highlights: numba is then not loaded on the warm-up thread (the main
    thread loads it when the run needs it)."""
    monkeypatch.delenv("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", raising=False)
    monkeypatch.setenv("NUMBA_COLOR_SCHEME", scheme)
    for name, present in (("numba", numba), ("colorama", colorama)):
        monkeypatch.delitem(sys.modules, name, raising=False)
        if present:
            monkeypatch.setitem(sys.modules, name, ModuleType(name))
    assert reading._numba_import_leaves_streams_alone() is thread
    assert "NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING" not in os.environ
