"""Damaged Parquet files through `gaca advantages` and `gaca validate` (issue 17, items 6-9).

The rule for every damaged input: exit 1 with exactly one `Error:` line naming the file (and
the column, where the footer that names columns is intact), nothing else on stderr (no
traceback, no panic text of a native reader) and nothing written; or, where the data can be
read, exactly what a verifying reader reads: the command's output then equals its output on
the table pyarrow reads from the damaged file with page checksums verified, and reads back.

The corpus: a tiny log (40 rows) written five ways (pyarrow's defaults; with page checksums;
with checksums and gzip; DELTA_BYTE_ARRAY text; no statistics), each damaged in the anchor
column, the id columns, a float column and a carried text column the command never reads:
truncated, a bit flipped in a page header, in the values, in the dictionary page, a header
flip that makes a lone read of the column return no rows, and a flip in the definition
levels that turns values into nulls the footer's statistics do not count (both found by a
search over the first bytes of the data page).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from tests.log.test_checks import base_rows, to_table

runner = CliRunner()

WRITERS = {
    "pyarrow": {},
    "checksums": {"write_page_checksum": True},
    "checksums-gzip": {"write_page_checksum": True, "compression": "gzip"},
    "delta-text": {
        "use_dictionary": ["group_id", "traj_id"],
        "column_encoding": {"anchor_obs": "DELTA_BYTE_ARRAY", "prompt": "DELTA_BYTE_ARRAY"},
    },
    "no-statistics": {"write_statistics": False},
}
COLUMNS = ["anchor_obs", "group_id", "traj_id", "reward", "prompt"]
DAMAGES = ["truncated", "page-header", "values", "dictionary-values", "short-read", "null-levels"]


def rows(copies: int = 4) -> dict[str, list]:
    """`base_rows` four times over, ids made distinct: 40 rows, 16 trajectories."""
    base = base_rows()
    out: dict[str, list] = {k: [] for k in base}
    for c in range(copies):
        for k, v in base.items():
            out[k] += [f"{x}-{c}" for x in v] if k in ("group_id", "traj_id") else v
    return out


def chunk_of(path: Path, column: str) -> pq.ColumnChunkMetaData:
    meta = pq.read_metadata(path)
    leaf = [meta.schema.column(i).path for i in range(meta.num_columns)].index(column)
    return meta.row_group(0).column(leaf)


def lone_read_nulls(path: Path, column: str) -> int | None:
    """Nulls pyarrow reads in `column` alone (checksums verified); None when it fails."""
    try:
        return pq.ParquetFile(path, page_checksum_verification=True).read(columns=[column]).column(0).null_count
    except (pa.ArrowException, OSError):
        return None


def lone_read_rows(path: Path, column: str) -> int | None:
    """Rows pyarrow returns reading `column` alone (checksums verified); None when it fails."""
    try:
        return pq.ParquetFile(path, page_checksum_verification=True).read(columns=[column]).num_rows
    except (pa.ArrowException, OSError):
        return None


def damage(src: Path, dest: Path, column: str, how: str) -> Path | None:
    """`src` damaged in `column` as `how` says, written to `dest`; None when the column has
    no such part (no dictionary page) or no header flip makes its lone read short."""
    data = bytearray(src.read_bytes())
    meta = chunk_of(src, column)
    first = meta.dictionary_page_offset or meta.data_page_offset
    end = first + meta.total_compressed_size
    if how == "truncated":
        data = data[: (first + end) // 2]
    elif how == "page-header":
        data[meta.data_page_offset + 2] ^= 0x01
    elif how == "values":
        data[end - 3] ^= 0x01
    elif how == "dictionary-values":
        if not meta.dictionary_page_offset:
            return None
        data[meta.data_page_offset - 3] ^= 0x01
    elif how in ("short-read", "null-levels"):  # the first flip that does it
        last = min(meta.data_page_offset + (24 if how == "short-read" else 48), end)
        for pos in range(meta.data_page_offset, last):
            for bit in (0x01, 0x80):
                data[pos] ^= bit
                dest.write_bytes(bytes(data))
                if how == "short-read" and lone_read_rows(dest, column) == 0:
                    return dest
                if how == "null-levels" and lone_read_nulls(dest, column) not in (0, None):
                    return dest  # non-null values read as nulls: the footer's null counts are wrong
                data[pos] ^= bit
        return None
    dest.write_bytes(bytes(data))
    return dest


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("damaged-sources")
    table = to_table(rows())
    out = {}
    for name, options in WRITERS.items():
        out[name] = d / f"{name}.parquet"
        pq.write_table(table, out[name], **options)
    return out


@pytest.fixture(scope="module")
def damaged_file(sources, tmp_path_factory):
    """`damaged_file(writer, column, how)`: that damaged file, made once for the module's tests."""
    d = tmp_path_factory.mktemp("damaged")
    made: dict[tuple[str, str, str], Path | None] = {}

    def get(writer: str, column: str, how: str) -> Path | None:
        key = (writer, column, how)
        if key not in made:
            made[key] = damage(sources[writer], d / f"{writer}-{column}-{how}.parquet", column, how)
        return made[key]

    return get


