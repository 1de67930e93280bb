"""`gaca import --from skyrl`: SkyRL eval dumps and generator output rows (tests/data/skyrl).

Every value is checked against the fixture read here with `json`, not through the importer.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import skyrl
from gaca_cli.integrations.imports.base import ImportOptions, SourceError
from tests.integrations.cli_helpers import error_line, gaca, import_json

DATA = Path(__file__).parents[1] / "data" / "skyrl"
EVALS = DATA / "dumped_evals" / "global_step_3_evals"
EVAL_ONLY = DATA / "dumped_evals" / "eval_only"
EVALS_STEPWISE = DATA / "dumped_evals" / "global_step_5_evals"  # step_wise_trajectories=true
EVAL_FILES = [EVALS / "house_garden.jsonl", EVALS / "unknown.jsonl", EVAL_ONLY / "house_garden.jsonl"]
LINES = {  # rollout lines per dump file, as make_fixture.py asked SkyRL for them
    "global_step_3_evals/house_garden.jsonl": 4,
    "global_step_3_evals/unknown.jsonl": 2,
    "eval_only/house_garden.jsonl": 2,
    "global_step_5_evals/house_garden.jsonl": 3,
}
STEPWISE = DATA / "generator_stepwise.jsonl"
BATCH = DATA / "generator_batch.jsonl"
# older releases (make_fixture_versions.py): the same runs; GeneratorOutput fields each one lacks
RELEASES = {
    "0.1.0": {"env_metrics", "trajectory_generation_times"},
    "0.2.0": {"env_metrics", "trajectory_generation_times"},
    "0.3.0": set(),
}
VERSION_FILES = sorted(p.relative_to(DATA / "versions") for p in (DATA / "versions").rglob("*.jsonl"))
EVAL_COLUMNS = ("group_id", "traj_id", "step_idx", "reward", "done", "prompt", "action")
EVAL_COLUMNS += ("stop_reason", "env_class", "data_source", "extra")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read(*paths: Path) -> list[dict]:
    return list(skyrl.read(list(paths), ImportOptions()))


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of the runs of 1s, found by a plain scan."""
    found, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            found.append((i, j))
            i = j
        else:
            i += 1
    return found


# -- eval dumps (written by skyrl 0.4.0's dump_per_dataset_eval_results) -----------------------


@pytest.mark.parametrize(
    "path", [*EVAL_FILES, EVALS_STEPWISE / "house_garden.jsonl"], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_eval_dump_one_row_per_line_with_every_field(path):
    source = lines(path)
    rows = read(path.parent / "aggregated_results.jsonl", path)
    assert len(rows) == len(source) == LINES[f"{path.parent.name}/{path.name}"]  # aggregated_results: none
    for n, (row, rec) in enumerate(zip(rows, source), start=1):
        assert row["traj_id"] == f"{path}:{n}"
        assert row["step_idx"] == 0 and row["done"] is True
        assert row["prompt"] == rec["input_prompt"]
        assert row["action"] == rec["output_response"]
        score = rec["score"]
        assert row["reward"] == (sum(score) if isinstance(score, list) else score)
        assert row["stop_reason"] == rec["stop_reason"]
        assert row["env_class"] == rec["env_class"]
        assert row["data_source"] == rec["data_source"]
        want_extra = {"env_extras": rec["env_extras"]}
        if isinstance(score, list):
            want_extra["score"] = score
        assert row["extra"] == want_extra
        digest = hashlib.sha1(rec["input_prompt"].encode()).hexdigest()[:16]
        assert row["group_id"] == f"{path}:{digest}"
        assert set(row) == set(EVAL_COLUMNS)  # every field of the line is somewhere, nothing more


def test_eval_dump_groups_the_samples_of_one_prompt_in_one_file():
    rows = read(*EVAL_FILES)
    groups = [r["group_id"] for r in rows]
    # house_garden: two prompts x two samples; unknown: the hall prompt again, its own group
    assert groups[0] == groups[1] != groups[2] == groups[3] != groups[4] == groups[5] != groups[6] == groups[7]
    assert rows[0]["prompt"] == rows[4]["prompt"] and groups[0] != groups[4]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # per-token summed


@pytest.mark.parametrize("folder", [EVALS, EVAL_ONLY], ids=lambda p: p.name)
def test_eval_dump_groups_give_skyrls_own_metrics(folder):
    """SkyRL's aggregated_results.jsonl (avg_score, pass_at_2 per data source, computed from its
    prompt uids) agrees with the importer's rewards and prompt-text groups."""
    (metrics,) = lines(folder / "aggregated_results.jsonl")
    for path in sorted(folder.glob("*.jsonl")):
        if path.name == "aggregated_results.jsonl":
            continue
        rows = read(path)
        name = path.stem
        assert metrics[f"eval/{name}/avg_score"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))
        by_group: dict[str, list[float]] = {}
        for row in rows:
            by_group.setdefault(row["group_id"], []).append(row["reward"])
        passed = sum(any(r > 0 for r in rewards) for rewards in by_group.values()) / len(by_group)
        assert metrics[f"eval/{name}/pass_at_2"] == passed
        assert all(len(rewards) == 2 for rewards in by_group.values())


