"""The input checks of log-schema.md, and the row index every command computes on.

`check_log` runs every check and collects all violations (for `gaca validate`);
`prepare_log` runs the same checks and raises the first violation (for every other command).
Both return the row index (`gaca_cli.log.index.TrajectoryIndex`): the rows of each trajectory
in step order, built in O(N) without sorting (a row's position is its trajectory's start plus
its step).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import anchor_column, anchor_warnings
from gaca_cli.log.grouping import contiguous_decoded, id_codes
from gaca_cli.log.index import TrajectoryIndex
from gaca_cli.log.reading import Log
from gaca_cli.log.schema import COMMAND_NEEDS, INPUT_BY_NAME


class CheckOptions(enum.Flag):
    """How `check_log` and `prepare_log` build the row index and which warnings they count."""

    NONE = 0
    CANONICAL_ORDER = enum.auto()  # the index in canonical order, else in the file's (see TrajectoryIndex)
    ANCHOR_WARNINGS = enum.auto()  # count the anchor warnings (else the caller does, from its step groups)
    COMPILED = enum.auto()  # check and build the index with the compiled kernels (see `_structure_checks`)
    DEFAULT = CANONICAL_ORDER | ANCHOR_WARNINGS


@dataclass
class CheckReport:
    violations: list[GacaError] = field(default_factory=list)
    warnings: dict[str, int] = field(default_factory=dict)
    index: TrajectoryIndex | None = None


def rows_text(table: pa.Table, rows: np.ndarray) -> list[str]:
    """`(traj_id, step_idx)` of up to five rows of `table`, for error messages."""
    rows = np.asarray(rows[:5])
    if len(rows) == 0:
        return []
    sel = pa.array(rows)
    tids = table.column(C.TRAJ_ID).take(sel).to_pylist() if C.TRAJ_ID in table.column_names else [None] * len(rows)
    steps = table.column(C.STEP_IDX).take(sel).to_pylist() if C.STEP_IDX in table.column_names else [None] * len(rows)
    return [f"({t}, {s})" for t, s in zip(tids, steps)]


def row_violation(log: Log, column: str, rule: str, rows: np.ndarray | None = None) -> GacaError:
    rows = np.asarray([], dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    return GacaError(
        rule,
        file=log.files_of_rows(rows) if len(rows) else log.source,
        column=log.original_name(column),
        rows=rows_text(log.table, rows),
        n_rows=len(rows),
    )


def _null_violation(log: Log, column: str, rows: np.ndarray) -> GacaError:
    """`column` must not be null, and is at `rows`: when a file of the log lacks the column
    (its rows read as nulls), the error names that file and says so."""
    lacking = log.files_lacking(column)
    if lacking:
        more = f" ({len(lacking) - 1} more files lack it too)" if len(lacking) > 1 else ""
        return GacaError(
            f"the column is missing from this file, which the other files of the log have{more}",
            file=lacking[0],
            column=log.original_name(column),
        )
    return row_violation(log, column, "must not be null", rows)


def _null_rows(arr: pa.ChunkedArray) -> np.ndarray:
    if arr.null_count == 0:
        return np.asarray([], dtype=np.int64)
    return np.flatnonzero(pc.is_null(arr).to_numpy(zero_copy_only=False))


_FINITE = (C.REWARD, C.EPISODE_REWARD, C.NLL_MEAN, C.NLL_SUM)


def _column_checks(log: Log, out: CheckReport) -> tuple[set[str], bool]:
    """Presence, types, nulls and finiteness, column by column. Returns the columns that broke
    a rule (later checks leave them alone) and whether a required column is unusable.

    Types are checked for every column of the files. A column that was not read (a command
    reads the columns it uses, see `gaca_cli.credit.run.columns_read`) is still checked for
    nulls, from the null counts in the files' footers when they have them, else by reading
    that column alone."""
    table = log.table
    schema = log.file_schema
    bad: set[str] = set()
    fatal = False
    for spec in INPUT_BY_NAME.values():
        before = len(out.violations)
        if spec.name not in schema.names:
            if spec.required:
                out.violations.append(row_violation(log, spec.name, "required column is missing"))
                fatal = True
            continue
        file_type = schema.field(spec.name).type
        if not spec.accepts(file_type):
            rule = f"type {file_type} is not usable here; expected {spec.accepted_types}"
            out.violations.append(row_violation(log, spec.name, rule))
            bad.add(spec.name)
            fatal |= spec.required
            continue
        if spec.name not in table.column_names:
            if not spec.nullable and log.null_count(spec.name) != 0:
                nulls = log.null_rows(spec.name)
                if len(nulls):
                    out.violations.append(_null_violation(log, spec.name, nulls))
                    bad.add(spec.name)
            continue
        col = table.column(spec.name)
        if not spec.nullable:
            nulls = _null_rows(col)
            if len(nulls):
                out.violations.append(_null_violation(log, spec.name, nulls))
                bad.add(spec.name)
                fatal |= spec.required
                continue
        if spec.name in _FINITE and pa.types.is_floating(col.type):
            # nulls (allowed in the NLL columns) are not offenders
            rows = np.flatnonzero(~pc.is_finite(col).fill_null(True).to_numpy(zero_copy_only=False))
            if len(rows):
                out.violations.append(row_violation(log, spec.name, "must be finite (no NaN, no ±inf)", rows))
        if spec.name == C.BEHAVIOR_LOGPROBS:
            lists = contiguous_decoded(col)
            finite = pc.is_finite(pc.list_flatten(lists)).to_numpy(zero_copy_only=False)
            if not finite.all():
                parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
                rows = np.unique(parents[~finite])
                out.violations.append(row_violation(log, spec.name, "log-probabilities must be finite", rows))
        if len(out.violations) > before:
            bad.add(spec.name)

    pair = (C.BEHAVIOR_LOGPROBS, C.ACTION_TOKEN_IDS)
    if all(name in table.column_names for name in pair) and not bad.intersection(pair):
        lp = pc.list_value_length(contiguous_decoded(table.column(C.BEHAVIOR_LOGPROBS))).to_numpy(zero_copy_only=False)
        ti = pc.list_value_length(contiguous_decoded(table.column(C.ACTION_TOKEN_IDS))).to_numpy(zero_copy_only=False)
        both = ~np.isnan(lp.astype(np.float64)) & ~np.isnan(ti.astype(np.float64))
        rows = np.flatnonzero(both & (lp != ti))
        if len(rows):
            rule = "len(behavior_logprobs) must equal len(action_token_ids)"
            out.violations.append(row_violation(log, C.BEHAVIOR_LOGPROBS, rule, rows))
    return bad, fatal


@dataclass(frozen=True)
class _RowIds:
    """Integer codes of every row's ids (see grouping.id_codes) and its step."""

    traj: np.ndarray  # int64 [N] trajectory code
    traj_rank: np.ndarray  # int64 [T] each trajectory code's place in sorted traj_id order
    group: np.ndarray  # int64 [N] episode-group code
    group_rank: np.ndarray  # int64 [G]
    step: np.ndarray  # int64 [N]

    def by_id_and_step(self, rows: np.ndarray) -> np.ndarray:
        """Offending rows sorted by (traj_id, step_idx), whatever the order of the file."""
        return rows[np.lexsort((self.step[rows], self.traj_rank[self.traj[rows]]))]