def assert_one_error(stderr: str, *fragments: str) -> None:
    """stderr is exactly one line, an `Error:` line holding every fragment."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), stderr
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


def verified_result(damaged: Path, tmp: Path, method: str) -> pa.Table:
    """What `gaca advantages` writes for the table a verifying reader reads from `damaged`."""
    clean = tmp / "verified.parquet"
    pq.write_table(pq.read_table(damaged, page_checksum_verification=True), clean)
    out = tmp / "verified.out.parquet"
    res = runner.invoke(app, ["advantages", str(clean), "--method", method, "-o", str(out)])
    assert res.exit_code == 0, res.output
    return pq.read_table(out).replace_schema_metadata(None)


CASES = [(w, c, d) for w in WRITERS for c in COLUMNS for d in DAMAGES]


@pytest.mark.parametrize("writer,column,how", CASES, ids=["-".join(c) for c in CASES])
def test_damaged_file(tmp_path, sources, damaged_file, capfd, writer, column, how):
    damaged = damaged_file(writer, column, how)
    if damaged is None:
        pytest.skip(f"{column} of the {writer} file has no part to damage that way")
    check_advantages(damaged, column, how, tmp_path, capfd)


STREAMED = ["page-header", "values", "short-read", "null-levels"]
STREAMED_WRITERS = ["delta-text", "pyarrow"]


@pytest.mark.parametrize("how", DAMAGES)
def test_every_damage_is_made(damaged_file, how):
    """The corpus does not shrink unseen: each damage is made in some file and column (the
    cases above skip the combinations that have no part to damage that way), and in the
    anchor column of a file the left-on-disk cases below run on."""
    made = [(w, c) for w in WRITERS for c in COLUMNS if damaged_file(w, c, how) is not None]
    assert made, f"no file of the corpus can be damaged as {how!r}"
    if how in STREAMED:
        assert any(c == "anchor_obs" and w in STREAMED_WRITERS for w, c in made), how


@pytest.mark.parametrize("writer", STREAMED_WRITERS)
@pytest.mark.parametrize("how", STREAMED)
def test_damaged_anchors_left_on_disk(tmp_path, damaged_file, capfd, monkeypatch, writer, how):
    """The same rule when the anchor column is left on disk (gaca_cli.log.anchors.
    StreamedAnchors, several batches): its pass over the column verifies every page, so that
    polars, which may panic (issue 17, item 8: DELTA_BYTE_ARRAY) or abort the process on a
    damaged page, only reads the pages again once they are known to be sound."""
    import gaca_cli.credit.reading as reading
    import gaca_cli.log.anchors as anchors

    damaged = damaged_file(writer, "anchor_obs", how)
    if damaged is None:
        pytest.skip(f"anchor_obs of the {writer} file has no part to damage that way")
    monkeypatch.setattr(reading, "HOLD_ANCHOR_BYTES", 0)
    monkeypatch.setattr(anchors, "BATCH_BYTES", 200)
    check_advantages(damaged, "anchor_obs", how, tmp_path, capfd)


def check_advantages(damaged: Path, column: str, how: str, tmp_path: Path, capfd) -> None:
    """`gaca advantages` on a file damaged in `column`: one Error line naming file and column
    and nothing written, or what it gives on what a verifying reader reads; nothing from
    native code on the process's stdout or stderr."""
    expected_rows = 40
    verifier_reads = lone_read_rows(damaged, column) == expected_rows and how != "truncated"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "annotated.parquet"
    capfd.readouterr()
    res = runner.invoke(app, ["advantages", str(damaged), "--method", "gaca", "-o", str(out)])
    native = capfd.readouterr()  # what native code wrote to the process's own stdout and stderr
    assert native.err == "" and native.out == "", native
    if res.exit_code == 0:
        assert verifier_reads, "exit 0 on a file a verifying reader refuses"
        written = pq.read_table(out, page_checksum_verification=True).replace_schema_metadata(None)
        assert written.equals(verified_result(damaged, tmp_path, "gaca"))
        return
    assert res.exit_code == 1, res.output
    assert os.listdir(out_dir) == []
    if verifier_reads and "not a readable Parquet file" not in res.stderr:
        # the values read break a rule: the error the verified table gives
        clean = tmp_path / "verified.parquet"
        pq.write_table(pq.read_table(damaged, page_checksum_verification=True), clean)
        expected = runner.invoke(app, ["advantages", str(clean), "--method", "gaca", "-o", str(tmp_path / "o.parquet")])
        assert res.stderr.replace(str(damaged), "LOG") == expected.stderr.replace(str(clean), "LOG")
    else:
        named = [str(damaged)] + ([] if how == "truncated" else [f"column '{column}'"])
        assert_one_error(res.stderr, *named, "not a readable Parquet file")


