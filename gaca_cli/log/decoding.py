"""Parquet files pyarrow cannot read as they are: encrypted files, and columns its decoder rejects.

Encrypted files (Parquet modular encryption, in the apache/parquet-format specification) are refused
from the footer's bytes, before pyarrow opens them: given no keys, pyarrow aborts the whole
process (an uncaught C++ exception) at its first look at an encrypted column's metadata, which
a plaintext footer lets it reach. A column pyarrow cannot decode in a file another writer made
is read by polars instead; where polars cannot read it either, the error names the writer.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError

ENCRYPTED = (
    "an encrypted Parquet file (Parquet modular encryption); gaca reads unencrypted files only: decrypt it first"
)
PYARROW_WRITER = "parquet-cpp-arrow"  # pyarrow's created_by: pyarrow reads what it writes, so a failure is damage


def encrypted(path: str) -> bool:
    """Whether `path` uses Parquet modular encryption, from its footer's bytes: "PARE" at either
    end (an encrypted footer), or a plaintext FileMetaData that names its encryption algorithm
    or footer signing key (fields 8 and 9, followed by the footer's signature). False for what
    is not Parquet at all or has a damaged footer: pyarrow's own error follows."""
    from gaca_cli.log._splice.thrift import DECODE_ERRORS, ThriftDecoder

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(4)
            f.seek(max(size - 8, 0))
            tail = f.read(8)
            if b"PARE" in (head, tail[4:]):
                return True
            length = int.from_bytes(tail[:4], "little")
            if size < 12 or tail[4:] != b"PAR1" or not 0 < length <= size - 12:
                return False
            if pq.read_metadata(path).serialized_size == length:  # no signature after the FileMetaData
                return False
            f.seek(size - 8 - length)
            meta = ThriftDecoder(f.read(length)).read_struct()
    except (OSError, pa.ArrowException, *DECODE_ERRORS):
        return False
    return meta.get(8) is not None or meta.get(9) is not None  # encryption_algorithm, footer_signing_key_metadata


def refuse_encrypted(paths: Sequence[str]) -> None:
    """One GacaError naming the first of `paths` that is an encrypted Parquet file."""
    for path in paths:
        if encrypted(path):
            raise GacaError(ENCRYPTED, file=path)


def read_failed(path: str, exc: BaseException, names: Sequence[str] | None) -> pa.Table:
    """The columns `names` of `path` (None: all) after pyarrow's read of them failed with `exc`:
    the columns pyarrow cannot decode read by polars and cast to the type pyarrow gives them,
    so that the table is the one pyarrow would read. Only for a file another writer made, and
    not past a page checksum that fails: a failure in a file pyarrow wrote is damage. Otherwise,
    or where polars cannot read them either, one GacaError naming the column (and the writer)."""
    import polars as pl

    from gaca_cli.log.io import READ_ERRORS, _first_line, _read_parquet, damaged_column, open_parquet, unreadable

    reason = _first_line(exc)
    try:
        with open_parquet(path) as f:
            writer, schema = f.metadata.created_by or "an unnamed writer", f.schema_arrow
        if writer.startswith(PYARROW_WRITER) or "crc" in reason.lower() or "checksum" in reason.lower():
            raise unreadable(path, exc, names)
        wanted = [n for n in (schema.names if names is None else names) if n in schema.names]
        failed = [n for n in wanted if damaged_column(path, [n]) is not None]
    except READ_ERRORS:
        raise unreadable(path, exc, names) from None
    if not failed:
        raise unreadable(path, exc, names)
    try:
        decoded = pl.read_parquet(path, columns=failed, use_pyarrow=False).to_arrow()
        decoded = decoded.cast(pa.schema([schema.field(n) for n in failed]))
    except BaseException as err:  # polars' own errors, and PanicException on a page it rejects
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        rule = f"not a readable Parquet file ({reason}); written by {writer}, which neither pyarrow nor polars decodes"
        raise GacaError(rule, file=path, column=failed[0]) from None
    rest = _read_parquet(path, columns=[n for n in wanted if n not in failed])
    columns = [decoded.column(n) if n in failed else rest.column(n) for n in wanted]
    return pa.Table.from_arrays(columns, schema=pa.schema([schema.field(n) for n in wanted]))