def _structure_checks(
    log: Log, out: CheckReport, bad: set[str], canonical: bool = True, compiled: bool = False
) -> TrajectoryIndex | None:
    """Steps 0..T-1 without duplicates, per-trajectory constancy rules, one group per
    trajectory; then the row index (canonical or file order, see TrajectoryIndex). `compiled`
    checks the rules and builds the index in one compiled pass (gaca_cli.log._kernels: the same
    index, for large logs whose caller loads the kernels anyway); when a rule is broken, the
    numpy code below finds and reports the offending rows."""
    table = log.table
    n = table.num_rows
    traj_of_row, traj_rank, _ = id_codes(table.column(C.TRAJ_ID))
    group_of_row, group_rank, _ = id_codes(table.column(C.GROUP_ID))
    step = contiguous_decoded(table.column(C.STEP_IDX)).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ids = _RowIds(traj_of_row, traj_rank, group_of_row, group_rank, step)
    n_traj = len(traj_rank)
    if compiled:  # every structure rule and the index in compiled passes; the numpy code reports
        from gaca_cli.log import _kernels as kernels  # numba: imported on use, not by `gaca validate`

        done = np.zeros(0, dtype=bool)
        if C.DONE in table.column_names and C.DONE not in bad:
            done = contiguous_decoded(table.column(C.DONE)).fill_null(False).to_numpy(zero_copy_only=False)
        episode_reward = np.zeros(0)
        if C.EPISODE_REWARD in table.column_names and C.EPISODE_REWARD not in bad:
            episode_reward = table.column(C.EPISODE_REWARD).cast(pa.float64()).to_numpy()
        arrays = (
            np.require(a, requirements=("C", "W")) for a in (traj_of_row, step, group_of_row, done, episode_reward)
        )
        traj, steps, group, done, episode_reward = arrays  # writable: the kernel's one compiled signature
        valid, order, starts, lengths, traj_group = kernels.trajectory_index(
            traj, steps, group, done, episode_reward, n_traj
        )
        if valid:
            return _index(canonical, ids, order, starts, lengths, traj_group)
    lengths = np.bincount(traj_of_row, minlength=n_traj).astype(np.int64)
    starts = np.cumsum(lengths) - lengths
    in_range = (step >= 0) & (step < lengths[traj_of_row])
    pos = starts[traj_of_row] + np.where(in_range, step, 0)
    occupancy = np.bincount(pos[in_range], minlength=n)
    duplicate = in_range & (occupancy[pos] > 1)
    if duplicate.any():
        rows = ids.by_id_and_step(np.flatnonzero(duplicate))
        out.violations.append(row_violation(log, C.STEP_IDX, "(traj_id, step_idx) must be unique", rows))
    # rows outside 0..T-1 reveal a gap (or a negative step) in their trajectory
    gap_rows = ids.by_id_and_step(np.flatnonzero(~in_range))
    if len(gap_rows):
        rule = "steps of a trajectory must be 0..T-1 with no gap"
        out.violations.append(row_violation(log, C.STEP_IDX, rule, gap_rows))
    if duplicate.any() or len(gap_rows):
        return None

    # rows ordered by (trajectory code, step_idx)
    order = np.empty(n, dtype=np.int64)
    order[pos] = np.arange(n, dtype=np.int64)
    del pos, occupancy, duplicate, in_range
    return _trajectory_rules(log, out, bad, canonical, ids, order, starts, lengths)


