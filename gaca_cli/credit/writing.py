"""Writing the annotated log of `gaca advantages`: every input column plus the method's, atomically.

Two paths write the same content (what pyarrow, polars and duckdb read back is compared in
tests/log/test_writers.py, on files from each of them):

- spliced: for plain Parquet files, the input's compressed column chunks are copied byte for
  byte and only the method's columns are encoded (the private gaca_cli.log._splice; 10-17x
  faster than the rewrite on 1M-10M rows, with up to 2.7x less memory: bench/write.py);
- rewritten: the whole log read and written again by pyarrow, for directories (hive
  partitions), for inputs the splice refuses, and whenever `GACA_NO_SPLICE=1` is set.

The splice never decodes what it copies, so the copied columns that the command did not read
(prompts, observations) are read back from the new file, page checksums verified, before it
is renamed into place (`check_copied_columns`): a damaged input page is one GacaError naming
the file and column, never an output no reader can open. It costs a decode of those columns
only: 0.13 s of the splice's 0.32 s for 1M rows of a 200-character text column
(bench/write.py --carried-text; the rewrite takes 1.9 s).

A refused splice is never silent: `write_annotated` warns (SpliceFallbackWarning, with the
reason) before it rewrites. Either way the output keeps every key/value metadata entry of the
(first) input file, such as pandas' index description, with gaca's own entries added, and the
carried columns keep the Arrow types the input stored.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.decoding import read_failed
from gaca_cli.log.io import (
    READ_ERRORS,
    atomic_path,
    damaged_column,
    open_parquet,
    read_key_value_metadata,
    read_log,
    restore_column_names,
    statistics_null_count,
    stored_arrow_schema,
    write_parquet_atomic,
)

if TYPE_CHECKING:
    from gaca_cli.credit.run import AdvantagesRun
    from gaca_cli.log.io import Log


_DICTIONARY_COLUMNS = (C.ADV_METHOD, C.GROUP_ID, C.TRAJ_ID, C.SUCCESS, C.DONE)

NO_SPLICE_ENV = "GACA_NO_SPLICE"  # set (to anything but "" or "0"): always write with pyarrow


class SpliceFallbackWarning(UserWarning):
    """The output could not be spliced from the input files and was written by pyarrow instead
    (the same content, more slowly); the message says why."""


def splice_disabled() -> bool:
    """Whether `GACA_NO_SPLICE` asks for the plain pyarrow write."""
    return os.environ.get(NO_SPLICE_ENV, "").strip() not in ("", "0")


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


def output_metadata(log: Log, metadata: Mapping[str, str]) -> dict[str, str]:
    """The output's key/value metadata: every entry of the log's first file (its ARROW:schema
    aside, which each writer makes for the output), then `metadata`, gaca's own, which replaces
    an older value of the same key."""
    out = read_key_value_metadata(log.files[0])
    out.update(metadata)
    return out


def with_stored_time_zones(table: pa.Table, path: str) -> pa.Table:
    """`table` with each timestamp column that pyarrow read without a time zone given back the
    one the file's stored Arrow schema records (pyarrow reads INT96 timestamps so; polars keeps
    the zone, from the input and from the spliced output alike). The values are instants in
    UTC either way: only the type changes."""
    stored = stored_arrow_schema(path)
    if stored is None:
        return table
    for i, field in enumerate(table.schema):
        if field.name not in stored.names:
            continue
        want = stored.field(field.name).type
        have = field.type
        if (
            pa.types.is_timestamp(have)
            and pa.types.is_timestamp(want)
            and have.tz is None
            and want.tz is not None
            and have.unit == want.unit
        ):
            table = table.set_column(i, field.with_type(want), table.column(i).cast(want))
    return table


def write_annotated(
    run: AdvantagesRun, out: str | os.PathLike, paths: Sequence[str | os.PathLike], column_map: Mapping[str, str]
) -> str:
    """Write every input column plus the method's columns to `out`, atomically; return
    "spliced" or "rewritten" (the module docstring says which and why). A refused splice
    warns with SpliceFallbackWarning before the rewrite."""
    from gaca_cli.log._splice import SpliceUnsupported, splice_columns

    log = run.log
    owned = set(C.ADVANTAGES_OUTPUTS)
    kept = [log.original_name(n) for n in log.file_schema.names if n not in owned]
    _check_no_clash(kept, log.renamed, run.new_columns, log.source)  # before either path starts
    metadata = output_metadata(log, run.metadata)
    if log.plain_files and not splice_disabled():
        drop = [log.original_name(n) for n in log.file_schema.names if n in owned]
        try:
            with atomic_path(out) as tmp:
                splice_columns(log.files, drop, run.new_columns, tmp, metadata, dictionary_columns=(C.ADV_METHOD,))
                unread = [n for n in kept if n not in drop and n not in _columns_read(log)]
                if unread:
                    check_copied_columns(tmp, log.files, unread)
            return "spliced"
        except SpliceUnsupported as exc:
            message = f"could not splice the output ({exc}); writing it with pyarrow instead (same content, slower)"
            warnings.warn(SpliceFallbackWarning(message), stacklevel=2)
    full = read_log(paths, column_map) if log.partial else log
    if full.table.num_rows != run.new_columns.num_rows:  # the files changed while we worked
        raise GacaError("the input changed while it was being read; run again", file=log.source)
    if log.partial and log.plain_files:  # the columns checked from their statistics, now read
        unread = [n for n in full.table.column_names if full.original_name(n) not in _columns_read(log)]
        starts = [0, *full.file_row_ends[:-1].tolist()]
        for name in unread:
            column = full.table.column(name)
            if pa.types.is_nested(column.type):
                continue
            for path, lo, hi in zip(full.files, starts, full.file_row_ends.tolist()):
                check_null_statistics(path, full.original_name(name), column.slice(lo, hi - lo).null_count)
    table = annotated_table(full.table, full.renamed, run.new_columns, full.source)
    table = with_stored_time_zones(table, full.files[0])
    dictionary = [n for n in table.column_names if n in _DICTIONARY_COLUMNS]
    int96 = _has_int96_timestamps(full.files[0])
    write_parquet_atomic(table, out, metadata, dictionary_columns=dictionary, int96_timestamps=int96)
    return "rewritten"


def check_copied_columns(spliced: str, files: Sequence[str], copied: Sequence[str]) -> None:
    """Read back the columns the splice copied byte for byte (`copied`, names in the files)
    from the spliced output, as any reader would, page checksums verified: the command never
    reads them, so this is where a damaged page of theirs is found, before the output is
    renamed into place. Their nulls are counted too: the not-null checks took them from the
    footers' statistics, which damaged pages no longer match. A damaged input is a GacaError
    naming the input file and column; an output that fails although every input reads is
    refused as a splice (the caller then writes it with pyarrow). Costs a decode of the
    copied columns (bench/write.py)."""
    nulls = dict.fromkeys(copied, 0)
    try:
        with open_parquet(spliced) as f:
            rows = 0
            for batch in f.iter_batches(batch_size=_CHECK_BATCH_ROWS, columns=list(copied)):
                rows += batch.num_rows
                for name, column in zip(batch.schema.names, batch.columns):
                    nulls[name] += column.null_count
            flat = [c.name for c in f.schema_arrow if c.name in nulls and not pa.types.is_nested(c.type)]
            if rows != f.metadata.num_rows:  # a damaged page header can make a lone column read short
                raise pa.ArrowInvalid(f"read {rows} rows of {f.metadata.num_rows}")
    except READ_ERRORS as exc:
        from gaca_cli.log._splice import SpliceUnsupported

        for path in files:
            column = damaged_column(path, copied)
            if column is not None:  # one error, unless polars decodes it: then the full read does
                read_failed(path, exc, [column])
                raise SpliceUnsupported(f"pyarrow cannot decode column '{column}' of {path}") from None
        raise SpliceUnsupported(f"the spliced output does not read back ({exc})") from None
    wrong = [n for n in flat if statistics_null_count(spliced, n) not in (None, nulls[n])]
    if wrong:
        for path in files:
            for name in wrong:
                with open_parquet(path) as f:
                    found = f.read(columns=[name]).column(0).null_count if name in f.schema_arrow.names else None
                check_null_statistics(path, name, found)
        from gaca_cli.log._splice import SpliceUnsupported

        raise SpliceUnsupported(f"the spliced output's null counts differ from its statistics ({wrong})")


def check_null_statistics(path: str, name: str, found: int | None) -> None:
    """Raise a GacaError when the `found` nulls of the flat column `name` of the file `path`
    (None: the file lacks it) are not the count its footer's statistics record."""
    expected = statistics_null_count(path, name)
    if found is not None and expected is not None and found != expected:
        raise GacaError(
            f"not a readable Parquet file (its pages hold {found} nulls, its footer's statistics say {expected})",
            file=path,
            column=name,
        )


