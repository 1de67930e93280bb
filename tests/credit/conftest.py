"""What the tests of `gaca advantages` output and input share: a rich random log, helpers that run
the command or the library, and exact comparisons of files and columns."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import gaca_cli.credit.writing as advantages_module
import gaca_cli.log._splice as parquet_splice
from gaca_cli.cli import app
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.reading import read_for_advantages
from gaca_cli.credit.run import compute_advantages
from gaca_cli.credit.writing import write_annotated
from gaca_cli.log import columns as C
from gaca_cli.log.reading import read_metadata

runner = CliRunner()


METHODS = ("grpo", "gigpo", "gaca", "hgpo")
METHOD_COLUMNS = {
    "grpo": {C.RETURN_TO_GO, C.ADV_EPISODE, C.ADV_STEP, C.ADVANTAGE, C.ADV_METHOD},
    "gigpo": {C.RETURN_TO_GO, C.ADV_EPISODE, C.ADV_STEP, C.STEP_GROUP_ID, C.STEP_GROUP_SIZE, C.ADVANTAGE, C.ADV_METHOD},
    "gaca": set(C.ADVANTAGES_OUTPUTS) - {C.HISTORY_GROUPS},
    "hgpo": {C.RETURN_TO_GO, C.HISTORY_GROUPS, C.ADVANTAGE, C.ADV_METHOD},  # and adv_episode with --base-group
}


def outputs_of(method: str) -> list[str]:
    """The method's columns, in the order they are appended (that of ADVANTAGES_OUTPUTS)."""
    return [n for n in C.ADVANTAGES_OUTPUTS if n in METHOD_COLUMNS[method]]


# --------------------------------------------------------------------------- helpers


def invoke(*args) -> object:
    return runner.invoke(app, [str(a) for a in args])


def run_ok(*args) -> str:
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    return res.stdout


def error_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]