def test_stepwise_eval_dump_one_line_per_step_each_its_own_trajectory():
    """Step-wise, SkyRL dumps every step (evaluate: "the dump keeps every step") with no
    trajectory id: each line imports as a one-step trajectory; a later step's prompt holds the
    earlier steps, so it is in a group of its own."""
    path = EVALS_STEPWISE / "house_garden.jsonl"
    source = lines(path)
    rows = read(path)
    assert [r["traj_id"] for r in rows] == [f"{path}:{n}" for n in (1, 2, 3)]
    assert source[1]["input_prompt"] == source[0]["input_prompt"] + source[0]["output_response"]
    assert rows[0]["group_id"] == rows[2]["group_id"] != rows[1]["group_id"]
    assert [r["reward"] for r in rows] == [0.0, 1.0, 0.0]


# -- generator output -------------------------------------------------------------------------


def test_generator_rows_split_into_loss_mask_runs():
    """Each run of 1s of each row is one step; its context is the prompt and the response
    before it; its log-probs are the run's; the trajectory's steps follow its rows."""
    source = lines(STEPWISE) + lines(BATCH)
    rows = read(STEPWISE, BATCH)
    it = iter(rows)
    steps_of: dict[str, int] = {}
    for rec in source:
        mask_runs = runs(rec["loss_masks"]) or [(0, len(rec["response_ids"]))]
        total = sum(rec["rewards"]) if isinstance(rec["rewards"], list) else rec["rewards"]
        got_total = 0.0
        for k, (start, end) in enumerate(mask_runs):
            row = next(it)
            got_total += row["reward"]
            assert row["action_token_ids"] == rec["response_ids"][start:end]
            assert row["prompt_token_ids"] == rec["prompt_token_ids"] + rec["response_ids"][:start]
            if rec.get("rollout_logprobs") is not None:
                assert row["behavior_logprobs"] == rec["rollout_logprobs"][start:end]
            else:
                assert "behavior_logprobs" not in row
            assert row["stop_reason"] == rec["stop_reasons"]
            assert row["global_step"] == rec["global_step"] and row["uid"] == rec["uid"]
            assert row["group_id"] == f"step{rec['global_step']}:{rec['uid']}"
            assert row["loss_mask_empty"] is (not any(rec["loss_masks"]))
            assert row["step_idx"] == steps_of.get(row["traj_id"], 0)
            steps_of[row["traj_id"]] = row["step_idx"] + 1
            last_of_row = k == len(mask_runs) - 1
            assert row["done"] is (last_of_row and rec.get("is_last_step", True))
            if last_of_row:
                assert row["extra"] == {"env_metrics": rec["env_metrics"]}
            if "trajectory_ids" in rec:
                tid = rec["trajectory_ids"]
                assert row["traj_id"] == f"{STEPWISE}:step3:{tid['instance_id']}_{tid['repetition_id']}"
                assert (row["instance_id"], row["repetition_id"]) == (tid["instance_id"], tid["repetition_id"])
            if "trajectory_generation_times" in rec:
                assert row["generation_time_s"] == rec["trajectory_generation_times"]
        assert got_total == total  # a row's rewards are all given to its steps
    assert next(it, None) is None


