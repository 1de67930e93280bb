"""`--from verl`: the fixtures verl 0.9.1's own dumping code wrote (tests/data/verl/README.md),
read with the format's `read()` and checked against the files read independently with `json`,
then through `gaca import`."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import verl
from gaca_cli.integrations.imports.base import ImportOptions
from tests.integrations.cli_helpers import error_line, gaca, import_json

DATA = Path(__file__).resolve().parents[1] / "data" / "verl"
ROLLOUT = sorted((DATA / "rollout").glob("*.jsonl"))
VALIDATION = DATA / "validation" / "3.jsonl"
V1 = DATA / "v1_rollout" / "4.jsonl"
AGENT = DATA / "agent_loop" / "trajectories.jsonl"


def read(*files: Path) -> list[dict]:
    return list(verl.read(list(files), ImportOptions()))


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_rollout_dump_rows_hold_every_field_of_the_file():
    rows = read(*ROLLOUT)
    assert len(rows) == 12
    for path, label in zip(ROLLOUT, ("1", "2"), strict=True):  # paths below the files' common folder
        ours = [r for r in rows if r["traj_id"].startswith(f"{label}/")]
        for line, (rec, row) in enumerate(zip(records(path), ours, strict=True), start=1):
            digest = hashlib.sha1(rec["input"].encode()).hexdigest()[:12]
            assert row["group_id"] == f"{label}/{digest}"
            assert row["traj_id"] == f"{label}/line{line}"
            assert row["step_idx"] == 0 and row["done"] is True
            assert row["reward"] == row["episode_reward"] == rec["score"]
            assert row["action"] == rec["output"] and row["input"] == rec["input"]
            assert row["step"] == rec["step"] and row["gts"] == rec["gts"]
            for key in ("acc", "pred", "request_id"):
                assert row[key] == rec[key]
            assert "prompt" not in row and "extra" not in row


def test_a_group_is_the_samples_of_one_prompt_in_one_file():
    rows = read(*ROLLOUT)
    groups: dict[str, set[str]] = {}
    for row in rows:
        groups.setdefault(row["group_id"], set()).add(row["input"])
    assert len(groups) == 4  # 2 prompts x 2 steps
    assert all(len(inputs) == 1 for inputs in groups.values())
    assert sorted(sum(1 for r in rows if r["group_id"] == g) for g in groups) == [3, 3, 3, 3]


def test_validation_dump_keeps_its_reward_column_apart():
    rows = read(VALIDATION)
    for rec, row in zip(records(VALIDATION), rows, strict=True):
        assert row["source_reward"] == rec["reward"] and row["reward"] == rec["score"]
        assert row["acc"] == rec["acc"]


def test_v1_uid_keys_give_groups_sessions_and_output_steps():
    rows = read(V1)
    by_key = {(r["traj_id"], r["step_idx"]): r for r in rows}
    for rec in records(V1):
        uid, session, index = rec["uid"].rsplit("_", 2)
        row = by_key[(f"{uid}_{session}", int(index))]
        assert row["group_id"] == uid and row["uid"] == rec["uid"]
        assert row["action"] == rec["output"] and row["episode_reward"] == rec["score"]
    # the multi-output session: the final score on its last output only
    multi = [by_key[("prompt0-uuid_1", 0)], by_key[("prompt0-uuid_1", 1)]]
    assert [r["reward"] for r in multi] == [0.0, 1.0]
    assert [r["done"] for r in multi] == [False, True]
    assert by_key[("prompt1-uuid_0", 0)]["reward"] == 1.0 and by_key[("prompt1-uuid_0", 0)]["done"] is True


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s, found apart from the importer's own `mask_runs`."""
    runs, i = [], 0
    for value, run in itertools.groupby(mask):
        n = len(list(run))
        if value:
            runs.append((i, i + n))
        i += n
    return runs


