"""`gaca advantages` as a library call: log in, annotated table and summary out."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli import __version__
from gaca_cli.log import columns as C
from gaca_cli.log.checks import StepIndex, prepare_log
from gaca_cli.log.anchors import anchor_column, anchor_warnings, anchors_of
from gaca_cli.errors import GacaError
from gaca_cli.advantages.estimators import ESTIMATORS, Advantages, AdvantagesConfig, StepArrays
from gaca_cli.log.grouping import plain
from gaca_cli.log.anchors import ScannedAnchors
from gaca_cli.advantages.step_groups import similarity_key_codes, step_group_codes
from gaca_cli.log.io import Log, atomic_path, expand_inputs, read_log, restore_column_names, write_parquet_atomic


#: low-cardinality columns worth dictionary-encoding when the whole table is rewritten
_DICTIONARY_COLUMNS = (C.ADV_METHOD, C.GROUP_ID, C.TRAJ_ID, C.SUCCESS, C.DONE)


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


def columns_read(config: AdvantagesConfig, names: Sequence[str]) -> list[str]:
    """The input columns `gaca advantages` reads: the required ones, every column with a value
    rule of log-schema.md (done, episode_reward, behavior_logprobs and action_token_ids, the
    NLL columns) and the anchor (used by gigpo and gaca; the anchor warnings for every method).
    Text it does not use (prompts, actions, observations) stays on disk: its type is checked
    from the files' footers and its nulls from their null counts (see checks._column_checks),
    and it is carried to the output as it is."""
    wanted = [C.GROUP_ID, C.TRAJ_ID, C.STEP_IDX, C.REWARD, C.DONE, C.EPISODE_REWARD]
    wanted += [C.BEHAVIOR_LOGPROBS, C.ACTION_TOKEN_IDS, C.NLL_MEAN, C.NLL_SUM]
    wanted.append(C.ANCHOR_KEY if C.ANCHOR_KEY in names else C.ANCHOR_OBS)  # grpo too: its warnings
    return [n for n in wanted if n in names]


def read_for_advantages(
    paths: Sequence[str | os.PathLike], column_map: Mapping[str, str], config: AdvantagesConfig
) -> Log:
    """The columns of the log that `config`'s method reads (`columns_read`), ids read
    dictionary-encoded (cheap to rank). The anchor text of plain Parquet files is never held
    in memory: gaca_cli.log._anchor_scan hashes it page by page, and compares the candidates for
    equal anchors the same way later (`ScannedAnchors`). Layouts the scan does not know, and
    directories, have the anchor read by polars (hashed and compared there)."""
    threading.Thread(target=_warm_up_kernels, name="gaca-kernels", daemon=True).start()
    scanning = not any(is_dir for _, is_dir in expand_inputs(paths))
    deferred: list[str] = []  # the anchor column, left to the scan

    def choose(names: list[str]) -> list[str]:
        wanted = columns_read(config, names)
        if scanning:
            deferred[:] = [n for n in wanted if n in (C.ANCHOR_KEY, C.ANCHOR_OBS)]
        return [n for n in wanted if n not in deferred]

    log = read_log(paths, column_map, columns=choose, dictionary=(C.GROUP_ID, C.TRAJ_ID),
                   via_polars=(C.ANCHOR_OBS, C.ANCHOR_KEY))
    if deferred:
        scanned = _scan_anchors(log, deferred[0])
        if scanned is None:
            return log.with_columns(deferred, via_polars=deferred)
        log.cache[("anchors", deferred[0])] = ScannedAnchors(scanned)
    return log


def _scan_anchors(log: Log, name: str):
    """The anchor column's hashes, streamed from the files' pages (gaca_cli.log._anchor_scan), or
    None when it is not text or the scan does not know the files' layout."""
    t = log.file_schema.field(name).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    from gaca_cli.log._anchor_scan import scan_anchors

    return scan_anchors(log.files, log.original_name(name))


def _warm_up_kernels() -> None:
    """Import and load the compiled kernels while the main thread reads (pyarrow and polars
    release the GIL). Errors are left to the real calls, which report them properly."""
    try:
        from gaca_cli.log import _anchor_scan as anchor_scan
        from gaca_cli.advantages import _kernels as kernels

        kernels.warm_up()
        anchor_scan.warm_up()
    except Exception:  # noqa: BLE001 - the computation itself will raise it with context
        pass


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


def annotated_table(
    table: pa.Table, renamed: Mapping[str, str], new_columns: pa.Table, source: str | None = None
) -> pa.Table:
    """`table` without the tool's own columns, names restored, with `new_columns` appended."""
    owned = set(C.ADVANTAGES_OUTPUTS)
    out = table.select([n for n in table.column_names if n not in owned])
    out = restore_column_names(out, renamed)
    clash = [n for n in new_columns.column_names if n in out.column_names]
    if clash:
        mapped = {old: new for new, old in renamed.items()}
        raise GacaError(
            f"--map {mapped.get(clash[0], '?')}={clash[0]}: the log's column '{clash[0]}' would be overwritten by "
            "the output column of that name; rename it in the log first",
            file=source,
            column=clash[0],
        )
    for name, column in zip(new_columns.column_names, new_columns.columns):
        out = out.append_column(name, column)
    return out


def write_annotated(
    run: AdvantagesRun, out: str | os.PathLike, paths: Sequence[str | os.PathLike], column_map: Mapping[str, str]
) -> str:
    """Write every input column plus the method's columns to `out`, atomically.

    Plain Parquet files are spliced: their compressed column chunks are copied byte for byte
    and only the new columns are encoded (`gaca_cli.log._splice`). Otherwise (directories,
    files whose schemas differ) the whole log is read and rewritten. Returns "spliced" or
    "rewritten"."""
    from gaca_cli.log._splice import SpliceUnsupported, splice_columns

    log = run.log
    if log.plain_files:
        owned = set(C.ADVANTAGES_OUTPUTS)
        drop = [log.original_name(n) for n in log.file_schema.names if n in owned]
        try:
            with atomic_path(out) as tmp:
                splice_columns(
                    log.files, drop, run.new_columns, tmp, run.metadata, dictionary_columns=(C.ADV_METHOD,)
                )
            return "spliced"
        except SpliceUnsupported:
            pass
    full = read_log(paths, column_map) if log.partial else log
    if full.table.num_rows != run.new_columns.num_rows:  # the files changed while we worked
        raise GacaError("the input changed while it was being read; run again", file=log.source)
    table = annotated_table(full.table, full.renamed, run.new_columns, full.source)
    dictionary = [n for n in table.column_names if n in _DICTIONARY_COLUMNS]
    write_parquet_atomic(table, out, run.metadata, dictionary_columns=dictionary)
    return "rewritten"


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
