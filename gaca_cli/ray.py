"""`gaca advantages` on a Ray Data dataset, computed on Ray's workers (docs/python-api.md).

Each block runs `gaca advantages` on its episode groups in place, less those with a trajectory
cut by the block's edges; a group found afterwards in more than one block is computed again.
Only the rows of such split groups are shuffled into buckets (hash of group_id; one
`map_groups` call per bucket, never per group); `step_group_id` gets each group's offset last.
What needs the whole log (`nll_scope="batch"`, `similarity_order="rows"`) is refused. Every row
equals the command's, bit for bit; rows come back by block, then bucket. The dataset's
DataContext (shared with the datasets made from it) gets op_resource_reservation_enabled=False
and the pull-based sort shuffle.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli.config import options_config
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C

_BUCKET, _GROUP_STEP_GROUPS, _WHOLE = "__gaca_bucket", "__gaca_group_step_groups", "__gaca_whole"  # temporary


def advantages(
    dataset: Any,
    *,
    method: str,
    column_map: Mapping[str, str] | None = None,
    rows_per_call: int = 200_000,
    **options: Any,
) -> Any:
    """A `ray.data.Dataset` of log rows -> one with the columns `gaca advantages` adds (and its
    other columns kept). `options` as `gaca_cli.advantages`; `rows_per_call` sizes the buckets
    of episode groups each worker call computes (its memory)."""
    config = options_config(AdvantagesConfig, options, method=method)
    if config.method == "gaca" and config.nll_scope == "batch":
        raise ValueError('nll_scope="batch" standardises NLL over the whole log; use "trajectory" or "group" on Ray')
    if config.anchor_similarity is not None and config.similarity_order == "rows":
        raise ValueError('similarity_order="rows" follows the file\'s row order, which Ray does not keep; use "sorted"')
    mapping = dict(column_map or {})
    group_column = mapping.get(C.GROUP_ID, C.GROUP_ID)
    blocks = {"batch_size": None, "batch_format": "pyarrow"}
    context = dataset.context  # shared by the datasets made from `dataset`, the result included
    # each stage's reserved share of the workers left them idle (10M rows: 17 s with it off, 22 s on)
    context.op_resource_reservation_enabled = False
    context.shuffle_strategy = "sort_shuffle_pull_based"  # 1.7x faster than hash here
    computed = dataset.map_batches(_compute_block, fn_args=(config, mapping), **blocks).materialize()
    summary = _summary(computed, group_column)  # a row per group and block
    blocks_of_group = summary.group_by(group_column).aggregate([([], "count_all")])
    spread = blocks_of_group.filter(pc.greater(blocks_of_group.column("count_all"), 1)).column(group_column)
    redo = summary.filter(pc.and_(summary.column(_WHOLE), pc.is_in(summary.column(group_column), value_set=spread)))
    redo = redo.column(group_column).combine_chunks()  # computed in a block, but rows of theirs lie in others
    done = computed.map_batches(_rows, fn_args=(True, group_column, redo, None), **blocks)
    in_place = pc.and_(summary.column(_WHOLE), pc.invert(pc.is_in(summary.column(group_column), value_set=redo)))
    parts, rest = [done], summary.filter(pc.invert(in_place))
    summary = summary.filter(in_place)
    if rest.num_rows:  # the rows of groups split across blocks: shuffled into buckets
        rest_rows = computed.map_batches(_rows, fn_args=(False, group_column, redo, dataset.columns()), **blocks)
        n_buckets = max(1, math.ceil(pc.sum(rest.column("count_all")).as_py() / rows_per_call))
        bucketed = rest_rows.map_batches(_add_bucket, fn_args=(group_column, n_buckets), batch_format="pyarrow")
        by_bucket = bucketed.groupby(_BUCKET, num_partitions=n_buckets)
        parts.append(by_bucket.map_groups(_compute, fn_args=(config, mapping), batch_format="pyarrow").materialize())
        summary = pa.concat_tables([summary, _summary(parts[1], group_column)], promote_options="permissive")
    out = done.union(*parts[1:]) if parts[1:] else done
    if _GROUP_STEP_GROUPS not in summary.column_names:  # the method writes no step_group_id
        return out
    step_groups = summary.group_by([group_column, _GROUP_STEP_GROUPS]).aggregate([]).sort_by(group_column)
    offset = np.cumsum(np.r_[0, step_groups.column(_GROUP_STEP_GROUPS).to_numpy()[:-1]])  # in sorted group_id order
    offsets = pa.table({"id": step_groups.column(group_column), "offset": offset})
    return out.map_batches(_number_step_groups, fn_args=(group_column, offsets), batch_format="pyarrow")


def _summary(dataset: Any, group: str) -> pa.Table:
    """(group_id, computed in place, step groups, rows) of a materialized dataset's blocks."""
    import ray

    task, keys = ray.remote(_group_sizes), [group, _WHOLE, _GROUP_STEP_GROUPS]  # _WHOLE null: by the shuffle
    tables = ray.get([task.remote(block, keys) for block in dataset.to_arrow_refs()])
    return pa.concat_tables(tables, promote_options="permissive")


def _group_sizes(batch: pa.Table, keys: list[str]) -> pa.Table:
    """The rows of each distinct value of the `keys` present."""
    keys = [c for c in keys if c in batch.column_names]
    return batch.group_by(keys).aggregate([([], "count_all")])


