"""`gaca advantages` as a library call: log in, annotated table and summary out."""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli import __version__
from gaca_cli.credit import _compiled
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.estimators import ESTIMATORS, Advantages, Rollouts
from gaca_cli.credit.step_groups import similarity_key_codes, step_group_codes
from gaca_cli.credit.summary import summarize
from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import anchor_column, anchor_warnings, anchors_of
from gaca_cli.log.checks import CheckOptions, prepare_log, row_violation
from gaca_cli.log.grouping import contiguous_decoded
from gaca_cli.log.index import TrajectoryIndex
from gaca_cli.log.reading import Log, restore_column_names


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for one run of `gaca advantages`.

    The run makes few reference cycles but many small objects (page and footer headers), and
    with numba, polars and pyarrow loaded each full collection walks millions of live objects
    (~0.3 s a time, ~1 s a run at 10M rows). Reference counting still frees everything else
    at once; the collector runs again when the block ends."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def warm_up_kernels(n_rows: int) -> None:
    """Load the compiled loops a log of `n_rows` rows will use (numba's start-up, ~0.5 s), so
    that a reader can overlap it with reading the log; nothing for a log the numpy code
    computes (gaca_cli.credit._compiled)."""
    _compiled.warm_up(n_rows)


@dataclass(frozen=True)
class AdvantagesRun:
    log: Log  # the input as read (possibly only the columns the method uses)
    new_columns: pa.Table  # the method's columns, rows in the file's order
    metadata: dict[str, str]  # Parquet key/value metadata to write
    summary: dict  # JSON-ready run summary
    result: Advantages  # per-row arrays, rows in the file's order
    index: TrajectoryIndex

    def result_at(self, rows: np.ndarray) -> Advantages:
        """The per-row arrays of `result` at the given file rows (e.g. another index's order)."""
        values = {f.name: getattr(self.result, f.name) for f in fields(Advantages)}
        return Advantages(**{k: v[rows] if isinstance(v, np.ndarray) else v for k, v in values.items()})

    @property
    def table(self) -> pa.Table:
        """Every column read (original names; the tool's own earlier columns replaced) plus
        the method's columns."""
        return annotated_table(self.log.table, self.log.renamed, self.new_columns, self.log.source)


def _floats(log: Log, name: str) -> np.ndarray:
    """A numeric column as float64 [N] in file order (nulls become NaN)."""
    return log.table.column(name).cast(pa.float64()).to_numpy()


def nll_values(log: Log, name: str) -> np.ndarray:
    """The NLL column `name` (nll_mean or nll_sum) as float64 [N] in file order, NaN where the
    step has no action tokens: a null value, and for nll_sum also a null nll_mean (gaca score
    writes nll_sum 0 for an empty action, and nll_mean null)."""
    u = _floats(log, name)
    if name == C.NLL_SUM and C.NLL_MEAN in log.table.column_names:
        empty = log.table.column(C.NLL_MEAN).is_null().to_numpy(zero_copy_only=False)
        u = np.where(empty, np.nan, u)
    return u


def nll_source(names: Collection[str], nll_reduce: str) -> str | None:
    """The column gaca reads u_t from, among the columns `names`: the NLL column of
    `nll_reduce`, else `behavior_logprobs` when the log has no NLL column; None if neither."""
    wanted = C.NLL_MEAN if nll_reduce == "mean" else C.NLL_SUM
    if wanted in names:
        return wanted
    if C.NLL_MEAN not in names and C.NLL_SUM not in names and C.BEHAVIOR_LOGPROBS in names:
        return C.BEHAVIOR_LOGPROBS
    return None


