"""`--from rllm`: rLLM's episode files (`Episode.to_dict`, one JSON document per episode), one
row per Step of every trajectory. The fields and the versions followed: docs/formats/rllm.md."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    broken,
    chat_messages,
    chat_turn,
    declared,
    keep_columns,
    locate,
    read_json,
    split_fields,
    with_extra,
)

INFO = FormatInfo(
    name="rllm",
    summary="rLLM saved episodes (EpisodeLogger's episodes/<mode>_step_<n>_epoch_<e>/*.json, or Episode.to_dict()): one row per Step",
    suffixes=(".json",),
    carries="per-step chats, rewards and done flags, observations, trajectory rewards, task ids; "
    "token ids and log-probs from Episode.to_dict()",
    lacks="anchors under that name (the observation is kept: --map anchor_obs=observation); "
    "token ids and log-probs in EpisodeLogger files",
    source="rllm-org/rllm v0.2.0 to main @ 9beb6e0: rllm/utils/episode_logger.py (EpisodeLogger.log_episode), "
    "rllm/agents/agent.py or rllm/types.py (Step/Trajectory/Episode.to_dict)",
    mapped={
        "messages": "steps[].chat_completions without its last message (the model's answer)",
        "action": "the last message of chat_completions (its text, then tool calls as JSON); model_response when "
        "the chat does not end with the answer",
        "reward": "steps[].reward",
        "episode_reward": "trajectories[].reward; the sum of the step rewards when it is null",
        "done": "steps[].done",
        "prompt_token_ids": "steps[].prompt_ids (to_dict)",
        "action_token_ids": "steps[].response_ids (to_dict)",
        "behavior_logprobs": "steps[].logprobs (to_dict)",
        "observation": "steps[].observation (text; JSON for an object)",
        "parsed_action": "steps[].action, the action the agent parsed from the answer",
        "thought": "steps[].thought",
        "model_response": "steps[].model_response",
        "mc_return": "steps[].mc_return (to_dict)",
        "weight_version": "steps[].weight_version (to_dict)",
        "source_advantage": "steps[].advantage (to_dict; a per-token list goes to extra)",
        "success": "is_correct",
        "episode_id": "episode_id (to_dict: id)",
        "traj_name": "trajectories[].name",
        "traj_uid": "trajectories[].uid",
        "num_steps": "trajectories[].num_steps (EpisodeLogger)",
        "termination_reason": "termination_reason",
        "training_step": "training_step (EpisodeLogger)",
        "epoch": "epoch (EpisodeLogger)",
        "task_hash": "task_hash (EpisodeLogger)",
        "session_id": "session_id (newer EpisodeLogger)",
        "extra": "{episode: task, metrics, timing, info, metadata; trajectory: timing, task, info; "
        "step: timing, info, model_output}",
    },
    derived={
        "group_id": "DIR/<task id>:<trajectory name>: the rollouts of one task (the episode id before ':') "
        "by one agent, among the episodes of one directory (EpisodeLogger: one training step)",
        "traj_id": "FILE:t<k>, the k-th trajectory of the episode file",
        "step_idx": "the step's position in its trajectory",
    },
)

#: the file EpisodeLogger.log_episodes_batch writes beside the episodes
SUMMARY = "batch_summary.json"
PICKLE = "a torch.save pickle (rLLM's save_trajectories writes one), which gaca does not unpickle: save the episodes "
PICKLE += "as JSON (EpisodeLogger, or json.dump of Episode.to_dict(), rLLM 0.2.0 and later) and import those"

EPISODE_KEYS = {"trajectories", "is_correct"}  # and the one of `id`, `episode_id` that is its id
EPISODE_COLUMNS = ("termination_reason", "training_step", "epoch", "task_hash", "session_id")
TRAJECTORY_KEYS = {"name", "uid", "reward", "steps"}
TRAJECTORY_COLUMNS = ("num_steps",)
#: the columns a row of this format has (the schema's, and those it maps or derives), and
#: `advantage`, gaca's: a step field of one of these names that is not the field mapped to it is
#: kept as `source_<name>` (`advantage` too: rLLM's own), and so is an episode field whose
#: `episode_<name>` is one of them (`episode_reward`, `episode_id`)
WRITTEN = frozenset({*SCHEMA_COLUMNS, *INFO.mapped, *INFO.derived, "advantage"} - {"source_advantage"})
#: what the scalar fields of a trajectory and of an episode that are not mapped are kept as
LEVEL_PREFIX = {"trajectory": "trajectory_", "episode": "episode_"}


def _text(value: Any) -> str | None:
    """A field as text: a string as it is, anything else as sorted JSON, None kept."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


