"""`--from trl`: the rows read from completion tables a real TRL 1.16.0 `GRPOTrainer` wrote
(tests/data/trl/), checked value by value against the files read here with pyarrow; TRL's own
advantage recomputed from the imported rewards; bad input; the command end to end."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import trl
from gaca_cli.integrations.imports.base import ImportOptions
from tests.integrations.cli_helpers import error_line, gaca, import_json

DATA = Path(__file__).resolve().parents[1] / "data" / "trl"
STANDARD = sorted((DATA / "standard").glob("*.parquet"))
CHAT = sorted((DATA / "conversational").glob("*.parquet"))
WEIGHTS = (1.0, 0.5)  # the standard run's GRPOConfig(reward_weights=[1.0, 0.5]) (make_fixture.py)
REWARD_COLUMNS = ("has_e", "brevity")


def read(files: list[Path], weights: tuple[float, ...] | None = None) -> list[dict]:
    return list(trl.read(files, ImportOptions(reward_weights=weights)))


def weighted(record: dict, weights: tuple[float, ...]) -> float:
    """TRL's aggregate: Σ w_i r_i over the functions that returned a value (null in the file)."""
    return sum(w * record[c] for c, w in zip(REWARD_COLUMNS, weights, strict=True) if record[c] is not None)


def write_like(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def test_the_fixture_has_what_the_tests_rely_on():
    """Two logging steps per run, 6 completions each (2 prompts x 3 generations); TRL's column
    order; the standard run's `brevity` returned None (null) for one task."""
    assert [p.name for p in STANDARD] == ["completions_00001.parquet", "completions_00002.parquet"]
    assert [p.name for p in CHAT] == [p.name for p in STANDARD]
    for path in STANDARD:
        table = pq.read_table(path)
        assert table.column_names == ["step", "prompt", "completion", "has_e", "brevity", "verdict", "advantage"]
        assert table.num_rows == 6 and table.column("brevity").null_count == 3
        assert 0 < sum(table.column("has_e").to_pylist()) < 6
    for path in CHAT:
        table = pq.read_table(path)
        assert table.column_names == ["step", "prompt", "completion", "has_e", "brevity", "advantage"]
        assert pa.types.is_list(table.schema.field("prompt").type)


def test_every_value_of_the_plain_text_tables():
    for path in STANDARD:
        records = pq.read_table(path).to_pylist()
        rows = read([path], WEIGHTS)
        assert len(rows) == len(records)
        for i, (row, rec) in enumerate(zip(rows, records, strict=True)):
            assert row["traj_id"] == f"{path.stem}/row{i}"
            assert row["step_idx"] == 0 and row["done"] is True
            assert row["prompt"] == rec["prompt"] and "messages" not in row
            assert row["action"] == rec["completion"]
            assert row["step"] == rec["step"]
            assert row["reward"] == pytest.approx(weighted(rec, WEIGHTS), abs=1e-12)
            assert row["reward_has_e"] == rec["has_e"] and row["reward_brevity"] == rec["brevity"]
            assert row["source_advantage"] == rec["advantage"]
            assert row["verdict"] == rec["verdict"]
            assert "extra" not in row and "advantage" not in row
        groups = defaultdict(set)
        for row, rec in zip(rows, records, strict=True):
            groups[row["group_id"]].add((rec["step"], rec["prompt"]))
        assert len(groups) == 2 and all(len(keys) == 1 for keys in groups.values())
        assert all(g.startswith(f"{path.stem}/step") for g in groups)


def test_every_value_of_the_chat_tables():
    for path in CHAT:
        records = pq.read_table(path).to_pylist()
        rows = read([path])
        assert len(rows) == len(records)
        for i, (row, rec) in enumerate(zip(rows, records, strict=True)):
            assert row["traj_id"] == f"{path.stem}/row{i}" and row["step_idx"] == 0 and row["done"] is True
            assert row["messages"] == [{"role": m["role"], "content": m["content"]} for m in rec["prompt"]]
            assert "prompt" not in row
            (turn,) = rec["completion"]
            assert turn["role"] == "assistant" and row["action"] == turn["content"]
            assert row["reward"] == pytest.approx(rec["has_e"] + rec["brevity"], abs=1e-12)
            assert row["reward_has_e"] == rec["has_e"] and row["reward_brevity"] == rec["brevity"]
            assert row["source_advantage"] == rec["advantage"] and row["step"] == rec["step"]
            assert "extra" not in row
        assert len({r["group_id"] for r in rows}) == 2


def trl_advantages(rows: list[dict]) -> list[float]:
    """TRL's default advantage (scale_rewards="group") of each row: (r - mean_g) / (std_g + 1e-4),
    std with Bessel's correction, over the rows' episode groups."""
    by_group = defaultdict(list)
    for row in rows:
        by_group[row["group_id"]].append(row["reward"])
    stats = {}
    for g, rewards in by_group.items():
        mean = sum(rewards) / len(rewards)
        stats[g] = mean, math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r["reward"] - stats[r["group_id"]][0]) / (stats[r["group_id"]][1] + 1e-4) for r in rows]


