"""Writing Parquet: atomically (`gaca_cli.files.atomic_path`), and the checks of a written
file that its writer cannot make (columns copied without decoding read back, null counts
against the footer's statistics), with the helpers that keep an input's types."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.files import atomic_path
from gaca_cli.log._splice.footer import SpliceUnsupported
from gaca_cli.log.reading import (
    READ_ERRORS,
    Log,
    damaged_column,
    open_parquet,
    read_failed,
    statistics_null_count,
    stored_arrow_schema,
)


def write_parquet_atomic(
    table: pa.Table,
    out: str | os.PathLike,
    metadata: Mapping[str, str],
    dictionary_columns: Sequence[str] = (),
    *,
    int96_timestamps: bool = False,
) -> None:
    """Write `table` to `out` through a temporary file in the same directory and a rename, so
    that `out` either keeps its old content or holds the complete new file.

    Dictionary encoding is used only for `dictionary_columns` and columns that are already
    dictionary-typed: on high-cardinality text (prompts, observations) it costs most of the
    write time and saves nothing. `int96_timestamps` stores timestamps as INT96 (as an input
    that had them did)."""
    meta = dict(table.schema.metadata or {})
    meta.update(
        {k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape") for k, v in metadata.items()}
    )
    table = table.replace_schema_metadata(meta)
    dictionary = [
        name
        for name, col in zip(table.column_names, table.columns)
        if name in dictionary_columns or pa.types.is_dictionary(col.type)
    ]
    # statistics on every column: min/max help readers skip row groups, and their null
    # counts let the next command check a column it does not read without reading it
    with atomic_path(out) as tmp:
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            use_dictionary=dictionary or False,
            use_deprecated_int96_timestamps=int96_timestamps,
        )


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


def columns_read(log: Log) -> set[str]:
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
    read = columns_read(log)
    for path in log.files if log.plain_files else ():
        unread = [n for n in pq.read_schema(path).names if n not in read]
        try:
            if unread:
                check_copied_columns(path, [path], unread)
        except SpliceUnsupported:  # a column pyarrow cannot decode that polars reads: readable
            pass


_CHECK_BATCH_ROWS = 65536  # rows decoded at a time by check_copied_columns (bounded memory)


def has_int96_timestamps(path: str) -> bool:
    """Whether the file stores timestamps as INT96 (Spark's layout, pyarrow's
    use_deprecated_int96_timestamps): the rewrite then stores them so too, and every reader
    types them as it typed the input's (pyarrow without a time zone, duckdb as TIMESTAMP)."""
    schema = pq.read_metadata(path).schema
    return any(schema.column(j).physical_type == "INT96" for j in range(len(schema)))
