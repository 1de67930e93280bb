"""Private: the output of `gaca advantages` written by splicing, Parquet written by our own code.

Why it exists: the output is the input plus a few numeric columns. pyarrow would decode every
carried column (prompts, observations: most of the bytes) and encode it again; the splice copies
the input's compressed column chunks byte for byte and encodes only the new columns (10x to 17x
faster than the plain write at 1M-10M rows: bench/write.py, docs/performance.md).

The fence: only `gaca_cli.credit.writing.write_annotated` calls `splice_columns`, and it
falls back to the plain pyarrow write, with a warning that gives the reason, whenever the
splice refuses its inputs (`SpliceUnsupported`, raised before anything is written);
`GACA_NO_SPLICE=1` in the environment skips the splice altogether. The tests run both paths
on files from pyarrow (every codec, data pages v1 and v2), polars and duckdb and compare what
pyarrow, polars and duckdb read back from each (tests/log/test_writers.py).

    thrift.py   the Thrift compact protocol (Parquet's footer encoding)
    footer.py   reading and checking a file's footer, its column chunks and stored Arrow schema
    writer.py   splice_columns: copy the kept chunks, encode the new ones, write the footer
"""

from gaca_cli.log._splice.footer import SpliceUnsupported
from gaca_cli.log._splice.writer import splice_columns

__all__ = ["SpliceUnsupported", "splice_columns"]