@pytest.mark.parametrize("files, weights", [(STANDARD, WEIGHTS), (CHAT, None)])
def test_the_imported_reward_gives_back_trls_own_advantage(files, weights):
    """From the imported rewards and groups, TRL's advantage (float32 there) comes out as logged:
    the groups are TRL's and the weighted sum is the reward TRL normalised."""
    rows = read(files, weights)
    assert sorted(Counter(r["group_id"] for r in rows).values()) == [3, 3, 3, 3]
    for row, advantage in zip(rows, trl_advantages(rows), strict=True):
        assert advantage == pytest.approx(row["source_advantage"], abs=1e-4)


def test_wrong_weights_do_not_give_back_trls_advantage():
    """The check above can fail: with weights 1, 1 (brevity counted twice as much) one group's
    advantages move by about 1e-2, a hundred times its tolerance."""
    rows = read(STANDARD, (1.0, 1.0))
    errors = [abs(a - r["source_advantage"]) for r, a in zip(rows, trl_advantages(rows), strict=True)]
    assert max(errors) > 5e-3


def test_runs_imported_together_keep_their_ids_apart():
    """Both runs have completions_00001.parquet: ids carry the path under the shared folder."""
    rows = read(STANDARD + CHAT, WEIGHTS)
    traj_ids = [r["traj_id"] for r in rows]
    assert len(set(traj_ids)) == len(traj_ids) == 24
    assert traj_ids[0] == "standard/completions_00001/row0"
    assert traj_ids[12] == "conversational/completions_00001/row0"
    assert len({r["group_id"] for r in rows}) == 8


def test_read_streams_row_by_row():
    rows = trl.read(STANDARD, ImportOptions(reward_weights=WEIGHTS))
    assert next(rows)["traj_id"] == "completions_00001/row0"


def test_a_log_extra_column_needs_reward_weights_when_it_is_not_a_number():
    with pytest.raises(GacaError) as err:
        read(STANDARD)
    message = str(err.value)
    assert message.startswith(f"{STANDARD[0]}: row 0: field 'verdict': must be a number (reward function 3 of 3)")
    assert "give --reward-weights" in message


def test_more_weights_than_reward_columns_is_an_error():
    with pytest.raises(GacaError, match=r"--reward-weights gives 3 weights but the table has 2 column\(s\)"):
        read(CHAT, (1.0, 1.0, 1.0))


def _standard_table() -> pa.Table:
    return pq.read_table(STANDARD[1])


def _replace(table: pa.Table, name: str, values: list) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, pa.array(values))