@pytest.fixture
def write_paths(monkeypatch) -> list[str]:
    """The path ("spliced" / "rewritten") each `write_annotated` call of the CLI took."""
    taken: list[str] = []
    original = advantages_module.write_annotated

    def recording(*args, **kwargs):
        taken.append(original(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(advantages_module, "write_annotated", recording)
    return taken


def refuse_splice(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise parquet_splice.SpliceUnsupported("refused by the test")

    monkeypatch.setattr(parquet_splice, "splice_columns", refuse)


def record_fallbacks(monkeypatch) -> list[str]:
    """The messages of the SpliceFallbackWarnings `write_annotated` emits, recorded where it
    calls `warnings.warn` (pytest.warns can miss them: the kernel warm-up thread's own
    catch_warnings may restore another test's warning hooks while it runs)."""
    messages: list[str] = []

    def warn(message, category=None, stacklevel=1, **kwargs):
        assert isinstance(message, advantages_module.SpliceFallbackWarning), message
        messages.append(str(message))

    monkeypatch.setattr(advantages_module, "warnings", types.SimpleNamespace(warn=warn))
    return messages


def library_run(paths, method: str, out: Path, column_map=None, **params) -> str:
    """read_for_advantages -> compute_advantages -> write_annotated; returns the path taken."""
    config = AdvantagesConfig(method=method, **params)
    paths = [str(p) for p in paths]
    log = read_for_advantages(paths, column_map or {}, config)
    run = compute_advantages(log, config)
    return write_annotated(run, out, paths, column_map or {})


def kv_metadata(path: Path) -> dict[bytes, bytes]:
    """The file's key/value metadata without the Arrow schema (compared through read_table)."""
    meta = dict(pq.read_schema(path).metadata or {})
    meta.pop(b"ARROW:schema", None)
    return meta


def assert_same_file_content(a: Path, b: Path) -> None:
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.schema.equals(tb.schema, check_metadata=True), (ta.schema, tb.schema)
    for fa, fb in zip(ta.schema, tb.schema):  # field metadata too
        assert fa.metadata == fb.metadata, (fa, fb)
    assert ta.equals(tb, check_metadata=True)
    assert kv_metadata(a) == kv_metadata(b)
    assert read_metadata(str(a)) == read_metadata(str(b))


def sort_by_step(table: pa.Table, traj_col: str = C.TRAJ_ID) -> pa.Table:
    """Rows sorted by (traj_id as text, step_idx)."""
    key = pc.cast(table[traj_col], pa.string())
    return table.append_column("_traj_key", key).sort_by([("_traj_key", "ascending"), (C.STEP_IDX, "ascending")])


def assert_outputs_bit_identical(got: pa.Table, want: pa.Table, names) -> None:
    got, want = sort_by_step(got), sort_by_step(want)
    assert got.num_rows == want.num_rows
    assert got["_traj_key"].to_pylist() == want["_traj_key"].to_pylist()
    assert np.array_equal(got[C.STEP_IDX].to_numpy(), want[C.STEP_IDX].to_numpy())
    for name in names:
        if name == C.ADV_METHOD:
            assert got[name].to_pylist() == want[name].to_pylist()
            continue
        g = got[name].to_numpy().astype(np.float64)
        w = want[name].to_numpy().astype(np.float64)
        assert np.array_equal(g, w, equal_nan=True), name


def rich_table(seed: int = 0) -> pa.Table:
    """A small log with many Arrow types: large_string text, int32 steps, list<float32>
    log-probs, a struct, a dictionary-typed column, field metadata; 4 groups x 3 rollouts of
    2-4 steps whose observations repeat (so gigpo finds step groups), one empty anchor, one
    group whose rollouts start from different anchors, an `nll_mean` with one null (what gaca
    uses). Rows in canonical order."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list] = {
        k: []
        for k in (
            "group_id",
            "traj_id",
            "step_idx",
            "prompt",
            "action",
            "anchor_obs",
            "reward",
            "done",
            "behavior_logprobs",
            "nll_mean",
            "info",
            "tag",
        )
    }
    for g in range(4):
        for r in range(3):
            n_steps = int(rng.integers(2, 5))
            for t in range(n_steps):
                rows["group_id"].append(f"g{g}")
                rows["traj_id"].append(f"g{g}/r{r}")
                rows["step_idx"].append(t)
                rows["prompt"].append(f"task {g}; step {t}; rollout {r} ✓")
                rows["action"].append(f"act-{rng.integers(0, 3)}")
                anchor = f"room {g}-{min(t, int(rng.integers(0, 3)))}"
                if (g, r, t) == (1, 2, 0):
                    anchor = "another start"  # group g1's rollouts start from different anchors
                if (g, r, t) == (2, 0, 1):
                    anchor = ""  # an empty anchor
                rows["anchor_obs"].append(anchor)
                last = t == n_steps - 1
                rows["reward"].append(float(rng.integers(0, 2)) if last else -0.1)
                rows["done"].append(last)
                logprobs = [float(x) for x in -rng.random(int(rng.integers(1, 4)))]
                rows["behavior_logprobs"].append(logprobs)
                rows["nll_mean"].append(None if (g, r, t) == (3, 1, 0) else -sum(logprobs) / len(logprobs))
                rows["info"].append({"a": int(rng.integers(0, 100)), "b": f"x{t}"})
                rows["tag"].append(["red", "green", "blue"][int(rng.integers(0, 3))])
    schema = pa.schema(
        [
            pa.field("group_id", pa.string()),
            pa.field("traj_id", pa.string()),
            pa.field("step_idx", pa.int32()),
            pa.field("prompt", pa.large_string()),
            pa.field("action", pa.large_string()),
            pa.field("anchor_obs", pa.large_string()),
            pa.field("reward", pa.float64(), metadata={"unit": "points"}),
            pa.field("done", pa.bool_()),
            pa.field("behavior_logprobs", pa.list_(pa.float32())),
            pa.field("nll_mean", pa.float64()),
            pa.field("info", pa.struct([("a", pa.int64()), ("b", pa.string())])),
            pa.field("tag", pa.dictionary(pa.int32(), pa.string())),
        ],
        metadata={C.META_SCORE: json.dumps({"model": "tiny"}), "user.note": "kept?"},
    )
    return pa.table(rows, schema=schema)


def renamed(table: pa.Table, renames: dict[str, str]) -> pa.Table:
    """`table` with columns renamed, schema metadata kept (rename_columns drops it)."""
    out = table.rename_columns([renames.get(n, n) for n in table.column_names])
    return out.replace_schema_metadata(table.schema.metadata)


def shuffled(table: pa.Table, seed: int) -> pa.Table:
    perm = np.random.default_rng(seed).permutation(table.num_rows)
    return table.take(pa.array(perm))


@pytest.fixture(scope="module")
def example_table(example_log) -> pa.Table:
    return pq.read_table(example_log)


@pytest.fixture
def rich_log(tmp_path) -> Path:
    """The rich log, rows shuffled (file order != canonical order), in 3 row groups."""
    path = tmp_path / "rich.parquet"
    pq.write_table(shuffled(rich_table(), seed=1), path, row_group_size=14)
    return path
