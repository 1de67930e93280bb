"""Parquet files pyarrow cannot read as they are: encrypted files, and columns its decoder rejects.

Encrypted files (Parquet modular encryption, in the apache/parquet-format specification) are refused
from the footer's bytes, before pyarrow opens them: given no keys, pyarrow aborts the whole
process (an uncaught C++ exception) at its first look at an encrypted column's metadata, which
a plaintext footer lets it reach. A column pyarrow cannot decode in a file another writer made
is read by polars instead (`read_failed` in gaca_cli/log/reading.py, which calls this module);
where polars cannot read it either, the error names the writer.
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
