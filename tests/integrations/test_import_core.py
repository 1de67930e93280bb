"""What every import shares: streaming in batches under one unified schema, the atomic write,
the summary's missing notes, usage errors naming their flag, and `--list`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import FORMATS, core
from gaca_cli.integrations.imports.base import ImportOptions, expand_sources, split_chat
from tests.integrations.cli_helpers import error_line, gaca
from tests.integrations.test_import_chat_jsonl import chat, write_jsonl


def records(n: int) -> list[dict]:
    """Trajectory records whose extra fields appear, and change type, only in later records."""
    out = []
    for i in range(n):
        r = {"group_id": f"g{i % 3}", "traj_id": f"t{i}", "messages": chat("a", "o", "b"), "reward": float(i % 2)}
        if i >= n // 2:
            r["late"] = f"x{i}"  # a column the first batches do not have
        r["score"] = i if i < n // 2 else i + 0.5  # ints, then floats: promoted to double
        out.append(r)
    return out


def test_batches_are_unified_into_one_schema(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "BATCH_ROWS", 3)
    src = write_jsonl(tmp_path / "r.jsonl", records(10))
    result = core.run_import("chat-jsonl", [src], tmp_path / "out.parquet", ImportOptions())
    assert not result.violations
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.num_rows == 20
    rows = table.to_pylist()
    assert [r["late"] for r in rows[:10]] == [None] * 10 and rows[10]["late"] == "x5"
    assert str(table.schema.field("score").type) == "double" and rows[-1]["score"] == 9.5 and rows[0]["score"] == 0
    # gaca's columns first in the schema's order, the source's own after, extra last
    assert table.column_names[:4] == ["group_id", "traj_id", "step_idx", "reward"]
    meta = json.loads(table.schema.metadata[b"gaca.import"])
    assert meta["format"] == "chat-jsonl" and meta["files"] == [str(src)]
    assert result.summary["rows"] == 20 and result.summary["trajectories"] == 10 and result.summary["groups"] == 3


def test_one_batch_equals_many(tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "r.jsonl", records(9))
    core.run_import("chat-jsonl", [src], tmp_path / "one.parquet", ImportOptions())
    monkeypatch.setattr(core, "BATCH_ROWS", 4)
    core.run_import("chat-jsonl", [src], tmp_path / "many.parquet", ImportOptions())
    assert pq.read_table(tmp_path / "one.parquet").equals(pq.read_table(tmp_path / "many.parquet"))


def test_nothing_is_left_behind_on_failure_and_an_old_output_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(core, "BATCH_ROWS", 2)
    out = tmp_path / "out.parquet"
    out.write_bytes(b"old")
    good = records(5)
    src = write_jsonl(tmp_path / "r.jsonl", [*good, {"messages": chat("a"), "reward": "bad"}])
    res = gaca("import", "--from", "chat-jsonl", src, "-o", out)
    assert res.exit_code == 1 and "line 6" in res.stderr
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet", "r.jsonl"]


def test_a_failed_import_removes_the_folders_it_created(tmp_path):
    src = write_jsonl(tmp_path / "r.jsonl", [{"messages": chat("a"), "reward": "bad"}])
    res = gaca("import", "--from", "chat-jsonl", src, "-o", tmp_path / "new" / "deeper" / "out.parquet")
    assert res.exit_code == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
    (tmp_path / "kept").mkdir()  # one that was there before stays
    res = gaca("import", "--from", "chat-jsonl", src, "-o", tmp_path / "kept" / "new" / "out.parquet")
    assert res.exit_code == 1 and list((tmp_path / "kept").iterdir()) == []


@pytest.mark.parametrize(
    ("fmt", "source", "companion"),
    [
        ("swift", "swift/grpo/completions.jsonl", "args.json"),
        ("verifiers", "verifiers/evals/math-tools--tiny-model/run0/results.jsonl", "metadata.json"),
    ],
)
def test_the_output_never_replaces_a_file_read_beside_the_source(tmp_path, fmt, source, companion):
    """ms-swift's args.json and verifiers' metadata.json are read with the source: -o onto one
    is a usage error, as -o onto the source itself is."""
    data = Path(__file__).parents[1] / "data"
    shutil.copytree((data / source).parent, tmp_path / "run")
    target = tmp_path / "run" / companion
    before = target.read_bytes()
    for src in [tmp_path / "run" / Path(source).name, tmp_path / "run" / "*.jsonl"]:
        res = gaca("import", "--from", fmt, src, "-o", target)
        assert res.exit_code == 2 and f"would overwrite {target}, which is read with the input" in " ".join(
            res.stderr.split()
        ), res.stderr
    assert target.read_bytes() == before


def test_missing_notes():
    full = ["group_id", "traj_id", "step_idx", "reward", "messages", "action", "anchor_obs", "behavior_logprobs"]
    assert core._missing(full, steps_per_traj=3) == []
    notes = core._missing(["group_id", "traj_id", "step_idx", "reward"], steps_per_traj=1)
    assert len(notes) == 4 and "anchor" in notes[0] and "score" in notes[1] and "one step" in notes[3]
    tokens = ["group_id", "traj_id", "step_idx", "reward", "prompt_token_ids", "action_token_ids"]
    assert not any("cannot run" in note for note in core._missing(tokens, steps_per_traj=2))
    # a logged observation (rllm) is a route to an anchor
    (note, *_) = core._missing([*tokens, "observation"], steps_per_traj=2)
    assert "--map anchor_obs=observation" in note and "observation" not in core._missing(tokens, 2)[0]


def test_sources_directories_and_globs(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    a = write_jsonl(tmp_path / "d" / "a.jsonl", records(1))
    b = write_jsonl(tmp_path / "d" / "sub" / "b.jsonl", records(1))
    (tmp_path / "d" / "notes.txt").write_text("x")
    assert expand_sources([tmp_path / "d"], (".jsonl",)) == [a, b]
    assert expand_sources([str(tmp_path / "d" / "*.jsonl"), a], (".jsonl",)) == [a]
    with pytest.raises(Exception, match="no file matches"):
        expand_sources([str(tmp_path / "*.nothing")], (".jsonl",))
    with pytest.raises(Exception, match="no .jsonl file"):
        (tmp_path / "empty").mkdir()
        expand_sources([tmp_path / "empty"], (".jsonl",))


def test_split_chat_keeps_tool_calls_in_the_action_and_the_later_context():
    calls = [{"type": "function", "function": {"name": "look", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "a room"},
        {"role": "assistant", "content": "done"},
    ]
    steps = list(split_chat(messages))
    assert steps[0][0] == [{"role": "user", "content": "hi"}] and json.loads(steps[0][1]) == calls
    assert steps[1][0][1] == {"role": "assistant", "content": steps[0][1]} and steps[1][1] == "done"


USAGE = [
    (["import", "x.jsonl", "-o", "o.parquet"], "'--from'", "give the source's format"),
    (["import", "--from", "nope", "x.jsonl"], "'--from'", "unknown format 'nope'"),
    (["import", "--from", "chat-jsonl"], "'SRC...'", "give the files"),
    (["import", "--from", "chat-jsonl", "x.jsonl", "--map", "bad"], "'--map'", "NEW=OLD"),
    (
        ["import", "--from", "chat-jsonl", "x.jsonl", "--reward-weights", "1,2"],
        "'--reward-weights'",
        "only --from trl and swift",
    ),
    (["import", "--from", "trl", "x", "--reward-weights", "1,a"], "'--reward-weights'", "comma-separated list"),
    (["import", "--from", "trl", "x", "--map", "a=b"], "'--map'", "only --from chat-jsonl"),
    (["import", "--from", "chat-jsonl", "x.jsonl", "--for", "nope"], "'--for'", "unknown command"),
    (["validate", "x.jsonl", "--from", "nope"], "'--from'", "unknown format"),
    (["validate", "x.parquet", "--reward-weights", "1"], "'--reward-weights'", "need --from trl or --from swift"),
]


@pytest.mark.parametrize(("args", "flag", "message"), USAGE, ids=[" ".join(a) for a, _, _ in USAGE])
def test_usage_errors_name_their_flag(args, flag, message):
    res = gaca(*args)
    assert res.exit_code == 2, res.output
    assert flag in res.stderr and message in " ".join(res.stderr.split()), res.stderr


def test_missing_source_and_bad_output(tmp_path):
    res = gaca("import", "--from", "chat-jsonl", tmp_path / "none.jsonl", "-o", tmp_path / "o.parquet")
    assert res.exit_code == 1 and "no such file" in res.stderr
    src = write_jsonl(tmp_path / "r.jsonl", records(1))
    res = gaca("import", "--from", "chat-jsonl", src, "-o", tmp_path)
    assert res.exit_code == 1 and "is a directory" in res.stderr
    res = gaca("import", "--from", "chat-jsonl", src)  # default: beside the input
    assert res.exit_code == 0 and (tmp_path / "r.gaca.parquet").exists()


def test_list_names_every_format(tmp_path):
    res = gaca("import", "--list", "--json")
    assert res.exit_code == 0
    listed = json.loads(res.stdout)
    assert [f["name"] for f in listed] == list(FORMATS)
    assert all(f["summary"] and "\n" not in f["summary"] for f in listed)
    res = gaca("import", "--list")
    assert res.exit_code == 0 and all(name in res.stdout for name in FORMATS)


def test_every_format_has_a_row_and_a_page_in_the_docs():
    from tests.cli.test_docs import ROOT

    table = (ROOT / "docs" / "importing.md").read_text()
    for name in FORMATS:
        assert f"| `{name}` |" in table, name
        assert (ROOT / "docs" / "formats" / f"{name}.md").exists(), name


def test_parquet_sources_are_read_with_page_checksums_verified(tmp_path):
    import pyarrow as pa

    from gaca_cli.integrations.imports.base import SourceError, iter_parquet_rows

    path = tmp_path / "src.parquet"
    pq.write_table(
        pa.table({"text": ["MARKER-one", "two"]}),
        path,
        write_page_checksum=True,
        compression="none",
        use_dictionary=False,
    )
    assert [r["text"] for _, r in iter_parquet_rows(path)] == ["MARKER-one", "two"]
    data = bytearray(path.read_bytes())
    at = -1
    while (at := data.find(b"MARKER-", at + 1)) >= 0:
        data[at] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        list(iter_parquet_rows(path))


JSON_FORMATS = [(name, "x.json" if name == "rllm" else "x.jsonl") for name in FORMATS if name != "trl"]


@pytest.mark.parametrize(("fmt", "name"), JSON_FORMATS, ids=[f for f, _ in JSON_FORMATS])
def test_a_json_source_that_is_not_utf8_names_file_and_line(tmp_path, fmt, name):
    """One Error line, no traceback, nothing written (JSON Lines line by line, rllm's one
    document per file)."""
    src = tmp_path / name
    if name.endswith(".json"):
        src.write_bytes(b'{"text":\n  "\xff"}\n')
        expected = "line 2: not UTF-8 text (byte 0xff at column 4)"
    else:
        src.write_bytes(b'{"text": "caf\xe9"}\n')
        expected = "line 1: not UTF-8 text (byte 0xe9 at column 14)"
    out = tmp_path / "out.parquet"
    assert error_line(gaca("import", "--from", fmt, src, "-o", out)) == f"Error: {src}: {expected}"
    assert error_line(gaca("validate", "--from", fmt, src)) == f"Error: {src}: {expected}"
    assert not out.exists()


@pytest.mark.parametrize(("fmt", "name"), JSON_FORMATS, ids=[f for f, _ in JSON_FORMATS])
def test_a_lone_surrogate_escape_names_file_and_field(tmp_path, fmt, name):
    """A JSON escape of half a UTF-16 pair (an emoji cut in two) cannot be stored as text: one
    Error line naming the field, before any format reads the record; nothing written."""
    src = tmp_path / name
    src.write_text('{"text": "cut \\ud83d", "n": 1}\n')
    where = "" if name.endswith(".json") else "line 1: "
    expected = f"Error: {src}: {where}field 'text': not valid Unicode: a lone surrogate \\ud83d (half of a UTF-16 pair"
    out = tmp_path / "out.parquet"
    assert error_line(gaca("import", "--from", fmt, src, "-o", out)).startswith(expected)
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["trl", "art", "verl-agent"])
def test_a_parquet_string_that_is_not_utf8_names_file_row_and_column(tmp_path, fmt):
    import pyarrow as pa

    raw = pa.array([b"fine", b"\xff\xfe"], type=pa.binary())
    text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # written unchecked, as a broken writer would
    src = tmp_path / "x.parquet"
    pq.write_table(pa.table({"n": [1, 2], "prompt": text}), src)
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", fmt, src, "-o", out))
    assert line == f"Error: {src}: row 1: field 'prompt': not UTF-8 text" and not out.exists()
