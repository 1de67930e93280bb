"""`gaca inspect` as a library: load an annotated log, find its trajectories and groups, and
read the step records and recomputed advantages every view is made of (the views themselves:
`views.py`; the figures' data: `plot.py`).

Every view is a JSON-ready dict (Python floats, ints, strings, bools and None; never NaN):
the terminal view (`terminal.py`) renders it and `--json` prints it unchanged, so the two
always hold the same fields. Arrays are kept in the canonical (traj_id, step_idx) order of
`gaca_cli.log.index.TrajectoryIndex`; the action and anchor text is read from the files only
for the rows a view shows.

Start-up is most of what a user waits for (`bench/startup.py`), so this module asks pyarrow
for no conversion from Python or numpy objects (`pa.array`, `pa.scalar`): pyarrow answers
each by first asking whether the object is a pandas one, which imports pandas where it is
installed (~0.2 s). Gathers run in numpy, and the few Arrow indices needed are made from
numpy buffers (`_arrow_indices`).

Conventions used by every view:
- a step is *critical* when its criticality z_t ≥ CRITICAL_Z (its NLL is at least one
  standard deviation above its scope's mean), z_t being the file's `nll_z` (gaca) or, for
  other methods, the NLL standardised within the trajectory exactly as gaca would;
- ranks are taken over every step of the log, 1 = the largest advantage, ties share their
  average rank (so a GRPO trajectory, whose steps are all equal, is not ordered arbitrarily).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli.credit.config import AdvantagesConfig, NllReduce
from gaca_cli.errors import GacaError
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.log import columns as C
from gaca_cli.log.anchors import anchor_column
from gaca_cli.log.checks import CheckOptions, prepare_log
from gaca_cli.log.grouping import contiguous_decoded
from gaca_cli.log.index import TrajectoryIndex
from gaca_cli.log.reading import READ_ERRORS, Log, expand_inputs, not_readable, open_parquet, read_log
from gaca_cli.log.writing import check_unread_columns

CRITICAL_Z = 1.0  # z_t at or above this marks a critical step

#: the columns inspect reads (everything else, prompts and chats included, stays on disk)
READ_COLUMNS = (
    *C.REQUIRED,
    C.EPISODE_REWARD,
    C.SUCCESS,
    C.BEHAVIOR_LOGPROBS,
    C.ACTION_TOKEN_IDS,  # read for the schema rule len(behavior_logprobs) == len(action_token_ids)
    C.DONE,  # read for the schema rule `done` only on a trajectory's last step
    C.NLL_SUM,
    C.NLL_MEAN,
    *C.ADVANTAGES_OUTPUTS,
)
#: text shown only for the rows of a view: read from the files for those rows alone (a log of
#: plain Parquet files; one with a directory reads them with the other columns). The log
#: checks need no more of them than their type and null count, which the footers give.
SHOWN_TEXT = (C.ACTION, C.ANCHOR_KEY, C.ANCHOR_OBS)

#: numeric output columns of `gaca advantages`, in the order a step record lists them
_NUMERIC_OUTPUTS = (
    C.RETURN_TO_GO,
    C.ADV_EPISODE,
    C.ADV_STEP,
    C.STEP_GROUP_ID,
    C.STEP_GROUP_SIZE,
    C.NLL_Z,
    C.GACA_WEIGHT,
    C.HISTORY_GROUPS,
    C.ADVANTAGE,
)


@dataclass(frozen=True)
class AnnotatedLog:
    """A log annotated by `gaca advantages`, with per-step arrays in canonical order.

    values: float64 [N] arrays for `reward`, `nll` (criticality u_t, NaN = no action tokens),
    `nll_z`, and each numeric output column of `gaca advantages` the file holds.
    traj_return: float64 [T] R(τ); traj_success: float64 [T] 1/0, NaN where unknown.
    """

    log: Log
    index: TrajectoryIndex
    traj_ids: tuple[str, ...]
    group_ids: tuple[str, ...]
    method: str | None
    params: dict | None
    written_by: str | None
    nll_source: str | None
    nll_unit: str | None
    z_from_file: bool
    values: dict[str, np.ndarray]
    traj_return: np.ndarray
    traj_success: np.ndarray | None

    @property
    def lambda_bar(self) -> float | None:
        if self.params is None or C.GACA_WEIGHT not in self.values:
            return None
        omega = float(self.params.get("step_weight", 1.0))
        return omega / (1.0 + omega)

    @property
    def critical(self) -> np.ndarray:
        """bool [N]: z_t ≥ CRITICAL_Z."""
        z = self.values.get(C.NLL_Z)
        return np.zeros(self.index.n_rows, dtype=bool) if z is None else z >= CRITICAL_Z

    def header(self) -> dict:
        """The fields every view starts with."""
        return {
            "source": self.log.source,
            "method": self.method,
            "params": self.params,
            "written_by": self.written_by,
            "criticality_column": self.nll_source,
            "nll_unit": self.nll_unit,
        }


# --------------------------------------------------------------------------- loading


def _arrow_indices(rows: np.ndarray) -> pa.Array:
    """int64 indices for Arrow's `take`, over the numpy array's own buffer. `pa.array(rows)`
    gives the same array but asks pyarrow's pandas shim first (see the module's docstring)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def _float_sorted(log: Log, index: TrajectoryIndex, name: str) -> np.ndarray:
    """A numeric column as float64 [N] in canonical order (nulls become NaN)."""
    values = contiguous_decoded(log.table.column(name)).cast(pa.float64()).to_numpy(zero_copy_only=False)
    return index.in_step_order(values.astype(np.float64, copy=False))


