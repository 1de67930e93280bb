"""The streaming anchor scan (gaca_cli.log._anchor_scan) against the texts pyarrow reads.

Every layout is written by pyarrow (or polars) and scanned; the scan's hashes must equal the
hash of each value's bytes computed directly (so they do not depend on page, encoding,
dictionary, codec or file), equal hashes must mean equal texts, each row's first equal row in
its column chunk (`_reps`) must be the one a dict finds, `equal` (and its streaming twin, which
reads every pair from the files) must agree with Python equality on random pairs in any order,
and `values` with pyarrow's values.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.log import _anchor_scan as anchor_scan
from gaca_cli.log import _splice as ps
from gaca_cli.log._anchor_scan import AnchorScan, hash_values, scan_anchors

COL = "anchor"


def texts(n: int, seed: int = 0, long_every: int = 0) -> list[str]:
    """n anchors: repeats of a small pool (so dictionaries help), unique ones, empty strings,
    non-ASCII text, strings of every short length (0..40 bytes) and, every `long_every` rows,
    a value longer than a data page."""
    rng = np.random.default_rng(seed)
    pool = ["", "a", "ab", "é", "Zürich ☃ 東京", "You are in the kitchen. " * 3]
    pool += ["x" * k for k in range(41)]
    pool += [f"You are in room {k}, you see a drawer {k % 7}." for k in range(30)]
    out = []
    for i in range(n):
        u = rng.random()
        if long_every and i % long_every == long_every - 1:
            out.append(f"long {i} " + "ünïcode and ascii " * 600)
        elif u < 0.6:
            out.append(pool[rng.integers(len(pool))])
        else:
            out.append(f"unique {i} {rng.integers(1 << 40)} " + "w" * int(rng.integers(0, 70)))
    return out


def reference_hashes(values: list[bytes]) -> np.ndarray:
    """hash_values over the values laid out one after another (no Parquet involved)."""
    buf = np.frombuffer(bytearray(b"".join(values) + b"\0"), dtype=np.uint8)  # writable, as the scan's buffers
    lens = np.array([len(v) for v in values], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    return hash_values(buf, starts, lens)


def reference_reps(values: list[bytes], bounds: np.ndarray) -> np.ndarray:
    """For each row, the first row of its chunk (rows bounds[c]..bounds[c+1]-1) with the same
    bytes, chunk-relative: a dict per chunk."""
    out = np.empty(len(values), dtype=np.int64)
    for c in range(len(bounds) - 1):
        first: dict[bytes, int] = {}
        for r in range(bounds[c], bounds[c + 1]):
            out[r] = first.setdefault(values[r], r - bounds[c])
    return out


def check(scan: AnchorScan | None, values: list, seed: int = 0) -> None:
    """Everything the scan promises, against the values pyarrow reads."""
    assert scan is not None
    raw = [v.encode() if isinstance(v, str) else v for v in values]
    n = len(raw)
    assert scan.n_rows == n and scan.hashes.dtype == np.uint64 and scan.hashes.shape == (n,)
    assert scan.empty == sum(len(v) == 0 for v in raw)
    np.testing.assert_array_equal(scan.hashes, reference_hashes(raw))
    np.testing.assert_array_equal(scan._reps, reference_reps(raw, scan._bounds()))
    # equal hashes <=> equal texts
    first_hash: dict[bytes, int] = {}
    for v, h in zip(raw, scan.hashes.tolist()):
        assert first_hash.setdefault(v, h) == h
    assert len(set(first_hash.values())) == len(first_hash)
    rng = np.random.default_rng(seed)
    m = 4 * n + 10
    a = rng.integers(0, n, m)
    b = np.where(rng.random(m) < 0.5, rng.integers(0, n, m), a)  # some pairs with themselves
    same_text = rng.random(m) < 0.3  # pairs with equal text but different rows, where any
    for i in np.flatnonzero(same_text):
        twins = [j for j in range(max(0, a[i] - 60), min(n, a[i] + 60)) if raw[j] == raw[a[i]]]
        b[i] = twins[rng.integers(len(twins))]
    got = scan.equal(a, b)
    assert got.dtype == np.bool_ and got.shape == (m,)
    want = [raw[i] == raw[j] for i, j in zip(a, b)]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(scan._equal_streamed(a, b), want)  # the slow twin, every pair read
    assert scan.equal(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).shape == (0,)
    rows = rng.integers(0, n, 50)
    got_values = scan.values(rows)
    want_type = pa.large_binary() if isinstance(values[0], bytes) else pa.large_string()
    assert got_values.type == want_type
    assert got_values.to_pylist() == [values[i] for i in rows]


def write(path, values, *, type_=pa.string(), nullable=True, **options):
    schema = pa.schema([pa.field("k", pa.int64()), pa.field(COL, type_, nullable=nullable)])
    table = pa.table({"k": np.arange(len(values)), COL: pa.array(values, type=type_)}, schema=schema)
    pq.write_table(table, path, **options)
    return path


def column_codes(path) -> set[int]:
    """The encodings and codecs the footer declares for COL (to check a layout is what the test
    means to cover)."""
    meta = pq.ParquetFile(path).metadata
    out = set()
    for rg in range(meta.num_row_groups):
        c = meta.row_group(rg).column(1)
        out |= set(c.encodings) | {c.compression}
    return out


LAYOUTS = {
    "dict-v1-zstd-small-pages": dict(use_dictionary=True, data_page_version="1.0", compression="zstd",
                                     data_page_size=512, row_group_size=700),
    "plain-v2-snappy": dict(use_dictionary=False, data_page_version="2.0", compression="snappy",
                            data_page_size=2048, row_group_size=1000),
    "dict-v2-gzip": dict(use_dictionary=True, data_page_version="2.0", compression="gzip", data_page_size=1024),
    "plain-v1-none": dict(use_dictionary=False, data_page_version="1.0", compression="none", data_page_size=700),
    "dict-v2-none": dict(use_dictionary=True, data_page_version="2.0", compression="none", data_page_size=300),
    "plain-v1-brotli": dict(use_dictionary=False, compression="brotli", data_page_size=4096, row_group_size=900),
    "dict-v1-lz4raw": dict(use_dictionary=True, compression="lz4", data_page_size=256, row_group_size=1500),
    "dict-fallback-to-plain": dict(use_dictionary=True, dictionary_pagesize_limit=400, data_page_size=600,
                                   row_group_size=2000, compression="zstd"),
    "delta-byte-array-v1": dict(use_dictionary=False, column_encoding={COL: "DELTA_BYTE_ARRAY"},
                                data_page_size=800, compression="zstd"),
    "delta-byte-array-v2": dict(use_dictionary=False, column_encoding={COL: "DELTA_BYTE_ARRAY"},
                                data_page_version="2.0", data_page_size=800, compression="snappy"),
    "delta-length-byte-array": dict(use_dictionary=False, column_encoding={COL: "DELTA_LENGTH_BYTE_ARRAY"},
                                    data_page_size=800, compression="none", row_group_size=1200),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layouts(tmp_path, name):
    values = texts(3000, seed=len(name), long_every=700)
    path = write(tmp_path / "a.parquet", values, **LAYOUTS[name])
    check(scan_anchors([path], COL), values)


def test_layouts_cover_what_they_claim(tmp_path):
    values = texts(3000, long_every=700)
    fallback = write(tmp_path / "f.parquet", values, **LAYOUTS["dict-fallback-to-plain"])
    assert {"PLAIN", "RLE_DICTIONARY"} <= column_codes(fallback)
    assert "DELTA_BYTE_ARRAY" in column_codes(write(tmp_path / "d.parquet", values, **LAYOUTS["delta-byte-array-v1"]))
    delta_length = write(tmp_path / "l.parquet", values, **LAYOUTS["delta-length-byte-array"])
    assert "DELTA_LENGTH_BYTE_ARRAY" in column_codes(delta_length)
    pages = pq.ParquetFile(write(tmp_path / "p.parquet", values, **LAYOUTS["dict-v1-zstd-small-pages"]))
    assert pages.metadata.num_row_groups == 5


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("nullable", [True, False])
def test_types_and_nullability(tmp_path, type_, nullable):
    values = texts(800, seed=3)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        values = [v.encode() for v in values]
    path = write(tmp_path / "a.parquet", values, type_=type_, nullable=nullable, data_page_size=512, row_group_size=300)
    check(scan_anchors([path], COL), values)


def test_several_files_in_order(tmp_path):
    parts = [texts(500, seed=s) for s in range(3)]
    parts[1] = parts[1][:200] + parts[0][:300]  # texts repeated across files
    paths = [
        write(tmp_path / "0.parquet", parts[0], row_group_size=200, data_page_size=500),
        write(tmp_path / "1.parquet", parts[1], use_dictionary=False, compression="snappy"),
        write(tmp_path / "2.parquet", parts[2], data_page_version="2.0", row_group_size=128, data_page_size=300),
    ]
    values = parts[0] + parts[1] + parts[2]
    scan = scan_anchors(paths, COL)
    check(scan, values, seed=1)
    assert scan.files == tuple(str(p) for p in paths)
    # the hash is a function of the bytes only: a file's hashes do not depend on its neighbours
    alone = scan_anchors([paths[2]], COL)
    np.testing.assert_array_equal(alone.hashes, scan.hashes[1000:])


def test_polars_written_file(tmp_path):
    values = texts(2000, seed=5, long_every=900)
    path = tmp_path / "pl.parquet"
    pl.DataFrame({"k": range(len(values)), COL: values}).write_parquet(path, row_group_size=512)
    check(scan_anchors([path], COL), values)


def test_representative_workload(tmp_path):
    """The caller's pattern: rows grouped by hash, every non-first row compared with its run's
    first row (file order); the pairs are given in hash order, not file order."""
    values = texts(5000, seed=9)
    path = write(tmp_path / "a.parquet", values, row_group_size=900, data_page_size=1000)
    scan = scan_anchors([path], COL)
    order = np.argsort(scan.hashes, kind="stable")
    h = scan.hashes[order]
    first = np.r_[True, h[1:] != h[:-1]]
    run_first = order[np.maximum.accumulate(np.where(first, np.arange(len(h)), 0))]
    rows_a, rows_b = order[~first], run_first[~first]
    assert (rows_b <= rows_a).all() and len(rows_a) > 1000
    assert scan.equal(rows_a, rows_b).all()
    shuffled = rows_b[::-1]
    want = [values[i] == values[j] for i, j in zip(rows_a, shuffled)]
    np.testing.assert_array_equal(scan.equal(rows_a, shuffled), want)


def test_rows_out_of_range(tmp_path):
    scan = scan_anchors([write(tmp_path / "a.parquet", ["a", "b"])], COL)
    with pytest.raises(IndexError):
        scan.equal(np.array([0]), np.array([2]))
    with pytest.raises(IndexError):
        scan.values(np.array([-1]))


def test_empty_file(tmp_path):
    scan = scan_anchors([write(tmp_path / "a.parquet", pa.array([], type=pa.string()))], COL)
    assert scan is not None and scan.n_rows == 0 and scan.empty == 0 and len(scan.hashes) == 0
    assert scan.values(np.zeros(0, dtype=np.int64)).to_pylist() == []


def test_hash_spreads_bits():
    """Near-identical inputs give unrelated hashes: each output bit flips about half the time."""
    values = [f"You are in the kitchen {i:08d}".encode() for i in range(4000)]
    h = reference_hashes(values)
    assert len(set(h.tolist())) == len(values) and 0 not in h
    bits = np.unpackbits(h.view(np.uint8)).reshape(len(values), 64).mean(axis=0)
    assert bits.min() > 0.45 and bits.max() < 0.55


# --------------------------------------------------------------------------- unsupported -> None


def test_unsupported_columns(tmp_path):
    path = tmp_path / "a.parquet"
    table = pa.table({
        "i": pa.array([1, 2, 3]),
        "s": pa.array(["a", "b", "c"]),
        "nested": pa.array([{"x": "a"}, {"x": "b"}, {"x": "c"}]),
        "listed": pa.array([["a"], ["b", "c"], []]),
        "nulls": pa.array(["a", None, "c"]),
    })
    pq.write_table(table, path)
    assert scan_anchors([path], "s") is not None
    for column in ("i", "nested", "listed", "nulls", "missing"):
        assert scan_anchors([path], column) is None, column
    pq.write_table(table, path, data_page_version="2.0")
    assert scan_anchors([path], "nulls") is None


def test_nulls_in_a_later_page(tmp_path):
    values = texts(2000, seed=4)
    values[1700] = None
    path = write(tmp_path / "a.parquet", values, data_page_size=500, use_dictionary=False)
    assert scan_anchors([path], COL) is None


DAMAGED = {
    "dict-snappy": dict(compression="snappy"),
    "dict-none-v1": dict(compression="none"),
    "plain-none-v2": dict(compression="none", use_dictionary=False, data_page_version="2.0"),
    "delta-none": dict(compression="none", use_dictionary=False, column_encoding={COL: "DELTA_BYTE_ARRAY"}),
    "delta-length-none": dict(compression="none", use_dictionary=False,
                              column_encoding={COL: "DELTA_LENGTH_BYTE_ARRAY"}),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_files(tmp_path, name):
    values = texts(2000, seed=2)
    good = write(tmp_path / "a.parquet", values, data_page_size=500, **DAMAGED[name])
    data = good.read_bytes()
    assert scan_anchors([good], COL) is not None
    (tmp_path / "t.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "x.parquet").write_bytes(b"not parquet at all")
    assert scan_anchors([tmp_path / "t.parquet"], COL) is None
    assert scan_anchors([tmp_path / "x.parquet"], COL) is None
    assert scan_anchors([tmp_path / "missing.parquet"], COL) is None
    assert scan_anchors([good, tmp_path / "t.parquet"], COL) is None
    # damage inside the column's pages (headers and compressed data): None or exact, never wrong
    meta = pq.ParquetFile(good).metadata.row_group(0).column(1)
    start = meta.dictionary_page_offset or meta.data_page_offset
    rng = np.random.default_rng(0)
    for k, offset in enumerate(rng.integers(start, start + meta.total_compressed_size, 60)):
        bad = bytearray(data)
        bad[offset] ^= int(rng.integers(1, 256))
        path = tmp_path / f"bad{k}.parquet"
        path.write_bytes(bytes(bad))
        scan = scan_anchors([path], COL)
        if scan is not None:  # the flip went unnoticed by the format: the hashes are of some bytes
            assert scan.n_rows == len(values)
            scan.values(np.arange(0, len(values), 97))


def _set_codec(path, codec: int) -> None:
    """Rewrite the footer of `path` declaring `codec` for every column chunk."""
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    meta = ps.decode_struct(data[-8 - length : -8])
    for rg in meta.get(ps.FMD_ROW_GROUPS).items:
        for chunk in rg.get(ps.RG_COLUMNS).items:
            chunk.get(ps.CC_META_DATA).set(4, ps.CT_I32, codec)
    footer = ps.encode_struct(meta)
    path.write_bytes(data[: -8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1")


def test_hadoop_lz4_is_refused(tmp_path):
    values = texts(500)
    path = write(tmp_path / "a.parquet", values, compression="lz4")
    _set_codec(path, 7)  # LZ4_RAW, what pyarrow writes: unchanged footer, still fine
    check(scan_anchors([path], COL), values)
    _set_codec(path, 5)  # the same bytes declared as Parquet's old (Hadoop-framed) LZ4
    assert scan_anchors([path], COL) is None


def test_changed_file_is_noticed(tmp_path):
    values = texts(300)
    path = write(tmp_path / "a.parquet", values)
    scan = scan_anchors([path], COL)
    write(path, values[::-1], compression="gzip")
    with pytest.raises(Exception, match="changed"):
        scan.equal(np.array([0]), np.array([1]))


def test_warm_up_compiles_what_real_use_needs(tmp_path):
    """After warm_up, scanning, comparing and fetching values compile nothing more (a kernel
    compiled on first real use would cost seconds inside `gaca advantages`)."""
    from numba.core.registry import CPUDispatcher

    anchor_scan.warm_up()
    kernels = {n: k for n, k in vars(anchor_scan).items() if isinstance(k, CPUDispatcher)}
    before = {n: len(k.signatures) for n, k in kernels.items()}
    assert before["_scan_plain"] and before["_triage"] and before["_collect_page"] and before["_compare_stored"]
    values = texts(3000, seed=8)
    paths = [write(tmp_path / "a.parquet", values, row_group_size=1000, dictionary_pagesize_limit=2000),
             write(tmp_path / "b.parquet", values, compression="none", use_dictionary=False, data_page_version="2.0")]
    scan = scan_anchors(paths, COL)
    rows = np.arange(0, 6000, 7)
    scan.equal(rows, rows[::-1])
    scan.equal(rows[1:], rows[:-1])
    scan.values(rows[::-1])
    assert {n: len(k.signatures) for n, k in kernels.items()} == before


@pytest.mark.parametrize("seed", range(6))
def test_random_layouts(tmp_path, seed):
    """Seeded random combinations of the writer's options."""
    rng = np.random.default_rng(seed)
    options = dict(
        use_dictionary=bool(rng.integers(2)),
        data_page_version=str(rng.choice(["1.0", "2.0"])),
        compression=str(rng.choice(["none", "snappy", "gzip", "brotli", "zstd", "lz4"])),
        data_page_size=int(rng.integers(64, 5000)),
        row_group_size=int(rng.integers(50, 3000)),
    )
    values = texts(int(rng.integers(1, 2500)), seed=seed, long_every=int(rng.integers(0, 2)) * 500)
    path = write(tmp_path / "a.parquet", values, **options)
    check(scan_anchors([path], COL), values, seed=seed)