def test_generator_columns_come_in_the_same_order_whatever_the_hash_seed():
    """The renamed generator fields (stop_reason, generation_time_s) were taken in a set's
    order, which follows PYTHONHASHSEED: the written columns changed order from run to run."""
    import subprocess
    import sys

    code = (
        "from tests.integrations.test_import_skyrl import BATCH, STEPWISE, read\n"
        "row = next(r for r in read(STEPWISE, BATCH) if 'generation_time_s' in r)\n"
        "print([k for k in row if k in ('stop_reason', 'generation_time_s')])"
    )
    orders = set()
    for seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        orders.add(proc.stdout.strip())
    assert orders == {"['stop_reason', 'generation_time_s']"}


def test_generator_rewards_per_step():
    """Per-token rewards: each step takes those from its first token to the next step's;
    the fixture's turns carry 1.0, (0.0, 0.5, 1.0) ... at their last output token. A scalar
    reward goes to the row's last step."""
    by_traj: dict[str, list[float]] = {}
    for row in read(STEPWISE, BATCH):
        by_traj.setdefault(row["traj_id"].rsplit(":", 1)[-1], []).append(row["reward"])
    assert by_traj == {
        "q0_0": [0.0, 1.0],
        "q0_1": [0.0],
        "q1_0": [0.0, 0.5, 1.0],  # the 0.5 sits on the synthetic EOS (mask 0) of step 1
        "q1_1": [0.0, 0.0],
        "1": [0.0, 1.0],  # generator_batch.jsonl line 1: one row, two turns, reward 1.0
        "2": [0.0],  # line 2: loss mask all 0
    }


def test_stepwise_trajectory_repeated_after_its_last_step_gets_a_new_id(tmp_path):
    rec = lines(STEPWISE)[2]  # q0_1: one row, is_last_step
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    ids = [r["traj_id"] for r in read(path)]
    assert ids == [f"{path}:step3:q0_1", f"{path}:step3:q0_1#2"]


def test_stepwise_rows_out_of_turn_order_are_refused(tmp_path):
    """A trajectory's rows swapped (its is_last_step row first) would split it in two; a file
    that ends inside a trajectory is refused the same way, naming the row left open."""
    source = STEPWISE.read_text().splitlines()
    swapped = tmp_path / "swapped.jsonl"
    swapped.write_text("\n".join([source[1], source[0], *source[2:]]) + "\n")
    with pytest.raises(SourceError) as exc:
        read(swapped)
    assert str(exc.value).startswith(
        f"{swapped}: line 2: field 'is_last_step': is false, and no later row continues trajectory q0_0: "
    )
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(source[:4]) + "\n")  # q1_0's first row, without its later turns
    with pytest.raises(SourceError, match=r"cut.jsonl: line 4: .* continues trajectory q1_0: "):
        read(cut)


def test_generator_fields_named_like_columns_are_kept_as_source_names(tmp_path):
    """A row's own scalar field `reward`, `done` or `traj_id` does not replace the value the
    import works out: it is kept as source_<name>, like every other field."""
    rec = lines(BATCH)[0]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**rec, "reward": 99.0, "done": False, "traj_id": "mine", "instance_id": "x"}) + "\n")
    rows = read(path)
    assert [r["reward"] for r in rows] == [0.0, 1.0] and [r["done"] for r in rows] == [False, True]
    assert {r["traj_id"] for r in rows} == {f"{path}:1"}
    for r in rows:
        assert (r["source_reward"], r["source_done"], r["source_traj_id"]) == (99.0, False, "mine")
        assert r["source_instance_id"] == "x"


@dataclass
class _TID:
    instance_id: str
    repetition_id: int


