"""Private: the output of `gaca advantages` written by splicing, Parquet written by our own code.

Why it exists: the output is the input plus a few numeric columns. pyarrow would decode every
carried column (prompts, observations: most of the bytes) and encode it again; the splice copies
the input's compressed column chunks byte for byte and encodes only the new columns. Measured
by bench/write.py (synthetic logs, the whole `write_annotated` call, 2 cores shared with other
jobs; the CPU ratio is the steadier figure):

    rows   write time, splice / plain     CPU ratio   output size, splice / plain   peak memory
    30k     0.05 s /  0.08 s   (1.6x)       1.7x        1.5 MB /   1.3 MB  (0.91x)    1.1x less
    1M      0.18 s /  1.77 s  (10.0x)      10.2x         49 MB /    56 MB  (1.13x)    1.5x less
    10M     0.81 s / 13.50 s  (16.6x)       9.4x        497 MB /   591 MB  (1.19x)    2.7x less

(the plain path reads every carried column back into memory; at 30k rows both take a blink.)

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
