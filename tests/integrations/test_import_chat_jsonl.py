"""`gaca import --from chat-jsonl`: whole chats split into steps, step records, --map, the
fields kept, and bad records (one Error line naming file, line and field; nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import chat_jsonl
from gaca_cli.integrations.imports.base import ImportOptions
from tests.integrations.cli_helpers import error_line, gaca, import_json

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "You are in a kitchen. Find the apple."}


def chat(*turns: str) -> list[dict]:
    """system, task, then assistant / user turns alternating (assistant first)."""
    messages = [SYSTEM, TASK]
    for i, text in enumerate(turns):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": text})
    return messages


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


TRAJECTORIES = [
    {
        "group_id": "g1",
        "traj_id": "r0",
        "messages": chat("go north", "You see an apple.", "take apple"),
        "reward": 1.0,
        "anchor_obs": ["kitchen", "hall, apple"],
        "seed": 3,
        "env": {"name": "house"},
        "advantage": 0.5,
    },
    {
        "group_id": "g1",
        "traj_id": "r1",
        "messages": chat("go south", "A cellar.", [{"type": "text", "text": "give "}, {"type": "text", "text": "up"}]),
        "rewards": [0.25, -0.5],
        "anchor_obs": ["kitchen", "cellar"],
        "seed": 4,
    },
]


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_trajectory_records_become_one_step_per_assistant_turn(tmp_path):
    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    summary = import_json("chat-jsonl", src, out=tmp_path / "out.parquet")
    rows = rows_of(tmp_path / "out.parquet")
    assert [(r["traj_id"], r["step_idx"]) for r in rows] == [("r0", 0), ("r0", 1), ("r1", 0), ("r1", 1)]
    r0, r1 = rows[0], rows[1]
    assert r0["messages"] == [SYSTEM, TASK] and r0["action"] == "go north"
    # the second step's context is the first's plus its action and the observation after it
    assert r1["messages"] == [
        SYSTEM,
        TASK,
        {"role": "assistant", "content": "go north"},
        chat("", "You see an apple.")[3],
    ]
    assert r1["action"] == "take apple"
    assert [r["reward"] for r in rows] == [0.0, 1.0, 0.25, -0.5]  # outcome on the last turn; per-turn rewards
    assert [r["episode_reward"] for r in rows] == [1.0, 1.0, -0.25, -0.25]
    assert [r["done"] for r in rows] == [False, True, False, True]
    assert [r["anchor_obs"] for r in rows] == ["kitchen", "hall, apple", "kitchen", "cellar"]
    assert rows[3]["action"] == "give up"  # content parts joined
    assert [r["group_id"] for r in rows] == ["g1"] * 4
    # nothing dropped: scalars as columns, nested in extra, gaca's own names as source_<name>
    assert [r["seed"] for r in rows] == [3, 3, 4, 4]
    assert json.loads(rows[0]["extra"]) == {"env": {"name": "house"}} and rows[2]["extra"] is None
    assert [r["source_advantage"] for r in rows] == [0.5, 0.5, None, None]
    assert summary["rows"] == 4 and summary["trajectories"] == 2 and summary["groups"] == 1
    assert set(summary["kept"]) == {"seed", "source_advantage", "extra"}
    assert summary["renamed"] == {"advantage": "source_advantage"}
    assert any("behavior_logprobs" in note for note in summary["missing"])
    assert not any("anchor" in note for note in summary["missing"])
    # the file passes every check of the command it is meant for
    assert gaca("validate", tmp_path / "out.parquet", "--for", "advantages:gigpo").exit_code == 0


def test_missing_ids_are_derived_and_reported(tmp_path):
    records = [{"messages": chat("a"), "reward": 1}, {"messages": chat("b"), "reward": 0}]
    other = {"messages": [SYSTEM, {"role": "user", "content": "Another task."}, {"role": "assistant", "content": "c"}]}
    src = write_jsonl(tmp_path / "chats.jsonl", [*records, {**other, "reward": 0}])
    summary = import_json("chat-jsonl", src, out=tmp_path / "out.parquet")
    rows = rows_of(tmp_path / "out.parquet")
    assert [r["traj_id"] for r in rows] == [f"{src}:1", f"{src}:2", f"{src}:3"]
    assert rows[0]["group_id"] == rows[1]["group_id"] != rows[2]["group_id"]  # the same task, one group
    assert "group_id" in summary["mapped"] and "hash" in summary["mapped"]["group_id"]
    assert any("anchor" in note for note in summary["missing"])


def test_step_records_and_field_map(tmp_path):
    steps = [
        {"uid": "g", "run": "t0", "conversation": [TASK], "act": "go north", "score": 0, "obs": "kitchen"},
        {"uid": "g", "run": "t0", "conversation": [TASK], "act": "take apple", "score": 1, "obs": "hall", "done": True},
        {"uid": "g", "run": "t1", "conversation": [TASK], "act": "wait", "score": 0.5, "obs": "kitchen"},
    ]
    src = write_jsonl(tmp_path / "steps.jsonl", steps)
    maps = ["group_id=uid", "traj_id=run", "messages=conversation", "action=act", "reward=score", "anchor_obs=obs"]
    more = tuple(x for m in maps for x in ("--map", m))
    summary = import_json("chat-jsonl", src, out=tmp_path / "out.parquet", more=more)
    for m in maps:  # the summary names the fields --map read
        field, source = m.split("=")
        assert summary["mapped"][field] == f"{source} (--map {m})"
    assert "done" in summary["mapped"] and "done" not in summary["derived"]  # listed once
    rows = rows_of(tmp_path / "out.parquet")
    assert [(r["traj_id"], r["step_idx"], r["action"], r["reward"]) for r in rows] == [
        ("t0", 0, "go north", 0.0),
        ("t0", 1, "take apple", 1.0),
        ("t1", 0, "wait", 0.5),
    ]
    assert rows[0]["messages"] == [TASK] and "prompt" not in rows[0]
    assert [r["anchor_obs"] for r in rows] == ["kitchen", "hall", "kitchen"] and rows[1]["done"] is True
    # prompt strings instead of chats
    prompts = [{"traj_id": "p", "group_id": "g", "prompt": f"> {i}", "action": "look", "reward": 0} for i in range(2)]
    import_json("chat-jsonl", write_jsonl(tmp_path / "p.jsonl", prompts), out=tmp_path / "p.parquet")
    rows = rows_of(tmp_path / "p.parquet")
    assert [(r["step_idx"], r["prompt"]) for r in rows] == [(0, "> 0"), (1, "> 1")] and "messages" not in rows[0]
    # a log must use one of the two for every row, as the schema says
    mixed = write_jsonl(tmp_path / "m.jsonl", [prompts[0], {**prompts[1], "prompt": None, "messages": [TASK]}])
    line = error_line(gaca("import", "--from", "chat-jsonl", mixed, "-o", tmp_path / "m.parquet"))
    assert "column 'prompt': must not be null" in line and "(p, 1)" in line


def test_read_streams_records_without_the_cli(tmp_path):
    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    rows = chat_jsonl.read([src], ImportOptions())
    first = next(rows)  # a generator: the first row comes before the file is read to its end
    assert first["traj_id"] == "r0" and first["step_idx"] == 0


BAD = [
    ("not json", "line 1: not valid JSON"),
    ([1, 2], "line 1: expected a JSON object, got list"),
    ({"traj_id": "t"}, "line 1: field 'messages': missing"),
    ({"messages": chat("a"), "reward": "high"}, "line 1: field 'reward': must be a number"),
    ({"messages": chat("a")}, "line 1: field 'reward': missing"),
    ({"messages": chat("a", "o", "b"), "rewards": [1]}, "line 1: field 'rewards': must be a list of 2 numbers"),
    ({"messages": [TASK], "reward": 1}, "line 1: field 'messages': has no assistant turn"),
    ({"messages": "hello", "reward": 1}, "line 1: field 'messages': must be a list of chat messages"),
    ({"messages": chat("a"), "reward": 1, "anchor_obs": "x"}, "line 1: field 'anchor_obs': must be a list of 1"),
    ({"messages": chat("a"), "reward": 1, "traj_id": [1]}, "line 1: field 'traj_id': must be an integer or a string"),
    ({"action": "a", "traj_id": "t", "group_id": "g", "reward": 0}, "line 1: field 'messages': missing"),
    ({"action": "a", "group_id": "g", "reward": 0, "prompt": "p"}, "line 1: field 'traj_id': missing"),
    ({"action": "a", "traj_id": "t", "group_id": "g", "reward": 0, "prompt": "p", "step_idx": 1.5}, "field 'step_idx'"),
    ({"action": None, "traj_id": "t", "group_id": "g", "reward": 0, "prompt": "p"}, "line 1: field 'action': is null"),
    ({"messages": [{"role": None, "content": "x"}, *chat("a")[1:]], "reward": 1}, "field 'messages': must be a list"),
    ({"messages": chat("a"), "reward": 10**400}, "line 1: field 'reward': is an integer of 401 digits, too large"),
    (
        {"messages": chat("a", "o", "b"), "reward": 1.0, "rewards": [0, 0]},
        "line 1: field 'reward': is 1.0, but `rewards` sums to 0.0: give one of the two, or both in agreement",
    ),
    (
        {"messages": chat("a"), "reward": 1, "seed": 2**63 + 5},
        "line 1: field 'seed': the chat-jsonl source gives 9223372036854775813 here, an integer outside the 64-bit",
    ),
]


@pytest.mark.parametrize(("record", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_records_name_file_line_and_field(tmp_path, record, message):
    good = {"messages": chat("fine"), "reward": 1, "traj_id": "ok", "group_id": "g"}
    src = write_jsonl(tmp_path / "bad.jsonl", [record])
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", src, "-o", out))
    assert line.startswith(f"Error: {src}: ") and message in line, line
    assert not out.exists() and not list(tmp_path.glob(".out.parquet*"))
    # the line number is the record's own, after good records
    src2 = write_jsonl(tmp_path / "bad2.jsonl", [good, record])
    line = error_line(gaca("import", "--from", "chat-jsonl", src2, "-o", out))
    assert message.replace("line 1", "line 2") in line and not out.exists()


def test_a_broken_schema_rule_writes_nothing(tmp_path):
    record = {"messages": chat("a"), "reward": 1, "traj_id": "same", "group_id": "g"}
    src = write_jsonl(tmp_path / "dup.jsonl", [record, record])
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", src, "-o", out))
    assert "(as imported)" in line and "(same, 0)" in line
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize("batch_rows", [8192, 1], ids=["one batch", "a batch per row"])
def test_types_that_do_not_agree_across_records_name_file_line_and_field(tmp_path, monkeypatch, batch_rows):
    from gaca_cli.integrations.imports import core

    monkeypatch.setattr(core, "BATCH_ROWS", batch_rows)  # the clash within one batch, or between two
    records = [
        {"messages": chat("a"), "reward": 1, "traj_id": "t0", "seed": 3},
        {"messages": chat("b"), "reward": 1, "traj_id": "t1", "seed": 4},
        {"messages": chat("c"), "reward": 1, "traj_id": "t2", "seed": "three"},
    ]
    src = write_jsonl(tmp_path / "mixed.jsonl", records)
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", src, "-o", out))
    assert line.startswith(f"Error: {src}: line 3: field 'seed': ") and "'three'" in line, line
    assert "one type in every record" in line and not out.exists()


def test_a_source_that_is_not_utf8_names_file_and_line(tmp_path):
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(b"\xff\xfe{}\n")
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", bad, "-o", out))
    assert line == f"Error: {bad}: line 1: not UTF-8 text (byte 0xff at column 1)"
    assert error_line(gaca("validate", "--from", "chat-jsonl", bad)) == line
    # after good lines: the line of the first byte that is not UTF-8
    good = json.dumps({"messages": chat("a"), "reward": 1}).encode()
    later = tmp_path / "later.jsonl"
    later.write_bytes(good + b"\n" + good.replace(b"}]", b', "note": "caf\xe9"}]', 1) + b"\n")
    assert f"{later}: line 2: not UTF-8 text (byte 0xe9" in error_line(
        gaca("import", "--from", "chat-jsonl", later, "-o", out)
    )
    # a Parquet file given to a JSON format
    parquet = tmp_path / "log.parquet"
    pq.write_table(pa.table({"x": [1.5, 2.5]}), parquet)
    line = error_line(gaca("import", "--from", "chat-jsonl", parquet, "-o", out))
    assert line.startswith(f"Error: {parquet}: line 1: not UTF-8 text") and "Parquet" in line, line
    assert not out.exists()


def test_a_field_named_extra_is_kept_as_source_extra(tmp_path):
    records = [
        {"messages": chat("a"), "reward": 1, "traj_id": "t0", "extra": 3, "env": {"k": 1}},
        {"messages": chat("b"), "reward": 1, "traj_id": "t1", "extra": {"nested": True}},
    ]
    src = write_jsonl(tmp_path / "extra.jsonl", records)
    summary = import_json("chat-jsonl", src, out=tmp_path / "out.parquet")
    rows = rows_of(tmp_path / "out.parquet")
    assert [r["source_extra"] for r in rows] == [3, None]  # a scalar `extra`: its own column
    assert json.loads(rows[0]["extra"]) == {"env": {"k": 1}}
    assert json.loads(rows[1]["extra"]) == {"extra": {"nested": True}}  # a nested one: in `extra`, by name
    assert set(summary["kept"]) == {"source_extra", "extra"}


def test_fields_named_like_columns_that_a_record_does_not_read_are_kept(tmp_path):
    """Nothing is dropped: a `prompt` beside `messages`, a `step_idx` in a whole chat, `rewards`
    in a step record are kept (as source_<name> when named like a column of the log); a
    `reward` that agrees with `rewards` is the same outcome; a null `done` is absent."""
    records = [
        {"messages": chat("a", "o", "b"), "rewards": [0.25, 0.5], "reward": 0.75, "traj_id": "t0", "prompt": "P"},
        {"messages": chat("a"), "reward": 1, "traj_id": "t1", "step_idx": 7, "done": None},
        {
            "action": "x",
            "messages": [TASK],
            "prompt": "Q",
            "rewards": [1],
            "traj_id": "t2",
            "group_id": "g",
            "reward": 1,
            "episode_reward": 1,
        },
    ]
    src = write_jsonl(tmp_path / "kept.jsonl", records)
    import_json("chat-jsonl", src, out=tmp_path / "out.parquet")
    rows = rows_of(tmp_path / "out.parquet")
    assert [r["traj_id"] for r in rows] == ["t0", "t0", "t1", "t2"]
    assert [r["reward"] for r in rows] == [0.25, 0.5, 1.0, 1.0] and rows[1]["episode_reward"] == 0.75
    assert [r["source_prompt"] for r in rows] == ["P", "P", None, "Q"]
    assert "prompt" not in rows[0]  # the context is `messages` in every record
    assert [r["source_step_idx"] for r in rows] == [None, None, 7, None] and rows[2]["step_idx"] == 0
    assert rows[2]["done"] is True  # null: the default, the chat's last turn is done
    assert json.loads(rows[3]["extra"]) == {"rewards": [1]}


def test_float32_rewards_agree_with_their_sum_and_null_fields_are_absent(tmp_path):
    """Per-turn rewards logged from float32 (torch .item()) beside their float32 sum agree;
    a null `prompt` beside `messages` (or the reverse) is an absent field, not a column."""
    import numpy as np

    turns = [float(np.float32(x)) for x in (0.1, 0.2, 0.7)]
    records = [
        {"messages": chat("a", "o", "b", "o", "c"), "rewards": turns, "reward": 1.0, "traj_id": "f32"},
        {"action": "x", "messages": [TASK], "prompt": None, "traj_id": "s1", "group_id": "g", "reward": 1},
        {"action": "y", "messages": None, "prompt": "P", "traj_id": "s2", "group_id": "g", "reward": 0},
    ]
    src = write_jsonl(tmp_path / "f.jsonl", records[:1])
    import_json("chat-jsonl", src, out=tmp_path / "f.parquet")
    assert [r["reward"] for r in rows_of(tmp_path / "f.parquet")] == turns
    for record, column in ((records[1], "source_prompt"), (records[2], "source_messages")):
        src = write_jsonl(tmp_path / "s.jsonl", [record])
        summary = import_json("chat-jsonl", src, out=tmp_path / "s.parquet")
        assert column not in pq.read_schema(tmp_path / "s.parquet").names and column not in summary["kept"]


def test_a_lone_surrogate_escape_names_its_field_and_a_pair_is_one_character(tmp_path):
    good = json.dumps({"messages": chat("smile \ud83d\ude00"), "reward": 1, "traj_id": "t0"})
    cut = json.dumps({"messages": chat("a"), "reward": 1, "traj_id": "t1", "note": "cut \ud83d"})
    src = write_jsonl(tmp_path / "s.jsonl", [good, cut])
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", src, "-o", out))
    assert line == (
        f"Error: {src}: line 2: field 'note': not valid Unicode: a lone surrogate \\ud83d "
        "(half of a UTF-16 pair, e.g. a cut emoji)"
    )
    assert not out.exists()
    write_jsonl(src, [good])
    import_json("chat-jsonl", src, out=out)
    assert rows_of(out)[0]["action"] == "smile \U0001f600"


CLASHES = [
    ({"advantage": 0.5, "source_advantage": 7}, "field 'advantage': is kept as 'source_advantage'"),
    ({"extra": 3, "source_extra": 4, "env": {"k": 1}}, "field 'extra': is kept as 'source_extra'"),
]


@pytest.mark.parametrize(("fields", "message"), CLASHES, ids=["advantage", "extra"])
def test_a_field_and_the_name_it_would_be_kept_under_are_refused(tmp_path, fields, message):
    """Both values cannot be kept under their names: one error line, nothing written."""
    good = {"messages": chat("a"), "reward": 1, "traj_id": "t0"}
    src = write_jsonl(tmp_path / "clash.jsonl", [good, {**good, "traj_id": "t1", **fields}])
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "chat-jsonl", src, "-o", out))
    assert line.startswith(f"Error: {src}: line 2: {message}") and "rename one of the two" in line, line
    assert not out.exists()


def test_validate_from_checks_without_writing(tmp_path):
    src = write_jsonl(tmp_path / "chats.jsonl", TRAJECTORIES)
    res = gaca("validate", "--from", "chat-jsonl", src, "--for", "advantages:gigpo", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] and report["rows"] == 4
    assert list(tmp_path.iterdir()) == [src]
    res = gaca("validate", "--from", "chat-jsonl", src, "--for", "advantages:gaca", "--json")
    assert res.exit_code == 1 and "nll_mean" in json.loads(res.stdout)["violations"][0]["column"]
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{"])
    assert "line 1" in error_line(gaca("validate", "--from", "chat-jsonl", bad))


CTRL_C_IN_CLEAN_UP = """
import os, shutil, signal, sys, time

signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C on, as in a terminal
remove = shutil.rmtree


def ctrl_c_then_remove(path, *args, **kwargs):  # a Ctrl-C as the work folder is removed
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
    remove(path, *args, **kwargs)


shutil.rmtree = ctrl_c_then_remove
sys.argv[:1] = ["gaca"]
from gaca_cli.cli import main
main()
"""


def test_a_ctrl_c_while_the_import_cleans_up_is_ignored(tmp_path):
    """The output is complete when the import removes its work folder: a Ctrl-C then used to
    stop the removal half way (the folder stayed beside OUT) and report 'nothing was
    written' beside a complete OUT. The clean-up now finishes, and so does the import."""
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": chat("a", "b"), "reward": 1.0}])
    out = tmp_path / "out" / "log.parquet"
    argv = ["import", "--from", "chat-jsonl", str(src), "-o", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_CLEAN_UP, *argv], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["log.parquet"]
    assert pq.read_table(out).num_rows == 1


def test_a_chat_keeps_what_follows_its_last_turn_and_every_message_field(tmp_path):
    """The environment's last word (after the last assistant turn) is the last step's
    final_observation; a message's fields besides role and content (tool_call_id, name, any
    key) are kept in extra.message_fields by position."""
    messages = [
        {"role": "user", "content": "guess"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "guess"}}]},
        {"role": "tool", "content": "too low", "tool_call_id": "c1", "name": "guess"},
        {"role": "assistant", "content": "42", "refusal": None, "seq": 7},
        {"role": "user", "content": "correct! you win"},
    ]
    src = write_jsonl(tmp_path / "game.jsonl", [{"messages": messages, "reward": 1, "traj_id": "t"}])
    out = tmp_path / "out.parquet"
    import_json("chat-jsonl", src, out=out)
    rows = pq.read_table(out).to_pylist()
    assert [r.get("final_observation") for r in rows] == [None, "user: correct! you win"]
    fields = {"2": {"tool_call_id": "c1", "name": "guess"}, "3": {"seq": 7}}
    assert all(json.loads(r["extra"])["message_fields"] == fields for r in rows)