def _columns_read(log: Log) -> set[str]:
    """The log's columns (names in the files) that the command has read whole from its files,
    page checksums verified: those in its table and an anchor column left on disk whose
    hashes were computed (gaca_cli.log.anchors.StreamedAnchors)."""
    from gaca_cli.log.anchors import StreamedAnchors

    read = {log.original_name(n) for n in log.table.column_names}
    for value in log.cache.values():
        if isinstance(value, StreamedAnchors) and value.read_whole:
            read.add(value.column)
    return read


def check_unread_columns(log: Log) -> None:
    """Read the columns of a log of plain files that `log` did not read, as `advantages` reads
    back the columns it copies and `validate` reads them all (check_copied_columns): a damaged
    page is the same one GacaError in a command that reads fewer columns (`inspect`)."""
    from gaca_cli.log._splice import SpliceUnsupported

    read = _columns_read(log)
    for path in log.files if log.plain_files else ():
        unread = [n for n in pq.read_schema(path).names if n not in read]
        try:
            if unread:
                check_copied_columns(path, [path], unread)
        except SpliceUnsupported:  # a column pyarrow cannot decode that polars reads: readable
            pass


_CHECK_BATCH_ROWS = 65536  # rows decoded at a time by check_copied_columns (bounded memory)


def _has_int96_timestamps(path: str) -> bool:
    """Whether the file stores timestamps as INT96 (Spark's layout, pyarrow's
    use_deprecated_int96_timestamps): the rewrite then stores them so too, and every reader
    types them as it typed the input's (pyarrow without a time zone, duckdb as TIMESTAMP)."""
    schema = pq.read_metadata(path).schema
    return any(schema.column(j).physical_type == "INT96" for j in range(len(schema)))
