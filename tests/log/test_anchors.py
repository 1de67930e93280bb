"""Anchor columns left on disk (`StreamedAnchors`) against the column read whole.

The slow twin is a plain Python dict over the column pyarrow reads: equal texts, equal ids.
Every layout (batches of a few rows or of whole files, row groups, several files, encodings,
stored Arrow types) must give: equal hashes for equal texts (the hashes `PolarsAnchors` gives
for the column read whole), `equal_rows` = Python equality on random pairs in and across
batches and files, `values` = the texts, `empty_count` = the empty strings. Hashes forced to
collide (a constant, or folded into a few values) must never make two different texts equal.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.errors import GacaError
from gaca_cli.log import anchors as anchors_module
from gaca_cli.log.anchors import PolarsAnchors, StreamedAnchors, anchor_series

COL = "anchor"


def texts(n: int, seed: int = 0) -> list[str]:
    """n anchors: repeats of a small pool (near and far apart), unique ones, empty strings,
    non-ASCII text, texts that differ only in their last byte or in length."""
    rng = np.random.default_rng(seed)
    base = "You are in a long corridor with doors on both sides. "
    pool = ["", "a", "é", "Zürich ☃ 東京", base, base[:-1], base + "!", base + "?"]
    pool += [f"You are in room {k}, you see a drawer {k % 7}." for k in range(20)]
    out = []
    for i in range(n):
        u = rng.random()
        if u < 0.6:
            out.append(pool[rng.integers(len(pool))])
        else:
            out.append(f"unique {i} {rng.integers(1 << 40)} " + "w" * int(rng.integers(0, 60)))
    return out


def dict_ids(values: list) -> np.ndarray:
    """The slow twin: each row's text numbered by first appearance, with a dict."""
    ids: dict = {}
    return np.array([ids.setdefault(v, len(ids)) for v in values], dtype=np.int64)


def write(path, values, type_=pa.string(), **options):
    array = pa.array(values, type=pa.string()).cast(type_)
    pq.write_table(pa.table({"k": np.arange(len(values)), COL: array}), path, **options)
    return str(path)


