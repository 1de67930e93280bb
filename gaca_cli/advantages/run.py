"""`gaca advantages` as a library call: log in, annotated table and summary out."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli import __version__
from gaca_cli.log import columns as C
from gaca_cli.log.checks import StepIndex, prepare_log
from gaca_cli.log.anchors import anchor_column, anchor_warnings, anchors_of
from gaca_cli.errors import GacaError
from gaca_cli.advantages.estimators import ESTIMATORS, Advantages, StepArrays
from gaca_cli.advantages.config import AdvantagesConfig
from gaca_cli.log.grouping import plain
from gaca_cli.advantages.step_groups import similarity_key_codes, step_group_codes
from gaca_cli.log.io import Log


#: low-cardinality columns worth dictionary-encoding when the whole table is rewritten


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


@dataclass(frozen=True)
class AdvantagesRun:
    log: Log  # the input as read (possibly only the columns the method uses)
    new_columns: pa.Table  # the method's columns, rows in the file's order
    metadata: dict[str, str]  # Parquet key/value metadata to write
    summary: dict  # JSON-ready run summary
    result: Advantages  # per-row arrays, rows in the file's order
    index: StepIndex

    def result_at(self, rows: np.ndarray) -> Advantages:
        """The per-row arrays of `result` at the given file rows (e.g. another index's order)."""
        arrays = {
            f.name: (getattr(self.result, f.name)[rows] if isinstance(getattr(self.result, f.name), np.ndarray)
                     else getattr(self.result, f.name))
            for f in fields(Advantages)
        }
        return Advantages(**arrays)

    @property
    def table(self) -> pa.Table:
        """Every column read (original names; the tool's own earlier columns replaced) plus
        the method's columns."""
        from gaca_cli.advantages.writing import annotated_table

        return annotated_table(self.log.table, self.log.renamed, self.new_columns, self.log.source)


def _floats(log: Log, name: str) -> np.ndarray:
    """A numeric column as float64 [N] in file order (nulls become NaN)."""
    return log.table.column(name).cast(pa.float64()).to_numpy()


def criticality(log: Log, config: AdvantagesConfig) -> tuple[np.ndarray, str]:
    """u_t per row, in file order (NaN = no action tokens), and the column it came from."""
    table = log.table
    wanted = C.NLL_MEAN if config.nll_reduce == "mean" else C.NLL_SUM
    if wanted in table.column_names:
        return _floats(log, wanted), wanted
    has_nll = C.NLL_MEAN in table.column_names or C.NLL_SUM in table.column_names
    if not has_nll and C.BEHAVIOR_LOGPROBS in table.column_names:
        lists = plain(table.column(C.BEHAVIOR_LOGPROBS))
        n = len(lists)
        lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = pc.list_flatten(lists).cast(pa.float64()).to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        total = np.bincount(parents, flat, minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            u = -total / lengths if config.nll_reduce == "mean" else -total
        u = np.where(lengths > 0, u, np.nan)
        return u, C.BEHAVIOR_LOGPROBS
    raise GacaError(
        f"--nll-reduce {config.nll_reduce} needs column '{wanted}' (or behavior_logprobs and no NLL column); "
        "run `gaca score` first",
        file=log.source,
        column=wanted,
    )


def step_groups(log: Log, index: StepIndex, config: AdvantagesConfig) -> np.ndarray:
    """Step-group codes of every row (file order), numbered by first appearance in canonical
    (group_id, traj_id, step_idx) order, i.e. by episode group and then first step: the
    step_group_id written out, whatever the order of rows (and each episode group's codes
    together in memory for the maths)."""
    name = anchor_column(log.file_schema.names)
    assert name is not None  # checked by prepare_log
    anchors = anchors_of(log, name)
    if config.anchor_similarity is None:
        return step_group_codes(index.trajectories, anchors)
    return similarity_key_codes(index.trajectories, anchors, config.anchor_similarity)


def compute_advantages(log: Log, config: AdvantagesConfig) -> AdvantagesRun:
    """Check the log, run the configured estimator, and build the output table."""
    # file order: gathers between the file and the index stay local in memory; nothing in the
    # results depends on it (sums run in value or canonical order)
    index, warnings = prepare_log(
        log, f"advantages:{config.method}", canonical=False, anchor_warnings=False, compiled=True
    )
    episode_reward = None
    if C.EPISODE_REWARD in log.table.column_names:
        episode_reward = _floats(log, C.EPISODE_REWARD)[index.trajectories.rows(index.traj_start)]
    step_group = u = None
    u_source = None
    if config.method in ("gigpo", "gaca"):
        step_group = step_groups(log, index, config)
    # exact anchor codes give the step-0 warning for free; grpo compares hashes (and confirms)
    exact = step_group if config.anchor_similarity is None else None
    warnings.update(anchor_warnings(log, index, exact))
    if config.method == "gaca":
        u, u_source = criticality(log, config)
    # every array per row in the file's order; `rows` walks each trajectory in step order
    arrays = StepArrays(
        rows=index.trajectories.order_or_empty,
        traj_start=index.traj_start,
        traj_len=index.traj_len,
        traj=index.row_traj,
        traj_group=index.traj_group,
        walk=index.trajectories.walk[0],
        n_groups=index.n_groups,
        reward=_floats(log, C.REWARD),
        episode_reward=episode_reward,
        step_group=step_group,
        criticality=u,
    )
    result = ESTIMATORS[config.method](arrays, config)
    _check_finite(log, result)

    new_columns: dict[str, pa.Array] = {
        C.RETURN_TO_GO: pa.array(result.return_to_go),
        C.ADV_EPISODE: pa.array(result.adv_episode),
        C.ADV_STEP: pa.array(result.adv_step),
    }
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
    import json

    metadata = dict(log.metadata)
    metadata[C.META_ADVANTAGES] = json.dumps(meta_value, sort_keys=True)
    summary = summarize(index, arrays, result, config, warnings)
    summary["criticality_column"] = u_source
    return AdvantagesRun(
        log=log, new_columns=pa.table(new_columns), metadata=metadata, summary=summary, result=result, index=index
    )


def _check_finite(log: Log, result: Advantages) -> None:
    for name in ("return_to_go", "adv_episode", "adv_step", "advantage"):
        values = getattr(result, name)
        if not np.all(np.isfinite(values)):
            raise GacaError(
                f"{name} overflowed float64 (rewards too large to accumulate); rescale the rewards",
                file=log.source,
                column=C.REWARD,
            )


_SIZE_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, 4, "3-4"), (5, 8, "5-8"), (9, 16, "9-16"), (17, None, "17+"))


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def summarize(
    index: StepIndex, arrays: StepArrays, result: Advantages, config: AdvantagesConfig, warnings: dict[str, int]
) -> dict:
    """The run summary printed on stderr (and by --json on stdout); every figure is the same
    whatever the order of rows in the file: sums run per trajectory in step order
    (kernels.trajectory_summary), then over the trajectories in canonical order."""
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    n = index.n_rows
    order = index.canonical_traj_order

    def total(per_traj: np.ndarray) -> float:
        return float(np.sum(per_traj[order]))

    lam, u = result.gaca_weight, arrays.criticality
    with_lam = lam is not None and u is not None
    none = np.zeros(0)
    abs_e, abs_s, lam_sum, sx, su, count = kernels.trajectory_summary(
        result.adv_episode, result.adv_step, float(config.step_weight), lam if with_lam else none,
        u if with_lam else none, arrays.rows, arrays.traj_start, arrays.traj_len,
    )
    traj_per_group = np.bincount(index.traj_group, minlength=index.n_groups)
    summary: dict = {
        "method": config.method,
        "params": config.as_metadata(),
        "rows": n,
        "trajectories": index.n_traj,
        "groups": index.n_groups,
        "singleton_groups": int(np.sum(traj_per_group == 1)),
        "mean_abs_adv_episode": total(abs_e) / n,
        "mean_abs_weighted_adv_step": total(abs_s) / n,
        "diagnostics": dict(result.diagnostics),
        "warnings": dict(warnings),
    }
    if result.step_group_size is not None:
        top = _SIZE_BUCKETS[-1][0]
        by_size = np.bincount(np.minimum(result.step_group_size, top), minlength=top + 1)
        counts = [int(by_size[lo: top + 1 if hi is None else hi + 1].sum()) for lo, hi, _ in _SIZE_BUCKETS]
        summary["steps_by_step_group_size"] = {label: int(c) for (_, _, label), c in zip(_SIZE_BUCKETS, counts)}
        summary["step_signal_share"] = float((n - counts[0]) / n)
    else:
        summary["step_signal_share"] = 0.0
    if with_lam:
        summary["lambda"] = {
            "bar": config.lambda_bar,
            "mean": total(lam_sum) / n,
            "min": float(lam.min()),
            "max": float(lam.max()),
            "corr_with_nll": _correlation(lam, u, arrays, total, (total(sx), total(su), total(count))),
        }
    return summary


def _correlation(
    x: np.ndarray, u: np.ndarray, arrays: StepArrays, total, first: tuple[float, float, float]
) -> float | None:
    """Pearson correlation of x and u over the rows where u is not NaN (None when fewer than
    two rows or either side is constant). `first`: Σx, Σu and the number of such rows (from
    the summary's pass); a second pass sums the centred squares and products per trajectory in
    step order (kernels.trajectory_sums), added by `total` over the trajectories in canonical
    order, so the result does not depend on the order of rows in the file."""
    from gaca_cli.advantages import _kernels as kernels  # numba: imported on use, not by `gaca --help`

    sum_x, sum_u, k = first
    if k < 2:
        return None
    rows, start, length = arrays.rows, arrays.traj_start, arrays.traj_len
    sxx, suu, sxu = kernels.trajectory_sums(x, u, rows, start, length, sum_x / k, sum_u / k)
    var_x, var_u = total(sxx), total(suu)
    if not (var_x > 0 and var_u > 0):
        return None
    return _finite_or_none(np.clip(total(sxu) / np.sqrt(var_x * var_u), -1.0, 1.0))
