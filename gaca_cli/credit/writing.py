"""Writing the annotated log of `gaca advantages`: every input column plus the method's, atomically.

Two paths write the same content (tests/log/test_writers.py compares what pyarrow, polars and
duckdb read back): spliced, for plain Parquet files (the private gaca_cli.log._splice copies
the input's compressed column chunks and encodes only the method's columns), or rewritten by
pyarrow, for directories, for inputs the splice refuses (a SpliceFallbackWarning gives the
reason) and whenever `GACA_NO_SPLICE=1` is set. docs/performance.md has the measurements.

The splice never decodes what it copies, so the copied columns that the command did not read
are read back from the new file, page checksums verified, before it is renamed into place
(`check_copied_columns`): a damaged input page is one GacaError naming the file and column,
never an output no reader can open. Either way the output keeps every key/value metadata entry
of the (first) input file, with gaca's own entries added, and the Arrow types the input stored.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from gaca_cli.credit.run import AdvantagesRun, _check_no_clash, annotated_table
from gaca_cli.errors import GacaError
from gaca_cli.files import atomic_path
from gaca_cli.log import columns as C
from gaca_cli.log.reading import read_key_value_metadata, read_log
from gaca_cli.log.writing import (
    check_copied_columns,
    check_null_statistics,
    columns_read,
    has_int96_timestamps,
    with_stored_time_zones,
    write_parquet_atomic,
)

if TYPE_CHECKING:
    from gaca_cli.log.reading import Log


_DICTIONARY_COLUMNS = (C.ADV_METHOD, C.GROUP_ID, C.TRAJ_ID, C.SUCCESS, C.DONE)

NO_SPLICE_ENV = "GACA_NO_SPLICE"  # set (to anything but "" or "0"): always write with pyarrow


class SpliceFallbackWarning(UserWarning):
    """The output could not be spliced from the input files and was written by pyarrow instead
    (the same content, more slowly); the message says why."""


def splice_disabled() -> bool:
    """Whether `GACA_NO_SPLICE` asks for the plain pyarrow write."""
    return os.environ.get(NO_SPLICE_ENV, "").strip() not in ("", "0")


def output_metadata(log: Log, metadata: Mapping[str, str]) -> dict[str, str]:
    """The output's key/value metadata: every entry of the log's first file (its ARROW:schema
    aside, which each writer makes for the output), then `metadata`, gaca's own, which replaces
    an older value of the same key."""
    return {**read_key_value_metadata(log.files[0]), **metadata}


def whole_annotated(
    run: AdvantagesRun, paths: Sequence[str | os.PathLike], column_map: Mapping[str, str] | None
) -> tuple[Log, pa.Table]:
    """(the whole log, the annotated table: every column of the files and the method's), the
    files read again when the run read only some columns; the columns that were checked from
    their statistics alone are checked on their values now."""
    log = run.log
    full = read_log(paths, column_map) if log.partial else log
    if full.table.num_rows != run.new_columns.num_rows:  # the files changed while we worked
        raise GacaError("the input changed while it was being read; run again", file=log.source)
    if log.partial and log.plain_files:  # the columns checked from their statistics, now read
        read = columns_read(log)
        unread = [n for n in full.table.column_names if full.original_name(n) not in read]
        starts = [0, *full.file_row_ends[:-1].tolist()]
        for name in unread:
            column = full.table.column(name)
            if pa.types.is_nested(column.type):
                continue
            for path, lo, hi in zip(full.files, starts, full.file_row_ends.tolist()):
                check_null_statistics(path, full.original_name(name), column.slice(lo, hi - lo).null_count)
    table = annotated_table(full.table, full.renamed, run.new_columns, full.source)
    return full, with_stored_time_zones(table, full.files[0])


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
                read = columns_read(log)
                unread = [n for n in kept if n not in drop and n not in read]
                if unread:
                    check_copied_columns(tmp, log.files, unread)
            return "spliced"
        except SpliceUnsupported as exc:
            message = f"could not splice the output ({exc}); writing it with pyarrow instead (same content, slower)"
            warnings.warn(SpliceFallbackWarning(message), stacklevel=2)
    full, table = whole_annotated(run, paths, column_map)
    dictionary = [n for n in table.column_names if n in _DICTIONARY_COLUMNS]
    int96 = has_int96_timestamps(full.files[0])
    write_parquet_atomic(table, out, metadata, dictionary_columns=dictionary, int96_timestamps=int96)
    return "rewritten"