BAD = [
    ("no prompt column", lambda t: t.drop_columns(["prompt"]), "row 0: field 'prompt': missing"),
    ("no advantage column", lambda t: t.drop_columns(["advantage"]), "row 0: field 'advantage': missing"),
    (
        "a text reward column",
        lambda t: _replace(t, "has_e", ["0.0", "1.0", "x", "0", "0", "0"]),
        "row 0: field 'has_e': must be a number (reward function 1 of 2), got \"0.0\"",
    ),
    (
        "a step that is not an integer",
        lambda t: _replace(t, "step", ["two"] * 6),
        "row 0: field 'step': must be an integer, got \"two\"",
    ),
    (
        "an unscorable completion",
        lambda t: _replace(_replace(t, "has_e", [0.0, None, 0, 0, 0, 0]), "brevity", [0.0, None, 0, 0, 0, 0]),
        "row 1: every reward function returned None (has_e, brevity all empty)",
    ),
    (
        "a chat completion without an assistant turn",
        lambda t: _replace(
            _replace(t, "prompt", [[{"role": "user", "content": "hi"}]] * 6),
            "completion",
            [[{"role": "tool", "content": "x"}]] * 6,
        ),
        "row 0: field 'completion': has no assistant message",
    ),
    (
        "a chat prompt with a plain-text completion",
        lambda t: _replace(t, "prompt", [[{"role": "user", "content": "hi"}]] * 6),
        "row 0: field 'completion': must be a list of chat messages ({'role': ..., 'content': ...}) when the prompt is one",
    ),
    (
        "a prompt that is neither",
        lambda t: _replace(t, "prompt", [7] * 6),
        "row 0: field 'prompt': must be a string or a list of chat messages",
    ),
]


@pytest.mark.parametrize("change, message", [(c, m) for _, c, m in BAD], ids=[name for name, _, _ in BAD])
def test_a_bad_table_names_file_row_and_field(tmp_path, change, message):
    path = write_like(tmp_path / "completions_00002.parquet", change(_standard_table()))
    with pytest.raises(GacaError) as err:
        read([path], WEIGHTS)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_a_table_without_reward_columns_is_an_error(tmp_path):
    path = write_like(
        tmp_path / "completions_00002.parquet", _standard_table().drop_columns([*REWARD_COLUMNS, "verdict"])
    )
    with pytest.raises(GacaError, match="no reward function column between 'completion' and 'advantage'"):
        read([path])


def test_a_file_that_is_not_parquet_is_an_error(tmp_path):
    path = tmp_path / "completions_00001.parquet"
    path.write_text("step,prompt\n1,hi\n")
    with pytest.raises(GacaError, match="not a readable Parquet file"):
        read([path])


def test_log_extra_columns_named_like_gaca_columns_are_kept_apart(tmp_path):
    table = _standard_table().drop_columns(["verdict"])
    at = table.column_names.index("advantage")
    for name, values in [("reward", [9.0] * 6), ("reward_has_e", ["x"] * 6), ("trace", [[1, 2]] * 6)]:
        table = table.add_column(at, name, pa.array(values))
    path = write_like(tmp_path / "completions_00002.parquet", table)
    row = read([path], WEIGHTS)[0]
    rec = table.to_pylist()[0]
    assert row["reward"] == pytest.approx(weighted(rec, WEIGHTS))
    assert row["source_reward"] == 9.0 and row["source_reward_has_e"] == "x"
    assert row["reward_has_e"] == rec["has_e"]
    assert row["extra"] == {"trace": [1, 2]}


def test_a_log_extra_column_beside_the_name_another_is_kept_under_is_refused(tmp_path):
    """`extra` is kept as source_extra: a log_extra column source_extra too would be lost."""
    table = _standard_table().drop_columns(["verdict"])
    at = table.column_names.index("advantage")
    for name, values in [("extra", [1] * 6), ("source_extra", [2] * 6)]:
        table = table.add_column(at, name, pa.array(values))
    path = write_like(tmp_path / "completions_00002.parquet", table)
    with pytest.raises(GacaError) as err:
        read([path], WEIGHTS)
    assert str(err.value).startswith(f"{path}: row 0: field 'extra': is kept as 'source_extra'")


