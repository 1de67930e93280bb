"""`--from verl-agent`: the files `gaca_cli.integrations.verl_agent.export_rollout` writes from
verl-agent's rollout loop (Parquet or JSONL): gaca rows already, so each row's fields and types
are checked and every column passed through. See docs/formats/verl-agent.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    FormatInfo,
    ImportOptions,
    broken,
    declared,
    iter_jsonl,
    iter_parquet_rows,
    json_text,
    locate,
    show,
)
from gaca_cli.log import columns as C

INFO = FormatInfo(
    name="verl-agent",
    summary="files written by gaca's exporter in verl-agent's rollout loop (export_rollout): multi-step, with anchors",
    suffixes=(".parquet", ".jsonl"),
    carries="uid, traj_uid, step order, anchor_obs, per-step rewards, episode rewards, prompt and action "
    "text and token ids, rollout log-probs when computed, is_action_valid and the step's other scalars",
    lacks="done for trajectories that ran all env.max_steps (verl-agent does not keep dones)",
    source="verl-agent, agent_system/multi_turn_rollout/rollout_loop.py (TrajectoryCollector.multi_turn_loop); "
    "gaca_cli/integrations/verl_agent/export.py writes the files",
    mapped={
        "group_id": "uid",
        "traj_id": "traj_uid",
        "reward": "rewards",
        "episode_reward": "episode_rewards",
        "anchor_obs": "anchor_obs",
        "prompt_token_ids": "prompts (unpadded)",
        "action_token_ids": "responses (unpadded)",
        "behavior_logprobs": "rollout_log_probs (response tokens)",
    },
    derived={
        "step_idx": "the step's position among its environment's active steps",
        "done": "true on the last active step of an environment that ended before env.max_steps",
        "prompt": "prompts decoded with the tokenizer, special tokens kept",
        "action": "responses decoded, special tokens skipped (what the environment was given)",
    },
)


class _Row(msgspec.Struct):
    """A row of export_rollout: the fields gaca reads (the others pass through unchecked)."""

    group_id: str | None = None
    traj_id: str | None = None
    step_idx: int | None = None
    reward: float | None = None
    episode_reward: float | None = None
    done: bool | None = None
    anchor_obs: str | None = None
    prompt: str | None = None
    action: str | None = None
    prompt_token_ids: list[Any] | None = None
    action_token_ids: list[Any] | None = None
    behavior_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        for key in (C.GROUP_ID, C.TRAJ_ID):
            if getattr(self, key) is None:
                raise broken(key, "missing: not a file of export_rollout")
        for key in (C.STEP_IDX, C.REWARD, C.EPISODE_REWARD):
            if getattr(self, key) is None:
                raise broken(key, "missing")
        if self.step_idx is not None and self.step_idx < 0:
            raise broken(C.STEP_IDX, f"must be an integer >= 0, got {self.step_idx}")
        for key in (C.PROMPT_TOKEN_IDS, C.ACTION_TOKEN_IDS):
            values = getattr(self, key)
            if values is not None and not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                raise broken(key, f"must be a list of integers, got {show(values)}")
        logprobs, actions = self.behavior_logprobs, self.action_token_ids
        if logprobs is not None and actions is not None and len(actions) != len(logprobs):
            raise broken(C.BEHAVIOR_LOGPROBS, f"has {len(logprobs)} values for {len(actions)} action tokens")


def _check(record: Any, path: Path, where: str) -> dict[str, Any]:
    """The record as a row, after checking the fields gaca reads."""
    checked = declared(_Row, record, path, where)
    row = dict(record)
    row[C.REWARD], row[C.EPISODE_REWARD] = checked.reward, checked.episode_reward
    if isinstance(row.get("extra"), str):
        row["extra"] = json_text(row["extra"], path, where, "extra")
    return row


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """Every row of every file, checked: Parquet by record batches, JSONL line by line."""
    for path in files:
        if path.suffix == ".jsonl":
            for line, record in iter_jsonl(path):
                yield locate(_check(record, path, f"line {line}"), path, f"line {line}")
        else:
            for row, record in iter_parquet_rows(path):
                yield locate(_check(record, path, f"row {row}"), path, f"row {row}")