def _compute_block(block: pa.Table, config: AdvantagesConfig, mapping: dict[str, str]) -> pa.Table:
    """The episode groups of `block` computed in place, unless a trajectory of theirs is cut by
    the block's edges (steps not 0..T-1 here): those rows are flagged, to be shuffled. A group
    whose rows also lie in other blocks is found afterwards (`advantages`) and computed again."""
    if block.num_rows == 0:
        return block.append_column(_WHOLE, pa.array([], pa.bool_()))
    try:
        out = _compute(block, config, mapping)
        return out.append_column(_WHOLE, pa.repeat(True, len(out)))
    except GacaError:
        cut = _cut_groups(block, mapping)
        if len(cut) == 0:
            raise  # a broken rule, not the block's edges
    mask = pc.invert(pc.is_in(block.column(mapping.get(C.GROUP_ID, C.GROUP_ID)), value_set=cut))
    rest = _where(block.append_column(_WHOLE, mask), pc.invert(mask))  # flagged False
    if not pc.any(mask).as_py():
        return rest
    out = _compute(_where(block, mask), config, mapping)
    return pa.concat_tables([out.append_column(_WHOLE, pa.repeat(True, len(out))), rest], promote_options="permissive")


def _cut_groups(block: pa.Table, mapping: dict[str, str]) -> pa.Array:
    """The groups of `block` with a trajectory whose steps here are not 0..T-1."""
    group, traj, step = (mapping.get(name, name) for name in (C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX))
    aggregates = [(step, "min"), (step, "max"), (step, "count_distinct"), ([], "count_all")]
    trajs = block.group_by([group, traj]).aggregate(aggregates)
    n = trajs.column("count_all")
    whole = pc.and_(pc.equal(trajs.column(f"{step}_min"), 0), pc.equal(trajs.column(f"{step}_max"), pc.subtract(n, 1)))
    whole = pc.fill_null(pc.and_(whole, pc.equal(trajs.column(f"{step}_count_distinct"), n)), False)
    return pc.unique(trajs.filter(pc.invert(whole)).column(group).combine_chunks())


def _where(table: pa.Table, mask: pa.Array) -> pa.Table:
    """The rows of `table` where `mask` is true: a zero-copy slice when they are one run of rows
    (a block whose only split groups lie at its edges), else a filtered copy."""
    rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
    if len(rows) == 0 or rows[-1] - rows[0] + 1 == len(rows):
        return table.slice(rows[0] if len(rows) else 0, len(rows))
    return table.filter(mask)


def _rows(batch: pa.Table, in_place: bool, group: str, redo: pa.Array, columns: list[str] | None) -> Iterator[pa.Table]:
    """The rows computed in place (`in_place`: in a block that holds all of their group's rows) or
    the others (the input's `columns`: to shuffle); none if none."""
    mask = pc.and_(batch.column(_WHOLE), pc.invert(pc.is_in(batch.column(group), value_set=redo)))
    batch = _where(batch, (mask if in_place else pc.invert(mask)).combine_chunks()).drop_columns([_WHOLE])
    if batch.num_rows:
        yield batch.select(columns) if columns is not None else batch


def _add_bucket(batch: pa.Table, group_column: str, n_buckets: int) -> pa.Table:
    """The bucket of each row: a hash of its group_id (polars', stable across processes)."""
    import polars as pl

    ids = pl.from_arrow(batch.column(group_column).combine_chunks())
    bucket = (ids.cast(pl.String).hash(seed=0) % n_buckets).to_numpy().astype(np.int64)  # type: ignore[union-attr]
    return batch.append_column(_BUCKET, pa.array(bucket))


def _compute(bucket: pa.Table, config: AdvantagesConfig, mapping: dict[str, str]) -> pa.Table:
    """`gaca advantages` on whole episode groups; step_group_id numbered within each group,
    with the group's number of step groups beside it. The numpy code or the compiled loops are
    chosen as for a large log: a worker computes many blocks, so the loops' start-up is paid
    once per worker."""
    from gaca_cli.credit._compiled import COMPILED_FROM_ROWS
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.grouping import id_codes
    from gaca_cli.log.reading import memory_log

    table = bucket.drop_columns([_BUCKET]) if _BUCKET in bucket.column_names else bucket  # or a block
    run = compute_advantages(memory_log(table, mapping, "<ray block>"), config, path_rows=COMPILED_FROM_ROWS)
    out = run.table
    if C.STEP_GROUP_ID not in out.column_names:
        return out
    group = id_codes(run.log.table.column(C.GROUP_ID))[0]
    code = out.column(C.STEP_GROUP_ID).to_numpy()
    first = np.full(group.max() + 1, code.max() + 1)
    np.minimum.at(first, group, code)  # the codes of a group are consecutive
    size = np.bincount(group[np.unique(code, return_index=True)[1]], minlength=len(first))
    i = out.column_names.index(C.STEP_GROUP_ID)
    out = out.set_column(i, C.STEP_GROUP_ID, pa.array(code - first[group]))
    return out.append_column(_GROUP_STEP_GROUPS, pa.array(size[group]))


def _number_step_groups(batch: pa.Table, group_column: str, offsets: pa.Table) -> pa.Table:
    """step_group_id across the whole log: each group's offset added."""
    at = pc.index_in(batch.column(group_column), value_set=offsets.column("id"))
    shift = offsets.column("offset").take(at).to_numpy()
    i = batch.column_names.index(C.STEP_GROUP_ID)
    batch = batch.set_column(i, C.STEP_GROUP_ID, pa.array(batch.column(i).to_numpy() + shift))
    return batch.drop_columns([_GROUP_STEP_GROUPS])