def criticality(log: Log, config: AdvantagesConfig) -> tuple[np.ndarray, str]:
    """u_t per row, in file order (NaN = no action tokens), and the column it came from."""
    table = log.table
    wanted = C.NLL_MEAN if config.nll_reduce == "mean" else C.NLL_SUM
    source = nll_source(table.column_names, config.nll_reduce)
    if source == wanted:
        return nll_values(log, wanted), wanted
    if source == C.BEHAVIOR_LOGPROBS:
        lists = contiguous_decoded(table.column(C.BEHAVIOR_LOGPROBS))
        n = len(lists)
        lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(lists).cast(pa.float64()).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        total = np.bincount(parents, flat, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            u = -total / lengths if config.nll_reduce == "mean" else -total
        u = np.where(lengths > 0, u, np.nan)
        return u, C.BEHAVIOR_LOGPROBS
    other = C.NLL_SUM if wanted == C.NLL_MEAN else C.NLL_MEAN
    fix = (
        f"this log has '{other}': use --nll-reduce {'sum' if other == C.NLL_SUM else 'mean'}, or run `gaca score` again"
        if other in table.column_names
        else "run `gaca score` first"
    )
    raise GacaError(
        f"--nll-reduce {config.nll_reduce} needs column '{wanted}' (or behavior_logprobs and no NLL column); {fix}",
        file=log.source,
        column=wanted,
    )


def step_groups(log: Log, index: TrajectoryIndex, config: AdvantagesConfig) -> np.ndarray:
    """Step-group codes of every row (file order), numbered by first appearance in canonical
    (group_id, traj_id, step_idx) order, i.e. by episode group and then first step: the
    step_group_id written out, whatever the order of rows (and each episode group's codes
    together in memory for the maths)."""
    name = anchor_column(log.file_schema.names)
    assert name is not None  # checked by prepare_log
    anchors = anchors_of(log, name)
    if config.anchor_similarity is None:
        return step_group_codes(index, anchors)
    return similarity_key_codes(
        index, anchors, config.anchor_similarity, config.similarity_metric, config.similarity_order
    )


def compute_advantages(
    log: Log, config: AdvantagesConfig, row_return: np.ndarray | None = None, path_rows: int | None = None
) -> AdvantagesRun:
    """Check the log, run the configured estimator, and build the output table: with the
    numpy code or its compiled twins, chosen once for the run (gaca_cli.credit._compiled) for
    the log's rows or `path_rows` (a part of a larger log: Ray's blocks).
    `row_return`: R per row (float64 [N], file order) instead of the log's episode_reward; with
    episode statistics over trajectories, one value per trajectory (`Rollouts.row_return`)."""
    with _compiled.chosen(path_rows or log.table.num_rows) as kernels:
        return _compute(log, config, row_return, compiled=kernels is not None)


def _compute(log: Log, config: AdvantagesConfig, row_return: np.ndarray | None, compiled: bool) -> AdvantagesRun:
    # file order: gathers between the file and the index stay local in memory; nothing in the
    # results depends on it (sums run in value or canonical order)
    index, warnings = prepare_log(
        log, f"advantages:{config.method}", CheckOptions.COMPILED if compiled else CheckOptions.NONE
    )
    episode_reward = None
    if C.EPISODE_REWARD in log.table.column_names:
        episode_reward = _floats(log, C.EPISODE_REWARD)[index.rows(index.traj_start)]
    if row_return is not None:
        episode_reward = _check_row_return(log, index, row_return, config)
    step_group = u = None
    u_source = None
    if config.method in ("gigpo", "gaca", "hgpo"):
        step_group = step_groups(log, index, config)
    # exact anchor codes give the step-0 warning for free; grpo compares hashes (and confirms)
    exact = step_group if config.anchor_similarity is None else None
    warnings.update(anchor_warnings(log, index, exact))
    if config.method == "gaca":
        u, u_source = criticality(log, config)
    # every array per row in the file's order; the index walks each trajectory in step order
    rollouts = Rollouts(
        index=index,
        reward=_floats(log, C.REWARD),
        episode_reward=episode_reward,
        step_group=step_group,
        criticality=u,
        row_return=row_return if config.episode_stats == "steps" else None,
    )
    result = ESTIMATORS[config.method](rollouts, config)
    _check_finite(log, result)

    new_columns: dict[str, pa.Array] = {C.RETURN_TO_GO: pa.array(result.return_to_go)}
    if config.method != "hgpo" or config.base_group:  # hgpo: A^E only as its base group, no A^S
        new_columns[C.ADV_EPISODE] = pa.array(result.adv_episode)
    if config.method != "hgpo":
        new_columns[C.ADV_STEP] = pa.array(result.adv_step)
    if result.history_groups is not None:
        new_columns[C.HISTORY_GROUPS] = pa.array(result.history_groups)
    if step_group is not None and result.step_group_size is not None:
        new_columns[C.STEP_GROUP_ID] = pa.array(step_group)
        new_columns[C.STEP_GROUP_SIZE] = pa.array(result.step_group_size)
    if result.nll_z is not None and result.gaca_weight is not None:
        new_columns[C.NLL_Z] = pa.array(result.nll_z)
        new_columns[C.GACA_WEIGHT] = pa.array(result.gaca_weight)
    new_columns[C.ADVANTAGE] = pa.array(result.advantage)
    new_columns[C.ADV_METHOD] = pa.repeat(pa.scalar(config.method, pa.string()), index.n_rows)

    params = config.as_metadata()
    meta_value = {"tool": "gaca", "version": __version__, "method": config.method, "params": params}
    if u_source:
        meta_value["criticality_column"] = u_source
    metadata = dict(log.metadata)
    metadata[C.META_ADVANTAGES] = json.dumps(meta_value, sort_keys=True)
    summary = summarize(rollouts, result, config, warnings)
    summary["criticality_column"] = u_source
    return AdvantagesRun(
        log=log, new_columns=pa.table(new_columns), metadata=metadata, summary=summary, result=result, index=index
    )


def _check_row_return(log: Log, index: TrajectoryIndex, row_return: np.ndarray, config: AdvantagesConfig) -> np.ndarray:
    """R of each trajectory (its first row's) from a return per row: finite and, with episode
    statistics over trajectories, the same on every row of a trajectory."""
    first = row_return[index.rows(index.traj_start)]
    rows = np.flatnonzero(~np.isfinite(row_return))
    rule = "must be finite (no NaN, no ±inf)"
    if not len(rows) and config.episode_stats == "trajectories":
        rows = np.flatnonzero(row_return != first[index.row_traj])
        rule = "episode statistics over trajectories need one score per trajectory; use episode_stats='steps'"
    if len(rows):
        raise row_violation(log, C.EPISODE_REWARD, rule, rows)
    return first


def _check_finite(log: Log, result: Advantages) -> None:
    for name in ("return_to_go", "adv_episode", "adv_step", "advantage"):
        values = getattr(result, name)
        if not np.all(np.isfinite(values)):
            raise GacaError(
                f"{name} overflowed float64 (rewards too large to accumulate); rescale the rewards",
                file=log.source,
                column=C.REWARD,
            )


def annotated_table(
    table: pa.Table, renamed: Mapping[str, str], new_columns: pa.Table, source: str | None = None
) -> pa.Table:
    """`table` without the tool's own columns, names restored, with `new_columns` appended."""
    owned = set(C.ADVANTAGES_OUTPUTS)
    out = table.select([n for n in table.column_names if n not in owned])
    out = restore_column_names(out, renamed)
    _check_no_clash(out.column_names, renamed, new_columns, source)
    for name, column in zip(new_columns.column_names, new_columns.columns):
        out = out.append_column(name, column)
    return out


def _check_no_clash(kept: Sequence[str], renamed: Mapping[str, str], new_columns: pa.Table, source: str | None) -> None:
    """Refuse a kept input column (file name) that a new column would overwrite: one mapped
    away with `--map` so that its name in the file is an output's."""
    clash = [n for n in new_columns.column_names if n in set(kept)]
    if clash:
        mapped = {old: new for new, old in renamed.items()}
        raise GacaError(
            f"--map {mapped.get(clash[0], '?')}={clash[0]}: the log's column '{clash[0]}' would be overwritten by "
            "the output column of that name; rename it in the log first",
            file=source,
            column=clash[0],
        )
