"""Re-record the `gaca import --from art` fixtures with OpenPipe ART's own writers.

Run with a Python that has openpipe-art installed (never the project's venv):

    python3 -m venv /tmp/fw/art
    /tmp/fw/art/bin/pip install openpipe-art==0.5.18 pyarrow
    LITELLM_LOCAL_MODEL_COST_MAP=True /tmp/fw/art/bin/python tests/data/art/make_fixture.py

It builds a few `art.TrajectoryGroup`s the way a rollout function does (openai `Choice`s for
the policy's sampled turns, plain dicts for the other messages, tool calls, metrics,
metadata, logs) and hands them to ART itself:

- `art.Model.log(groups, split=..., step=...)`, which writes
  `<base>/<project>/models/<name>/trajectories/<split>/<step:04d>.parquet` with
  `art.utils.trajectory_logging.write_trajectory_groups_parquet`;
- `art.utils.trajectory_migration.serialize_trajectory_groups`, the JSONL writer of ART
  before 0.5 (kept by ART to migrate old runs), into `legacy/trajectories/train/0000.jsonl`.

`history.jsonl`, which `Model.log` also writes (aggregate metrics only), is removed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art  # noqa: E402
from art.utils.trajectory_migration import serialize_trajectory_groups  # noqa: E402
from fixture_chat import TOOLS, chat  # noqa: E402
from fixture_chat import few_shot as few_shot_chat  # noqa: E402

HERE = Path(__file__).parent


def rollout(task: str, moves: list[str], reward: float, won: bool) -> art.Trajectory:
    """A chat: system, task, then per move a sampled assistant turn and the game's answer;
    the first move is a tool call (look) answered by a tool message."""
    messages = chat(task, moves)
    trajectory = art.Trajectory(
        messages_and_choices=messages,
        tools=TOOLS,
        reward=reward,
        metrics={"won": won, "moves": len(moves)},
        metadata={"task": task, "seed": 7},
    )
    trajectory.log(f"finished after {len(moves)} moves")
    return trajectory


def groups_step0() -> list[art.TrajectoryGroup]:
    open_door = art.TrajectoryGroup(
        [
            rollout("open the door", ["take key", "open door"], 1.0, True),
            rollout("open the door", ["go east", "wait", "go west"], 0.0, False),
        ],
        metadata={"task_id": "door-1"},
        metrics={"difficulty": 2},
        logs=["group door-1 done"],
    )
    few_shot = art.Trajectory(
        messages_and_choices=few_shot_chat(),
        reward=0.5,
        metrics={"won": False},
    )
    north = art.TrajectoryGroup([few_shot, rollout("go north", ["go north"], 1.0, True)])
    return [open_door, north]


def groups_val_step1() -> list[art.TrajectoryGroup]:
    return [art.TrajectoryGroup([rollout("open the door", ["open door"], -0.5, False)], metadata={"task_id": "door-1"})]


async def main() -> None:
    base = HERE / "_run"
    shutil.rmtree(base, ignore_errors=True)
    model = art.Model(name="agent-001", project="gaca-fixture", base_path=str(base))
    await model.log(groups_step0(), split="train", step=0)
    await model.log(groups_val_step1(), split="val", step=1)
    written = base / "gaca-fixture" / "models" / "agent-001" / "trajectories"
    target = HERE / "trajectories"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(written, target)
    shutil.rmtree(base)

    legacy = HERE / "legacy" / "trajectories" / "train"
    shutil.rmtree(HERE / "legacy", ignore_errors=True)
    legacy.mkdir(parents=True)
    (legacy / "0000.jsonl").write_text(serialize_trajectory_groups(groups_step0()) + "\n")
    print("openpipe-art", importlib.metadata.version("openpipe-art"), "fixtures written under", HERE)


if __name__ == "__main__":
    asyncio.run(main())