def pairs(values: list, n_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random pairs of rows: any two rows, a row with itself, and (a third) a row with another
    row of the same text anywhere in the column."""
    rng = np.random.default_rng(seed)
    n = len(values)
    a = rng.integers(0, n, n_pairs)
    b = np.where(rng.random(n_pairs) < 0.5, rng.integers(0, n, n_pairs), a)
    rows_of: dict = {}
    for r, v in enumerate(values):
        rows_of.setdefault(v, []).append(r)
    for i in np.flatnonzero(rng.random(n_pairs) < 0.33):
        twins = rows_of[values[a[i]]]
        b[i] = twins[rng.integers(len(twins))]
    return a, b


def check(anchors: StreamedAnchors, values: list, seed: int = 0) -> None:
    """Everything `StreamedAnchors` promises, against the slow twin."""
    n = len(values)
    ids = dict_ids(values)
    hashes = anchors.file_hashes()
    assert anchors.n_rows == n and hashes.dtype == np.uint64 and hashes.shape == (n,)
    first_hash: dict = {}
    for i, h in zip(ids.tolist(), hashes.tolist()):
        assert first_hash.setdefault(i, h) == h  # equal texts, equal hashes
    assert anchors.empty_count() == sum(v == "" for v in values)
    a, b = pairs(values, 3 * n + 10, seed)
    got = anchors.equal_rows(a, b)
    assert got.dtype == np.bool_ and got.shape == (len(a),)
    np.testing.assert_array_equal(got, ids[a] == ids[b])
    assert anchors.equal_rows(a[:0], b[:0]).shape == (0,)
    rows = np.random.default_rng(seed).integers(0, n, 60)  # unsorted, with repeats
    got_values = anchors.values(rows)
    assert got_values.type == pa.large_string()
    assert got_values.to_pylist() == [values[r] for r in rows]
    assert anchors.values(rows[:0]).to_pylist() == []


LAYOUTS = {
    "one batch": dict(batch_bytes=1 << 40, options=dict(row_group_size=700)),
    "batches of a few rows": dict(batch_bytes=600, options=dict(row_group_size=300)),
    "batches across row groups": dict(batch_bytes=9000, options=dict(row_group_size=97, use_dictionary=False)),
    "row groups across batches": dict(batch_bytes=3000, options=dict(row_group_size=2000, data_page_size=512)),
    "plain v2 pages": dict(
        batch_bytes=5000,
        options=dict(use_dictionary=False, data_page_version="2.0", data_page_size=256, compression="snappy"),
    ),
    "delta encoding": dict(
        batch_bytes=4000,
        options=dict(use_dictionary=False, compression="none", column_encoding={COL: "DELTA_BYTE_ARRAY"}),
    ),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layouts(tmp_path, name):
    layout = LAYOUTS[name]
    values = texts(2500, seed=len(name))
    path = write(tmp_path / "a.parquet", values, **layout["options"])
    anchors = StreamedAnchors.from_files([path], COL, batch_bytes=layout["batch_bytes"])
    check(anchors, values, seed=len(name))


@pytest.mark.parametrize(
    "type_", [pa.string(), pa.large_string(), pa.string_view(), pa.dictionary(pa.int32(), pa.string())]
)
def test_stored_arrow_types(tmp_path, type_):
    """Whatever Arrow type the writer stored, the texts (and hashes) are those of the strings."""
    values = texts(900, seed=3)
    path = write(tmp_path / "a.parquet", values, type_=type_, row_group_size=250)
    anchors = StreamedAnchors.from_files([path], COL, batch_bytes=2000)
    check(anchors, values)
    np.testing.assert_array_equal(anchors.file_hashes(), held(values).file_hashes())


def held(values: list) -> PolarsAnchors:
    return PolarsAnchors(anchor_series(pa.chunked_array([pa.array(values, pa.string())])))


def test_hashes_are_those_of_the_column_held_in_memory(tmp_path):
    values = texts(3000, seed=8)
    path = write(tmp_path / "a.parquet", values, row_group_size=512)
    for batch_bytes in (500, 1 << 40):
        anchors = StreamedAnchors.from_files([path], COL, batch_bytes=batch_bytes)
        np.testing.assert_array_equal(anchors.file_hashes(), held(values).file_hashes())


def test_several_files_in_order(tmp_path):
    parts = [texts(700, seed=s) for s in range(3)]
    parts[1] = parts[1][:300] + parts[0][:400]  # texts repeated across files
    paths = [
        write(tmp_path / "0.parquet", parts[0], row_group_size=200),
        write(tmp_path / "1.parquet", [], row_group_size=100),  # a file without rows
        write(tmp_path / "2.parquet", parts[1], use_dictionary=False, compression="snappy"),
        write(tmp_path / "3.parquet", parts[2], type_=pa.large_string(), data_page_version="2.0"),
    ]
    values = parts[0] + parts[1] + parts[2]
    for batch_bytes in (700, 20_000, 1 << 40):
        anchors = StreamedAnchors.from_files(paths, COL, batch_bytes=batch_bytes)
        check(anchors, values, seed=batch_bytes % 7)
    # a file's hashes do not depend on its neighbours
    alone = StreamedAnchors.from_files(paths[3:], COL)
    np.testing.assert_array_equal(alone.file_hashes(), anchors.file_hashes()[1400:])


def fold(monkeypatch, modulus: int) -> None:
    """Fold every streamed hash into `modulus` values (1: one constant for every text)."""
    honest = StreamedAnchors.file_hashes
    monkeypatch.setattr(StreamedAnchors, "file_hashes", lambda self: honest(self) % np.uint64(modulus))


@pytest.mark.parametrize("modulus", [1, 3, 64])
@pytest.mark.parametrize("batch_bytes", [400, 5000, 1 << 40])
def test_forced_hash_collisions(tmp_path, monkeypatch, modulus, batch_bytes):
    """Different texts sharing a hash, in one batch and across batches and files, are told
    apart by their texts: `equal_rows` stays Python equality."""
    fold(monkeypatch, modulus)
    values = texts(1500, seed=modulus)
    paths = [
        write(tmp_path / "0.parquet", values[:800], row_group_size=150),
        write(tmp_path / "1.parquet", values[800:], row_group_size=400),
    ]
    anchors = StreamedAnchors.from_files(paths, COL, batch_bytes=batch_bytes)
    assert len(np.unique(anchors.file_hashes())) <= modulus
    check(anchors, values, seed=modulus)


def test_pairs_far_apart_and_in_either_order(tmp_path):
    """A text repeated many batches apart, pairs given later row first, and kept texts
    released once no pair needs them: the answers stay exact."""
    base = "You are in a long corridor with doors on both sides. "
    values = [f"filler {i} " + "z" * (i % 50) for i in range(4000)]
    for r in (5, 1200, 2999, 3999):
        values[r] = base
    values[700], values[701] = base[:-1] + "!", base + " "
    anchors = StreamedAnchors.from_files(
        [write(tmp_path / "a.parquet", values, row_group_size=333)], COL, batch_bytes=1500
    )
    assert len(anchors._batch_file) > 50
    a = np.array([3999, 1200, 5, 2999, 700, 701, 5, 3999])
    b = np.array([5, 2999, 1200, 5, 5, 5, 701, 1200])
    assert anchors.equal_rows(a, b).tolist() == [True, True, True, True, False, False, False, True]


def test_each_batch_is_read_at_most_once_per_call(tmp_path, monkeypatch):
    values = texts(3000, seed=4)
    anchors = StreamedAnchors.from_files(
        [write(tmp_path / "a.parquet", values, row_group_size=256)], COL, batch_bytes=8000
    )
    anchors.file_hashes()
    reads: list[int] = []
    real = StreamedAnchors._read
    monkeypatch.setattr(StreamedAnchors, "_read", lambda self, k, lo, hi: reads.append(k) or real(self, k, lo, hi))
    a, b = pairs(values, 6000, seed=1)
    np.testing.assert_array_equal(anchors.equal_rows(a, b), dict_ids(values)[a] == dict_ids(values)[b])
    assert len(reads) == len(set(reads)) > 1


def test_sparse_rows_read_only_the_rows_around_them(tmp_path, monkeypatch):
    """A few wanted rows far apart in a large batch are read as short runs, not the batch."""
    values = texts(40_000, seed=6)
    for r in (10, 20_500, 39_990):
        values[r] = "the same text, far apart"
    anchors = StreamedAnchors.from_files([write(tmp_path / "a.parquet", values)], COL, batch_bytes=1 << 40)
    anchors.file_hashes()
    monkeypatch.setattr(anchors_module, "GAP_ROWS", 1000)
    spans: list[int] = []
    real = StreamedAnchors._read
    monkeypatch.setattr(
        StreamedAnchors, "_read", lambda self, k, lo, hi: spans.append(hi - lo) or real(self, k, lo, hi)
    )
    rows = np.array([39_990, 10, 20_000, 12, 20_500, 39_999])
    assert anchors.values(rows).to_pylist() == [values[r] for r in rows]
    assert sorted(spans) == [3, 10, 501]
    spans.clear()
    a, b = np.array([10, 20_000, 39_999, 20_500]), np.array([39_990, 12, 20_500, 10])
    assert anchors.equal_rows(a, b).tolist() == [True, values[20_000] == values[12], False, True]
    assert 0 < sum(spans) < 1000


def test_rows_out_of_range(tmp_path):
    anchors = StreamedAnchors.from_files([write(tmp_path / "a.parquet", ["a", "b"])], COL)
    with pytest.raises(IndexError):
        anchors.equal_rows(np.array([0]), np.array([2]))
    with pytest.raises(IndexError):
        anchors.values(np.array([-1]))


def test_empty_file(tmp_path):
    anchors = StreamedAnchors.from_files([write(tmp_path / "a.parquet", [])], COL)
    assert anchors.n_rows == 0 and anchors.empty_count() == 0 and len(anchors.file_hashes()) == 0
    assert anchors.values(np.zeros(0, dtype=np.int64)).to_pylist() == []


def test_size_estimate_from_the_footers(tmp_path):
    """nbytes: the text's uncompressed size plus 16 bytes per row (polars' string views);
    dictionary pages count once, not once per row."""
    values = ["x" * 100] * 5000
    plain = StreamedAnchors.from_files([write(tmp_path / "p.parquet", values, use_dictionary=False)], COL)
    assert 5000 * (100 + 16) <= plain.nbytes < 5000 * (100 + 16) * 1.1
    repeated = StreamedAnchors.from_files([write(tmp_path / "d.parquet", values, use_dictionary=True)], COL)
    assert repeated.nbytes < 5000 * 20


def test_columns_left_to_the_ordinary_reading(tmp_path):
    """from_files declines (None) what it does not stream: a file without the column, a
    column that is not text, a file with a type polars' reader does not know."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"s": ["a", "b"], "i": [1, 2], "listed": [["a"], []]}), path)
    assert StreamedAnchors.from_files([path], "s") is not None
    for column in ("i", "listed", "missing"):
        assert StreamedAnchors.from_files([path], column) is None
    other = tmp_path / "b.parquet"
    pq.write_table(pa.table({"t": ["a", "b"]}), other)
    assert StreamedAnchors.from_files([path, other], "s") is None
    extension = tmp_path / "json.parquet"
    pq.write_table(pa.table({"s": ["a", "b"], "j": pa.array(["{}", "[]"], pa.json_(pa.string()))}), extension)
    assert StreamedAnchors.from_files([extension], "s") is None