def test_write_generator_output_one_line_per_row(tmp_path):
    out = {
        "prompt_token_ids": [[1], [1]],
        "response_ids": [[2, 3], [4]],
        "rewards": [1.0, 0.0],
        "loss_masks": [[1, 1], [1]],
        "stop_reasons": ["stop", "stop"],
        "rollout_logprobs": None,
        "trajectory_ids": [_TID("a", 0), _TID("a", 1)],
        "is_last_step": [True, True],
        "rollout_metrics": {"x": 1.0},
    }
    path = tmp_path / "g.jsonl"
    assert skyrl.write_generator_output(path, out, ["a", "a"], global_step=2) == 2
    written = lines(path)
    assert written[1] == {
        "global_step": 2,
        "uid": "a",
        "prompt_token_ids": [1],
        "response_ids": [4],
        "rewards": 0.0,
        "loss_masks": [1],
        "stop_reasons": "stop",
        "is_last_step": True,
        "trajectory_ids": {"instance_id": "a", "repetition_id": 1},
    }
    with pytest.raises(ValueError, match="uids has 1 entries for 2"):
        skyrl.write_generator_output(path, out, ["a"])


# -- older releases (versions/<release>/, written by that release's own code) ------------------


@pytest.mark.parametrize("name", VERSION_FILES, ids=str)
def test_older_release_writes_the_same_records_less_the_fields_it_lacks(name):
    """skyrl 0.1.0-0.3.0 dump the same eval lines as 0.4.0 (the same dump_per_dataset_eval_results);
    their generator rows lack the GeneratorOutput fields the release does not declare; their
    aggregated metrics lack some generate/* ones (all of them for a step-wise run)."""
    release, rel = name.parts[0], Path(*name.parts[1:])
    old, new = lines(DATA / "versions" / name), lines(DATA / rel)
    assert len(old) == len(new) > 0
    for o, n in zip(old, new):
        if rel.name == "aggregated_results.jsonl":
            assert o.items() <= n.items()
            assert all(k in o for k in n if "/generate/" not in k)
        else:
            assert o == {k: v for k, v in n.items() if k not in RELEASES[release]}


@pytest.mark.parametrize("name", [n for n in VERSION_FILES if n.name != "aggregated_results.jsonl"], ids=str)
def test_older_release_imports_as_the_040_fixture_less_the_fields_it_lacks(name):
    release, rel = name.parts[0], Path(*name.parts[1:])
    old_path, new_path = DATA / "versions" / name, DATA / rel
    got, want = read(old_path), read(new_path)
    assert len(got) == len(want) > 0
    lacks = RELEASES[release]
    for g, w in zip(got, want):
        g = {k: v.replace(str(old_path), str(new_path)) if isinstance(v, str) else v for k, v in g.items()}
        if "trajectory_generation_times" in lacks:
            w.pop("generation_time_s", None)
        if "env_metrics" in lacks and w.get("extra", {}).keys() == {"env_metrics"}:
            del w["extra"]
        assert g == w


# -- bad input --------------------------------------------------------------------------------

GOOD = lines(STEPWISE)[0]
N = len(GOOD["response_ids"])


@pytest.mark.parametrize(
    ("change", "field", "rule"),
    [
        ({"loss_masks": [1, 1]}, "loss_masks", f"has 2 values for {N} response_ids"),
        ({"rewards": "abc"}, "rewards", 'must be a number or a list, got "abc"'),
        ({"rewards": [0.0, "x"] + [0.0] * (N - 2)}, "rewards[1]", "must be a number"),
        ({"response_ids": [1, 2.5] + [3] * (N - 2)}, "response_ids[1]", "must be an integer, got 2.5"),
        ({"rollout_logprobs": [0.0]}, "rollout_logprobs", f"has 1 values for {N} response_ids"),
        ({"trajectory_ids": "q0_0"}, "trajectory_ids", "must be an object"),
        ({"trajectory_ids": {"instance_id": "q0"}}, "trajectory_ids.repetition_id", "missing"),
        ({"is_last_step": "yes"}, "is_last_step", "must be true or false"),
        ({"prompt_token_ids": None}, "prompt_token_ids", "must be a list, got null"),
    ],
)
def test_bad_generator_row_names_file_line_field(tmp_path, change, field, rule):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **change}) + "\n")
    with pytest.raises(SourceError) as exc:
        read(path)
    assert str(exc.value).startswith(f"{path}: line 2: field '{field}': {rule}")


