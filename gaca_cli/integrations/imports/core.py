"""Run an import: a format's rows streamed into a Parquet gaca log, checked like `gaca validate`,
written atomically, and summarised (what was mapped, derived, kept and what is missing).

Rows arrive as dicts (see `base.py` and docs/importing.md). They are gathered in batches of
bounded size; each batch becomes an Arrow table with the schema's types for the columns gaca
knows and inferred types for the others, and is written as one part file. At the end the parts
are concatenated, batch by batch, under one schema that unifies them (a column a later batch
introduces is null before it), so memory stays bounded by one batch whatever the source's size.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import FORMATS, format_module
from gaca_cli.integrations.imports.base import (
    File,
    FormatInfo,
    ImportOptions,
    SourceError,
    expand_sources,
    keep_columns,
    locate,
    origin,
)

# the Arrow type of every column the schema knows (docs/log-schema.md)
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.large_string())])
KNOWN_TYPES: dict[str, pa.DataType] = {
    "group_id": pa.string(),
    "traj_id": pa.string(),
    "step_idx": pa.int64(),
    "reward": pa.float64(),
    "episode_reward": pa.float64(),
    "done": pa.bool_(),
    "prompt": pa.large_string(),
    "messages": pa.list_(MESSAGE),
    "action": pa.large_string(),
    "anchor_obs": pa.large_string(),
    "anchor_key": pa.string(),
    "prompt_token_ids": pa.list_(pa.int32()),
    "action_token_ids": pa.list_(pa.int32()),
    "behavior_logprobs": pa.list_(pa.float32()),
}
TEXT_FIELDS = ("prompt", "action", "anchor_obs", "extra")
UNCHECKED = ("prompt", "messages", "action", "prompt_token_ids")  # no rule reads them
EXTRA = "extra"

#: a batch is written when it holds this many rows or about this many bytes of text
BATCH_ROWS = 8192
BATCH_BYTES = 64 << 20


@dataclass
class _Parts:
    """The part files written so far and what they hold."""

    directory: Path
    label: str  # the sources as given, named by errors about rows that do not say their file
    files: list[Path] = field(default_factory=list)
    schema: pa.Schema | None = None  # the parts' schemas unified so far
    rows: int = 0
    order: dict[str, None] = field(default_factory=dict)  # column names in first-seen order
    renamed: dict[str, str] = field(default_factory=dict)  # source field -> column it was kept as


def _row_label(row: Mapping[str, Any]) -> str:
    return f"({row.get('traj_id')}, {row.get('step_idx')})"


def _row_error(row: Mapping[str, Any], label: str, name: str, rule: str) -> GacaError:
    """An error about field `name` of one row: naming the file and line (or row) of the source
    record it came from where the format says (see `base.Located`), else the sources and the
    row's (traj_id, step_idx)."""
    file, where = origin(row)
    if file is None:
        return GacaError(rule, file=label, column=name, rows=[_row_label(row)])
    return SourceError(file, where, name, rule)


def _normalise(
    row: dict[str, Any], reserved: frozenset[str], renamed: dict[str, str], label: str
) -> tuple[dict[str, Any], int]:
    """The row with `extra` as JSON text and a source field named like a column gaca writes
    renamed `source_<name>` (the commands would replace it; noted in `renamed`; see
    `keep_columns`), and its approximate size in bytes."""
    if clashes := [k for k in row if k in reserved]:
        file, where = origin(row)
        renamed.update((key, f"source_{key}") for key in clashes)
        row = locate(keep_columns(row, file or label, where, reserved), file or label, where)
    extra = row.get(EXTRA)
    if extra is not None and not isinstance(extra, str):
        row[EXTRA] = json.dumps(extra, sort_keys=True, default=str, ensure_ascii=False)
    size = 64 + sum(len(value) for key in TEXT_FIELDS if isinstance(value := row.get(key), str))
    return row, size + sum(len(m.get("content") or "") for m in row.get("messages") or ())


