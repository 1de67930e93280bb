"""Anchor states: the anchor column of a log, its hashes and exact comparisons, and the
anchor warnings (empty anchors, episode groups whose step-0 anchors differ).

Hashes only find candidates for equal anchors; every match is confirmed exactly, so a hash
collision can never merge two different anchors. The column is held one of two ways:
`PolarsAnchors` keeps it in memory as one polars Series; `StreamedAnchors` keeps only its
hashes, compares in its one pass the pairs step grouping asks about (`expect_groups`), and
reads the text again from the files for any other pair.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.grouping import contiguous_decoded
from gaca_cli.log.index import TrajectoryIndex
from gaca_cli.log.reading import READ_ERRORS, Log, _polars_reads, not_readable, open_parquet, statistics_null_count

if TYPE_CHECKING:
    import polars as pl

T = TypeVar("T")
U = TypeVar("U")

HASH_SEED = 0  # polars' hashes are stable within one process (and one polars version)
#: text read per batch by `StreamedAnchors` (estimated in memory, as polars string views)
BATCH_BYTES = 128 * 2**20
#: wanted rows this far apart are read as separate runs (see `StreamedAnchors._lookup`)
GAP_ROWS = 65536
#: rows pyarrow reads at a time in the pass (small reads reuse memory: 1.2x faster than
#: reading a whole batch at once)
PIECE_ROWS = 65536
#: row groups the pass reads at once, each on a thread of its own
READ_THREADS = 2
_VIEW_BYTES = 16  # a polars string view per row, besides the text


def anchor_series(column: pa.ChunkedArray | pa.Array) -> pl.Series:
    """An anchor column as one polars Series in file order (string views: gathers move
    16-byte views, not the text)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    # one chunk: polars gathers from a many-chunk series ~30x slower
    import polars as pl  # imported on use: `gaca --help` does not need it

    series = pl.from_arrow(column)
    assert isinstance(series, pl.Series)  # an array, not a table
    return series.rechunk()


class Anchors:
    """An anchor column, addressed by file row. `PolarsAnchors` holds it as a polars Series;
    `StreamedAnchors` reads it from the files without keeping it. Hashes only find
    candidates; `equal_rows` decides, exactly."""

    def file_hashes(self) -> np.ndarray:
        """uint64 [N] hash of each row's anchor (equal anchors, equal hashes)."""
        raise NotImplementedError

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        """bool [len(rows_a)]: anchor of row rows_a[i] == anchor of row rows_b[i], exactly."""
        raise NotImplementedError

    @property
    def read_whole(self) -> bool:
        """Whether the column has been read (hashed) whole: a column held in memory always."""
        return True

    def expect_groups(self, groups: np.ndarray) -> None:
        """The episode group of each file row (int64 [N]), told before `file_hashes`: the pairs
        `equal_rows` will be asked about are each row and the first row of the file with its
        group and hash (`gaca_cli.credit.step_groups.hash_codes`). A column held in memory
        compares any pair at once and ignores it."""

    def values(self, rows: np.ndarray) -> pa.Array:
        """The anchors of the given rows, as one plain array."""
        raise NotImplementedError

    def empty_count(self) -> int | None:
        """Rows whose anchor is the empty string (None for integer anchors)."""
        raise NotImplementedError


@dataclass(frozen=True)
class PolarsAnchors(Anchors):
    """An anchor column held as one polars Series in file order (see `anchor_series`)."""

    series: pl.Series

    def file_hashes(self) -> np.ndarray:
        return self.series.hash(seed=HASH_SEED).to_numpy().astype(np.uint64, copy=False)

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        return (self.series.gather(rows_a) == self.series.gather(rows_b)).to_numpy()

    def values(self, rows: np.ndarray) -> pa.Array:
        return contiguous_decoded(self.series.gather(rows).to_arrow())

    def empty_count(self) -> int | None:
        import polars as pl

        if self.series.dtype != pl.String:
            return None
        return int((self.series.str.len_bytes() == 0).sum())