def test_agent_loop_runs_of_the_response_mask_become_steps():
    rows = read(AGENT)
    recs = records(AGENT)
    assert len(rows) == sum(len(_runs(r["response_mask"])) for r in recs) == 8
    for line, rec in enumerate(recs, start=1):
        steps = [r for r in rows if r["traj_id"] == f"trajectories/line{line}"]
        runs = _runs(rec["response_mask"])
        assert [s["step_idx"] for s in steps] == list(range(len(runs)))
        tools = rec["extra_fields"]["tool_rewards"]
        for k, ((start, end), row) in enumerate(zip(runs, steps, strict=True)):
            assert row["group_id"] == rec["uid"] and row["step"] == rec["step"]
            assert row["prompt_token_ids"] == rec["prompt_ids"] + rec["response_ids"][:start]
            assert row["action_token_ids"] == rec["response_ids"][start:end]
            if rec["response_logprobs"] is None:
                assert "behavior_logprobs" not in row
            else:
                assert row["behavior_logprobs"] == rec["response_logprobs"][start:end]
            last = k == len(runs) - 1
            tool = tools[k] if k < len(tools) else 0.0
            assert row["reward"] == pytest.approx(tool + (rec["reward_score"] if last else 0.0))
            assert row["reward_score"] == rec["reward_score"] and row["num_turns"] == rec["num_turns"]
            assert row["done"] is last
            if tools:
                assert row["tool_reward"] == tool
            if last:
                assert row["extra"] == {
                    "metrics": rec["metrics"],
                    "extra_fields": {"reward_extra_info": rec["extra_fields"]["reward_extra_info"]},
                }
            else:
                assert "extra" not in row


def _agent_record(**changes) -> dict:
    rec = records(AGENT)[3]  # three turns, two tool responses
    rec.update(changes)
    return rec


def test_turn_scores_add_to_their_turn_and_misaligned_lists_stay_in_extra(tmp_path):
    path = tmp_path / "t.jsonl"
    fields = {"turn_scores": [0.1, 0.2, 0.3], "tool_rewards": [1.0, 2.0, 3.0, 4.0]}
    path.write_text(json.dumps(_agent_record(extra_fields=fields, reward_score=5.0)) + "\n")
    rows = read(path)
    assert [r["turn_score"] for r in rows] == [0.1, 0.2, 0.3]
    assert [r["reward"] for r in rows] == pytest.approx([0.1, 0.2, 5.3])
    assert all("tool_reward" not in r for r in rows)
    assert rows[-1]["extra"]["extra_fields"] == {"tool_rewards": [1.0, 2.0, 3.0, 4.0]}


def test_a_record_without_reward_score_uses_score(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_agent_record(reward_score=None, score=2.5)) + "\n")
    assert read(path)[-1]["reward"] == 2.5


def _write(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_fields_named_like_gaca_columns_are_kept_as_source_names(tmp_path):
    """Reward extra info (dumps) and AgentLoopOutput fields (agent loop) named like gaca's own
    columns: a scalar one is kept as source_<name>, a nested one in `extra` under its name."""
    dump = records(ROLLOUT[0])
    dump[0].update(extra="note", traj_id="t-7", reward=[0.5, 0.5])
    row = read(_write(tmp_path / "1.jsonl", dump))[0]
    assert (row["source_extra"], row["source_traj_id"]) == ("note", "t-7")
    assert row["traj_id"] == "1/line1" and row["reward"] == dump[0]["score"]
    assert row["extra"] == {"reward": [0.5, 0.5]}
    agent = _agent_record(extra="note", done="yes")
    rows = read(_write(tmp_path / "t.jsonl", [agent]))
    assert all(r["source_extra"] == "note" and r["source_done"] == "yes" for r in rows)
    assert [r["done"] for r in rows] == [False, False, True]


@pytest.mark.parametrize("field", ["extra", "reward", "traj_id"])
@pytest.mark.parametrize("kind", ["dump", "agent loop"])
def test_a_field_beside_its_source_name_is_one_error(tmp_path, field, kind):
    """`extra` and `source_extra` side by side cannot both be `source_extra`: the import stops
    with one line naming the file, the line and the field, rather than keep one of them."""
    if kind == "dump":
        recs = records(ROLLOUT[0])
        recs[2].update({field: "mine", f"source_{field}": "theirs"})
        path = _write(tmp_path / "1.jsonl", recs)
        line = 3
    else:
        path = _write(tmp_path / "t.jsonl", [records(AGENT)[0], _agent_record(**{field: 1, f"source_{field}": 2})])
        line = 2
    message = (
        f"{path}: line {line}: field '{field}': is kept as 'source_{field}' because gaca writes a column "
        f"'{field}', but the record also gives 'source_{field}'; rename one of the two in the source"
    )
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value) == message
    out = tmp_path / "out.parquet"
    assert error_line(gaca("import", "--from", "verl", path, "-o", out)) == f"Error: {message}"
    assert not out.exists()


