"""`import gaca_cli as gaca`: the library calls against the commands they replace.

- advantages: every golden case, every input kind (pyarrow, polars, pandas, path), equal to
  the file `gaca advantages` writes, bit for bit, rows in the input's order.
- compute_advantages: numpy and torch arrays give the command's bits on the same rows.
- validate, read_log, import_logs: what `gaca validate --json`, `read_log`, `gaca import` give.
- options: unknown or inactive options and bad values are refused, naming the option.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import gaca_cli as gaca
from gaca_cli.cli import app
from tests.credit.record_golden import CASES, tiny_table

OPTIONS = {case: {k: v for k, v in params.items() if k != "method"} for case, params in CASES.items()}


def cli(*args) -> None:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def cli_advantages(src, out, params: dict) -> pa.Table:
    flags = []
    for k, v in params.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):  # a switch: --base-group / --no-base-group
            flags.append(flag if v else "--no-" + flag[2:])
        else:
            flags += [flag, v]
    cli("advantages", src, "-o", out, *flags)
    return pq.read_table(out)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.parquet"
    pq.write_table(tiny_table(), path)
    return path


@pytest.mark.parametrize("case", CASES)
def test_advantages_equals_the_command_for_every_input_kind(tmp_path, tiny, case):
    import pandas as pd
    import polars as pl

    want = cli_advantages(tiny, tmp_path / "out.parquet", CASES[case])
    method = CASES[case]["method"]
    from_path = gaca.advantages(tiny, method=method, **OPTIONS[case])
    assert from_path.equals(want) and from_path.schema.metadata == want.schema.metadata
    assert gaca.advantages([str(tiny)], method=method, **OPTIONS[case]).equals(want)
    assert gaca.advantages(tiny_table(), method=method, **OPTIONS[case]).equals(want)
    from_polars = gaca.advantages(pl.from_arrow(tiny_table()), method=method, **OPTIONS[case])
    assert isinstance(from_polars, pl.DataFrame) and from_polars.columns == want.column_names
    from_pandas = gaca.advantages(tiny_table().to_pandas(), method=method, **OPTIONS[case])
    assert isinstance(from_pandas, pd.DataFrame) and list(from_pandas.columns) == want.column_names
    for name in want.column_names:
        expected = want.column(name).to_numpy(zero_copy_only=False)
        for got in (from_polars[name].to_numpy(), from_pandas[name].to_numpy()):
            if expected.dtype.kind == "f":
                assert np.array_equal(got.view(np.int64), expected.view(np.int64), equal_nan=False), name
            else:
                assert list(got) == list(expected), name


def test_rows_stay_in_the_input_order_and_earlier_outputs_are_replaced():
    rows = np.random.default_rng(0).permutation(tiny_table().num_rows)
    shuffled = tiny_table().take(rows)
    once = gaca.advantages(shuffled, method="gaca", gamma=0.5)
    assert once.select(shuffled.column_names).equals(shuffled)
    again = gaca.advantages(once, method="gigpo", gamma=0.5)
    assert again.column_names == [*shuffled.column_names, *gaca.advantages(shuffled, method="gigpo").column_names[6:]]
    canonical = gaca.advantages(tiny_table(), method="gaca", gamma=0.5)
    assert once.column("advantage").to_pylist() == canonical.column("advantage").take(rows).to_pylist()


def test_column_map_reads_other_names():
    renamed = tiny_table().rename_columns(["uid", "traj_uid", "step_idx", "reward", "anchor_obs", "nll_mean"])
    got = gaca.advantages(renamed, method="gaca", column_map={"group_id": "uid", "traj_id": "traj_uid"})
    assert got.column_names[:2] == ["uid", "traj_uid"]
    assert got.column("advantage").equals(gaca.advantages(tiny_table(), method="gaca").column("advantage"))


def test_options_are_checked_as_on_the_command_line(tiny):
    with pytest.raises(TypeError, match="unknown option 'betta'; did you mean 'beta'\\? the options are: ") as error:
        gaca.advantages(tiny, method="gaca", betta=0.3)
    listed = str(error.value).rpartition(": ")[2].split(", ")
    assert "beta" in listed and "gamma" in listed and "method" not in listed  # method is a keyword of its own
    with pytest.raises(TypeError, match="unknown option 'zzz'; the options are: ") as error:
        gaca.compute_advantages(group_id=[0], traj_id=[0], step_idx=[0], reward=[1.0], method="grpo", zzz=1)
    assert "method" not in str(error.value)
    with pytest.raises(TypeError, match="did you mean 'temperature'") as error:
        gaca.score(tiny, model="unused", temprature=2.0)
    assert "'model'" not in str(error.value) and "max_batch_tokens" in str(error.value)
    with pytest.raises(ValueError, match="beta"):
        gaca.advantages(tiny, method="gaca", beta=-1.0)
    with pytest.raises(ValueError, match="beta=0.3 has no effect unless method gaca"):
        gaca.advantages(tiny, method="grpo", beta=0.3)
    with pytest.raises(TypeError, match="pyarrow Table"):
        gaca.advantages({"reward": [1.0]}, method="grpo")


def test_data_errors_are_gaca_errors_with_the_commands_message(tmp_path):
    bad = tiny_table().set_column(3, "reward", pa.array([0.0, float("nan")] + [0.0] * 9))
    pq.write_table(bad, tmp_path / "bad.parquet")
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["advantages", str(tmp_path / "bad.parquet"), "-o", str(out)])
    assert result.exit_code == 1 and not out.exists()
    with pytest.raises(gaca.GacaError) as caught:
        gaca.advantages(tmp_path / "bad.parquet", method="gaca")
    assert result.stderr.strip() == f"Error: {caught.value}"
    assert (caught.value.file, caught.value.column, caught.value.rows) == (
        str(tmp_path / "bad.parquet"),
        "reward",
        ("(a1, 1)",),
    )
    with pytest.raises(gaca.GacaError, match="<pyarrow.Table>: column 'reward': must be finite"):
        gaca.advantages(bad, method="gaca")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.parquet"]  # nothing left behind


# --------------------------------------------------------------------------- compute_advantages


def arrays_of(table: pa.Table) -> dict:
    return {
        "group_id": table.column("group_id").to_numpy(zero_copy_only=False),
        "traj_id": table.column("traj_id").to_numpy(zero_copy_only=False),
        "step_idx": table.column("step_idx").to_numpy(),
        "reward": table.column("reward").to_numpy(),
        "anchor": table.column("anchor_obs").to_numpy(zero_copy_only=False),
        "nll": table.column("nll_mean").to_numpy(zero_copy_only=False).astype(np.float64),
    }


@pytest.mark.parametrize("case", CASES)
def test_compute_advantages_gives_the_commands_bits(tmp_path, tiny, case):
    want = cli_advantages(tiny, tmp_path / "out.parquet", CASES[case])
    got = gaca.compute_advantages(**arrays_of(tiny_table()), **CASES[case])
    assert set(got) == set(want.column_names) - set(tiny_table().column_names) - {"adv_method"}
    for name, values in got.items():
        assert isinstance(values, np.ndarray)
        assert values.tobytes() == want.column(name).to_numpy().tobytes(), name


def test_compute_advantages_on_integer_ids_and_anchors():
    arrays = arrays_of(tiny_table())
    for name in ("group_id", "traj_id", "anchor"):
        arrays[name] = np.unique(arrays[name], return_inverse=True)[1] * 7 + 3
    got = gaca.compute_advantages(**arrays, method="gaca", gamma=0.5)
    want = gaca.compute_advantages(**arrays_of(tiny_table()), method="gaca", gamma=0.5)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_compute_advantages_on_torch_tensors():
    torch = pytest.importorskip("torch")
    arrays = arrays_of(tiny_table())
    want = gaca.compute_advantages(**arrays, method="gaca", gamma=0.5)
    tensors = {**arrays, "step_idx": torch.tensor(arrays["step_idx"]), "nll": torch.tensor(arrays["nll"])}
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        reward = torch.tensor(arrays["reward"], dtype=dtype)
        got = gaca.compute_advantages(**{**tensors, "reward": reward}, method="gaca", gamma=0.5)
        assert got["advantage"].dtype == dtype and got["step_group_id"].dtype == torch.int64
        assert torch.equal(got["advantage"], torch.tensor(want["advantage"]).to(dtype))
    got = gaca.compute_advantages(**{**tensors, "reward": torch.tensor(arrays["reward"])}, method="gaca", gamma=0.5)
    assert got["advantage"].numpy().tobytes() == want["advantage"].tobytes()


def test_compute_advantages_refuses_bad_arrays():
    arrays = arrays_of(tiny_table())
    with pytest.raises(ValueError, match="traj_id has 10 values for 11 rewards"):
        gaca.compute_advantages(**{**arrays, "traj_id": arrays["traj_id"][:-1]}, method="grpo")
    with pytest.raises(gaca.GacaError, match="group_id must hold text or integer"):
        gaca.compute_advantages(**{**arrays, "group_id": np.array([1.5] * 11)}, method="grpo")
    steps = arrays["step_idx"].copy()
    steps[1] = 5
    with pytest.raises(gaca.GacaError, match="<arrays>: column 'step_idx': steps of a trajectory"):
        gaca.compute_advantages(**{**arrays, "step_idx": steps}, method="grpo")
    with pytest.raises(gaca.GacaError, match="<arrays>: the log has no rows"):  # was a ZeroDivisionError
        none = np.zeros(0, dtype=np.int64)
        gaca.compute_advantages(group_id=none, traj_id=none, step_idx=none, reward=np.zeros(0), method="grpo")


# --------------------------------------------------------------------------- validate, read_log, import


def test_validate_returns_what_the_command_prints(tmp_path):
    broken = tiny_table().set_column(2, "step_idx", pa.array([0, 1, 0, 1, 3, 0, 0, 0, 1, 0, 0]))
    pq.write_table(broken, tmp_path / "broken.parquet")
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "broken.parquet"), "--json"])
    assert result.exit_code == 1
    printed = json.loads(result.stdout)["violations"]
    for data in (tmp_path / "broken.parquet", broken):
        found = gaca.validate(data)
        assert [(v.column, v.rule, list(v.rows), v.n_rows) for v in found] == [
            (p["column"], p["rule"], p["rows"], p["n_rows"]) for p in printed
        ]
        assert all(isinstance(v, gaca.GacaError) for v in found)
    assert gaca.validate(tiny_table()) == []
    assert [v.column for v in gaca.validate(tiny_table().drop_columns(["nll_mean"]), command="advantages:gaca")] == [
        "nll_mean"
    ]


def test_read_log_maps_columns(tiny):
    table = gaca.read_log(tiny, column_map={"episode": "group_id"})
    assert table.column_names[0] == "episode" and table.num_rows == 11


def test_import_logs_equals_the_command(tmp_path):
    from tests.integrations.test_import_chat_jsonl import TRAJECTORIES, write_jsonl

    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    cli("import", "--from", "chat-jsonl", src, "-o", tmp_path / "cli.parquet")
    assert gaca.import_logs("chat-jsonl", src).equals(pq.read_table(tmp_path / "cli.parquet"))
    written = gaca.import_logs("chat-jsonl", [src], output=tmp_path / "api.parquet")
    assert written.equals(pq.read_table(tmp_path / "api.parquet"))
    with pytest.raises(gaca.GacaError):
        gaca.import_logs(
            "chat-jsonl", write_jsonl(tmp_path / "bad.jsonl", [{"messages": 3}]), output=tmp_path / "x.parquet"
        )
    assert not (tmp_path / "x.parquet").exists()


def test_an_unknown_command_is_refused_before_importing(tmp_path):
    """`command=` is checked first, as `validate`'s is: a ValueError, nothing written."""
    from tests.integrations.test_import_chat_jsonl import TRAJECTORIES, write_jsonl

    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    with pytest.raises(ValueError, match="command='advantage' is not valid"):
        gaca.import_logs("chat-jsonl", src, output=tmp_path / "x.parquet", command="advantage")
    assert not (tmp_path / "x.parquet").exists()