@pytest.mark.parametrize("writer,column,how", CASES, ids=["-".join(c) for c in CASES])
def test_damaged_file_validate(tmp_path, sources, damaged_file, capfd, writer, column, how):
    damaged = damaged_file(writer, column, how)
    if damaged is None:
        pytest.skip(f"{column} of the {writer} file has no part to damage that way")
    verifier_reads = lone_read_rows(damaged, column) == 40 and how != "truncated"
    capfd.readouterr()
    res = runner.invoke(app, ["validate", str(damaged), "--json"])
    native = capfd.readouterr()
    assert native.err == "" and native.out == "", native
    if res.exit_code == 1 and res.stdout == "":
        named = [str(damaged)] + ([] if how == "truncated" else [f"column '{column}'"])
        assert_one_error(res.stderr, *named)
    else:  # a report: the one validate gives for what a verifying reader reads
        assert verifier_reads, res.output
        clean = tmp_path / "verified.parquet"
        pq.write_table(pq.read_table(damaged, page_checksum_verification=True), clean)
        expected = runner.invoke(app, ["validate", str(clean), "--json"])
        assert (res.exit_code, res.stdout.replace(str(damaged), "LOG")) == (
            expected.exit_code,
            expected.stdout.replace(str(clean), "LOG"),
        )


def test_the_corpus_damages_what_it_says(sources, tmp_path):
    """Each kind of damage is made somewhere: a header flip that makes a lone read of the
    column short (issue 17, item 6) exists for the anchor column, and checksummed files turn
    a dictionary-values flip, which a reader without verification takes silently, into an
    error of the verifying reader (item 9)."""
    assert damage(sources["pyarrow"], tmp_path / "a.parquet", "anchor_obs", "short-read") is not None
    flipped = damage(sources["checksums"], tmp_path / "b.parquet", "anchor_obs", "dictionary-values")
    assert flipped is not None
    assert pq.read_table(flipped).num_rows == 40  # no verification: different values, no error
    assert lone_read_rows(flipped, "anchor_obs") is None