def test_a_file_changed_between_passes_is_an_error(tmp_path):
    values = texts(300)
    values[7] = values[250] = "the same text"
    path = write(tmp_path / "a.parquet", values)
    anchors = StreamedAnchors.from_files([path], COL)
    assert anchors.equal_rows(np.array([7]), np.array([250])).tolist() == [True]
    write(path, values[::-1])
    os.utime(path, ns=(0, 0))  # a different modification time even on a coarse clock
    with pytest.raises(GacaError, match="changed"):
        anchors.equal_rows(np.array([7]), np.array([250]))
    os.unlink(path)
    with pytest.raises(GacaError, match="changed"):
        anchors.values(np.array([0]))


def test_damaged_pages_are_an_error(tmp_path):
    """Pages that cannot be decompressed: one Error naming the file, not a crash."""
    path = write(tmp_path / "a.parquet", texts(3000), use_dictionary=False, compression="zstd")
    meta = pq.ParquetFile(path).metadata.row_group(0).column(1)
    data = bytearray(open(path, "rb").read())
    start, size = meta.data_page_offset, meta.total_compressed_size
    data[start + 40 : start + size - 10] = bytes(size - 50)
    with open(path, "wb") as fh:
        fh.write(bytes(data))
    anchors = StreamedAnchors.from_files([path], COL)
    with pytest.raises(GacaError, match="not a readable Parquet file") as info:
        anchors.file_hashes()
    assert path in str(info.value)


