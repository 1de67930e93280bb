"""Record `versions/<release>/` with an older openpipe-art release's own saving code: the
rollouts of make_fixture.py (a tool call answered by a tool message, a hand-written assistant
turn, metrics, metadata, logs), logged the way a training script of that release logs them.

Run it in a throwaway virtual environment that has that release (never the project's):

    python3.11 -m venv /work/venvs/art-0.4.12
    /work/venvs/art-0.4.12/bin/pip install torch==2.13.0
    /work/venvs/art-0.4.12/bin/pip install openpipe-art==0.4.12
    /work/venvs/art-0.4.12/bin/pip install transformers==4.53.2 wandb==0.21.0 polars numpy \
        aiohttp pyyaml nest-asyncio setproctitle tblib
    LITELLM_LOCAL_MODEL_COST_MAP=True WANDB_MODE=disabled \
        /work/venvs/art-0.4.12/bin/python tests/data/art/make_fixture_versions.py

and for 0.3.13, 0.2.0 and 0.1.25 the same with `pip install --no-deps openpipe-art==<release>`
(their requirements pin vllm and unsloth), plus what `import art` and its local backend
import: openai litellm pydantic polars numpy transformers wandb==0.21.0 pyyaml matplotlib
seaborn tblib setproctitle nest-asyncio httpx tqdm typer, with fastapi weave semver for
0.3.13 and peft trl for 0.2.0 and 0.1.25 (the versions used: tests/data/art/README.md).

What writes the files, in every release: `await model.log(groups, split=...)` on an
`art.Model` registered with the local backend (`art.local.LocalBackend`, 0.3 and 0.4;
`art.local.LocalAPI`, 0.1 and 0.2), whose `_log` writes
`<path>/<project>/models/<name>/trajectories/<split>/0000.<ext>` (step 0: the model is not
trainable) with `art.utils.trajectory_logging.serialize_trajectory_groups`:

- 0.4.x: JSON lines, one group a line (`{"trajectories": [...]}`), file `0000.jsonl`;
- 0.1.x to 0.3.x: `yaml.dump` of the list of groups (`trajectories` and the group's
  `metadata`), file `0000.yaml`.

`history.jsonl` (aggregate metrics) and `model.json` beside `trajectories/` are removed.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("WANDB_MODE", "disabled")

import art  # noqa: E402
from fixture_chat import TOOLS, chat  # noqa: E402
from fixture_chat import few_shot as few_shot_chat  # noqa: E402

VERSION = importlib.metadata.version("openpipe-art")
OUT = Path(__file__).resolve().parent / "versions" / VERSION


def rollout(task: str, moves: list[str], reward: float, won: bool) -> art.Trajectory:
    """As make_fixture.py: system, task, a `look` tool call and its answer, then the moves."""
    messages = chat(task, moves)
    # metrics as floats (before 0.3 a metric must be a float); logs as the field (log() came later)
    trajectory = art.Trajectory(
        messages_and_choices=messages,
        tools=TOOLS,
        reward=reward,
        metrics={"won": float(won), "moves": len(moves)},
        metadata={"task": task, "seed": 7},
        logs=[f"finished after {len(moves)} moves"],
    )
    return trajectory


def group(trajectories: list[art.Trajectory], task_id: str | None = None) -> art.TrajectoryGroup:
    """A group; with its metadata where the release has group metadata (before 0.4)."""
    if task_id is not None and "metadata" in art.TrajectoryGroup.model_fields:
        return art.TrajectoryGroup(trajectories, metadata={"task_id": task_id})
    return art.TrajectoryGroup(trajectories)


def groups_train() -> list[art.TrajectoryGroup]:
    open_door = group(
        [
            rollout("open the door", ["take key", "open door"], 1.0, True),
            rollout("open the door", ["go east", "wait", "go west"], 0.0, False),
        ],
        "door-1",
    )
    few_shot = art.Trajectory(
        messages_and_choices=few_shot_chat(),
        reward=0.5,
        metrics={"won": 0.0},
    )
    return [open_door, group([few_shot, rollout("go north", ["go north"], 1.0, True)])]


def groups_val() -> list[art.TrajectoryGroup]:
    return [group([rollout("open the door", ["open door"], -0.5, False)], "door-1")]


def local_backend(path: str):
    """The release's local, directory-based backend."""
    if VERSION.startswith(("0.1.", "0.2.")):
        from art.local import LocalAPI

        return LocalAPI(path=path)
    from art.local import LocalBackend

    return LocalBackend(path=path)


async def main() -> None:
    base = OUT.parent / "_run"
    shutil.rmtree(base, ignore_errors=True)
    model = art.Model(name="agent-001", project="gaca-fixture")
    await model.register(local_backend(str(base)))
    await model.log(groups_train(), split="train")
    await model.log(groups_val(), split="val")
    (written,) = base.rglob("trajectories")
    shutil.rmtree(OUT, ignore_errors=True)
    shutil.copytree(written, OUT / "trajectories")
    shutil.rmtree(base)
    files = sorted(str(p.relative_to(OUT)) for p in OUT.rglob("*") if p.is_file())
    print("openpipe-art", VERSION, "wrote", files)


if __name__ == "__main__":
    asyncio.run(main())