def test_a_damaged_carried_column_is_not_copied(tmp_path, sources):
    """The splice copies carried columns byte for byte without reading them: a damaged page
    there is found by reading the copy back before the rename (item 9), one Error line."""
    damaged = damage(sources["checksums-gzip"], tmp_path / "damaged.parquet", "prompt", "values")
    old = tmp_path / "annotated.parquet"
    old.write_bytes(b"previous output\n")
    res = runner.invoke(app, ["advantages", str(damaged), "--method", "grpo", "-o", str(old)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(damaged), "column 'prompt'")
    assert old.read_bytes() == b"previous output\n"
    assert sorted(os.listdir(tmp_path)) == ["annotated.parquet", "damaged.parquet"]


def test_the_damaged_file_of_several_is_named(tmp_path):
    """Two input files, the second damaged in a carried column: the Error names that file."""
    table = to_table(rows())
    good, whole, bad = tmp_path / "a.parquet", tmp_path / "b-whole.parquet", tmp_path / "b.parquet"
    pq.write_table(table.slice(0, 20), good, compression="gzip", write_page_checksum=True)
    pq.write_table(table.slice(20), whole, compression="gzip", write_page_checksum=True)
    damage(whole, bad, "prompt", "values")
    out = tmp_path / "out" / "annotated.parquet"
    res = runner.invoke(app, ["advantages", str(good), str(bad), "--method", "grpo", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(bad), "column 'prompt'", "not a readable Parquet file")
    assert str(good) not in res.stderr
    assert not out.exists()


@pytest.mark.parametrize("column", ["anchor_obs", "prompt"])
def test_a_damaged_file_in_a_directory_is_named(tmp_path, column):
    """A directory (hive partitions) with one damaged file: the Error names that file and the
    column, for advantages (which reads and rewrites directories with pyarrow.dataset) and
    validate."""
    table = to_table(rows())
    logs = tmp_path / "logs"
    for part, (lo, hi) in enumerate([(0, 20), (20, 40)]):
        (logs / f"part={part}").mkdir(parents=True)
        pq.write_table(table.slice(lo, hi - lo), logs / f"part={part}" / "data.parquet", write_page_checksum=True)
    bad = logs / "part=1" / "data.parquet"
    damage(bad, bad, column, "dictionary-values")
    out = tmp_path / "out" / "annotated.parquet"
    res = runner.invoke(app, ["advantages", str(logs), "--method", "gaca", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(bad), f"column '{column}'", "not a readable Parquet file")
    assert not out.exists()
    res = runner.invoke(app, ["validate", str(logs)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(bad), f"column '{column}'")


@pytest.mark.parametrize(("writer", "how"), [("checksums-gzip", "values"), ("pyarrow", "null-levels")])
def test_a_damaged_carried_column_without_the_splice(tmp_path, damaged_file, monkeypatch, writer, how):
    """With the splice turned off (GACA_NO_SPLICE=1: the whole log read and written again by
    pyarrow) a damaged carried column is the same one Error line, found by the read or by its
    nulls against the footer's statistics, which the not-null check used."""
    monkeypatch.setenv("GACA_NO_SPLICE", "1")
    damaged = damaged_file(writer, "prompt", how)
    assert damaged is not None
    out = tmp_path / "annotated.parquet"
    res = runner.invoke(app, ["advantages", str(damaged), "--method", "grpo", "-o", str(out)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(damaged), "column 'prompt'", "not a readable Parquet file")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("writer", "how"), [("checksums-gzip", "values"), ("pyarrow", "null-levels")])
def test_a_damaged_carried_column_is_the_librarys_error_too(damaged_file, writer, how):
    """`gaca.advantages` on files runs the command's checks of the columns it carries: the
    same error, from the read or from the nulls against the footer's statistics."""
    import gaca_cli as gaca

    damaged = damaged_file(writer, "prompt", how)
    assert damaged is not None
    with pytest.raises(gaca.GacaError, match="column 'prompt': not a readable Parquet file"):
        gaca.advantages(str(damaged), method="grpo")