def test_a_tool_calling_chat_is_one_step_per_assistant_turn(tmp_path):
    """With `tools=`, TRL's completion is the assistant's turns interleaved with the tool results
    (GRPOTrainer._tool_call_loop), written by pandas as one list<struct> whose absent keys are
    null. A random-weight model makes no tool calls, so this table is written here in that layout."""
    call = [{"type": "function", "function": {"name": "look", "arguments": {"at": "table"}}}]
    prompt = [{"role": "user", "content": "Find the key.", "name": None, "tool_calls": None}]
    completion = [
        {"role": "assistant", "content": "", "name": None, "tool_calls": call},
        {"role": "tool", "content": "A key is on the table.", "name": "look", "tool_calls": None},
        {"role": "assistant", "content": "take key", "name": None, "tool_calls": None},
    ]
    table = pa.table(
        {
            "step": [3, 3],
            "prompt": [prompt, prompt],
            "completion": [completion, completion[:1]],
            "solved": [1.0, 0.0],
            "advantage": [0.7, -0.7],
        }
    )
    path = write_like(tmp_path / "completions_00003.parquet", table)
    rows = read([path])
    first, second, alone = rows
    task = [{"role": "user", "content": "Find the key."}]
    assert (first["traj_id"], first["step_idx"], second["step_idx"]) == ("completions_00003/row0", 0, 1)
    assert first["messages"] == task and first["action"] == json.dumps(call, sort_keys=True)
    assert second["messages"] == [
        *task,
        {"role": "assistant", "content": first["action"]},
        {"role": "tool", "content": "A key is on the table."},
    ]
    assert second["action"] == "take key"
    assert (first["reward"], first["done"], second["reward"], second["done"]) == (0.0, False, 1.0, True)
    assert second["extra"] == {"completion": completion} and "extra" not in first  # the tool's name
    assert "extra" not in alone  # one assistant turn: its text and tool calls are all it holds
    assert (alone["step_idx"], alone["done"], alone["reward"]) == (0, True, 0.0)
    assert first["group_id"] == second["group_id"] == alone["group_id"]


# --- the command, end to end ------------------------------------------------------------------


def test_gaca_import_from_trl_end_to_end(tmp_path):
    out = tmp_path / "trl.parquet"
    summary = import_json("trl", DATA / "standard", out=out, more=("--reward-weights", "1,0.5"))
    assert summary["rows"] == 12 and summary["trajectories"] == 12 and summary["groups"] == 4
    assert summary["mapped"]["reward"].startswith("Σ_i w_i·r_i")
    assert {"group_id", "traj_id", "step_idx", "done"} <= set(summary["derived"])
    assert {"step", "reward_has_e", "reward_brevity", "source_advantage", "verdict"} <= set(summary["kept"])
    assert any(note.startswith("no anchor column") for note in summary["missing"])
    assert gaca("validate", out, "--for", "score").exit_code == 0
    assert gaca("validate", out, "--for", "advantages:grpo").exit_code == 0

    log = pq.read_table(out).to_pylist()
    records = [dict(r, file=p.stem, row=i) for p in STANDARD for i, r in enumerate(pq.read_table(p).to_pylist())]
    by_traj = {row["traj_id"]: row for row in log}
    for rec in records:
        row = by_traj[f"{rec['file']}/row{rec['row']}"]
        assert row["prompt"] == rec["prompt"] and row["action"] == rec["completion"]
        assert row["reward"] == pytest.approx(weighted(rec, WEIGHTS), abs=1e-12)
        assert row["source_advantage"] == rec["advantage"] and row["reward_brevity"] == rec["brevity"]
        assert row["verdict"] == rec["verdict"] and row["step"] == rec["step"]

    adv = tmp_path / "adv.parquet"
    res = gaca("advantages", out, "--method", "grpo", "-o", adv)
    assert res.exit_code == 0, res.output
    # gaca's grpo gives back the advantage TRL trained on, but for TRL's 1e-4 added to the std
    # (1% of the smallest std here, 0.0125) and float32
    for row in pq.read_table(adv).to_pylist():
        assert row["advantage"] == pytest.approx(row["source_advantage"], rel=1e-2, abs=1e-3)