def _id_texts(log: Log, name: str, rows: np.ndarray) -> tuple[str, ...]:
    """The ids in column `name` at the given file rows, as text."""
    values = contiguous_decoded(log.table.column(name)).take(_arrow_indices(rows)).to_pylist()
    return tuple(str(v) for v in values)


def _advantages_metadata(log: Log) -> dict | None:
    raw = log.metadata.get(C.META_ADVANTAGES)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _method_from_column(log: Log) -> str | None:
    if C.ADV_METHOD not in log.table.column_names:
        return None
    names = pc.unique(contiguous_decoded(log.table.column(C.ADV_METHOD)).drop_null()).to_pylist()
    return ",".join(sorted(str(n) for n in names)) or None


def _criticality(
    log: Log, index: TrajectoryIndex, nll_reduce: NllReduce
) -> tuple[np.ndarray | None, str | None, str | None]:
    """u_t as gaca reads it (the file's nll_reduce), its source column and its unit."""
    from gaca_cli.credit.run import criticality, nll_values

    names = set(log.table.column_names)
    preferred = C.NLL_MEAN if nll_reduce == "mean" else C.NLL_SUM
    for name in (preferred, C.NLL_MEAN, C.NLL_SUM):
        if name in names:
            u = index.in_step_order(nll_values(log, name))
            return u, name, "nats/token" if name == C.NLL_MEAN else "nats"
    if C.BEHAVIOR_LOGPROBS in names:
        u, source = criticality(log, AdvantagesConfig(nll_reduce=nll_reduce))  # file order
        return u[index.order], source, "nats/token" if nll_reduce == "mean" else "nats"
    return None, None, None


def _as_recorded(log: Log, criticality_column: str | None) -> Log:
    """`log` as gaca advantages read its criticality: without the NLL columns when it took it
    from behavior_logprobs, which a later `gaca score` (adding nll_mean) would otherwise
    displace in what inspect shows and recomputes."""
    nll = [c for c in (C.NLL_MEAN, C.NLL_SUM) if c in log.table.column_names]
    if criticality_column != C.BEHAVIOR_LOGPROBS or C.BEHAVIOR_LOGPROBS not in log.table.column_names or not nll:
        return log
    return dataclasses.replace(log, table=log.table.drop_columns(nll), cache={})


def _traj_success(log: Log, index: TrajectoryIndex) -> np.ndarray | None:
    """1.0 where any step of the trajectory says success, 0.0 where all known steps say
    failure, NaN where the column is null throughout (or not boolean / numeric)."""
    if C.SUCCESS not in log.table.column_names:
        return None
    col = contiguous_decoded(log.table.column(C.SUCCESS))
    if not (pa.types.is_boolean(col.type) or pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        return None
    v = index.in_step_order(col.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64, copy=False))
    known = ~np.isnan(v)
    n_known = np.bincount(index.traj, known.astype(np.float64), minlength=index.n_traj)
    n_true = np.bincount(index.traj, (known & (np.nan_to_num(v) > 0)).astype(np.float64), minlength=index.n_traj)
    return np.where(n_known > 0, (n_true > 0).astype(np.float64), np.nan)


