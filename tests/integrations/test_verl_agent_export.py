"""`export_rollout` on batches shaped like verl-agent's rollout loop, then `--from verl-agent`.

verl-agent is not on the package registry, so the step dicts are built here the way
`TrajectoryCollector.vanilla_multi_turn_loop` (agent_system/multi_turn_rollout/rollout_loop.py)
builds them: `to_list_of_dict` of the step's DataProto, that is one row of each tensor (left-padded
`prompts`, right-padded `responses`, `attention_mask` over both, `input_ids`, `position_ids`,
`rollout_log_probs`) and one element of each numpy object array (`uid`, `traj_uid`, `anchor_obs`,
`rewards`, `active_masks`, `is_action_valid`, `index`, `data_source`)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from gaca_cli.errors import GacaError
from gaca_cli.integrations.imports import verl_agent
from gaca_cli.integrations.imports.base import ImportOptions
from gaca_cli.integrations.verl_agent import export_rollout
from tests.integrations.cli_helpers import error_line, gaca, import_json
from tests.lm.tiny_models import build_tokenizer

PAD = 1
OBS = ["Hall. A key lies on the floor.", "Hall. You carry a key.", "Open door."]
ACTIONS = [["take key", "open door with key", "go to garden"], ["go to kitchen", "look around", "look around"]]
REWARDS = [[0.0, 0.0, 1.0], [0.0, -0.1, -0.1]]
ACTIVE = [[True, True, True], [True, True, False]]  # environment 1 ended after step 1


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _rollout(tok, tensor, with_logprobs=True) -> tuple[list[list[dict]], np.ndarray]:
    """Two environments of one group, three loop steps, as vanilla_multi_turn_loop returns them."""
    as_tensor = torch.tensor if tensor == "torch" else np.array
    uid = np.array(["group-1", "group-1"], dtype=object)
    traj_uid = np.array(["traj-a", "traj-b"], dtype=object)
    total: list[list[dict]] = [[], []]
    for t in range(3):
        prompts = [tok.encode(f"<|user|>{OBS[t]}\n<|assistant|>") for _ in range(2)]
        responses = [tok.encode(ACTIONS[e][t]) + [tok.eos_token_id] for e in range(2)]
        width_p, width_r = max(map(len, prompts)) + 1, max(map(len, responses)) + 2
        rewards = np.array([REWARDS[e][t] for e in range(2)], dtype=np.float32).astype(object)
        active = np.array([ACTIVE[e][t] for e in range(2)]).astype(object)
        for e in range(2):
            p, r = prompts[e], responses[e]
            padded_p = [PAD] * (width_p - len(p)) + p
            padded_r = r + [PAD] * (width_r - len(r))
            mask = [0] * (width_p - len(p)) + [1] * len(p) + [1] * len(r) + [0] * (width_r - len(r))
            step = {
                "prompts": as_tensor(padded_p),
                "responses": as_tensor(padded_r),
                "input_ids": as_tensor(padded_p + padded_r),
                "attention_mask": as_tensor(mask),
                "position_ids": as_tensor(list(range(len(mask)))),
                "anchor_obs": np.array(OBS, dtype=object)[t],
                "index": e,
                "data_source": "alfworld",
                "uid": uid[e],
                "traj_uid": traj_uid[e],
                "is_action_valid": np.bool_(e == 0 or t == 0),
                "rewards": rewards[e],
                "active_masks": active[e],
                "won": {"room": "hall"},
            }
            if with_logprobs:
                lp = [-0.5 - 0.01 * i for i in range(len(r))] + [0.0] * (width_r - len(r))
                step["rollout_log_probs"] = as_tensor(np.array(lp, dtype=np.float32))
            total[e].append(step)
    episode_rewards = np.array([sum(r for r, a in zip(REWARDS[e], ACTIVE[e], strict=True) if a) for e in range(2)])
    return total, episode_rewards.astype(np.float32)


def _read(path) -> list[dict]:
    return list(verl_agent.read([path], ImportOptions()))


@pytest.mark.parametrize("tensor", ["torch", "numpy"])
@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
def test_every_active_step_becomes_a_row_with_every_value(tmp_path, tok, tensor, file_format):
    total, episode_rewards = _rollout(tok, tensor)
    path = export_rollout(tmp_path, total, episode_rewards, tok, global_step=7, file_format=file_format)
    assert path.parent == tmp_path and path.name.startswith("rollout-000007-") and path.suffix == f".{file_format}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    rows = _read(path)
    assert [(r["traj_id"], r["step_idx"]) for r in rows] == [
        ("traj-a", 0),
        ("traj-a", 1),
        ("traj-a", 2),
        ("traj-b", 0),
        ("traj-b", 1),
    ]
    for row in rows:
        e, t = (0 if row["traj_id"] == "traj-a" else 1), row["step_idx"]
        assert row["group_id"] == "group-1"
        assert row["reward"] == pytest.approx(REWARDS[e][t])
        assert row["episode_reward"] == pytest.approx([1.0, -0.1][e])
        assert row["anchor_obs"] == OBS[t]
        prompt_ids = tok.encode(f"<|user|>{OBS[t]}\n<|assistant|>")
        action_ids = tok.encode(ACTIONS[e][t]) + [tok.eos_token_id]
        assert row["prompt_token_ids"] == prompt_ids and row["action_token_ids"] == action_ids
        assert row["prompt"] == f"<|user|>{OBS[t]}\n<|assistant|>"
        assert row["action"] == ACTIONS[e][t]
        assert row["behavior_logprobs"] == pytest.approx([-0.5 - 0.01 * i for i in range(len(action_ids))], rel=1e-6)
        assert row["is_action_valid"] is (e == 0 or t == 0)
        assert row["index"] == e and row["data_source"] == "alfworld" and row["global_step"] == 7
        assert row["extra"] == {"won": {"room": "hall"}}
        assert "input_ids" not in row and "position_ids" not in row and "rewards" not in row
    done = {(r["traj_id"], r["step_idx"]): r["done"] for r in rows}
    # traj-b ended (a later inactive step); traj-a ran every loop step: not known to be done
    assert done == {
        ("traj-a", 0): False,
        ("traj-a", 1): False,
        ("traj-a", 2): False,
        ("traj-b", 0): False,
        ("traj-b", 1): True,
    }


def test_max_steps_tells_an_environment_that_ended_at_the_last_loop_step(tmp_path, tok):
    """The loop stops once every environment is done: with max_steps (env.max_steps) above
    the loop's 3 steps, traj-a ended at its last step too; at 3 it may have been cut. Image
    inputs (multi_modal_inputs) are left out, not written as text."""
    total, episode_rewards = _rollout(tok, "numpy")
    for steps in total:
        for step in steps:
            step["multi_modal_inputs"] = {"pixel_values": np.zeros((2, 3), dtype=np.float32)}
    for max_steps, traj_a_done in ((50, True), (3, False), (None, False)):
        out = tmp_path / str(max_steps)
        rows = _read(export_rollout(out, total, episode_rewards, tok, max_steps=max_steps))
        done = {(r["traj_id"], r["step_idx"]): r["done"] for r in rows}
        assert done[("traj-a", 2)] is traj_a_done and done[("traj-b", 1)] is True
        assert not any(done[("traj-a", t)] for t in (0, 1))
        assert all("multi_modal_inputs" not in row and "multi_modal_inputs" not in row.get("extra", {}) for row in rows)


def test_without_tokenizer_or_logprobs_the_text_and_logprob_columns_are_absent(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy", with_logprobs=False)
    rows = _read(export_rollout(tmp_path, total, episode_rewards))
    assert all("prompt" not in r and "action" not in r and "behavior_logprobs" not in r for r in rows)
    assert all("global_step" not in r for r in rows)
    assert rows[0]["action_token_ids"] == tok.encode(ACTIONS[0][0]) + [tok.eos_token_id]


def test_non_text_anchors_are_written_as_json(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy")
    for e in range(2):
        for t, step in enumerate(total[e]):
            step["anchor_obs"] = np.array([t, 1])
    rows = _read(export_rollout(tmp_path, total, episode_rewards))
    assert [r["anchor_obs"] for r in rows[:3]] == ["[0, 1]", "[1, 1]", "[2, 1]"]


def test_step_keys_named_like_gaca_columns_are_kept_apart(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy")
    total[0][0]["reward"] = 9.0
    rows = _read(export_rollout(tmp_path, total, episode_rewards, file_format="jsonl"))
    assert rows[0]["source_reward"] == 9.0 and rows[0]["reward"] == 0.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda total, er: total[1][0].pop("traj_uid"), "environment 1, step 0: the step has no 'traj_uid'"),
        (lambda total, er: total[0][1].update(rewards="x"), "environment 0, step 1: 'rewards' must be a number"),
        (
            lambda total, er: total[0][0].update(attention_mask=np.ones(3)),
            "environment 0, step 0: 'attention_mask' has 3 values",
        ),
        (
            lambda total, er: total[0][0].update(rollout_log_probs=np.zeros(2)),
            "environment 0, step 0: 'rollout_log_probs' has 2 values",
        ),
        (lambda total, er: total[0][0].update(prompts=np.zeros((2, 2))), "'prompts' must be one row's 1-D tensor"),
        (lambda total, er: total[0][0].update(active_masks=False), "environment 0: an active step follows"),
    ],
)
def test_bad_batches_name_the_environment_step_and_key(tmp_path, tok, change, message):
    total, episode_rewards = _rollout(tok, "numpy")
    change(total, episode_rewards)
    with pytest.raises(ValueError, match=message):
        export_rollout(tmp_path, total, episode_rewards)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy")
    with pytest.raises(ValueError, match="episode_rewards has 1 values for 2 environments"):
        export_rollout(tmp_path, total, episode_rewards[:1])
    with pytest.raises(ValueError, match="file_format must be one of parquet, jsonl"):
        export_rollout(tmp_path, total, episode_rewards, file_format="csv")


def test_exporter_does_not_import_torch():
    code = (
        "import sys; import gaca_cli.integrations.verl_agent.export as e; "
        "from gaca_cli.integrations.verl_agent import export_rollout; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_parquet_file_records_its_source(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy")
    path = export_rollout(tmp_path, total, episode_rewards, global_step=3)
    meta = json.loads(pq.read_schema(path).metadata[b"gaca.export"])
    assert meta == {"source": "verl-agent", "rows": 5, "global_step": 3}


# --- the importer on bad files -------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"traj_id": None}, "field 'traj_id': missing: not a file of export_rollout"),
        ({"group_id": 3}, "field 'group_id': must be a string, got 3"),
        ({"step_idx": -1}, "field 'step_idx': must be an integer >= 0, got -1"),
        ({"reward": "1"}, "field 'reward': must be a number, got \"1\""),
        ({"done": 1}, "field 'done': must be true or false, got 1"),
        ({"anchor_obs": 5}, "field 'anchor_obs': must be a string, got 5"),
        ({"action_token_ids": [1.5]}, "field 'action_token_ids': must be a list of integers"),
        ({"behavior_logprobs": [0.0]}, "field 'behavior_logprobs': has 1 values for"),
        ({"extra": "{"}, "field 'extra': not valid JSON"),
        ({"extra": '{"a": "\\ud800"}'}, "field 'a': not valid Unicode"),  # in extra: was a UnicodeEncodeError
    ],
)
def test_a_bad_exported_row_names_file_line_and_field(tmp_path, tok, change, message):
    total, episode_rewards = _rollout(tok, "numpy")
    path = export_rollout(tmp_path, total, episode_rewards, file_format="jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1].update(change)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(GacaError) as err:
        _read(path)
    assert str(err.value).startswith(f"{path}: line 2: {message}"), str(err.value)


# --- the command ---------------------------------------------------------------------------


def test_gaca_import_from_verl_agent_then_gigpo(tmp_path, tok):
    out_dir = tmp_path / "export"
    for step in (1, 2):
        total, episode_rewards = _rollout(tok, "torch")
        for e in range(2):
            for s in total[e]:
                s["uid"], s["traj_uid"] = f"g{step}", f"t{step}-{e}"
        export_rollout(
            out_dir, total, episode_rewards, tok, global_step=step, file_format="jsonl" if step == 1 else "parquet"
        )
    out = tmp_path / "log.parquet"
    summary = import_json("verl-agent", out_dir, out=out, more=("--for", "advantages:gaca"))
    assert summary
    log = pq.read_table(out).to_pylist()
    assert len(log) == 10 and {r["group_id"] for r in log} == {"g1", "g2"}
    assert gaca("validate", out, "--for", "score").exit_code == 0
    res = gaca("advantages", out, "--method", "gigpo", "-o", tmp_path / "adv.parquet")
    assert res.exit_code == 0, res.output
    adv = pq.read_table(tmp_path / "adv.parquet").to_pylist()
    # step 0 of both trajectories shares the anchor OBS[0]: one step group of size 2 per group
    assert {r["step_group_size"] for r in adv if r["step_idx"] == 0} == {2}


def test_gaca_import_from_verl_agent_bad_file_writes_nothing(tmp_path, tok):
    total, episode_rewards = _rollout(tok, "numpy")
    src = tmp_path / "export"
    path = export_rollout(src, total, episode_rewards, file_format="jsonl")
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace('"reward": ', '"reward": "x", "was": ')
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.parquet"
    line = error_line(gaca("import", "--from", "verl-agent", src, "-o", out))
    assert f"{path.name}: line 4: field 'reward': must be a number" in line
    assert not out.exists()