class StreamedAnchors(Anchors):
    """A text anchor column of plain Parquet files, left on disk.

    One pass reads the column (pyarrow, which verifies page checksums and reports a damaged
    page as an error; two row groups at a time on threads of their own, overlapping the work
    on what was read: see `_verified_pieces`) and hashes it with polars (the hash
    `PolarsAnchors` gives), keeping 8 bytes per row. Given the rows' episode groups first
    (`expect_groups`), the same pass compares each row with the first row of its group with
    the same hash (`_FirstRows`, on batches of about `BATCH_BYTES` of text), so step grouping
    needs no second read. Other pairs are read again
    (polars, which skips the pages outside the rows it wants, and only from files that pass
    has read whole, unchanged since: their size and modification time): `equal_rows` reads
    only the batches that hold them; a pair inside one batch is compared there; for a pair
    spanning batches, the earlier row's text is copied out of its batch and kept until the
    batch holding the later row arrives. `values` reads the batches holding the rows asked
    for. Peak memory: the hashes, a few batches, and the kept text of pairs spanning batches.
    """

    def __init__(
        self,
        files: Sequence[str],
        column: str,
        row_groups: Sequence[Sequence[int]],
        nbytes: int,
        stamps: Sequence[tuple[int, int] | None],
        batch_bytes: int | None = None,
    ):
        self.files = tuple(files)
        self.column = column  # the name in the files
        self.nbytes = nbytes  # the column in memory as polars holds it (estimated from the footers)
        self._stamps = tuple(stamps)
        self._row_groups = tuple(tuple(int(n) for n in rows) for rows in row_groups)  # rows of each, per file
        file_rows = [sum(rows) for rows in self._row_groups]
        self.n_rows = int(sum(file_rows))
        per_row = max(1, nbytes // max(1, self.n_rows))
        self._batch_bytes = BATCH_BYTES if batch_bytes is None else batch_bytes
        size = max(1, self._batch_bytes // per_row)
        self._size = size  # rows per batch (the last batch of each file may be shorter)
        # batches: rows [start[k], start[k + 1]) of the log, inside file batch_file[k]
        starts, files_of = [], []
        first = 0
        for f, rows in enumerate(file_rows):
            for lo in range(0, rows, size):
                starts.append(first + lo)
                files_of.append(f)
            first += rows
        self._batch_start = np.array([*starts, self.n_rows], dtype=np.int64)
        self._batch_file = np.array(files_of, dtype=np.int64)
        self._file_start = np.concatenate([[0], np.cumsum(file_rows)]).astype(np.int64)
        self._groups: np.ndarray | None = None  # see expect_groups

    @classmethod
    def from_files(
        cls, files: Sequence[str | os.PathLike], column: str, batch_bytes: int | None = None
    ) -> StreamedAnchors | None:
        """The column `column` (its name in the files) of plain Parquet files, from their
        footers; None when a file lacks it, it is not text, or polars cannot read a file
        (then it is read whole, the ordinary way)."""
        row_groups, nbytes, stamps = [], 0, []
        for path in files:
            stamps.append(_stamp(path))
            meta = pq.read_metadata(path)
            schema = meta.schema.to_arrow_schema()
            if column not in schema.names or not all(_polars_reads(field.type) for field in schema):
                return None
            t = schema.field(column).type
            t = t.value_type if pa.types.is_dictionary(t) else t
            if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
                return None
            leaf = next(i for i in range(meta.num_columns) if meta.schema.column(i).path == column)
            row_groups.append([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
            nbytes += _VIEW_BYTES * meta.num_rows
            nbytes += sum(meta.row_group(g).column(leaf).total_uncompressed_size for g in range(meta.num_row_groups))
        return cls([str(p) for p in files], column, row_groups, nbytes, stamps, batch_bytes)

    def file_hashes(self) -> np.ndarray:
        return self._first_pass[0]

    def expect_groups(self, groups: np.ndarray) -> None:
        if not self.read_whole and len(groups) == self.n_rows:
            self._groups = np.asarray(groups, dtype=np.int64)

    @property
    def read_whole(self) -> bool:
        """Whether the pass over the whole column (page checksums verified) has run."""
        return "_first_pass" in self.__dict__  # functools.cached_property keeps its value there

    def empty_count(self) -> int | None:
        return self._first_pass[1]

    @cached_property
    def _first_pass(self) -> tuple[np.ndarray, int, _FirstRows | None]:
        """(uint64 [N] hashes, count of empty anchors, the comparisons with the first rows of
        (group, hash) when the groups were expected), from one pass over the column."""
        import polars as pl

        hashes = np.empty(self.n_rows, dtype=np.uint64)
        first_rows = None if self._groups is None else _FirstRows(self._groups, hashes)
        empty = at = begin = 0  # rows [begin, at) wait in `pending` for first_rows
        pending: list[pl.Series] = []
        for text in self._verified_pieces():
            hashes[at : at + len(text)] = text.hash(seed=HASH_SEED).to_numpy()
            empty += int((text.str.len_bytes() == 0).sum())
            at += len(text)
            if first_rows is not None:
                pending.append(text)
                if at - begin >= self._size or at == self.n_rows:
                    first_rows.add(begin, pl.concat(pending, rechunk=True))
                    pending, begin = [], at
        self._groups = None
        return hashes, empty, first_rows

    def _verified_pieces(self) -> Iterator[pl.Series]:
        """The column's text in row order, in pieces of at most `PIECE_ROWS` rows as pyarrow
        reads them (page checksums verified: see gaca_cli.log.reading.open_parquet), each as the
        polars String series `_read` gives. When no row group holds more than two batches of
        text, row groups (of all the files, in order) are read `READ_THREADS` at a time, each
        by a thread with a reader of its own, and handed on in order; otherwise the files are
        read piece by piece, the next piece read while the last is worked on. Hashes do not
        depend on where the pieces split."""
        per_row = max(1, self.nbytes // max(1, self.n_rows))
        size = min(self._size, PIECE_ROWS)
        whole = all(n * per_row <= 2 * self._batch_bytes for rows in self._row_groups for n in rows)
        with _Readers() as readers, ThreadPoolExecutor(READ_THREADS, thread_name_prefix="gaca-anchors") as pool:
            units = [(path, k) for path, rows in zip(self.files, self._row_groups) for k in range(len(rows))]
            work = functools.partial(_row_group_pieces, readers, self.column, size)
            groups = _in_order(pool, work, units) if whole else iter(())
            for f, path in enumerate(self.files):
                if _stamp(path) != self._stamps[f]:
                    raise GacaError("the input changed while it was being read; run again", file=path)
                expected = int(self._file_start[f + 1] - self._file_start[f])
                nulls = read = 0
                try:
                    if whole:
                        pieces: Iterator[_Piece] = itertools.chain.from_iterable(
                            next(groups) for _ in self._row_groups[f]
                        )
                    else:
                        pieces = _read_ahead(pool, _pieces(readers.get(path), self.column, size))
                    for rows, null_count, text in pieces:
                        read += rows
                        nulls += null_count
                        if read > expected:  # reported below, before any hash lands out of range
                            break
                        yield text
                    else:  # every read of the file is done (and none to come): its readers can go
                        if path not in self.files[f + 1 :]:
                            readers.close(path)
                except READ_ERRORS as exc:
                    raise not_readable(path, exc, self.column) from None
                if _stamp(path) != self._stamps[f]:
                    raise GacaError("the input changed while it was being read; run again", file=path)
                # the not-null check took the footer's count: pages that disagree are damaged
                recorded = statistics_null_count(path, self.column)
                problem = f"its pages hold {read} rows, its footer says {expected}" if read != expected else None
                if problem is None and recorded is not None and recorded != nulls:
                    problem = f"its pages hold {nulls} nulls, its footer's statistics say {recorded}"
                if problem is not None:
                    raise GacaError(f"not a readable Parquet file ({problem})", file=path, column=self.column)

    def equal_rows(self, rows_a: np.ndarray, rows_b: np.ndarray) -> np.ndarray:
        a, b = self._rows(rows_a), self._rows(rows_b)
        hashes = self.file_hashes()
        same = hashes[a] == hashes[b]
        check = np.flatnonzero(same & (a != b))
        first_rows = self._first_pass[2]
        if len(check) and first_rows is not None:  # pairs the pass compared
            known, equal = first_rows.lookup(a[check], b[check])
            same[check[known]] = equal[known]
            check = check[~known]
        if len(check):
            same[check] = self._compare(a[check], b[check])
        return same

    def _compare(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """bool [P]: text of row a[i] == text of row b[i], read from the files batch by batch."""
        import polars as pl

        early, late = np.minimum(a, b), np.maximum(a, b)
        early_batch, late_batch = self._batch_of(early), self._batch_of(late)
        by_late = np.argsort(late_batch, kind="stable")  # pairs grouped by their later row's batch
        ends = np.searchsorted(late_batch[by_late], np.arange(len(self._batch_file) + 1))
        # earlier rows of pairs spanning batches, and the last row compared with each
        across = np.flatnonzero(early_batch != late_batch)
        keep_rows, pair_keep = np.unique(early[across], return_inverse=True)
        keep_until = np.full(len(keep_rows), -1, dtype=np.int64)
        np.maximum.at(keep_until, pair_keep, late[across])
        kept_rows = kept_until = np.zeros(0, dtype=np.int64)
        kept = pa.array([], type=pa.large_string())  # text of kept_rows, copied out of its batch
        out = np.empty(len(a), dtype=bool)
        for k in np.unique(np.concatenate([early_batch, late_batch])).tolist():
            start, stop = self._batch_start[k], self._batch_start[k + 1]
            pairs = by_late[ends[k] : ends[k + 1]]  # the pairs whose later row is in this batch
            x, y = early[pairs], late[pairs]
            inside = x >= start
            p, q = np.searchsorted(keep_rows, [start, stop])
            new = p + np.flatnonzero(keep_until[p:q] >= stop)  # kept for pairs ending in later batches
            at = self._lookup(k, np.concatenate([x[inside], y, keep_rows[new]]))
            out[pairs[inside]] = (at(x[inside]) == at(y[inside])).to_numpy()
            if not inside.all():
                earlier = pl.from_arrow(kept).gather(np.searchsorted(kept_rows, x[~inside]))
                out[pairs[~inside]] = (earlier == at(y[~inside])).to_numpy()
            alive = kept_until >= stop  # drop what no pair needs any more
            if alive.all() and not len(new):
                continue
            copied = contiguous_decoded(at(keep_rows[new]).to_arrow())  # its own buffers, not the batch's
            kept = pa.concat_arrays([kept.filter(pa.array(alive)), copied])
            kept_rows = np.concatenate([kept_rows[alive], keep_rows[new]])
            kept_until = np.concatenate([kept_until[alive], keep_until[new]])
        return out

    def values(self, rows: np.ndarray) -> pa.Array:
        rows = self._rows(rows)
        wanted, inverse = np.unique(rows, return_inverse=True)
        parts = [pa.array([], type=pa.large_string())]
        for k in np.unique(self._batch_of(wanted)).tolist():
            i, j = np.searchsorted(wanted, self._batch_start[k : k + 2])
            parts.append(contiguous_decoded(self._lookup(k, wanted[i:j])(wanted[i:j]).to_arrow()))
        return pa.concat_arrays(parts).take(pa.array(inverse))

    def _rows(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n_rows):
            raise IndexError(f"rows out of range 0..{self.n_rows - 1}")
        return rows

    def _batch_of(self, rows: np.ndarray) -> np.ndarray:
        """The batch holding each row."""
        return np.searchsorted(self._batch_start, rows, side="right") - 1

    def _lookup(self, k: int, rows: np.ndarray) -> Callable[[np.ndarray], pl.Series]:
        """A function giving the texts of any of `rows` (rows of batch k, in any order), read
        once: the whole batch when they are many, else only runs of rows around them (split
        where `GAP_ROWS` or more rows are not wanted), so that sparse rows cost only the
        pages that hold them."""
        import polars as pl

        start, stop = int(self._batch_start[k]), int(self._batch_start[k + 1])
        if len(rows) * 4 >= stop - start:
            whole = self._read(k, start, stop)
            return lambda r: whole.gather(r - start)
        wanted = np.unique(rows)
        runs = np.split(wanted, np.flatnonzero(np.diff(wanted) >= GAP_ROWS) + 1)
        parts = [self._read(k, int(run[0]), int(run[-1]) + 1).gather(run - run[0]) for run in runs if len(run)]
        text = pl.concat(parts).rechunk() if parts else pl.Series(self.column, [], dtype=pl.String)
        return lambda r: text.gather(np.searchsorted(wanted, r))

    def _read(self, k: int, lo: int, hi: int) -> pl.Series:
        """Rows lo..hi-1 of the log (all in batch k), read by polars (which skips the row
        groups and pages outside them)."""
        import polars as pl

        f = int(self._batch_file[k])
        path = self.files[f]
        if _stamp(path) != self._stamps[f]:
            raise GacaError("the input changed while it was being read; run again", file=path)
        try:
            scan = pl.scan_parquet(path, glob=False, hive_partitioning=False).select(pl.col(self.column))
            text = scan.slice(lo - int(self._file_start[f]), hi - lo).collect().to_series()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - polars' PanicException derives from BaseException
            raise not_readable(path, exc) from None
        if len(text) != hi - lo:
            raise GacaError("the input changed while it was being read; run again", file=path)
        # one chunk: polars gathers from a many-chunk series ~20x slower
        return _as_string_series(text).rechunk()


#: batches of text `_FirstRows` keeps for first rows that later rows will be compared with
KEEP_BATCHES = 3
_MIX = np.uint64(0x9E3779B97F4A7C15)  # spreads group codes over 64 bits before they meet the hash


class _FirstRows:
    """The comparisons `step_group_codes` needs, made during `StreamedAnchors`' one pass:
    each row with the first row of the file that has its episode group and hash.

    Batches arrive in file order. A key of (group, hash) is looked up among the first rows
    seen (`live`: one row per key whose group has rows still to come) and the batch's own
    rows, with a polars window over one integer mixing group and hash; a mixed key shared by
    two (group, hash) pairs is told apart by checking the pair and left to `equal_rows`'
    second read. The text of a first row stays in its batch, which is kept while a live key
    points into it, at most `KEEP_BATCHES` of them (older ones are dropped and the rows that
    would have needed them are compared by the second read).

    verdict int8 [N]: 3 the first row of its key, 1 equal to it, 2 different, 0 not compared.
    """

    def __init__(self, groups: np.ndarray, hashes: np.ndarray):
        import polars as pl

        self.groups = groups
        self.hashes = hashes  # filled by the pass before each batch is added
        self.verdict = np.zeros(len(groups), dtype=np.int8)
        frame = pl.DataFrame({"g": groups}).with_row_index("row")
        last = frame.group_by("g").agg(pl.col("row").max())
        self.last_row = np.full(int(groups.max()) + 1 if len(groups) else 0, -1, dtype=np.int64)
        self.last_row[last["g"].to_numpy()] = last["row"].to_numpy()
        self.live = pl.DataFrame(schema={"key": pl.UInt64, "g": pl.Int64, "ref": pl.Int64})
        self.kept: list[tuple[int, pl.Series]] = []  # (first row, text) of the batches kept

    def add(self, start: int, text: pl.Series) -> None:
        """Compare the rows of the batch starting at file row `start` (their hashes already in
        `hashes`) with the first rows of their keys."""
        import polars as pl

        stop = start + len(text)
        rows = np.arange(start, stop, dtype=np.int64)
        g, h = self.groups[start:stop], self.hashes[start:stop]
        key = h ^ (g.astype(np.uint64) * _MIX)
        both = pl.concat([self.live, pl.DataFrame({"key": key, "g": g, "ref": rows})])
        first = both.select(pl.col("ref").first().over("key")).to_series().to_numpy()
        rep = first[len(self.live) :]
        verdict = np.zeros(len(rows), dtype=np.int8)
        verdict[rep == rows] = 3
        at = np.flatnonzero((rep >= 0) & (rep < rows))  # -1: the first row's batch was dropped
        at = at[(self.groups[rep[at]] == g[at]) & (self.hashes[rep[at]] == h[at])]  # not a mixed-key clash
        self.kept.append((start, text))
        for begin, kept in self.kept:
            inside = at[(rep[at] >= begin) & (rep[at] < begin + len(kept))]
            if len(inside):
                equal = (text.gather(inside) == kept.gather(rep[inside] - begin)).to_numpy()
                verdict[inside] = np.where(equal, 1, 2)
        self.verdict[start:stop] = verdict
        # the first rows of keys whose group goes on past this batch, and the batches they are in
        refs, groups = both["ref"].to_numpy(), both["g"].to_numpy()
        self.live = both.filter(pl.Series((first == refs) & (self.last_row[groups] >= stop)))
        refs = self.live["ref"].to_numpy()
        self.kept = [(b, kept) for b, kept in self.kept if ((refs >= b) & (refs < b + len(kept))).any()]
        if len(self.kept) > KEEP_BATCHES:  # the oldest batches go; their keys stay known
            cut = self.kept[-KEEP_BATCHES][0]
            self.kept = self.kept[-KEEP_BATCHES:]
            self.live = self.live.with_columns(
                pl.when(pl.col("ref") < cut).then(-1).otherwise(pl.col("ref")).alias("ref")
            )

    def lookup(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(known, equal) bool [P] for pairs of rows with equal hashes: known where b is the
        first row of a's group and hash and the pass compared a with it."""
        v = self.verdict
        known = (v[b] == 3) & ((v[a] == 1) | (v[a] == 2)) & (self.groups[a] == self.groups[b])
        known &= self.hashes[a] == self.hashes[b]
        return known, v[a] == 1


class _Readers:
    """Readers of Parquet files (page checksums verified: `open_parquet`), one per thread and
    file, as a pyarrow reader is not to be used by two threads at once."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, str], pq.ParquetFile] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> pq.ParquetFile:
        key = (threading.get_ident(), path)
        with self._lock:
            reader = self._open.get(key)
        if reader is None:
            reader = open_parquet(path)
            with self._lock:
                self._open[key] = reader
        return reader

    def close(self, path: str | None = None) -> None:
        """Close the readers of `path` (default: all); no thread may be reading it."""
        with self._lock:
            keys = [key for key in self._open if path is None or key[1] == path]
            readers = [self._open.pop(key) for key in keys]
        for reader in readers:
            reader.close()

    def __enter__(self) -> _Readers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_Piece = tuple[int, int, "pl.Series"]  # rows, nulls, text


def _pieces(reader: pq.ParquetFile, column: str, size: int, row_groups: list[int] | None = None) -> Iterator[_Piece]:
    """The column's text in `reader`'s row groups (default: all), `size` rows at a time."""
    import polars as pl

    for batch in reader.iter_batches(batch_size=size, columns=[column], row_groups=row_groups):
        text = _as_string_series(pl.from_arrow(contiguous_decoded(batch.column(0))))
        yield batch.num_rows, batch.column(0).null_count, text


def _row_group_pieces(readers: _Readers, column: str, size: int, unit: tuple[str, int]) -> list[_Piece]:
    """Row group k of `path` (unit: (path, k)), read whole by the calling thread's reader."""
    path, k = unit
    return list(_pieces(readers.get(path), column, size, [k]))


def _in_order(pool: ThreadPoolExecutor, work: Callable[[T], U], items: Sequence[T]) -> Iterator[U]:
    """work(item) for each of `items`, in order, at most `READ_THREADS` of them running at
    once; nothing is started before the first result is asked for."""
    ahead = iter(items)
    running = deque(pool.submit(work, k) for k in itertools.islice(ahead, READ_THREADS))
    while running:
        done = running.popleft().result()
        running.extend(pool.submit(work, k) for k in itertools.islice(ahead, 1))
        yield done


def _read_ahead(pool: ThreadPoolExecutor, items: Iterator[_Piece]) -> Iterator[_Piece]:
    """The items of `items`, each next one read by the pool while the caller works on the one
    before (pyarrow reads without the GIL, so reading and hashing share the cores)."""
    ahead = pool.submit(next, items, None)
    while (item := ahead.result()) is not None:
        ahead = pool.submit(next, items, None)
        yield item


def _as_string_series(text: object) -> pl.Series:
    """A polars series of anchors (from `pl.from_arrow` or a read) as one String series."""
    import polars as pl

    assert isinstance(text, pl.Series)
    return text if text.dtype == pl.String else text.cast(pl.String)


def _stamp(path: str | os.PathLike) -> tuple[int, int] | None:
    """(size, modification time) of a file, to notice one that changed between reads."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def initial_anchors_differ(
    trajs: TrajectoryIndex, n_groups: int, anchors: Anchors, codes: np.ndarray | None = None
) -> int:
    """Episode groups whose trajectories do not all start from the same anchor. From the step
    groups' `codes` (per row) when they are known (exact), else from hashes with every
    equality confirmed by `anchors.equal_rows`."""
    first_rows = trajs.rows(trajs.traj_start)
    first = codes[first_rows] if codes is not None else anchors.file_hashes()[first_rows]
    # the first trajectory of each group in canonical order (groups are contiguous there)
    # stands for the group
    group_by_canon = trajs.traj_group[trajs.canonical_traj_order]
    heads = np.flatnonzero(np.r_[True, group_by_canon[1:] != group_by_canon[:-1]])
    lead = np.zeros(n_groups, dtype=np.int64)
    lead[group_by_canon[heads]] = trajs.canonical_traj_order[heads]
    rep = lead[trajs.traj_group]
    differs = first != first[rep]
    if codes is None:  # equal hashes: confirm the text
        check = np.flatnonzero(~differs & (rep != np.arange(len(rep))))
        if len(check):
            same = anchors.equal_rows(first_rows[check], first_rows[rep[check]])
            differs[check[~same]] = True
    return int(len(np.unique(trajs.traj_group[differs])))


def anchor_column(names: Collection[str]) -> str | None:
    """`anchor_key` wins over `anchor_obs` (log-schema.md); `names`: the log's columns."""
    return next((name for name in (C.ANCHOR_KEY, C.ANCHOR_OBS) if name in names), None)


def anchors_of(log: Log, name: str) -> Anchors:
    """The anchor column, built once per log: the anchors a reader left in the log's cache
    (gaca_cli.credit.reading leaves large ones on disk, `StreamedAnchors`), else the
    column of the table as a polars Series."""
    anchors = log.cached(("anchors", name), lambda: PolarsAnchors(anchor_series(log.table.column(name))))
    assert isinstance(anchors, Anchors)
    return anchors


def anchor_warnings(log: Log, index: TrajectoryIndex, step_codes: np.ndarray | None = None) -> dict[str, int]:
    """The anchor warnings' counts (empty anchors, groups whose step-0 anchors differ); from
    the step groups' codes when the caller has them."""
    name = anchor_column(log.file_schema.names)
    if name is None:
        return {}
    anchors = anchors_of(log, name)
    warnings = {}
    empty = anchors.empty_count()
    if empty is not None:
        warnings["empty_anchors"] = empty
    warnings["differing_initial_anchors"] = initial_anchors_differ(index, index.n_groups, anchors, step_codes)
    return warnings