def first_of_group_pairs(groups: np.ndarray, values: list) -> tuple[np.ndarray, np.ndarray]:
    """The pairs step grouping asks about, by the slow twin: each row and the first row with
    its group and text (rows that are that first row left out)."""
    first: dict = {}
    rows, reps = [], []
    for r, key in enumerate(zip(groups.tolist(), values)):
        if first.setdefault(key, r) != r:
            rows.append(r)
            reps.append(first[key])
    return np.array(rows, dtype=np.int64), np.array(reps, dtype=np.int64)


def grouped(tmp_path, n: int, seed: int, batch_bytes: int, spread: bool):
    """n texts in episode groups: groups of neighbouring rows, or (spread) groups whose rows
    are scattered over the whole file; written in small row groups."""
    rng = np.random.default_rng(seed)
    values = texts(n, seed=seed)
    groups = rng.integers(0, 6, n) if spread else np.sort(rng.integers(0, n // 40, n))
    path = write(tmp_path / f"g{seed}.parquet", values, row_group_size=97)
    anchors = StreamedAnchors.from_files([path], COL, batch_bytes=batch_bytes)
    anchors.expect_groups(groups)
    return anchors, groups.astype(np.int64), values


def refuse_second_reads(monkeypatch) -> None:
    def second_read(self, a, b):
        raise AssertionError("the pass should have compared these pairs")

    monkeypatch.setattr(StreamedAnchors, "_compare", second_read)


@pytest.mark.parametrize("seed", range(4))
def test_the_pass_compares_each_row_with_the_first_of_its_group(tmp_path, monkeypatch, seed):
    """Told the groups first, the one pass answers every (row, first row of its group and
    text) pair itself: no second read, even across many batches; other pairs stay exact."""
    monkeypatch.setattr(anchors_module, "KEEP_BATCHES", 10**6)
    anchors, groups, values = grouped(tmp_path, 2500, seed, batch_bytes=2000, spread=seed % 2 == 1)
    assert len(anchors._batch_file) > 20
    rows, reps = first_of_group_pairs(groups, values)
    anchors.file_hashes()
    with monkeypatch.context() as m:
        refuse_second_reads(m)
        assert anchors.equal_rows(rows, reps).all()
    check(anchors, values, seed=seed)


def test_batches_dropped_from_the_pass_are_read_again(tmp_path, monkeypatch):
    """Keeping one batch, first rows of groups spread over the file are dropped; the pairs
    that needed them are compared by a second read, exactly."""
    monkeypatch.setattr(anchors_module, "KEEP_BATCHES", 1)
    anchors, groups, values = grouped(tmp_path, 2500, 7, batch_bytes=2000, spread=True)
    rows, reps = first_of_group_pairs(groups, values)
    anchors.file_hashes()
    with monkeypatch.context() as m:
        refuse_second_reads(m)
        with pytest.raises(AssertionError, match="should have compared"):
            anchors.equal_rows(rows, reps)
    assert anchors.equal_rows(rows, reps).all()
    ids = dict_ids(values)
    a, b = pairs(values, 4000, seed=7)
    np.testing.assert_array_equal(anchors.equal_rows(a, b), ids[a] == ids[b])


def test_groups_whose_mixed_keys_clash(tmp_path, monkeypatch):
    """With group and hash mixed into a key that ignores the group (every group clashes), the
    pass leaves the clashing pairs to the second read: answers stay exact."""
    monkeypatch.setattr(anchors_module, "_MIX", np.uint64(0))
    anchors, groups, values = grouped(tmp_path, 2500, 3, batch_bytes=2000, spread=True)
    rows, reps = first_of_group_pairs(groups, values)
    assert anchors.equal_rows(rows, reps).all()
    different = np.array([ids != jds for ids, jds in zip(values, values[1:])] + [False])
    a = np.flatnonzero(different)
    np.testing.assert_array_equal(anchors.equal_rows(a, a + 1), np.zeros(len(a), dtype=bool))


def test_row_groups_read_two_at_a_time_or_piece_by_piece(tmp_path, monkeypatch):
    """When no row group holds more than two batches, the row groups of all the files are read
    two at a time (each by a thread with a reader of its own), across file boundaries;
    otherwise each file is read piece by piece. Both in row order, with every file's rows and
    nulls checked, and the same hashes."""
    ways: list[str] = []
    for name in ("_in_order", "_read_ahead"):
        real = getattr(anchors_module, name)
        monkeypatch.setattr(anchors_module, name, lambda *a, _real=real, _name=name: ways.append(_name) or _real(*a))
    parts = [texts(900, seed=s) for s in range(3)]
    paths = [
        write(tmp_path / "small.parquet", parts[0], row_group_size=50),
        write(tmp_path / "one.parquet", parts[1][:30], row_group_size=50),
        write(tmp_path / "empty.parquet", []),
        write(tmp_path / "large.parquet", parts[2], row_group_size=900),
    ]
    values = parts[0] + parts[1][:30] + parts[2]
    pieces = StreamedAnchors.from_files(paths, COL, batch_bytes=8000)
    check(pieces, values, seed=5)
    assert ways == ["_read_ahead"] * 4
    ways.clear()
    whole = StreamedAnchors.from_files(paths, COL, batch_bytes=1 << 40)
    check(whole, values, seed=6)
    np.testing.assert_array_equal(whole.file_hashes(), pieces.file_hashes())
    assert ways == ["_in_order"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open files through /proc")
def test_the_pass_closes_each_file_once_read(tmp_path, monkeypatch):
    """Many files: each file's readers close once its rows are read, so open files stay few."""
    values = texts(40 * 30, seed=8)
    paths = [write(tmp_path / f"{i:02}.parquet", values[i * 30 : (i + 1) * 30], row_group_size=10) for i in range(40)]
    peak: list[int] = []
    real = anchors_module._Readers.get

    def counted(self, path):
        peak.append(len(os.listdir("/proc/self/fd")))
        return real(self, path)

    check(StreamedAnchors.from_files(paths, COL), values, seed=9)  # polars' and pyarrow's threads started
    monkeypatch.setattr(anchors_module._Readers, "get", counted)
    before = len(os.listdir("/proc/self/fd"))
    for batch_bytes in (1 << 40, 200):  # two row groups at a time; piece by piece
        anchors = StreamedAnchors.from_files(paths, COL, batch_bytes=batch_bytes)
        anchors.file_hashes()
        assert len(os.listdir("/proc/self/fd")) == before
    assert max(peak) <= before + 8