def _column(name: str, values: list[Any], rows: list[dict[str, Any]], format_name: str, label: str) -> pa.Array:
    """One column of a batch: the schema's type for a known column, an inferred one otherwise."""
    target = KNOWN_TYPES.get(name)
    try:
        return pa.array(values, type=target, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        pass
    # find the first value that does not fit, to name its row
    first = next((v for v in values if v is not None), None)
    for value, row in zip(values, rows):
        if value is None:
            continue
        try:
            pa.array([value], type=target) if target is not None else pa.array([first, value])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            rule = f"the {format_name} source gives {value!r:.60} here, "
            if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
                rule += "an integer outside the 64-bit range a column holds"
            else:
                want = f"the type of its earlier values ({first!r:.40})" if target is None else f"the schema's {target}"
                rule += f"which does not fit {want}; a field must have one type in every record"
            raise _row_error(row, label, name, rule) from None
    raise GacaError(f"the {format_name} source's values cannot be stored in one column", file=label, column=name)


def _unify(earlier: pa.Schema, table: pa.Table, rows: list[dict[str, Any]], format_name: str, label: str) -> pa.Schema:
    """`earlier` (the batches before) unified with the schema of the batch `table`; a field
    whose values in this batch have a type its earlier values' cannot take names the batch's
    first row that gives it."""
    try:
        return pa.unify_schemas([earlier, table.schema], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    for name in (n for n in table.column_names if n in earlier.names):
        try:
            pair = [pa.schema([earlier.field(name)]), pa.schema([table.schema.field(name)])]
            pa.unify_schemas(pair, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            row = next(r for r in rows if r.get(name) is not None)
            rule = f"the {format_name} source gives {row[name]!r:.60} here, which does not fit the type of its earlier "
            rule += f"values ({earlier.field(name).type}); a field must have one type in every record"
            raise _row_error(row, label, name, rule) from None
    raise GacaError("the source's values of one field have types that do not agree", file=label)


def _write_part(parts: _Parts, rows: list[dict[str, Any]], format_name: str) -> None:
    names = list(parts.order)
    arrays = [_column(name, [r.get(name) for r in rows], rows, format_name, parts.label) for name in names]
    table = pa.Table.from_arrays(arrays, names=names)
    earlier = parts.schema
    parts.schema = table.schema if earlier is None else _unify(earlier, table, rows, format_name, parts.label)
    path = parts.directory / f"part-{len(parts.files):06d}.parquet"
    pq.write_table(table, path, compression="none")
    parts.files.append(path)
    parts.rows += table.num_rows


def _stream_parts(rows: Iterable[dict[str, Any]], parts: _Parts, format_name: str) -> None:
    from gaca_cli.log.schema import OUTPUT_COLUMNS

    batch: list[dict[str, Any]] = []
    size = 0
    reserved = frozenset(c.name for cols in OUTPUT_COLUMNS.values() for c in cols)  # the columns gaca writes
    for row in rows:
        row, n = _normalise(row, reserved, parts.renamed, parts.label)
        parts.order.update(dict.fromkeys(row))
        batch.append(row)
        size += n
        if len(batch) >= BATCH_ROWS or size >= BATCH_BYTES:
            _write_part(parts, batch, format_name)
            batch, size = [], 0
    if batch:
        _write_part(parts, batch, format_name)


def _column_order(names: Iterable[str]) -> list[str]:
    """gaca's columns first (in the schema's order), the source's own after them, `extra` last."""
    names = list(names)
    known = [n for n in KNOWN_TYPES if n in names]
    rest = [n for n in names if n not in KNOWN_TYPES and n != EXTRA]
    return known + rest + ([EXTRA] if EXTRA in names else [])


def _merge(parts: _Parts, out: str, metadata: Mapping[str, str]) -> list[str]:
    """Concatenate the parts into `out` under their unified schema; returns its column names."""
    assert parts.schema is not None
    schema = pa.schema([parts.schema.field(n) for n in _column_order(parts.schema.names)])
    schema = schema.with_metadata({k.encode(): v.encode() for k, v in metadata.items()})
    with pq.ParquetWriter(out, schema, compression="zstd", use_dictionary=["group_id"]) as writer:
        for path in parts.files:
            table = pq.read_table(path)
            columns = [
                table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                for f in schema
            ]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return schema.names


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote (or, for `validate --from`, checked), and the summary's data."""

    summary: dict[str, Any]
    violations: list[GacaError]


def _missing(columns: Sequence[str], steps_per_traj: int) -> list[str]:
    """What the imported log lacks, and what that means for each command."""
    have, notes = set(columns), []
    if not have & {"anchor_obs", "anchor_key"}:
        route = "or log anchor_obs"
        if "observation" in have:
            route = "read the observation as the anchor (gaca advantages --map anchor_obs=observation) where every"
            route += " step has one, or log anchor_obs"
        note = "no anchor column (anchor_obs): gigpo and gaca have no step groups to compare; use --method grpo, "
        notes.append(note + route)
    texts = {"prompt/messages": {"prompt", "messages", "prompt_token_ids"}, "action": {"action", "action_token_ids"}}
    if lacking := [name for name, names in texts.items() if not have & names]:
        notes.append(f"no {' or '.join(lacking)} (text or token ids): gaca score and train-offline cannot run")
    if "behavior_logprobs" not in have:
        notes.append("no behavior_logprobs: gaca's criticality needs `gaca score` first")
    if steps_per_traj <= 1:
        notes.append("every trajectory is one step: gigpo's and gaca's step signal adds nothing over grpo")
    return notes


def run_import(
    format_name: str, sources: Sequence[File], out: Path | None, options: ImportOptions, command: str = "validate"
) -> ImportResult:
    """Import `sources` in format `format_name`; write the log to `out` (atomically), or, when
    `out` is None, only check it. A source record that does not fit the format raises a
    GacaError (nothing written); a broken schema rule is returned in `violations` (nothing
    written either)."""
    from gaca_cli.files import atomic_path, missing_dirs, remove_empty, temporary_dir
    from gaca_cli.interrupts import ctrl_c_ignored
    from gaca_cli.log.checks import check_log
    from gaca_cli.log.reading import read_log

    if format_name not in FORMATS:
        raise GacaError(f"unknown format {format_name!r}; use one of {', '.join(FORMATS)}")
    module = format_module(format_name)
    info: FormatInfo = module.INFO
    files = expand_sources(sources, info.suffixes)
    label = ", ".join(str(s) for s in sources)
    # beside OUT (one file system for the final rename); a killed run's is removed by the next
    created = missing_dirs(Path(out).parent) if out is not None else []  # removed again if the import fails
    tmp = temporary_dir(out) if out is not None else Path(tempfile.mkdtemp(prefix=".import.", suffix=".tmp"))
    try:
        parts = _Parts(directory=tmp, label=label)
        _stream_parts(module.read(files, options), parts, format_name)
        if parts.rows == 0:
            raise GacaError(f"no records found for format {format_name}", file=label)
        merged = tmp / "log.parquet"
        about = {"format": format_name, "files": [str(f) for f in files], "source": info.source}
        columns = _merge(parts, str(merged), {"gaca.import": json.dumps(about, sort_keys=True)})
        log = read_log([merged], {}, columns=_checked_columns)
        result = check_log(log, command)
        violations = [_renamed(v, f"{label} (as imported)") for v in result.violations]
        steps = _max_steps(log) if not violations else 0
        summary = {
            "format": format_name,
            "files": len(files),
            "rows": parts.rows,
            "trajectories": _distinct(log, "traj_id"),
            "groups": _distinct(log, "group_id"),
            "mapped": {
                k: f"{options.field_map[k]} (--map {k}={options.field_map[k]})" if k in options.field_map else v
                for k, v in info.mapped.items()
                if k in columns
            },
            "derived": {k: v for k, v in info.derived.items() if k in columns},
            "kept": [c for c in columns if c not in KNOWN_TYPES],
            "renamed": dict(parts.renamed),
            "missing": _missing(columns, steps),
            "warnings": result.warnings,
        }
        if out is not None and not violations:
            with atomic_path(out) as final:
                os.replace(merged, final)
            summary["output"] = str(out)
        return ImportResult(summary=summary, violations=violations)
    finally:
        with ctrl_c_ignored():  # a Ctrl-C here would leave the work folder half removed
            shutil.rmtree(tmp, ignore_errors=True)
            if out is not None and not Path(out).exists():
                remove_empty(created)


def _checked_columns(names: list[str]) -> list[str]:
    """The columns the checks read: all but the long texts (bounded memory on big imports)."""
    return [n for n in names if n in KNOWN_TYPES and n not in UNCHECKED]


def _distinct(log: Any, column: str) -> int:
    return len(pc.unique(log.table.column(column))) if column in log.table.column_names else 0


def _max_steps(log: Any) -> int:
    value = pc.max(log.table.column("step_idx")).as_py()
    return 0 if value is None else int(value) + 1


def _renamed(error: GacaError, file: str) -> GacaError:
    """A violation found in the temporary imported file, named after the sources instead."""
    return GacaError(error.rule, file=file, column=error.column, rows=error.rows, n_rows=error.n_rows)
