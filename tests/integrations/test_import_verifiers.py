"""`gaca import --from verifiers`: vf-eval results.jsonl + metadata.json (tests/data/verifiers).

The fixture was written by verifiers' own `save_outputs` / `save_metadata`; every value is
checked against it read here with `json`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import verifiers
from gaca_cli.integrations.imports.base import ImportOptions, SourceError
from tests.integrations.cli_helpers import error_line, gaca, import_json

RUN = Path(__file__).parents[1] / "data" / "verifiers" / "evals" / "math-tools--tiny-model" / "run0"
RESULTS = RUN / "results.jsonl"


def records() -> list[dict]:
    return [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]


def read(*paths: Path) -> list[dict]:
    return list(verifiers.read(list(paths), ImportOptions()))


def by_traj(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["traj_id"], []).append(r)
    return out


def test_every_rollout_field_is_mapped():
    metadata = json.loads((RUN / "metadata.json").read_text())
    trajs = by_traj(read(RESULTS))
    source = records()
    assert len(trajs) == len(source) == 4
    for n, rec in enumerate(source, start=1):
        steps = trajs[f"{RESULTS}:{n}"]
        assistant_turns = [m for m in rec["completion"] if m["role"] == "assistant"]
        assert [s["step_idx"] for s in steps] == list(range(len(assistant_turns)))
        for s in steps:
            assert s["group_id"] == f"{RESULTS}:{rec['example_id']}"
            assert s["example_id"] == rec["example_id"]
            assert s["episode_reward"] == rec["reward"]
            assert s["answer"] == rec["answer"] and s["task"] == rec["task"]
            assert s["is_completed"] == rec["is_completed"] and s["is_truncated"] == rec["is_truncated"]
            assert s["stop_condition"] == rec["stop_condition"]
            assert {k: v for k, v in s.items() if k.startswith("metric_")} == {
                f"metric_{k}": v for k, v in rec["metrics"].items()
            }
            assert s["env_id"] == metadata["env_id"] and s["model"] == metadata["model"]
            assert "correct" not in s  # the metrics repeated at the top level are not copied twice
        assert [s["reward"] for s in steps] == [0.0] * (len(steps) - 1) + [rec["reward"]]
        assert [s["done"] for s in steps] == [False] * (len(steps) - 1) + [rec["is_completed"]]
        assert steps[-1]["extra"] == {"info": rec["info"], "timing": rec["timing"]}
        assert all("extra" not in s for s in steps[:-1])


def test_turns_split_with_the_chat_before_them():
    """Context of a turn = the prompt + the completion before it; an action is the turn's text,
    its tool calls (saved by verifiers as JSON strings) appended as JSON objects."""
    source = records()
    trajs = by_traj(read(RESULTS))
    single = trajs[f"{RESULTS}:1"]
    assert single[0]["messages"] == source[0]["prompt"]
    assert single[0]["action"] == "5"

    tools = trajs[f"{RESULTS}:3"]
    rec = source[2]
    call = json.loads(rec["completion"][0]["tool_calls"][0])
    assert tools[0]["messages"] == rec["prompt"]
    assert tools[0]["action"] == json.dumps([call], sort_keys=True)
    assert tools[1]["messages"] == [
        *rec["prompt"],
        {"role": "assistant", "content": tools[0]["action"]},
        {"role": "tool", "content": rec["completion"][1]["content"]},
    ]
    assert tools[1]["action"] == rec["completion"][2]["content"]

    cut = trajs[f"{RESULTS}:4"]  # truncated after a tool result: one turn, not done
    assert len(cut) == 1 and cut[0]["done"] is False
    assert cut[0]["action"].startswith("Let me compute.\n[")


def test_few_shot_assistant_turns_in_the_prompt_are_context(tmp_path):
    rec = records()[0]
    shots = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    rec["prompt"] = [rec["prompt"][0], *shots, rec["prompt"][1]]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    rows = read(path)
    assert len(rows) == 1 and rows[0]["messages"] == rec["prompt"] and rows[0]["action"] == "5"
    assert "env_id" not in rows[0]  # no metadata.json beside this file


def test_completion_environment_strings(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"example_id": 3, "prompt": "2+2=", "completion": "4", "reward": 1.0}) + "\n")
    (row,) = read(path)
    assert (row["prompt"], row["action"], row["reward"], row["done"]) == ("2+2=", "4", 1.0, True)


def test_rollout_without_assistant_turn_is_one_empty_step(tmp_path):
    rec = {**records()[0], "completion": [], "error": {"error": "RuntimeError", "error_chain_repr": "x"}}
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    (row,) = read(path)
    assert row["action"] == "" and row["messages"] == rec["prompt"]
    assert row["extra"]["error"] == rec["error"]


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"reward": "high"}, "reward", "must be a number"),
        ({"example_id": None}, "example_id", "missing"),
        ({"example_id": [1]}, "example_id", "must be an integer or a string"),
        ({"completion": [{"content": "no role"}]}, "completion", "must be a list of chat messages with a role"),
        ({"metrics": [1.0]}, "metrics", "must be an object"),
        ({"metrics": {"correct": "yes"}}, "metrics.correct", "must be a number"),
    ],
)
def test_bad_rollout_names_file_line_field(tmp_path, change, field, rule):
    good = records()[0]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
    with pytest.raises(SourceError) as exc:
        read(path)
    assert str(exc.value).startswith(f"{path}: line 2: field '{field}': {rule}")


def test_missing_reward_and_v04_traces(tmp_path):
    path = tmp_path / "results.jsonl"
    rec = records()[0]
    del rec["reward"]
    path.write_text(json.dumps(rec) + "\n")
    with pytest.raises(SourceError, match="line 1: field 'reward': missing"):
        read(path)
    path.write_text(json.dumps({"id": "e1", "task": {"type": "T", "data": {}}, "traces": []}) + "\n")
    with pytest.raises(SourceError, match="verifiers 0.4 traces.jsonl episode"):
        read(path)


def test_cli_import_writes_a_valid_log(tmp_path):
    out = tmp_path / "log.parquet"
    import_json("verifiers", RUN.parent.parent, out=out)  # a directory: its results.jsonl files
    table = pq.read_table(out).to_pylist()
    expected = read(RESULTS)
    key = lambda r: (r["traj_id"], r["step_idx"])  # noqa: E731
    assert len(table) == len(expected) == 5
    for got, want in zip(sorted(table, key=key), sorted(expected, key=key)):
        for col in ("group_id", "reward", "episode_reward", "done", "action", "messages", "metric_correct"):
            assert got[col] == want[col], col
    res = gaca("validate", out, "--for", "score")
    assert res.exit_code == 0, res.output


def test_cli_bad_input_one_error_line_and_no_output(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({**records()[0], "reward": "high"}) + "\n")
    out = tmp_path / "log.parquet"
    line = error_line(gaca("import", "--from", "verifiers", path, "-o", out))
    assert "results.jsonl: line 1: field 'reward': must be a number" in line
    assert not out.exists()
