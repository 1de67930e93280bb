"""`--from art`: the rows read from files openpipe-art 0.5.18 wrote (tests/data/art/), checked
value by value against the files read here with pyarrow and json, and the command end to end;
the files older releases wrote (tests/data/art/versions/<release>/: JSONL from 0.4, YAML before)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import art
from gaca_cli.integrations.imports.base import ImportOptions
from tests.integrations.test_import_lossless import Output, leaves

DATA = Path(__file__).resolve().parents[1] / "data" / "art"
TRAIN = DATA / "trajectories" / "train" / "0000.parquet"
VAL = DATA / "trajectories" / "val" / "0001.parquet"
LEGACY = DATA / "legacy" / "trajectories" / "train" / "0000.jsonl"
VERSIONS = DATA / "versions"
#: the releases that wrote YAML (`trajectories/<split>/<step>.yaml`), and those that wrote JSONL
YAML_RELEASES = ["0.1.25", "0.2.0", "0.3.13"]
JSONL_RELEASES = ["0.4.12"]
#: the gaca columns two writers given the same groups agree on
COLUMNS = ("step_idx", "reward", "episode_reward", "done", "messages", "action", "trainable", "group_index")
runner = CliRunner()


def read(*files: Path) -> list[dict]:
    return list(art.read(list(files), ImportOptions()))


def expected_action(content: str | None, tool_calls: list | None) -> str:
    """An assistant turn as gaca's action: its text, then its tool calls as sorted JSON."""
    text = content or ""
    if tool_calls:
        calls = json.dumps(tool_calls, sort_keys=True)
        text = f"{text}\n{calls}" if text else calls
    return text


def expected_steps(messages: list[dict]) -> list[tuple[list[dict], str, bool]]:
    """(context, action, trainable) per assistant turn, from ART's flattened messages."""
    steps, context = [], []
    for m in messages:
        calls = json.loads(m["tool_calls"]) if m["tool_calls"] else None
        if m["role"] == "assistant":
            action = expected_action(m["content"], calls)
            steps.append((list(context), action, m["trainable"]))
            context.append({"role": "assistant", "content": action})
        else:
            context.append({"role": m["role"], "content": m["content"] or ""})
    return steps


def test_every_value_of_the_parquet_files():
    for path in (TRAIN, VAL):
        records = pq.read_table(path).to_pylist()
        rows = read(path)
        by_traj: dict[str, list[dict]] = {}
        for row in rows:
            by_traj.setdefault(row["traj_id"], []).append(row)
        assert len(by_traj) == len(records)
        seen_in_group: dict[int, int] = {}
        for record in records:
            g = record["group_index"]
            k = seen_in_group.get(g, 0)
            seen_in_group[g] = k + 1
            steps = by_traj[f"{path}:g{g}/t{k}"]
            want = expected_steps(record["messages"])
            assert [s["step_idx"] for s in steps] == list(range(len(want)))
            for i, (row, (context, action, trainable)) in enumerate(zip(steps, want)):
                last = i == len(want) - 1
                assert row["group_id"] == f"{path}:g{g}"
                assert row["messages"] == context
                assert row["action"] == action
                assert row["trainable"] is trainable
                assert row["reward"] == (record["reward"] if last else 0.0)
                assert row["episode_reward"] == record["reward"]
                assert row["done"] is last
                assert row["group_index"] == g
                assert row["split"] == path.parent.name
                assert row["training_step"] == int(path.stem)
                extra = row.get("extra", {})
                for key in ("metrics", "metadata", "tools", "group_metadata", "group_metrics"):
                    assert extra.get(key) == (json.loads(record[key]) if record[key] else None)
                for key in ("logs", "group_logs"):
                    assert extra.get(key) == (record[key] or None)
                ids = [m["tool_call_id"] for m in record["messages"][: len(context)] if m["tool_call_id"]]
                assert extra.get("tool_call_ids") == (ids or None)


def test_the_fixture_has_what_the_tests_rely_on():
    """Tool calls, a tool result, a hand-written (non-trainable) assistant turn, group fields."""
    rows = read(TRAIN)
    assert len(rows) == 11
    assert {r["traj_id"] for r in rows} == {f"{TRAIN}:g0/t0", f"{TRAIN}:g0/t1", f"{TRAIN}:g1/t0", f"{TRAIN}:g1/t1"}
    assert (
        rows[0]["action"] == '[{"function": {"arguments": "{}", "name": "look"}, "id": "call_0", "type": "function"}]'
    )
    assert rows[1]["messages"][-1] == {"role": "tool", "content": "A hall. A key lies on the floor."}
    assert rows[1]["extra"]["tool_call_ids"] == ["call_0"]
    few_shot = [r for r in rows if r["traj_id"] == f"{TRAIN}:g1/t0"]
    assert [r["trainable"] for r in few_shot] == [False, True]
    assert [r["action"] for r in few_shot] == ["wait", "go north"]
    assert rows[0]["extra"]["group_metadata"] == {"task_id": "door-1"}
    assert rows[0]["extra"]["group_logs"] == ["group door-1 done"]