#: a level's scalar fields as their columns: {column: (the field, its value)}
Kept = dict[str, tuple[str, Any]]


def _kept(fields: Mapping[str, Any], path: Path, where: str | None, level: str) -> tuple[Kept, dict[str, Any]]:
    """A level's unmapped fields: (its scalars as columns, `LEVEL_PREFIX` + name, or `source_<name>`
    for one of this format's columns (`keep_columns`); its non-empty nested ones, for `extra`)."""
    own, nested = split_fields(fields.items())
    prefix = LEVEL_PREFIX.get(level, "")
    named = {f"{prefix}{key}": key for key in own}
    kept = keep_columns({column: own[key] for column, key in named.items()}, path, where, WRITTEN)
    columns = {
        column: (named[column] if column in named else named[column.removeprefix("source_")], value)
        for column, value in kept.items()
    }
    return columns, {key: value for key, value in nested.items() if value not in ({}, [])}


def _join(row: dict[str, Any], columns: Kept, level: str, path: Path, where: str) -> None:
    """A trajectory's or an episode's kept columns added to the row of one of its steps (at
    `where`); a step field of the same name (`trajectory_task` beside the trajectory's `task`)
    is a SourceError naming it: the two cannot share the column."""
    for column, (key, value) in columns.items():
        if column in row:
            rule = f"the {level}'s field '{key}' is kept as '{column}', but the step also gives '{column}'"
            raise SourceError(path, where, column, rule + "; rename one of the two in the source")
        row[column] = value


def _group_of(episode_id: str, episode: Mapping[str, Any]) -> str:
    """The task id: the episode id before ':' (rLLM's `{task_id}:{rollout_idx}`), else the
    task's hash."""
    if ":" in episode_id:
        return episode_id.rsplit(":", 1)[0]
    if isinstance(episode.get("task_hash"), str):
        return episode["task_hash"]
    task = json.dumps(episode.get("task"), sort_keys=True, default=str)
    return hashlib.sha256(task.encode("utf-8")).hexdigest()[:8]


class _Step(msgspec.Struct):
    reward: float
    done: bool | None = None  # absent or null: rllm's Step default (False)
    chat_completions: Any = None  # checked by chat_messages
    model_response: str | None = None
    prompt_ids: list[Any] | None = None
    response_ids: list[Any] | None = None
    logprobs: list[float] | None = None
    advantage: float | list[Any] | None = None


class _Trajectory(msgspec.Struct):
    name: str
    steps: list[Any]
    reward: float | None = None

    def __post_init__(self) -> None:
        if not self.steps:
            raise broken("steps", "missing or empty: a trajectory needs at least one step")


class _Episode(msgspec.Struct):
    trajectories: list[Any]
    id: str | None = None
    episode_id: str | None = None
    is_correct: bool | None = None

    def __post_init__(self) -> None:
        if self.episode_id is None and self.id is None:
            raise broken("episode_id", "missing (or `id`)")


#: the step fields read (the others are kept under their names)
TEXT_KEYS, NUMBER_KEYS = ("thought", "model_response"), ("mc_return", "weight_version")  # kept when given
STEP_KEYS = {*_Step.__struct_fields__, *TEXT_KEYS, *NUMBER_KEYS, "observation", "action", "model_output"}


def _ints(value: list[Any] | None) -> list[int] | None:
    """A token id list, None when empty or when it holds something else than ints (tinker's
    image blocks: then it is kept in extra)."""
    return value if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) else None


def _context_and_action(step: _Step, path: Path, where: str) -> tuple[list[dict[str, str]], str]:
    chat = chat_messages(step.chat_completions or [], path, where, "chat_completions")
    context = [chat_turn(m) for m in chat]
    if chat and chat[-1]["role"] == "assistant":
        return context[:-1], context[-1]["content"]
    if not chat and not step.model_response:
        raise SourceError(path, where, "chat_completions", "empty, and no model_response: the step has no action")
    return context, step.model_response or ""


