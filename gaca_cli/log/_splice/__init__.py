"""Private: the output of `gaca advantages` written by splicing, Parquet written by our own code.

Why it exists: the output is the input plus a few numeric columns. pyarrow would decode every
carried column (prompts, observations: most of the bytes) and encode it again; the splice copies
the input's compressed column chunks byte for byte and encodes only the new columns. Measured
by bench/write.py (synthetic logs, 2-core machine, the whole `write_annotated` call):

    rows   write time, splice / plain      output size, splice / plain
    1M     0.10 s /  1.55 s  (15.6x)        49 MB /  56 MB  (1.13x)
    10M    0.70 s / 13.80 s  (19.8x)       497 MB / 591 MB  (1.19x)

(peak memory 2.1 GB against 5.8 GB at 10M rows: the plain path holds the whole table.)

The fence: only `gaca_cli.advantages.writing.write_annotated` calls `splice_columns`, and it
falls back to the plain pyarrow write, with a warning that gives the reason, whenever the
splice refuses its inputs (`SpliceUnsupported`, raised before anything is written);
`GACA_NO_SPLICE=1` in the environment skips the splice altogether. The tests run both paths
on files from pyarrow (every codec, data pages v1 and v2), polars and duckdb and compare what
pyarrow, polars and duckdb read back from each (tests/log/test_writers.py).

    thrift.py   the Thrift compact protocol (Parquet's footer encoding)
    footer.py   reading and checking a file's footer, its column chunks and stored Arrow schema
    writer.py   splice_columns: copy the kept chunks, encode the new ones, write the footer

The footer reader is also used by gaca_cli.log._anchor_scan, which walks the anchor column's
pages itself; the names it uses are re-exported here.
"""

from gaca_cli.log._splice.footer import (
    CC_META_DATA,
    CMD_TOTAL_UNCOMPRESSED_SIZE,
    FMD_ROW_GROUPS,
    FMD_SCHEMA,
    RG_COLUMNS,
    RG_NUM_ROWS,
    SpliceUnsupported,
    chunk_piece,
    read_footer,
    top_level_fields,
)
from gaca_cli.log._splice.thrift import CT_I32, ThriftDecoder, decode_struct, encode_struct
from gaca_cli.log._splice.writer import splice_columns

__all__ = [
    "CC_META_DATA",
    "CMD_TOTAL_UNCOMPRESSED_SIZE",
    "CT_I32",
    "FMD_ROW_GROUPS",
    "FMD_SCHEMA",
    "RG_COLUMNS",
    "RG_NUM_ROWS",
    "SpliceUnsupported",
    "ThriftDecoder",
    "chunk_piece",
    "decode_struct",
    "encode_struct",
    "read_footer",
    "splice_columns",
    "top_level_fields",
]