def annotate(log: Log) -> AnnotatedLog:
    """Check `log` as every command does (it must hold an `advantage` column) and gather
    the arrays the views need."""
    index, _ = prepare_log(log, "inspect", CheckOptions.CANONICAL_ORDER)  # inspect shows no warnings
    table = log.table
    # the ids of the index's trajectories and groups (canonical codes), from their first rows
    first_rows = index.rows(index.traj_start)
    group_heads = np.searchsorted(index.traj_group, np.arange(index.n_groups))  # traj_group is sorted
    meta = _advantages_metadata(log)
    method = meta.get("method") if meta else None
    method = method or _method_from_column(log)
    params = meta.get("params") if meta and isinstance(meta.get("params"), dict) else None
    written_by = f"{meta.get('tool', 'gaca')} {meta.get('version', '')}".strip() if meta else None

    values: dict[str, np.ndarray] = {C.REWARD: _float_sorted(log, index, C.REWARD)}
    for name in _NUMERIC_OUTPUTS:
        if name in table.column_names:
            values[name] = _float_sorted(log, index, name)
    nll_reduce = str((params or {}).get("nll_reduce", "mean"))
    recorded = meta.get("criticality_column") if meta else None
    nll, nll_source, nll_unit = _criticality(
        _as_recorded(log, recorded), index, "sum" if nll_reduce == "sum" else "mean"
    )
    z_from_file = C.NLL_Z in values
    if nll is not None:
        values["nll"] = nll
        if not z_from_file:
            from gaca_cli.credit.estimators import standardize_in_scopes

            values[C.NLL_Z] = standardize_in_scopes(nll, index.traj, index.n_traj)[0]
    if C.EPISODE_REWARD in table.column_names:
        traj_return = _float_sorted(log, index, C.EPISODE_REWARD)[index.traj_start]
    else:
        traj_return = np.bincount(index.traj, values[C.REWARD], minlength=index.n_traj)
    return AnnotatedLog(
        log=log,
        index=index,
        traj_ids=_id_texts(log, C.TRAJ_ID, first_rows),
        group_ids=_id_texts(log, C.GROUP_ID, first_rows[group_heads]),
        method=method,
        params=params,
        written_by=written_by,
        nll_source=nll_source,
        nll_unit=nll_unit,
        z_from_file=z_from_file,
        values=values,
        traj_return=traj_return,
        traj_success=_traj_success(log, index),
    )


def load_annotated(paths: Sequence[str], column_map: Mapping[str, str] | None = None) -> AnnotatedLog:
    """Read an annotated log (only the columns inspect uses, see READ_COLUMNS and
    SHOWN_TEXT) and check it."""
    plain_files = not any(is_dir for _, is_dir in expand_inputs(paths))
    columns = READ_COLUMNS if plain_files else (*READ_COLUMNS, *SHOWN_TEXT)
    log = read_log(paths, column_map, columns=columns)
    check_unread_columns(log)  # damaged pages of the columns not read: refused as other commands refuse them
    return annotate(log)


# --------------------------------------------------------------------------- ids


def closest_ids(query: str, choices: Sequence[str], limit: int = 5) -> list[str]:
    """The ids most similar to `query` (normalised Levenshtein on lower-cased text)."""
    from rapidfuzz import process, utils
    from rapidfuzz.distance import Levenshtein

    found = process.extract(
        query, choices, scorer=Levenshtein.normalized_similarity, processor=utils.default_process, limit=limit
    )
    return [choice for choice, _, _ in found]


def _find(a: AnnotatedLog, kind: str, query: str) -> int:
    """The code of the trajectory ("traj") or episode group ("group") whose id is `query`
    (compared as text), or an error naming the closest ids."""
    ids, other, column, other_column, other_flag = (
        (a.traj_ids, a.group_ids, C.TRAJ_ID, C.GROUP_ID, "--group")
        if kind == "traj"
        else (a.group_ids, a.traj_ids, C.GROUP_ID, C.TRAJ_ID, "--traj")
    )
    if query in ids:
        return ids.index(query)
    close = closest_ids(query, ids)
    rule = f"no step has {column} {query!r}; closest: {', '.join(repr(c) for c in close)}"
    if query in set(other):
        rule += f" ({query!r} is a {other_column}: use {other_flag})"
    raise GacaError(rule, file=a.log.source, column=a.log.original_name(column))


