"""Writing the annotated log of `gaca advantages`: every input column plus the method's, atomically."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.io import atomic_path, read_log, restore_column_names, write_parquet_atomic

if TYPE_CHECKING:
    from gaca_cli.advantages.run import AdvantagesRun


_DICTIONARY_COLUMNS = (C.ADV_METHOD, C.GROUP_ID, C.TRAJ_ID, C.SUCCESS, C.DONE)


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
    if log.plain_files and os.environ.get("GACA_NO_SPLICE", "") in ("", "0"):
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