BAD_DUMP = [
    ({"score": "high"}, "field 'score': must be a number, got \"high\""),
    ({"score": 10**400}, "field 'score': is an integer of 401 digits, too large for a number"),
    ({"step": 1.5}, "field 'step': must be an integer, got 1.5"),
    ({"output": None}, "field 'output': must be a string, got null"),
    ({"uid": "u_0_1"}, "field 'uid': output index 1 of session 'u_0': expected 0"),
]


@pytest.mark.parametrize(("change", "message"), BAD_DUMP)
def test_a_bad_dump_record_names_file_line_and_field(tmp_path, change, message):
    lines = records(ROLLOUT[0])
    lines[2].update(change)
    path = tmp_path / "1.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value) == f"{path}: line 3: {message}"


def test_a_session_split_over_lines_is_an_error(tmp_path):
    lines = records(V1)
    lines[1], lines[3] = lines[3], lines[1]
    path = tmp_path / "4.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(GacaError, match=r"line 3: field 'uid': output index 1 of session 'prompt0-uuid_1'"):
        read(path)


BAD_AGENT = [
    ({"uid": None}, "field 'uid': missing: add the sample's uid when writing the record"),
    ({"response_mask": [1, 0]}, "field 'response_mask': has 2 values for 42 response_ids"),
    ({"response_ids": [1, "x"]}, "field 'response_ids[1]': must be an integer, got \"x\""),
    ({"response_mask": [2] * 42}, "field 'response_mask': must hold 0s and 1s, got 2 at position 0"),
    ({"response_mask": [0] * 42}, "field 'response_mask': no generated token (no 1 in the mask): no step to import"),
    ({"response_logprobs": [0.0]}, "field 'response_logprobs': has 1 values for 42 response_ids"),
    ({"reward_score": None}, "field 'reward_score': is null and the record has no 'score'"),
    ({"extra_fields": {"tool_rewards": ["a"]}}, "field 'extra_fields.tool_rewards[0]': must be a number"),
    (
        {"extra_fields": {"tool_rewards": [10**400]}},
        "field 'extra_fields.tool_rewards[0]': is an integer of 401 digits",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_AGENT)
def test_a_bad_agent_loop_record_names_file_line_and_field(tmp_path, change, message):
    assert len(_agent_record()["response_ids"]) == 42
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(records(AGENT)[0]) + "\n" + json.dumps(_agent_record(**change)) + "\n")
    with pytest.raises(GacaError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}: line 2: {message}"), str(err.value)


def test_a_file_of_neither_kind_and_mixed_kinds_are_errors(tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "p", "completion": "c"}\n')
    with pytest.raises(GacaError, match="line 1: neither a rollout dump record"):
        read(other)
    with pytest.raises(GacaError, match="import rollout dumps and agent-loop trajectories separately"):
        read(AGENT, ROLLOUT[0])


# --- the command ---------------------------------------------------------------------------


@pytest.mark.parametrize("sub", ["rollout", "validation", "v1_rollout", "agent_loop"])
def test_gaca_import_from_verl(tmp_path, sub):
    out = tmp_path / "out.parquet"
    summary = import_json("verl", DATA / sub, out=out)
    assert summary
    table = pq.read_table(out).to_pylist()
    expected = read(*sorted((DATA / sub).glob("*.jsonl")))
    assert len(table) == len(expected)
    key = {(r["traj_id"], r["step_idx"]): r for r in table}
    for row in expected:
        got = key[(row["traj_id"], row["step_idx"])]
        for name in ("group_id", "reward", "done", "action", "action_token_ids", "behavior_logprobs"):
            if name in row:
                # rewards are float64, log-probs float32 in the log
                exact = name not in ("reward", "behavior_logprobs")
                assert got[name] == row[name] if exact else got[name] == pytest.approx(row[name], rel=1e-6)
    res = gaca("validate", out)
    assert res.exit_code == 0, res.output