def find_traj(a: AnnotatedLog, traj_id: str) -> int:
    return _find(a, "traj", str(traj_id))


def find_group(a: AnnotatedLog, group_id: str) -> int:
    return _find(a, "group", str(group_id))


def traj_positions(a: AnnotatedLog, t: int) -> np.ndarray:
    start = int(a.index.traj_start[t])
    return np.arange(start, start + int(a.index.traj_len[t]), dtype=np.int64)


def group_trajs(a: AnnotatedLog, g: int) -> np.ndarray:
    return np.flatnonzero(a.index.traj_group == g)


def selected_trajs(a: AnnotatedLog, traj: str | None = None, group: str | None = None) -> list[int] | None:
    """The codes of one trajectory, or of the trajectories of one episode group; None = all."""
    if traj is not None:
        return [find_traj(a, traj)]
    if group is not None:
        return [int(t) for t in group_trajs(a, find_group(a, group))]
    return None


def select(a: AnnotatedLog, traj: str | None = None, group: str | None = None) -> np.ndarray | None:
    """Positions (canonical order) of one trajectory or one episode group; None = all."""
    trajs = selected_trajs(a, traj, group)
    return None if trajs is None else np.concatenate([traj_positions(a, t) for t in trajs])


def selection_record(config: InspectConfig) -> dict:
    """The trajectory or group a view is limited to, as the view records it."""
    return {"traj": config.traj, "group": config.group}


# --------------------------------------------------------------------------- records


def finite_float(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def finite_int(x) -> int | None:
    x = float(x)
    return int(x) if np.isfinite(x) else None


def _texts(a: AnnotatedLog, name: str | None, positions: np.ndarray) -> list[str | None]:
    """The text of column `name` at the given positions (None where null or absent)."""
    if name is None or name not in a.log.file_schema.names:
        return [None] * len(positions)
    rows = a.index.rows(positions)
    if name in a.log.table.column_names:
        values = contiguous_decoded(a.log.table.column(name)).take(_arrow_indices(rows)).to_pylist()
    else:
        values = read_rows(a.log, name, rows)
    return [None if v is None else str(v) for v in values]


def read_rows(log: Log, name: str, rows: np.ndarray) -> list:
    """The values of column `name` (canonical name) at the given rows of a log of plain
    Parquet files, in the order of `rows`, read from the files: only the row groups that hold
    them. A file without the column gives nulls."""
    rows = np.asarray(rows, dtype=np.int64)
    out: list = [None] * len(rows)
    column = log.original_name(name)
    file_start = np.concatenate([[0], log.file_row_ends[:-1]])
    file_of = np.searchsorted(log.file_row_ends, rows, side="right")
    for f in np.unique(file_of).tolist():
        at = np.flatnonzero(file_of == f)
        path = log.files[f]
        try:
            with open_parquet(path) as parquet:  # page checksums verified
                meta = parquet.metadata
                if meta.num_rows != log.file_row_ends[f] - file_start[f]:
                    raise GacaError("the input changed while it was being read; run again", file=path)
                if column not in parquet.schema_arrow.names:
                    continue
                sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], dtype=np.int64)
                local = rows[at] - file_start[f]
                group_of = np.searchsorted(np.cumsum(sizes), local, side="right")
                groups = np.unique(group_of)
                # each row's place in the row groups read, one after the other
                read_start = np.cumsum(sizes[groups]) - sizes[groups]
                place = local - (np.cumsum(sizes) - sizes)[group_of] + read_start[np.searchsorted(groups, group_of)]
                chunk = parquet.read_row_groups(groups.tolist(), columns=[column]).column(0)
                if len(chunk) != int(sizes[groups].sum()):  # a damaged page header can make a read short
                    raise pa.ArrowInvalid(f"read {len(chunk)} rows of {int(sizes[groups].sum())}")
        except READ_ERRORS as exc:
            raise not_readable(path, exc, column) from None
        for i, value in zip(
            at.tolist(), contiguous_decoded(chunk).take(_arrow_indices(place)).to_pylist(), strict=True
        ):
            out[i] = value
    return out