def test_gaca_import_from_trl_chat_tables(tmp_path):
    out = tmp_path / "chat.parquet"
    summary = import_json("trl", *CHAT, out=out)
    assert summary["rows"] == 12 and summary["groups"] == 4
    assert "messages" in summary["mapped"] and "prompt" not in summary["mapped"]
    assert gaca("validate", out, "--for", "score").exit_code == 0
    log = pq.read_table(out)
    assert log.schema.field("messages").type.value_type.names == ["role", "content"]


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "row 0: field 'verdict': must be a number (reward function 3 of 3)"),
        (("--reward-weights", "1,1,1,1"), "--reward-weights gives 4 weights but the table has 3 column(s)"),
    ],
)
def test_gaca_import_from_trl_bad_input_writes_nothing(tmp_path, args, message):
    src = tmp_path / "completions"
    shutil.copytree(DATA / "standard", src)
    out = tmp_path / "out.parquet"
    res = gaca("import", "--from", "trl", src, "-o", out, *args)
    line = error_line(res)
    assert f"completions_00001.parquet: {message}" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["completions"]


@pytest.mark.parametrize("weights", ["nan,1", "1,inf", "-inf,0.5", "1,1e999"])
def test_reward_weights_that_are_not_finite_are_a_usage_error(tmp_path, weights):
    """Refused up front, naming the flag (exit 2), not later as a non-finite `reward`."""
    out = tmp_path / "out.parquet"
    for command in (
        ("import", "--from", "trl", DATA / "standard", "-o", out),
        ("validate", "--from", "trl", DATA / "standard"),
    ):
        res = gaca(*command, "--reward-weights", weights)
        assert res.exit_code == 2, res.output
        message = " ".join(res.stderr.split())
        assert "'--reward-weights'" in message and "is not a finite number" in message, message
        assert "column 'reward'" not in message
    assert not out.exists()


def test_gaca_import_from_trl_missing_prompt_column(tmp_path):
    path = write_like(tmp_path / "completions_00002.parquet", _standard_table().drop_columns(["prompt"]))
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "trl", path, "-o", out, "--reward-weights", "1,0.5"))
    assert line == f"Error: {path}: row 0: field 'prompt': missing: not a TRL completions table (log_completions=True)"
    assert not out.exists()


def test_gaca_validate_from_trl_writes_nothing(tmp_path):
    src = tmp_path / "completions"
    shutil.copytree(DATA / "conversational", src)
    res = gaca("validate", "--from", "trl", src)
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in src.iterdir()) == ["completions_00001.parquet", "completions_00002.parquet"]


@pytest.mark.parametrize(("folder", "weights"), [("standard", WEIGHTS), ("conversational", None)])
def test_the_tables_of_trl_0_29_read_without_reward_weights(folder, weights):
    """TRL 0.28 and 0.29 write the table without log_extra columns (tests/data/trl/0.29/, written
    by TRL 0.29.1's own `GRPOTrainer.log`, make_fixture.py): every column between completion and
    advantage is a reward function's, and the import needs no --reward-weights to say so."""
    for path in sorted((DATA / "0.29" / folder).glob("*.parquet")):
        table = pq.read_table(path)
        assert table.column_names == ["step", "prompt", "completion", "has_e", "brevity", "advantage"]
        records = table.to_pylist()
        rows = read([path])
        last = [r for r in rows if r["done"]]
        assert len(last) == len(records) == 6
        for row, rec in zip(last, records, strict=True):
            assert row["step"] == rec["step"] and row["source_advantage"] == rec["advantage"]
            assert row["reward_has_e"] == rec["has_e"] and row["reward_brevity"] == rec["brevity"]
            assert row["reward"] == pytest.approx(weighted(rec, (1.0, 1.0)), abs=1e-12)
        if weights is not None:  # the run's own weights give TRL's aggregate
            assert [r["reward"] for r in read([path], weights) if r["done"]] == pytest.approx(
                [weighted(rec, weights) for rec in records], abs=1e-12
            )
