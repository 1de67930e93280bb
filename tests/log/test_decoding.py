"""Parquet files other writers make that pyarrow cannot read as they are (gaca_cli/log/decoding.py).

- Parquet modular encryption with a plaintext footer: pyarrow, given no keys, aborts the process
  at its first look at the encrypted column's metadata (`terminate called ... ParquetException`).
  Every command that reads logs must instead exit 1 with one line saying the file is encrypted.
  The commands run in a subprocess, so that a regression fails the test instead of the run.
- A carried column pyarrow cannot decode. The case reported (DuckDB 2.x, `PARQUET_VERSION V2`, a
  struct column: pyarrow's `Unexpected end of stream: InitBlock EOF`) does not reproduce with
  the duckdb 2.0.1 and pyarrow 26.0.1 installed here, so the file is made another way: DuckDB
  writes the log with a struct column, then the header of that column's data page is made to
  count more values than it holds (a writer's miscount). pyarrow refuses such a page, polars
  reads the values the levels give; a page that counts fewer values than it holds neither reads.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.log._splice.thrift import ThriftDecoder, encode_struct
from gaca_cli.log.decoding import encrypted
from tests.log.test_checks import base_rows, to_table
from tests.log.test_damaged import assert_one_error

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


class _ToyKms(pe.KmsClient):
    """A KMS that 'wraps' a key by base64: enough to write an encrypted file in a test."""

    def __init__(self, config):
        super().__init__()

    def wrap_key(self, key_bytes, master_key_identifier):
        return base64.b64encode(key_bytes)

    def unwrap_key(self, wrapped_key, master_key_identifier):
        return base64.b64decode(wrapped_key)


def write_encrypted(table: pa.Table, path: Path, plaintext_footer: bool) -> Path:
    """`table` with its `prompt` column encrypted (Parquet modular encryption)."""
    config = pe.EncryptionConfiguration(
        footer_key="footer", column_keys={"col": ["prompt"]}, plaintext_footer=plaintext_footer, double_wrapping=False
    )
    props = pe.CryptoFactory(_ToyKms).file_encryption_properties(pe.KmsConnectionConfig(), config)
    with pq.ParquetWriter(path, table.schema, encryption_properties=props) as writer:
        writer.write_table(table)
    return path


def gaca_subprocess(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gaca_cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_encryption_is_seen_from_the_footer(tmp_path):
    table = to_table(base_rows())
    plain = tmp_path / "plain.parquet"
    pq.write_table(table, plain)
    assert encrypted(str(write_encrypted(table, tmp_path / "a.parquet", plaintext_footer=True)))
    assert encrypted(str(write_encrypted(table, tmp_path / "b.parquet", plaintext_footer=False)))
    assert not encrypted(str(plain))
    (tmp_path / "short.parquet").write_bytes(plain.read_bytes()[:-20])  # a damaged footer: pyarrow's error follows
    (tmp_path / "text.parquet").write_text("not parquet\n")
    assert not encrypted(str(tmp_path / "short.parquet")) and not encrypted(str(tmp_path / "text.parquet"))


COMMANDS = {
    "validate": ["validate", "{log}"],
    "advantages": ["advantages", "{log}", "--method", "gaca", "-o", "out.parquet"],
    "inspect": ["inspect", "{log}", "--no-pager"],
    "score": ["score", "{log}", "--model", "no-such-model", "-o", "scored.parquet"],
    "train-offline": ["train-offline", "{log}", "--model", "no-such-model", "-o", "trained"],
    "import-verl-agent": ["import", "--from", "verl-agent", "{log}", "-o", "imported.parquet"],
    "import-trl": ["import", "--from", "trl", "{log}", "-o", "imported.parquet"],
}


@pytest.mark.parametrize("plaintext_footer", [True, False], ids=["plaintext-footer", "encrypted-footer"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_encrypted_log_is_one_error_in_every_command(tmp_path, command, plaintext_footer):
    table = to_table(base_rows())
    log = write_encrypted(table, tmp_path / "enc.parquet", plaintext_footer)
    res = gaca_subprocess(*[a.format(log=log) for a in COMMANDS[command]], cwd=tmp_path)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert_one_error(res.stderr, str(log), "an encrypted Parquet file")
    assert sorted(os.listdir(tmp_path)) == ["enc.parquet"]


def test_an_encrypted_file_in_a_directory_is_named(tmp_path):
    table = to_table(base_rows())
    for part in (0, 1):
        (tmp_path / "logs" / f"part={part}").mkdir(parents=True)
    pq.write_table(table, tmp_path / "logs" / "part=0" / "a.parquet")
    bad = write_encrypted(table, tmp_path / "logs" / "part=1" / "b.parquet", plaintext_footer=True)
    for args in (["validate"], ["advantages", "--method", "grpo", "-o", "out.parquet"]):
        res = gaca_subprocess(args[0], str(tmp_path / "logs"), *args[1:], cwd=tmp_path)
        assert res.returncode == 1, res.stderr
        assert_one_error(res.stderr, str(bad), "an encrypted Parquet file")


# --------------------------------------------------------------------------- undecodable columns


def miscounted(src: Path, dest: Path, leaf: str, extra: int) -> Path:
    """`src` with the first data page of the column chunk `leaf` claiming `extra` more values
    (fewer, when negative) than it holds; the header keeps its length."""
    meta = pq.read_metadata(src)
    leaves = [meta.schema.column(j).path for j in range(meta.num_columns)]
    offset = meta.row_group(0).column(leaves.index(leaf)).data_page_offset
    data = bytearray(src.read_bytes())
    decoder = ThriftDecoder(data, offset)
    header = decoder.read_struct()
    page = header.get(5) or header.get(8)  # DataPageHeader, or DataPageHeaderV2
    page.set(1, 5, page.get(1) + extra)  # num_values (an i32)
    encoded = encode_struct(header)
    assert len(encoded) == decoder.pos - offset
    data[offset : decoder.pos] = encoded
    dest.write_bytes(bytes(data))
    return dest


@pytest.fixture(scope="module")
def duckdb_logs(tmp_path_factory) -> dict[str, Path]:
    """The log as DuckDB writes it with PARQUET_VERSION V2 and a carried struct column `meta`,
    and two copies whose `meta.turn` page miscounts its values: +8 (polars reads it, pyarrow
    does not) and -1 (neither does)."""
    duckdb = pytest.importorskip("duckdb")
    folder = tmp_path_factory.mktemp("duckdb")
    clean = folder / "clean.parquet"
    con = duckdb.connect()
    con.register("log", to_table(base_rows()))
    con.execute(
        "COPY (SELECT *, {'turn': step_idx, 'tool': 'tool-' || step_idx} AS meta FROM log) "
        f"TO '{clean}' (FORMAT parquet, PARQUET_VERSION V2)"
    )
    con.close()
    return {
        "clean": clean,
        "over": miscounted(clean, folder / "over.parquet", "meta.turn", 8),
        "under": miscounted(clean, folder / "under.parquet", "meta.turn", -1),
    }


def test_the_files_are_what_the_test_says(duckdb_logs):
    pl = pytest.importorskip("polars")
    assert pq.read_metadata(duckdb_logs["clean"]).created_by.startswith("DuckDB")
    clean = pq.read_table(duckdb_logs["clean"])
    with pytest.raises(OSError, match="do not match num_values in page header"):
        pq.ParquetFile(duckdb_logs["over"]).read(columns=["meta"])
    assert pq.ParquetFile(duckdb_logs["under"]).read(columns=["meta"]).num_rows < clean.num_rows  # read short
    for name in ("over", "under"):
        assert pq.read_table(duckdb_logs[name], columns=["group_id", "reward"]).equals(
            clean.select(["group_id", "reward"])
        )
    assert pl.read_parquet(duckdb_logs["over"]).to_arrow().cast(clean.schema).equals(clean)
    with pytest.raises(Exception):  # noqa: B017 (polars' own error type)
        pl.read_parquet(duckdb_logs["under"])


@pytest.mark.parametrize("splice", ["splice", "no-splice"])
def test_a_column_only_polars_decodes_gives_the_same_output(tmp_path, duckdb_logs, monkeypatch, splice):
    """`advantages` on the file whose carried column pyarrow cannot decode writes what it writes
    for the clean file (the same table, types and metadata); `validate` passes."""
    if splice == "no-splice":
        monkeypatch.setenv("GACA_NO_SPLICE", "1")
    outputs = {}
    for name in ("clean", "over"):
        out = tmp_path / f"{name}.out.parquet"
        res = runner.invoke(app, ["advantages", str(duckdb_logs[name]), "--method", "gaca", "-o", str(out)])
        assert res.exit_code == 0, res.output
        outputs[name] = pq.read_table(out)
    assert outputs["over"].equals(outputs["clean"], check_metadata=True)
    assert outputs["over"].column("meta").to_pylist()[1] == {"turn": 1, "tool": "tool-1"}
    res = runner.invoke(app, ["validate", str(duckdb_logs["over"])])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("command", ["advantages", "validate"])
def test_a_column_neither_decodes_is_one_error_naming_it_and_the_writer(tmp_path, duckdb_logs, command):
    args = [command, str(duckdb_logs["under"])]
    if command == "advantages":
        args += ["--method", "grpo", "-o", str(tmp_path / "out.parquet")]
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(duckdb_logs["under"]), "column 'meta'", "written by DuckDB version")
    assert os.listdir(tmp_path) == []


def test_a_failing_page_in_a_file_pyarrow_wrote_is_damage(tmp_path):
    """pyarrow reads what pyarrow writes: the same miscount in its own file is refused as
    damage, without asking polars."""
    table = to_table(base_rows()).append_column("meta", pa.array([{"turn": i} for i in range(10)]))
    pq.write_table(
        table, tmp_path / "clean.parquet", column_encoding={"meta.turn": "DELTA_BINARY_PACKED"}, use_dictionary=False
    )
    bad = miscounted(tmp_path / "clean.parquet", tmp_path / "over.parquet", "meta.turn", 8)
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 1, res.output
    assert_one_error(res.stderr, str(bad), "column 'meta'", "not a readable Parquet file")
    assert "polars" not in res.stderr