def test_all_pairs_small_log(tmp_path):
    values = texts(120, seed=11)
    scan = scan_anchors([write(tmp_path / "a.parquet", values, data_page_size=100, row_group_size=50)], COL)
    pairs = np.array(list(itertools.product(range(120), repeat=2)))
    same = scan.equal(pairs[:, 0], pairs[:, 1])
    want = [values[i] == values[j] for i, j in pairs]
    np.testing.assert_array_equal(same, want)
    np.testing.assert_array_equal(scan.hashes[pairs[:, 0]] == scan.hashes[pairs[:, 1]], want)


# --------------------------------------------------------------------------- equal from the scan's record


def test_pairs_inside_chunks_read_nothing(tmp_path, monkeypatch):
    """Pairs of one chunk are answered from `_reps` (files only stat-checked); pairs across
    chunks (row groups, files) go to the streaming comparison, each row replaced by its first
    equal row in its chunk."""
    parts = [texts(900, seed=s) for s in range(2)]
    paths = [write(tmp_path / f"{k}.parquet", part, row_group_size=300, data_page_size=400)
             for k, part in enumerate(parts)]
    values = [v.encode() for v in parts[0] + parts[1]]
    scan = scan_anchors(paths, COL)
    bounds = scan._bounds()
    assert len(bounds) == 7
    rng = np.random.default_rng(3)
    chunk = rng.integers(0, 6, 4000)
    a = bounds[chunk] + rng.integers(0, 300, 4000)
    b = bounds[chunk] + rng.integers(0, 300, 4000)
    for i in np.flatnonzero(rng.random(4000) < 0.5):  # half the pairs: a row with the same text
        lo = bounds[chunk[i]]
        twins = [r for r in range(lo, lo + 300) if values[r] == values[a[i]]]
        b[i] = twins[rng.integers(len(twins))]
    want = [values[i] == values[j] for i, j in zip(a, b)]
    assert 1500 < sum(want) < 3500

    def no_reading(*args):
        raise AssertionError("read the files for pairs inside chunks")

    with monkeypatch.context() as m:
        m.setattr(AnchorScan, "_equal_streamed", no_reading)
        np.testing.assert_array_equal(scan.equal(a, b), want)
    streamed = []
    real = AnchorScan._equal_streamed

    def spy(self, x, y):
        streamed.append((x.copy(), y.copy()))
        return real(self, x, y)

    monkeypatch.setattr(AnchorScan, "_equal_streamed", spy)
    b2 = np.where(rng.random(4000) < 0.5, b, (b + 300) % 1800)  # half the pairs across chunks
    want2 = [values[i] == values[j] for i, j in zip(a, b2)]
    np.testing.assert_array_equal(scan.equal(a, b2), want2)
    (x, y), = streamed
    assert len(x) and (np.searchsorted(bounds, x, "right") != np.searchsorted(bounds, y, "right")).all()
    assert (scan.hashes[x] == scan.hashes[y]).all()  # different hashes never read
    reps = bounds[np.searchsorted(bounds, x, "right") - 1] + scan._reps[x]
    np.testing.assert_array_equal(x, reps)  # rows replaced by their chunk's first equal row