def test_validate_from_equals_validate_on_the_imported_log(tmp_path):
    """`gaca validate --from` reports what `validate` finds in the table `import_logs` gives."""
    from tests.integrations.test_import_chat_jsonl import TRAJECTORIES, write_jsonl

    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    for command, code in (("validate", 0), ("advantages:gaca", 1)):
        result = CliRunner().invoke(app, ["validate", "--from", "chat-jsonl", str(src), "--for", command, "--json"])
        assert result.exit_code == code, result.output
        report = json.loads(result.stdout)
        table = gaca.import_logs("chat-jsonl", src)
        found = gaca.validate(table, command=command)
        assert report["rows"] == table.num_rows and report["ok"] == (not found)
        assert [(v.column, v.rule, list(v.rows), v.n_rows) for v in found] == [
            (p["column"], p["rule"], p["rows"], p["n_rows"]) for p in report["violations"]
        ]
    assert found  # advantages:gaca needs nll_mean, which chat logs lack


def test_score_equals_the_command(tmp_path, tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.lm.test_score import make_rows, write_log

    log = write_log(tmp_path / "log.parquet", make_rows(groups=2, trajs=2, steps=3, seed=1))
    cli("score", log, "--model", tiny_llama, "-o", tmp_path / "cli.parquet")
    want = pq.read_table(tmp_path / "cli.parquet")
    from_path = gaca.score(log, model=tiny_llama)
    assert from_path.equals(want) and from_path.schema.metadata == want.schema.metadata
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).train()
    loaded = gaca.score(pq.read_table(log), model=model, tokenizer=AutoTokenizer.from_pretrained(tiny_llama))
    assert loaded.equals(want) and model.training  # scored in eval mode, left as it was
    with pytest.raises(TypeError, match="tokenizer"):
        gaca.score(log, model=model)
    with pytest.raises(TypeError, match="without options that load one .'dtype'"):
        gaca.score(log, model=model, tokenizer=object(), dtype="bf16")