def _step_row(step: Any, path: Path, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    declared_step = declared(_Step, step, path, where)
    messages, action = _context_and_action(declared_step, path, where)
    row: dict[str, Any] = {
        "reward": declared_step.reward,
        "done": bool(declared_step.done),
        "messages": messages,
        "action": action,
        "observation": _text(step.get("observation")),
        "parsed_action": _text(step.get("action")),
    }
    row.update((key, _text(step[key])) for key in TEXT_KEYS if key in step)
    row.update((key, step[key]) for key in NUMBER_KEYS if step.get(key) is not None)
    extra: dict[str, Any] = {}
    others = {key: value for key, value in step.items() if key not in STEP_KEYS}
    advantage = declared_step.advantage
    if isinstance(advantage, list):
        extra["advantage"] = advantage
    elif advantage is not None:  # gaca's column: kept as source_advantage, with the other fields below
        others["advantage"] = advantage
    prompt_ids, response_ids = _ints(declared_step.prompt_ids), _ints(declared_step.response_ids)
    token_columns = {"prompt_ids": ("prompt_token_ids", prompt_ids), "response_ids": ("action_token_ids", response_ids)}
    for key, (column, ids) in token_columns.items():
        if ids is not None:
            row[column] = ids
        elif step.get(key):  # other than token ids (tinker's image blocks): kept as written
            extra[key] = step[key]
    logprobs = declared_step.logprobs
    if logprobs:
        if response_ids is None or len(logprobs) != len(response_ids):
            n = 0 if response_ids is None else len(response_ids)
            raise SourceError(path, where, "logprobs", f"has {len(logprobs)} values for {n} response_ids")
        row["behavior_logprobs"] = logprobs
    output = step.get("model_output")
    if isinstance(output, Mapping):
        # the token lists it repeats are the step's own; the rest is kept
        same = {"prompt_ids": prompt_ids, "completion_ids": response_ids, "logprobs": logprobs}
        output = {k: v for k, v in output.items() if not (k in same and v == same[k])}
    columns, nested = _kept(others, path, where, "step")
    row.update((column, value) for column, (_, value) in columns.items())
    return row, {**extra, **nested, **({"model_output": output} if output else {})}


def _episode(path: Path, record: Any, at: str) -> Iterator[dict[str, Any]]:
    """The rows of the episode `record`, `at` in its file ("" the whole file, "[3]." its 4th element)."""
    top = at[:-1] or None
    episode = declared(_Episode, record, path, top)
    id_key = "episode_id" if "episode_id" in record else "id"
    episode_id = str(episode.episode_id if id_key == "episode_id" else episode.id)
    episode_row = {"episode_id": episode_id, "success": episode.is_correct}
    episode_row.update((key, record[key]) for key in EPISODE_COLUMNS if key in record)
    used = {id_key, *EPISODE_KEYS, *EPISODE_COLUMNS}
    episode_columns, episode_extra = _kept({k: v for k, v in record.items() if k not in used}, path, top, "episode")
    task_id = _group_of(episode_id, record)
    for k, trajectory in enumerate(episode.trajectories):
        where = f"{at}trajectories[{k}]"
        declared_trajectory = declared(_Trajectory, trajectory, path, where)
        name, steps = declared_trajectory.name, declared_trajectory.steps
        traj_row: dict[str, Any] = {"traj_name": name, "traj_uid": _text(trajectory.get("uid"))}
        traj_row.update((key, trajectory[key]) for key in TRAJECTORY_COLUMNS if key in trajectory)
        used = {*TRAJECTORY_KEYS, *TRAJECTORY_COLUMNS}
        traj_fields = {key: value for key, value in trajectory.items() if key not in used}
        traj_columns, traj_extra = _kept(traj_fields, path, where, "trajectory")
        parsed = [_step_row(step, path, f"{where}.steps[{i}]") for i, step in enumerate(steps)]
        # rLLM allows a trajectory without a reward: its return is the sum of its steps'
        reward = declared_trajectory.reward
        traj_row["episode_reward"] = math.fsum(r["reward"] for r, _ in parsed) if reward is None else reward
        for i, (step_row, step_extra) in enumerate(parsed):
            # the step's kept fields are never named like these columns (`_kept`), nor like the
            # trajectory's and the episode's kept ones but by a clash `_join` refuses
            step_where = f"{where}.steps[{i}]"
            row = {"group_id": f"{path.parent}/{task_id}:{name}", "traj_id": f"{path}:{at}t{k}", "step_idx": i}
            row.update({**step_row, **traj_row, **episode_row})
            _join(row, traj_columns, "trajectory", path, step_where)
            _join(row, episode_columns, "episode", path, step_where)
            levels = (("episode", episode_extra), ("trajectory", traj_extra), ("step", step_extra))
            yield locate(with_extra(row, {level: part for level, part in levels if part}), path, step_where)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per Step of every trajectory of every episode file (one small JSON document
    each: an episode, or a list of them as rLLM's examples save a run); `batch_summary.json`
    is passed over, and a `.pt` file (`save_trajectories`' pickle) is refused."""
    for path in files:
        if path.suffix == ".pt":
            raise SourceError(path, None, None, PICKLE)
        document = read_json(path) if path.name != SUMMARY else []
        listed = isinstance(document, list)
        for j, record in enumerate(document if listed else [document]):
            yield from _episode(path, record, f"[{j}]." if listed else "")