@pytest.mark.parametrize("fold", [0, 3, 0xFFFF_0000_0000_0003])
@pytest.mark.parametrize("name", ["dict-v1-zstd-small-pages", "dict-fallback-to-plain", "plain-v2-snappy",
                                  "delta-byte-array-v2", "delta-length-byte-array"])
def test_forced_hash_collisions_inside_chunks(tmp_path, monkeypatch, name, fold):
    """With the table's keys folded into a few values, different texts share keys and are told
    apart by their bytes only: `_reps` and `equal` stay exact (the batched lookup finds
    unequal candidates and falls back to the row-at-a-time one)."""
    monkeypatch.setattr(anchor_scan, "_KEY_FOLD", np.uint64(fold))
    values = texts(1500, seed=fold % 7, long_every=400)
    path = write(tmp_path / "a.parquet", values, **LAYOUTS[name])
    check(scan_anchors([path], COL), values, seed=fold % 5)


def test_duplicates_pages_apart(tmp_path):
    """A text repeated far apart in one chunk, with many pages between: the later rows point
    to the first, across pages, dictionary and PLAIN alike; texts differing only in their last
    byte or in length stay apart."""
    base = "You are in a long corridor with doors on both sides. " * 3
    values = [f"filler {i} " + "z" * (i % 50) for i in range(3000)]
    for r in (5, 1200, 2999):
        values[r] = base
    values[700] = base[:-1] + "!"
    values[701] = base + " "
    for name in ("dict-fallback-to-plain", "plain-v1-none", "delta-byte-array-v1"):
        options = dict(LAYOUTS[name], row_group_size=3000, data_page_size=256)
        scan = scan_anchors([write(tmp_path / f"{name}.parquet", values, **options)], COL)
        assert scan._reps[1200] == 5 and scan._reps[2999] == 5 and scan._reps[700] == 700 and scan._reps[701] == 701
        assert scan.equal(np.array([1200, 2999, 700, 701]), np.array([5, 1200, 5, 5])).tolist() == [
            True, True, False, False]
        check(scan, values)


def test_changed_file_is_noticed_without_reading(tmp_path):
    """`equal` answers pairs inside a chunk from the scan's record, and still refuses a file
    that changed (or vanished) since the scan."""
    values = texts(300)
    path = write(tmp_path / "a.parquet", values)
    scan = scan_anchors([path], COL)
    assert scan.equal(np.array([0, 1]), np.array([1, 1])).tolist() == [values[0] == values[1], True]
    path.unlink()
    with pytest.raises(Exception, match="changed"):
        scan.equal(np.array([0]), np.array([1]))