def test_bad_eval_line_and_unknown_record(tmp_path):
    path = tmp_path / "ds.jsonl"
    path.write_text(json.dumps({"input_prompt": "p", "output_response": "r", "score": None}) + "\n")
    with pytest.raises(SourceError, match=r"ds.jsonl: line 1: field 'score': must be a number or a list, got null"):
        read(path)
    path.write_text('{"foo": 1}\n')
    with pytest.raises(SourceError, match=r"line 1: neither a SkyRL eval dump line"):
        read(path)
    path.write_text("{not json\n")
    with pytest.raises(SourceError, match=r"line 1: not valid JSON"):
        read(path)


def test_eval_fields_named_like_columns_gaca_writes_are_kept_as_source_names(tmp_path):
    """Nothing the dump holds is dropped: `traj_id` or `extra` in a line do not replace the
    row's own; a line with both `extra` and `source_extra` is refused."""
    path = tmp_path / "ds.jsonl"
    line = {
        "input_prompt": "p",
        "output_response": "r",
        "score": 1,
        "traj_id": "mine",
        "extra": 3,
        "env_extras": {"a": 1},
    }
    path.write_text(json.dumps(line) + "\n")
    (row,) = read(path)
    assert row["traj_id"] == f"{path}:1" and row["source_traj_id"] == "mine"
    assert row["source_extra"] == 3 and row["extra"] == {"env_extras": {"a": 1}}
    path.write_text(json.dumps({**line, "source_extra": 4}) + "\n")
    with pytest.raises(SourceError, match=r"ds.jsonl: line 1: field 'extra': is kept as 'source_extra'"):
        read(path)


# -- the command ------------------------------------------------------------------------------


OLDEST = DATA / "versions" / "0.1.0"


@pytest.mark.parametrize(
    "source",
    [
        EVALS,
        EVAL_ONLY,
        EVALS_STEPWISE,
        STEPWISE,
        BATCH,
        OLDEST / "dumped_evals" / "global_step_5_evals",
        OLDEST / "generator_stepwise.jsonl",
    ],
)
def test_cli_import_writes_a_valid_log(tmp_path, source):
    out = tmp_path / "log.parquet"
    import_json("skyrl", source, out=out)
    table = pq.read_table(out).to_pylist()
    expected = read(*(sorted(p for p in source.iterdir() if p.suffix == ".jsonl") if source.is_dir() else [source]))
    assert len(table) == len(expected)
    key = lambda r: (r["traj_id"], r["step_idx"])  # noqa: E731
    for got, want in zip(sorted(table, key=key), sorted(expected, key=key)):
        for col in ("group_id", "reward", "done", "prompt", "action", "prompt_token_ids", "action_token_ids"):
            if col in want:
                assert got[col] == want[col], col
        if "extra" in want:
            assert json.loads(got["extra"]) == want["extra"]
    res = gaca("validate", out, "--for", "score")
    assert res.exit_code == 0, res.output


def test_cli_bad_input_one_error_line_and_no_output(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**GOOD, "rewards": "abc"}) + "\n")
    out = tmp_path / "log.parquet"
    res = gaca("import", "--from", "skyrl", path, "-o", out)
    line = error_line(res)
    assert "rows.jsonl: line 1: field 'rewards'" in line
    assert not out.exists()


def test_cli_refuses_mixed_kinds(tmp_path):
    out = tmp_path / "log.parquet"
    res = gaca("import", "--from", "skyrl", EVALS, BATCH, "-o", out)
    assert "generator_batch.jsonl: line 1: a generator output record after eval dump records" in error_line(res)
    assert not out.exists()