def test_the_legacy_jsonl_reads_as_the_parquet_file_of_the_same_groups():
    """`serialize_trajectory_groups` (ART before 0.5) and `write_trajectory_groups_parquet` were
    given the same groups: the rows agree on every gaca column (ids aside, which name the file)."""
    old, new = read(LEGACY), read(TRAIN)
    assert len(old) == len(new)
    for a, b in zip(old, new):
        assert {c: a[c] for c in COLUMNS} == {c: b[c] for c in COLUMNS}
        assert a["traj_id"].removeprefix(str(LEGACY)) == b["traj_id"].removeprefix(str(TRAIN))
        for key in ("metrics", "metadata", "tools", "logs", "tool_call_ids"):
            assert a.get("extra", {}).get(key) == b.get("extra", {}).get(key)


def test_every_value_of_the_legacy_jsonl():
    lines = [json.loads(line) for line in LEGACY.read_text().splitlines() if line.strip()]
    rows = read(LEGACY)
    for g, group in enumerate(lines):
        for k, trajectory in enumerate(group["trajectories"]):
            steps = [r for r in rows if r["traj_id"] == f"{LEGACY}:g{g}/t{k}"]
            turns = [m for m in trajectory["messages_and_choices"] if "message" in m or m["role"] == "assistant"]
            assert len(steps) == len(turns)
            for row, turn in zip(steps, turns):
                message = turn.get("message", turn)
                assert row["action"] == expected_action(message["content"], message.get("tool_calls"))
                assert row["trainable"] is ("message" in turn)
                assert row.get("finish_reason") == turn.get("finish_reason")
                assert row["episode_reward"] == trajectory["reward"]
                assert row["extra"]["metrics"] == trajectory["metrics"]
            assert steps[-1]["reward"] == trajectory["reward"] and steps[-1]["done"]


def test_the_release_fixtures_are_all_there():
    """Every release line's fixture: 0.4 wrote JSON lines, 0.1 to 0.3 YAML, for train and val."""
    for release in [*YAML_RELEASES, *JSONL_RELEASES]:
        ext = "yaml" if release in YAML_RELEASES else "jsonl"
        files = sorted(str(p.relative_to(VERSIONS / release)) for p in (VERSIONS / release).rglob("*.*"))
        assert files == [f"trajectories/train/0000.{ext}", f"trajectories/val/0000.{ext}"], release
    assert sorted(p.name for p in VERSIONS.iterdir()) == sorted([*YAML_RELEASES, *JSONL_RELEASES])


@pytest.mark.parametrize("release", JSONL_RELEASES)
def test_a_jsonl_release_reads_as_the_05_jsonl_of_the_same_groups(release):
    """0.4's `Model.log` wrote the groups of make_fixture.py as JSON lines: the same rows as the
    JSONL 0.5.18's `serialize_trajectory_groups` wrote (ids aside), and every value there."""
    path = VERSIONS / release / "trajectories" / "train" / "0000.jsonl"
    rows, legacy = read(path), read(LEGACY)
    assert len(rows) == len(legacy) == 11
    for a, b in zip(rows, legacy):
        assert {c: a.get(c) for c in (*COLUMNS, "finish_reason")} == {c: b.get(c) for c in (*COLUMNS, "finish_reason")}
        assert a["split"] == "train" and a["training_step"] == 0
        for key in ("metadata", "tools", "logs", "tool_call_ids"):
            assert a.get("extra", {}).get(key) == b.get("extra", {}).get(key)
    val = read(VERSIONS / release / "trajectories" / "val" / "0000.jsonl")
    assert [(r["split"], r["episode_reward"]) for r in val] == [("val", -0.5)] * 2