def _trajectory_rules(  # noqa: PLR0913
    log: Log,
    out: CheckReport,
    bad: set[str],
    canonical: bool,
    ids: _RowIds,
    order: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> TrajectoryIndex | None:
    """The per-trajectory rules, on the rows ordered by (trajectory, step) (`order`, with each
    trajectory's `starts` and `lengths`); then the index."""
    table = log.table
    n = table.num_rows
    traj_of_row, group_of_row, by_id_and_step = ids.traj, ids.group, ids.by_id_and_step
    if C.EPISODE_REWARD in table.column_names and C.EPISODE_REWARD not in bad:
        er = contiguous_decoded(table.column(C.EPISODE_REWARD)).to_numpy(zero_copy_only=False)[order]
        differs = er != np.repeat(er[starts], lengths)
        if differs.any():
            rows = by_id_and_step(order[differs])
            out.violations.append(row_violation(log, C.EPISODE_REWARD, "must be constant within a trajectory", rows))

    if C.DONE in table.column_names and C.DONE not in bad:
        done = contiguous_decoded(table.column(C.DONE)).fill_null(False).to_numpy(zero_copy_only=False)
        last = np.zeros(n, dtype=bool)
        last[order[starts + lengths - 1]] = True
        early = np.flatnonzero(done & ~last)
        if len(early):
            rule = "done may be true only once per trajectory, on its last step"
            out.violations.append(row_violation(log, C.DONE, rule, by_id_and_step(early)))

    traj_group = group_of_row[order[starts]]
    mixed = group_of_row != traj_group[traj_of_row]
    if mixed.any():
        bad_traj = np.unique(traj_of_row[mixed])
        rows = by_id_and_step(np.flatnonzero(np.isin(traj_of_row, bad_traj)))
        rule = "each trajectory must belong to exactly one group_id"
        out.violations.append(row_violation(log, C.GROUP_ID, rule, rows))
        return None

    return _index(canonical, ids, order, starts, lengths, traj_group)


def _index(  # noqa: PLR0913
    canonical: bool,
    ids: _RowIds,
    order: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    traj_group: np.ndarray,
) -> TrajectoryIndex:
    """The index of a log whose rules hold, from the rows ordered by (trajectory code,
    step) and each trajectory's start, length and group code."""
    n, n_traj = len(ids.traj), len(ids.traj_rank)
    traj_of_row, traj_rank, group_rank, step = ids.traj, ids.traj_rank, ids.group_rank, ids.step
    # canonical order of the trajectories: by sorted group_id, then sorted traj_id
    by_canon = np.lexsort((traj_rank, group_rank[traj_group]))
    canonical_start = np.empty(n_traj, dtype=np.int64)
    canonical_start[by_canon] = np.cumsum(lengths[by_canon]) - lengths[by_canon]
    if not canonical:
        return TrajectoryIndex(order, starts, lengths, traj_group, len(group_rank), canonical_start, traj_of_row)
    pos = canonical_start[traj_of_row] + step
    order = np.empty(n, dtype=np.int64)
    order[pos] = np.arange(n, dtype=np.int64)
    lengths = lengths[by_canon]
    return TrajectoryIndex(
        order=order,
        traj_start=canonical_start[by_canon],
        traj_len=lengths,
        traj_group=group_rank[traj_group][by_canon],
        n_groups=len(group_rank),
        canonical_start=canonical_start[by_canon],
        row_traj=np.argsort(by_canon)[traj_of_row],
    )


def output_column_problem(log: Log, column: str = C.ADVANTAGE, float32: bool = False) -> GacaError | None:
    """What train-offline and inspect refuse in the `advantage` column (read), and inspect in
    the other numeric columns `gaca advantages` writes: a type that is not a number, nulls, NaN
    or ±inf, a `gaca_weight` outside [0, 1], and with `float32` (train-offline, whose losses
    are float32) a value float32 would turn into ±inf; None when every row has a usable value."""
    col = contiguous_decoded(log.table.column(column))
    if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
        return row_violation(
            log, column, f"type {col.type} is not usable here; expected a number (as `gaca advantages` writes)"
        )
    nulls = _null_rows(col)
    if len(nulls):
        return row_violation(log, column, "must not be null", nulls)
    values = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        return row_violation(log, column, "must be finite (no NaN, no ±inf)", bad)
    if float32 and len(big := np.flatnonzero(np.abs(values) > np.finfo(np.float32).max)):
        return row_violation(
            log, column, "must fit in float32 (|value| ≤ 3.4e38): train-offline computes its losses in float32", big
        )
    if column == C.GACA_WEIGHT and len(out := np.flatnonzero((values < 0) | (values > 1))):
        return row_violation(log, column, "must be a weight in [0, 1]", out)
    return None


#: the numeric columns of `gaca advantages` that `gaca inspect` reads and checks
INSPECTED_OUTPUTS = (C.RETURN_TO_GO, C.ADV_EPISODE, C.ADV_STEP, C.NLL_Z, C.GACA_WEIGHT, C.ADVANTAGE)


def _needs_checks(log: Log, command: str, out: CheckReport) -> None:
    names = set(log.file_schema.names)
    for alternatives in COMMAND_NEEDS[command]:
        if not names.intersection(alternatives):
            wanted = " or ".join(f"'{a}'" for a in alternatives)
            hint = _NEEDS_HINT.get(alternatives, "")
            rule = f"{command.replace(':', ' --method ')} needs a column {wanted}{hint}"
            out.violations.append(GacaError(rule, file=log.source, column=alternatives[0]))


_NEEDS_HINT = {
    (C.NLL_MEAN, C.NLL_SUM, C.BEHAVIOR_LOGPROBS): "; run `gaca score` first to add the NLL columns",
    (C.ADVANTAGE,): "; run `gaca advantages` first",
}


def _warnings(log: Log, index: TrajectoryIndex, bad: set[str], anchors: bool) -> dict[str, int]:
    traj_per_group = np.bincount(index.traj_group, minlength=index.n_groups)
    warnings = {"singleton_groups": int(np.sum(traj_per_group == 1))}
    name = anchor_column(log.file_schema.names)
    if anchors and name is not None and name not in bad:
        warnings.update(anchor_warnings(log, index))
    return warnings


def check_log(log: Log, command: str = "validate", options: CheckOptions = CheckOptions.DEFAULT) -> CheckReport:
    """Run every check; collect all violations and the warnings' counts. `options` chooses the
    order of the returned index, whether the anchor warnings are counted here and whether the
    compiled kernels build it (CheckOptions)."""
    canonical, compiled = CheckOptions.CANONICAL_ORDER in options, CheckOptions.COMPILED in options
    out = CheckReport()
    bad, fatal = _column_checks(log, out)
    _needs_checks(log, command, out)
    if command == "train-offline" and C.ADVANTAGE in log.table.column_names:
        problem = output_column_problem(log, float32=True)
        if problem is not None:
            out.violations.append(problem)
    if command == "inspect":
        for name in INSPECTED_OUTPUTS:
            if name in log.table.column_names and (problem := output_column_problem(log, name)) is not None:
                out.violations.append(problem)
    if fatal:  # a required column is missing, unusable or null: nothing else can be checked
        return out
    index = _structure_checks(log, out, bad, canonical, compiled)
    if index is not None:
        out.warnings = _warnings(log, index, bad, CheckOptions.ANCHOR_WARNINGS in options)
        out.index = index
    return out


def prepare_log(
    log: Log, command: str, options: CheckOptions = CheckOptions.DEFAULT
) -> tuple[TrajectoryIndex, dict[str, int]]:
    """Run every check and raise the first violation; else return the index and warnings."""
    result = check_log(log, command, options)
    if result.violations:
        raise result.violations[0]
    assert result.index is not None
    return result.index, result.warnings
