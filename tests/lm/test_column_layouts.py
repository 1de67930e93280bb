"""Columns in every layout Arrow reads from Parquet give the same numbers as the plain ones in
`gaca score` and `gaca train-offline`: token-id and log-prob lists as list, large_list,
list_view, large_list_view or fixed_size_list (the view layouts here store their values last
row first, so a reader that took the offsets to be increasing would read the wrong tokens),
token ids of unsigned types, and text as string_view (what polars hands pyarrow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.log import columns as C
from tests.lm.test_score import score_lib
from tests.lm.test_train_offline import FAST, load_state, one_thread, run  # noqa: F401 (fixture)

LAYOUTS = ["list", "large_list", "list_view", "large_list_view", "fixed_size_list"]


def as_layout(values: list[list], value_type: pa.DataType, layout: str) -> pa.Array:
    if layout == "list":
        return pa.array(values, pa.list_(value_type))
    if layout == "large_list":
        return pa.array(values, pa.large_list(value_type))
    if layout == "fixed_size_list":
        return pa.array(values, pa.list_(value_type, len(values[0])))
    sizes = [len(v) for v in values]
    offsets = [sum(sizes[i + 1 :]) for i in range(len(values))]  # the last row's values first
    flat = pa.array([x for v in reversed(values) for x in v], value_type)
    kind = pa.ListViewArray if layout == "list_view" else pa.LargeListViewArray
    index = pa.int32() if layout == "list_view" else pa.int64()
    array = kind.from_arrays(pa.array(offsets, index), pa.array(sizes, index), flat)
    assert array.to_pylist() == values
    return array


def id_rows(n_groups: int = 2, n_trajs: int = 2, n_steps: int = 2) -> dict[str, list]:
    """Steps given as token ids only: contexts of 10 tokens, actions of 3 (fixed sizes, so that
    fixed_size_list can hold them)."""
    rng = np.random.default_rng(5)
    cols: dict[str, list] = {k: [] for k in (C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.REWARD, C.ADVANTAGE)}
    cols |= {C.PROMPT_TOKEN_IDS: [], C.ACTION_TOKEN_IDS: [], C.BEHAVIOR_LOGPROBS: []}
    for g in range(n_groups):
        for t in range(n_trajs):
            for s in range(n_steps):
                cols[C.GROUP_ID].append(f"g{g}")
                cols[C.TRAJ_ID].append(f"g{g}t{t}")
                cols[C.STEP_IDX].append(s)
                cols[C.REWARD].append(float(t))
                cols[C.ADVANTAGE].append(float(t) - 0.5 + 0.1 * s)
                cols[C.PROMPT_TOKEN_IDS].append(rng.integers(5, 250, 10).tolist())
                cols[C.ACTION_TOKEN_IDS].append(rng.integers(5, 250, 3).tolist())
                cols[C.BEHAVIOR_LOGPROBS].append((-rng.random(3) * 4).astype(np.float32).tolist())
    return cols


def write(path: Path, cols: dict[str, list], layouts: dict[str, str], id_type: pa.DataType = pa.int32()) -> Path:
    types = {C.PROMPT_TOKEN_IDS: id_type, C.ACTION_TOKEN_IDS: id_type, C.BEHAVIOR_LOGPROBS: pa.float32()}
    arrays = {
        name: as_layout(values, types[name], layouts.get(name, "list")) if name in types else pa.array(values)
        for name, values in cols.items()
    }
    pq.write_table(pa.table(arrays), path)
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_score_reads_token_ids_in_every_list_layout(tiny_llama, tmp_path, layout):
    cols = id_rows()
    want = score_lib(write(tmp_path / "list.parquet", cols, {}), tiny_llama, tmp_path / "a.parquet")
    layouts = {C.PROMPT_TOKEN_IDS: layout, C.ACTION_TOKEN_IDS: layout}
    log = write(tmp_path / f"{layout}.parquet", cols, layouts)
    assert str(pq.read_schema(log).field(C.ACTION_TOKEN_IDS).type).startswith(layout)
    got = score_lib(log, tiny_llama, tmp_path / "b.parquet")
    assert got.summary["context_sources"]["token_ids"] == len(cols[C.REWARD])
    assert got.table.column(C.NLL_SUM).equals(want.table.column(C.NLL_SUM))
    assert got.table.column(C.N_ACTION_TOKENS).equals(want.table.column(C.N_ACTION_TOKENS))


def test_train_offline_reads_behavior_logprobs_in_every_list_layout(tiny_llama, tmp_path):
    cols = id_rows()
    common = ["--model", tiny_llama, "--loss", "ppo", "--max-steps", "1", "--seed", "3", *FAST]
    states = {}
    for layout in LAYOUTS:
        log = write(tmp_path / f"{layout}.parquet", cols, {C.BEHAVIOR_LOGPROBS: layout, C.ACTION_TOKEN_IDS: layout})
        res = run([log, *common, "-o", tmp_path / layout])
        assert res.exit_code == 0, res.output
        states[layout] = load_state(tmp_path / layout)
    for layout in LAYOUTS[1:]:
        for name, tensor in states["list"].items():
            assert tensor.equal(states[layout][name]), (layout, name)


@pytest.mark.parametrize("id_type", [pa.uint16(), pa.uint32(), pa.int64()])
def test_score_reads_token_ids_of_every_integer_type(tiny_llama, tmp_path, id_type):
    cols = id_rows()
    want = score_lib(write(tmp_path / "list.parquet", cols, {}), tiny_llama, tmp_path / "a.parquet")
    got = score_lib(write(tmp_path / f"{id_type}.parquet", cols, {}, id_type), tiny_llama, tmp_path / "b.parquet")
    assert got.table.column(C.NLL_SUM).equals(want.table.column(C.NLL_SUM))


def test_score_and_train_read_text_held_as_string_view(tiny_llama, tmp_path):
    """prompt and action as string_view, which pyarrow cannot take rows from."""
    from tests.lm.test_score import make_rows

    rows = make_rows(groups=2, trajs=2, steps=2, seed=3)
    table = pa.Table.from_pylist(rows)
    table = table.append_column(C.ADVANTAGE, pa.array(np.linspace(-1, 1, table.num_rows)))
    plain_log = tmp_path / "plain.parquet"
    pq.write_table(table, plain_log)

    def views(t: pa.DataType) -> pa.DataType:  # top-level only: pyarrow cannot write nested views
        return pa.string_view() if pa.types.is_string(t) or pa.types.is_large_string(t) else t

    viewed = table.cast(pa.schema([f.with_type(views(f.type)) for f in table.schema]))
    view_log = tmp_path / "views.parquet"
    pq.write_table(viewed, view_log)
    assert pq.read_schema(view_log).field(C.ACTION).type == pa.string_view()
    for context in ("prompt", "messages"):
        want = score_lib(plain_log, tiny_llama, tmp_path / f"a-{context}.parquet", context=context)
        got = score_lib(view_log, tiny_llama, tmp_path / f"b-{context}.parquet", context=context)
        assert got.table.column(C.NLL_SUM).equals(want.table.column(C.NLL_SUM)), context
    common = ["--model", tiny_llama, "--loss", "pg", "--max-steps", "1", *FAST]
    for name, log in (("plain", plain_log), ("views", view_log)):
        assert run([log, *common, "-o", tmp_path / name]).exit_code == 0
    a, b = load_state(tmp_path / "plain"), load_state(tmp_path / "views")
    assert all(a[k].equal(b[k]) for k in a)