def test_gaca_import_from_verl_then_grpo_advantages(tmp_path):
    out = tmp_path / "out.parquet"
    import_json("verl", DATA / "rollout", out=out)
    res = gaca("advantages", out, "--method", "grpo", "-o", tmp_path / "adv.parquet")
    assert res.exit_code == 0, res.output
    adv = pq.read_table(tmp_path / "adv.parquet").to_pylist()
    # group rollout/1, hall prompt: scores 1, 1, 0 -> advantages (x - 2/3) / std > 0 for the 1s
    for row in adv:
        assert (row["advantage"] > 0) == (
            row["reward"] == max(r["reward"] for r in adv if r["group_id"] == row["group_id"])
        )


def test_gaca_import_from_verl_bad_input_writes_nothing(tmp_path):
    src = tmp_path / "rollout"
    shutil.copytree(DATA / "rollout", src)
    lines = records(src / "2.jsonl")
    lines[4]["score"] = "n/a"
    (src / "2.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "verl", src, "-o", out))
    assert "2.jsonl: line 5: field 'score': must be a number" in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["rollout"]


VERSIONS = Path(__file__).parents[1] / "data" / "verl" / "versions"


@pytest.mark.parametrize(
    ("folder", "kept", "absent"),
    [
        ("0.5.0", {"acc", "pred", "request_id"}, {"gts"}),  # verl before 0.6 writes no gts
        ("0.9.1-no-ground-truth", set(), {"gts", "acc", "pred"}),  # gts null on every line, no extra info
    ],
)
def test_dumps_with_and_without_gts_and_extra_info(tmp_path, folder, kept, absent):
    """No column is made up: a dump without ground truths has no `gts` column, and the summary
    names what is missing (the prompt: `input` is kept under its name), not the action it has."""
    out = tmp_path / "out.parquet"
    summary = import_json("verl", VERSIONS / folder, out=out)
    columns = set(pq.read_table(out).column_names)
    assert kept <= columns and not absent & columns, columns
    assert {"action", "input"} <= columns and "gts" not in summary["kept"]
    assert any(note.startswith("no prompt/messages (text or token ids)") for note in summary["missing"])
    assert not any("action" in note for note in summary["missing"])


@pytest.mark.parametrize(
    ("folder", "fields"),
    [
        ("0.5.0", {"acc", "pred", "request_id"}),  # also what 0.4.1 writes (the same _dump_generations)
        ("0.6.1", {"gts", "acc", "pred"}),  # also what 0.7.1 writes; no request_id before 0.8
        ("0.9.1-no-ground-truth", set()),  # also what 0.8.0 writes
    ],
)
def test_each_release_line_dump_rows_hold_the_file_values(folder, fields):
    (path,) = sorted((VERSIONS / folder).glob("*.jsonl"))
    rows = read(path)
    for line, (rec, row) in enumerate(zip(records(path), rows, strict=True), start=1):
        assert set(rec) == {"input", "output", "score", "step"} | fields | ({"gts"} if "gts" in rec else set())
        assert row["traj_id"] == f"{path.stem}/line{line}" and row["step_idx"] == 0 and row["done"] is True
        assert row["group_id"] == f"{path.stem}/{hashlib.sha1(rec['input'].encode()).hexdigest()[:12]}"
        assert row["reward"] == row["episode_reward"] == rec["score"]
        assert row["action"] == rec["output"] and row["input"] == rec["input"] and row["step"] == rec["step"]
        for key in fields:
            assert row[key] == rec[key], key
        assert set(row) & {"gts", "acc", "pred", "request_id"} == fields  # a null gts makes no column
        assert "extra" not in row
