"""TextWorld logs (examples/textworld/): a real environment's rollouts pass every check.

One small game (3 rooms, 4 objects, a 3-command quest, generation seed 0) is compiled
offline once per session. Skipped when the optional `textworld` package is missing.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textworld", reason="the optional `textworld` package is not installed (pip install textworld)")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:jericho")  # "unsupported game": harmless

ROOT = Path(__file__).resolve().parents[2]
TW_DIR = ROOT / "examples" / "textworld"


from gaca_cli.demo import textworld_games as tw  # noqa: E402


@pytest.fixture(scope="module")
def game(tmp_path_factory) -> tuple[str, Path]:
    spec = tw.GameSpec(seed=0, rooms=3, objects=4, quest_length=3)
    return spec.name, tw.make_game(spec, tmp_path_factory.mktemp("tw-games"))


def _check(table, tmp_path: Path, command: str):
    import pyarrow.parquet as pq

    from gaca_cli.log.checks import prepare_log
    from gaca_cli.log.reading import read_log

    path = tmp_path / "log.parquet"
    pq.write_table(table, path)
    return prepare_log(read_log([path]), command)


def test_scripted_log_is_valid_with_repeated_anchors(game, tmp_path):
    table = tw.collect([game], tw.ScriptedPolicy(epsilon=0.4, seed=3), n_rollouts=6, max_steps=8, seed=5)
    index, warnings = _check(table, tmp_path, "advantages:gigpo")
    rows = table.to_pylist()
    assert index.n_groups == 1 and index.n_traj == 6
    assert warnings["singleton_groups"] == 0 and warnings["differing_initial_anchors"] == 0
    assert warnings["empty_anchors"] == 0
    # anchors repeat across rollouts (GiGPO's step groups are not all singletons)
    anchors: dict[str, set[str]] = {}
    for r in rows:
        anchors.setdefault(r["anchor_obs"], set()).add(r["traj_id"])
    assert max(len(t) for t in anchors.values()) == 6  # at least the initial state
    assert sum(len(t) > 1 for t in anchors.values()) >= 2
    # rewards are score deltas: a won rollout earns the quest's point on its last step
    by_traj: dict[str, list[dict]] = {}
    for r in rows:
        by_traj.setdefault(r["traj_id"], []).append(r)
    for traj in by_traj.values():
        traj.sort(key=lambda r: r["step_idx"])
        won = traj[-1]["success"]
        assert [r["done"] for r in traj] == [False] * (len(traj) - 1) + [won]
        assert sum(r["reward"] for r in traj) == (1.0 if won else 0.0)
        assert all(r["episode_reward"] == (1.0 if won else 0.0) for r in traj)
        # the prompt is an append-only history
        for a, b in zip(traj, traj[1:]):
            assert b["prompt"].startswith(a["prompt"] + a["action"] + tw.END_OF_TURN)
        assert "TextWorld" not in traj[0]["anchor_obs"]  # no banner, no history in anchors
    assert any(r["success"] for r in rows) and len(rows) > 6


def test_scripted_logprobs_are_the_epsilon_greedy_probabilities(game, tmp_path):
    eps = 0.4
    table = tw.collect([game], tw.ScriptedPolicy(epsilon=eps, seed=1), n_rollouts=4, max_steps=6, seed=0)
    for r in table.to_pylist():
        lp = r["behavior_logprobs"]
        assert all(x == 0.0 for x in lp[1:])  # the command's log-probability sits on its first token
        assert r["is_action_valid"] or r["command"] == r["expert_command"]
        # π(a) = (1-ε)[a = expert] + ε/|A| for an admissible a (A is not logged; infer |A|)
        p = math.exp(lp[0])
        if r["command"] == r["expert_command"]:
            assert p > 1 - eps
        else:
            assert p < eps and round(eps / p) == pytest.approx(eps / p, abs=1e-4)


def test_collect_is_deterministic_and_seeded(game):
    a = tw.collect([game], tw.ScriptedPolicy(0.5, seed=0), 3, 6, seed=11)
    b = tw.collect([game], tw.ScriptedPolicy(0.5, seed=0), 3, 6, seed=11)
    c = tw.collect([game], tw.ScriptedPolicy(0.5, seed=0), 3, 6, seed=12)
    assert a.equals(b)
    assert a["group_id"][0].as_py().endswith("@11") and c["group_id"][0].as_py().endswith("@12")


def test_game_command_is_safe_for_the_interpreter():
    # TextWorld's interpreter crashes on non-ASCII input and treats backslashes as escapes
    assert tw.game_command("go\u00e9 north\\f\n\x14") == "go north f"
    assert tw.game_command("\ufffd\ufffd") == "look"
    assert len(tw.game_command("x" * 500)) == tw.MAX_COMMAND_CHARS


def test_lm_policy_log_matches_a_plain_forward(game, tiny_llama, tmp_path):
    """--model: sampled commands (junk, from random weights) with token ids and log-probs that
    equal log_softmax of a plain unpadded forward over prompt_token_ids + action_token_ids."""
    import torch
    from transformers import AutoModelForCausalLM

    policy = tw.LMPolicy(tiny_llama, max_new_tokens=6, seed=0)
    table = tw.collect([game], policy, n_rollouts=3, max_steps=3, seed=0)
    index, warnings = _check(table, tmp_path, "advantages:gigpo")
    assert index.n_traj == 3 and warnings["differing_initial_anchors"] == 0
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    rows = table.to_pylist()
    for r in rows:
        ctx, act = r["prompt_token_ids"], r["action_token_ids"]
        assert 1 <= len(act) <= 6 and len(act) == len(r["behavior_logprobs"])
        with torch.no_grad():
            logits = model(torch.tensor([ctx + act])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(ctx) - 1 : len(ctx) + len(act) - 1].gather(
            1, torch.tensor(act)[:, None]
        )[:, 0]
        np.testing.assert_allclose(r["behavior_logprobs"], ref.numpy(), atol=1e-4)
    # token-level append-only history: step t's context + action is a prefix of step t+1's
    by_traj: dict[str, list[dict]] = {}
    for r in rows:
        by_traj.setdefault(r["traj_id"], []).append(r)
    for traj in by_traj.values():
        traj.sort(key=lambda r: r["step_idx"])
        for a, b in zip(traj, traj[1:]):
            assert b["prompt_token_ids"][: len(a["prompt_token_ids"]) + len(a["action_token_ids"])] == (
                a["prompt_token_ids"] + a["action_token_ids"]
            )
            assert b["prompt"].startswith(a["prompt"] + a["action"] + tw.END_OF_TURN)


@pytest.mark.slow
def test_loop_runs_one_tiny_iteration(game, tiny_llama, tmp_path):
    """loop.py end to end with the tiny random model: collect → score → advantages → (train)
    → collect. The random model never wins, so every advantage is 0 and the loop keeps the
    model (train-offline refuses an all-zero log); the files of each stage must exist."""
    import json
    import subprocess

    out = tmp_path / "loop"
    games_dir = Path(str(game[1])).parent
    proc = subprocess.run(
        [
            sys.executable,
            str(TW_DIR / "loop.py"),
            "--out",
            str(out),
            "--start-model",
            str(tiny_llama),
            "--games",
            "1",
            "--games-dir",
            str(games_dir),
            "--rollouts",
            "3",
            "--max-steps",
            "2",
            "--max-new-tokens",
            "4",
            "--iterations",
            "1",
            "--methods",
            "gaca",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert list(results["success"]) == ["gaca"] and len(results["success"]["gaca"]["0"]) == 2
    work = out / "seed0" / "gaca" / "iter0"
    assert (out / "seed0" / "iter0.parquet").exists()
    assert (work / "scored.parquet").exists() and (work / "advantages.parquet").exists()
    assert (out / "seed0" / "gaca" / "iter1" / "rollouts.parquet").exists()
    assert "success" in proc.stdout or "gaca" in proc.stdout