def step_records(a: AnnotatedLog, positions: np.ndarray) -> list[dict]:
    """One JSON-ready dict per step (in the order of `positions`), with every field a view
    can show. A field the file does not have is None."""
    positions = np.asarray(positions, dtype=np.int64)
    actions = _texts(a, C.ACTION, positions)
    anchors = _texts(a, anchor_column(a.log.file_schema.names), positions)
    step = a.index.step
    traj = a.index.traj
    critical = a.critical
    v = a.values

    def get(name: str, p: int, finite: Callable[[float], float | int | None] = finite_float) -> float | int | None:
        arr = v.get(name)
        return None if arr is None else finite(arr[p])

    out = []
    for i, p in enumerate(positions.tolist()):
        t = int(traj[p])
        out.append(
            {
                "traj_id": a.traj_ids[t],
                "group_id": a.group_ids[int(a.index.traj_group[t])],
                "step": int(step[p]),
                "action": actions[i],
                "anchor": anchors[i],
                "reward": get(C.REWARD, p),
                "return_to_go": get(C.RETURN_TO_GO, p),
                "nll": get("nll", p),
                "nll_z": get(C.NLL_Z, p),
                "lambda": get(C.GACA_WEIGHT, p),
                "adv_episode": get(C.ADV_EPISODE, p),
                "adv_step": get(C.ADV_STEP, p),
                "advantage": get(C.ADVANTAGE, p),
                "step_group_id": get(C.STEP_GROUP_ID, p, finite_int),
                "step_group_size": get(C.STEP_GROUP_SIZE, p, finite_int),
                "history_groups": get(C.HISTORY_GROUPS, p, finite_int),
                "critical": bool(critical[p]),
            }
        )
    return out


def trajectory_record(a: AnnotatedLog, t: int) -> dict:
    """A trajectory's header fields and its steps."""
    positions = traj_positions(a, t)
    steps = step_records(a, positions)
    success = None
    if a.traj_success is not None and np.isfinite(a.traj_success[t]):
        success = bool(a.traj_success[t] > 0)
    adv_e = a.values.get(C.ADV_EPISODE)
    return {
        "traj_id": a.traj_ids[t],
        "group_id": a.group_ids[int(a.index.traj_group[t])],
        "length": len(positions),
        "return": finite_float(a.traj_return[t]),
        "success": success,
        "adv_episode": None if adv_e is None else finite_float(adv_e[positions[0]]),
        "critical_steps": [s["step"] for s in steps if s["critical"]],
        "steps": steps,
        # what the chat held after the last step (gaca import's final_observation), when logged
        "final_observation": _texts(a, "final_observation", positions[-1:])[0],
    }


def config_for(a: AnnotatedLog, method: str) -> AdvantagesConfig:
    known = {f.name for f in fields(AdvantagesConfig)}
    params = {k: val for k, val in (a.params or {}).items() if k in known}
    params["method"] = method
    try:
        return AdvantagesConfig(**params)
    except (TypeError, ValueError) as exc:
        raise GacaError(
            f"cannot recompute --method {method} with the file's parameters ({exc})", file=a.log.source
        ) from None


def recompute(a: AnnotatedLog, method: str):
    """`gaca advantages --method METHOD` on the same log with the parameters the file records
    (the defaults where it records none): the estimator's arrays, in canonical order."""
    from gaca_cli.credit.run import compute_advantages

    log = _as_recorded(_with_anchors(a.log), a.nll_source)
    return compute_advantages(log, config_for(a, method)).result_at(a.index.order)


def _with_anchors(log: Log) -> Log:
    """`log` with its anchor column read (gigpo and gaca group steps by it; `load_annotated`
    leaves it on disk), read once per log."""
    name = anchor_column(log.file_schema.names)
    if name is None or name in log.table.column_names:
        return log
    full = log.cached(("inspect", "with anchors"), lambda: log.with_columns([name]))
    assert isinstance(full, Log)
    return full


def method_advantages(a: AnnotatedLog, methods: Sequence[str]) -> dict[str, np.ndarray]:
    """A_t of each method (canonical order), recomputed from the log (see `recompute`)."""
    return {m: recompute(a, m).advantage for m in methods}