@pytest.mark.parametrize("release", YAML_RELEASES)
def test_a_yaml_release_is_refused_with_what_to_do_and_reads_once_converted(tmp_path, release):
    """Before 0.4, `Model.log` wrote YAML: one `Error:` line names the file and the command that
    converts it; run as printed, the converted run imports, every value of the YAML in the log."""
    import yaml

    trajectories = tmp_path / "trajectories"
    shutil.copytree(VERSIONS / release / "trajectories", trajectories)
    out = tmp_path / "log.parquet"
    for source in sorted(trajectories.rglob("*.yaml")):
        res = runner.invoke(app, ["import", "--from", "art", str(trajectories), "-o", str(out)])
        assert res.exit_code == 1 and not out.exists()
        (error,) = [line for line in res.output.splitlines() if line.startswith("Error:")]
        assert error.startswith(f"Error: {source}: a YAML trajectory file (openpipe-art before 0.4)")
        command = re.search(r": (python -c .*) > (\S+), then import again", error)
        assert command and command[2] == str(source.with_suffix(".jsonl")), error
        args = shlex.split(command[1])
        assert args[-1] == str(source)
        with open(command[2], "w") as converted:
            subprocess.run([sys.executable, *args[1:]], stdout=converted, check=True)
    res = runner.invoke(app, ["import", "--from", "art", str(trajectories), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"] == 13
    rows = pq.read_table(out).to_pylist()
    output = Output(rows)
    for source in trajectories.rglob("*.yaml"):
        groups = yaml.safe_load(source.read_text())
        assert not [leaf for leaf in leaves(groups) if not output.holds(leaf)]
    train = [r for r in rows if r["split"] == "train"]
    for a, b in zip(train, read(LEGACY)):
        assert {c: a[c] for c in COLUMNS} == {c: b[c] for c in COLUMNS}
    assert json.loads(train[0]["extra"])["group_fields"] == {"metadata": {"task_id": "door-1"}}


def test_a_yaml_file_outside_arts_layout_is_passed_over(tmp_path):
    """A model directory's other YAML (a checkpoint's info.yaml) is not a trajectory file."""
    (tmp_path / "checkpoints" / "0001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "0001" / "info.yaml").write_text("step: 1\n")
    shutil.copy(LEGACY, tmp_path / "0000.jsonl")
    assert len(read(*sorted(tmp_path.rglob("*.*")))) == 11


def test_history_jsonl_beside_the_trajectories_is_passed_over(tmp_path):
    (tmp_path / "history.jsonl").write_text('{"train/reward": 0.5, "step": 0}\n')
    assert read(tmp_path / "history.jsonl") == []


def test_a_file_outside_arts_layout_has_no_split(tmp_path):
    copy = tmp_path / "batch.parquet"
    shutil.copy(TRAIN, copy)
    rows = read(copy)
    assert "split" not in rows[0] and "training_step" not in rows[0]
    assert rows[0]["group_id"] == f"{copy}:g0"


def test_other_columns_and_message_fields_are_kept(tmp_path):
    """Nothing the file holds is dropped: a column ART does not write (a scalar as its own
    column, one named like a column of the log as source_<name>, a nested one in `extra`), and a
    message's other fields (an OpenAI `name`), on the turn's step or in the later context."""
    table = pq.read_table(TRAIN)
    n = table.num_rows
    table = table.append_column("judge_note", pa.array([f"note {i}" for i in range(n)]))
    table = table.append_column("traj_id", pa.array(["mine"] * n))
    table = table.append_column("scores", pa.array([[1, 2]] * n))
    path = tmp_path / "trajectories" / "train" / "0000.parquet"  # ART's layout: the same split and step
    path.parent.mkdir(parents=True)
    pq.write_table(table, path)
    plain = read(TRAIN)
    rows = read(path)
    assert len(rows) == len(plain)
    for row, before in zip(rows, plain):
        assert row["traj_id"] == before["traj_id"].replace(str(TRAIN), str(path)) and row["source_traj_id"] == "mine"
        assert row["extra"] == {**before.get("extra", {}), "scores": [1, 2]}
        assert {k: v for k, v in row.items() if k in before and k not in ("group_id", "traj_id", "extra")} == {
            k: v for k, v in before.items() if k not in ("group_id", "traj_id", "extra")
        }
    assert {r["judge_note"] for r in rows} == {f"note {i}" for i in range(n)}
    lines = [json.loads(line) for line in LEGACY.read_text().splitlines()]
    chat = lines[0]["trajectories"][0]["messages_and_choices"]
    chat[1]["name"] = "player"  # the task message: context of every step
    chat[2]["message"]["refusal"] = "no"  # a Choice: its step
    legacy = tmp_path / "0000.jsonl"
    legacy.write_text("".join(json.dumps(line) + "\n" for line in lines))
    steps = [r for r in read(legacy) if r["traj_id"] == f"{legacy}:g0/t0"]
    assert steps[0]["extra"]["message_fields"] == {"refusal": "no"}
    assert steps[0]["extra"]["context_message_fields"] == {"1": {"name": "player"}}
    for later in steps[1:]:  # the first turn is in their context now
        assert later["extra"]["context_message_fields"] == {"1": {"name": "player"}, "2": {"refusal": "no"}}
        assert "message_fields" not in later["extra"]


def _bad_parquet(tmp_path: Path, column: str, values: list) -> Path:
    table = pq.read_table(TRAIN)
    index = table.schema.get_field_index(column)
    table = table.set_column(index, column, pa.array(values, type=table.schema.field(column).type))
    path = tmp_path / "0000.parquet"
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(
    ("column", "change", "message"),
    [
        ("reward", lambda v: [v[0], None, *v[2:]], "row 1: field 'reward': missing"),
        ("metrics", lambda v: [v[0], v[1], "{not json", *v[3:]], "row 2: field 'metrics': not valid JSON"),
        ("group_index", lambda v: [None, *v[1:]], "row 0: field 'group_index': must be an integer"),
    ],
)
def test_a_bad_parquet_row_names_file_row_and_field(tmp_path, column, change, message):
    values = pq.read_table(TRAIN).column(column).to_pylist()
    path = _bad_parquet(tmp_path, column, change(values))
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_a_trajectory_without_an_assistant_turn_is_an_error(tmp_path):
    table = pq.read_table(TRAIN)
    messages = table.column("messages").to_pylist()
    messages[3] = [m for m in messages[3] if m["role"] != "assistant"]
    path = _bad_parquet(tmp_path, "messages", messages)
    with pytest.raises(GacaError, match=r"row 3: field 'messages': has no assistant turn"):
        read(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('{"groups": []}', "line 2: field 'trajectories': missing"),
        ('{"trajectories": [{"messages_and_choices": []}]}', "line 2, trajectory 0: field 'reward': missing"),
        (
            '{"trajectories": [{"reward": "high", "messages_and_choices": []}]}',
            "line 2, trajectory 0: field 'reward': must be a number",
        ),
        (
            '{"trajectories": [{"reward": 1, "messages_and_choices": {}}]}',
            "line 2, trajectory 0: field 'messages_and_choices': must be a list",
        ),
        (
            '{"trajectories": [{"reward": 1, "messages_and_choices": [{"role": "user", "content": "hi"}]}]}',
            "line 2, trajectory 0: field 'messages_and_choices': has no assistant turn",
        ),
    ],
)
def test_a_bad_jsonl_line_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "0000.jsonl"
    path.write_text(LEGACY.read_text().splitlines()[0] + "\n" + line + "\n")
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: {message}")


# --- the command end to end -------------------------------------------------------------


def test_gaca_import_from_art_end_to_end(tmp_path):
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "art", str(DATA / "trajectories"), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["rows"] == 13 and summary["trajectories"] == 5 and summary["groups"] == 3
    assert any("anchor" in line for line in summary["missing"])
    table = pq.read_table(out)
    got = table.to_pylist()
    want = read(TRAIN, VAL)
    assert len(got) == len(want)
    for a, b in zip(
        sorted(got, key=lambda r: (r["traj_id"], r["step_idx"])),
        sorted(want, key=lambda r: (r["traj_id"], r["step_idx"])),
    ):
        for key in ("group_id", "traj_id", "step_idx", "reward", "episode_reward", "done", "messages", "action"):
            assert a[key] == b[key]
        assert json.loads(a["extra"]) == b.get("extra")
    check = runner.invoke(app, ["validate", str(out)])
    assert check.exit_code == 0, check.output


def test_gaca_import_from_art_bad_input_writes_nothing(tmp_path):
    bad = tmp_path / "0000.jsonl"
    bad.write_text('{"trajectories": [{"reward": "x", "messages_and_choices": []}]}\n')
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "art", str(bad), "-o", str(out)])
    assert res.exit_code == 1
    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {bad}: line 1, trajectory 0: field 'reward': must be a number, got \"x\""]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]


def test_gaca_import_from_art_model_directory(tmp_path):
    """The model's directory as ART lays it out: history.jsonl (metrics) and state.json beside
    trajectories/ are not trajectory files; the Parquet files are read."""
    model = tmp_path / "models" / "agent-001"
    shutil.copytree(DATA / "trajectories", model / "trajectories")
    (model / "history.jsonl").write_text('{"train/reward": 0.5, "training_step": 0, "step": 0}\n')
    (model / "state.json").write_text("{}")
    out = tmp_path / "log.parquet"
    res = runner.invoke(app, ["import", "--from", "art", str(model), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"] == 13
    assert set(pq.read_table(out).column("split").to_pylist()) == {"train", "val"}
