"""Re-record the `gaca import --from rllm` fixtures with rLLM's own serialisers.

rLLM is not on the package index these machines reach, so this script imports rLLM's classes
from a source tree given as the first argument (default /tmp/fw/src/rllm): `rllm/agents/agent.py`
(`Step`, `Trajectory`, `Episode` and their `to_dict`) and `rllm/utils/episode_logger.py`
(`EpisodeLogger`, what rLLM's trainer runs with `trainer.log_episodes=true`), copied from
rllm-org/rllm (see README.md here for the commits), plus the `TerminationReason` enum of
`rllm/workflows/workflow.py` and `ToolCall`/`ToolOutput` of `rllm/tools/tool_base.py`.

    python3 tests/data/rllm/make_fixture.py /tmp/fw/src/rllm

The episodes are built as rLLM's multi-turn agents build them (each step's `chat_completions`
is the chat so far, ending with the model's answer; `observation` the environment's state;
`action` the parsed action), with the trajectory reward set as `Workflow.compute_trajectory_reward`
sets it (the sum of the step rewards). They are written twice:

- `episodes/train_step_3_epoch_0/*.json` (+ `batch_summary.json`) by
  `EpisodeLogger.log_episodes_batch(episodes, step=3, mode="train", epoch=0)`;
- `to_dict/<episode id>.json`: `json.dumps(episode.to_dict())`, rLLM's full serialisation
  (token ids, log-probs, advantages), as a script that saves episodes writes it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/tmp/fw/src/rllm")

from rllm.agents.agent import Episode, Step, Trajectory  # noqa: E402
from rllm.utils.episode_logger import EpisodeLogger  # noqa: E402
from rllm.workflows.workflow import TerminationReason  # noqa: E402

SYSTEM = {"role": "system", "content": "You walk on a frozen lake. Answer with LEFT, RIGHT, UP or DOWN."}
GRIDS = {
    (0, 0): "S F\nF G\nYou are at S.",
    (0, 1): "S P\nF G\nYou are at P.",
    (1, 0): "S F\nP G\nYou are at P.",
    (1, 1): "S F\nF P\nYou reached the goal.",
}
MOVES = {"RIGHT": (0, 1), "DOWN": (1, 0), "LEFT": (0, -1), "UP": (-1, 0)}


def walk(moves: list[str], token_base: int, reach_goal: bool) -> Trajectory:
    """One FrozenLake trajectory: a step per move, the reward 1 on reaching the goal."""
    chat = [SYSTEM]
    position = (0, 0)
    steps = []
    for i, move in enumerate(moves):
        observation = GRIDS[position]
        chat = [*chat, {"role": "user", "content": observation}]
        answer = f"<think>go {move.lower()}</think>```{move}```"
        chat = [*chat, {"role": "assistant", "content": answer}]
        dr, dc = MOVES[move]
        position = (min(max(position[0] + dr, 0), 1), min(max(position[1] + dc, 0), 1))
        last = i == len(moves) - 1
        steps.append(
            Step(
                prompt_ids=[token_base + i, 11, 12],
                response_ids=[token_base + 100 + i, 21],
                logprobs=[-0.25 * (i + 1), -0.5],
                chat_completions=chat,
                observation=observation,
                thought=f"go {move.lower()}",
                action=move,
                model_response=answer,
                info={"timing": {"llm_s": 0.5 + i}},
                reward=1.0 if (last and reach_goal) else 0.0,
                done=last and reach_goal,
                mc_return=1.0 if reach_goal else 0.0,
                advantage=0.5 if reach_goal else -0.5,
                weight_version=2,
            )
        )
    trajectory = Trajectory(name="frozenlake_agent", task={"map": "2x2", "seed": 3}, steps=steps)
    trajectory.reward = float(sum(s.reward for s in steps))  # Workflow.compute_trajectory_reward
    trajectory.info = {"timing": {"total_s": 2.0}}
    return trajectory


def solver_judge(rollout: int, correct: bool) -> Episode:
    """A two-agent episode: a solver's answer and a judge's verdict, one step each."""
    question = {"role": "user", "content": "What is 17 + 25?"}
    answer = "42" if correct else "43"
    solver = Trajectory(
        name="solver",
        task={"question": "What is 17 + 25?", "ground_truth": "42"},
        steps=[
            Step(
                chat_completions=[question, {"role": "assistant", "content": answer}],
                model_response=answer,
                action=answer,
                reward=1.0 if correct else 0.0,
                done=True,
            )
        ],
    )
    judge = Trajectory(
        name="judge",
        steps=[
            Step(
                chat_completions=[
                    {"role": "user", "content": f"Is {answer} the sum of 17 and 25? Say yes or no."},
                    {"role": "assistant", "content": "yes" if correct else "no"},
                ],
                model_response="yes" if correct else "no",
                reward=1.0,
                done=True,
            )
        ],
    )
    for t in (solver, judge):
        t.reward = float(sum(s.reward for s in t.steps))
    return Episode(
        id=f"math-17:{rollout}",
        task={"question": "What is 17 + 25?", "ground_truth": "42"},
        termination_reason=TerminationReason.ENV_DONE,
        is_correct=correct,
        trajectories=[solver, judge],
        metrics={"solver_acc": 1.0 if correct else 0.0, "judge_acc": 1.0},
    )


def episodes() -> list[Episode]:
    lake = {"map": "2x2", "seed": 3}
    out = []
    for rollout, (moves, goal, reason) in enumerate(
        [
            (["RIGHT", "DOWN"], True, TerminationReason.ENV_DONE),
            (["LEFT", "DOWN", "RIGHT"], True, TerminationReason.ENV_DONE),
            (["UP", "LEFT"], False, TerminationReason.MAX_TURNS_EXCEEDED),
        ]
    ):
        trajectory = walk(moves, 1000 * (rollout + 1), goal)
        out.append(
            Episode(
                id=f"lake-3:{rollout}",
                task=lake,
                termination_reason=reason,
                is_correct=goal,
                trajectories=[trajectory],
                metrics={"frozenlake_agent_acc": trajectory.reward},
                info={"timing": {"episode_s": 3.0 + rollout}},
            )
        )
    out += [solver_judge(0, True), solver_judge(1, False)]
    return out


def main() -> None:
    tmp = HERE / "_tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    logger = EpisodeLogger(str(tmp))
    logger.log_episodes_batch(episodes(), step=3, mode="train", epoch=0)
    shutil.rmtree(HERE / "episodes", ignore_errors=True)
    shutil.copytree(tmp / "episodes", HERE / "episodes")
    shutil.rmtree(tmp)

    target = HERE / "to_dict"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir()
    for episode in episodes():
        name = episode.id.replace(":", "_") + ".json"
        (target / name).write_text(json.dumps(episode.to_dict(), indent=2) + "\n")
    print("written under", HERE)


if __name__ == "__main__":
    main()
