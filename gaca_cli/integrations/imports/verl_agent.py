"""`--from verl-agent`: the files `gaca_cli.integrations.verl_agent.export_rollout` writes from
verl-agent's rollout loop (Parquet or JSONL): gaca rows already, so each row's fields and types
are checked and every column passed through. See docs/formats/verl-agent.md."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gaca_cli.integrations.imports.base import (
    FormatInfo,
    ImportOptions,
    SourceError,
    iter_jsonl,
    iter_parquet_rows,
    locate,
    number,
)
from gaca_cli.log import columns as C

TEXTS = (C.GROUP_ID, C.TRAJ_ID)  # required strings
OPTIONAL_TEXTS = (C.ANCHOR_OBS, C.PROMPT, C.ACTION)
INT_LISTS = (C.PROMPT_TOKEN_IDS, C.ACTION_TOKEN_IDS)

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


def _show(value: Any) -> str:
    return json.dumps(value, default=str)[:40]


def _check(record: Any, path: Path, where: str) -> dict[str, Any]:
    """The record as a row, after checking the fields gaca reads."""
    if not isinstance(record, Mapping):
        raise SourceError(path, where, None, f"expected a JSON object, got {type(record).__name__}")
    row = dict(record)
    for key in TEXTS:
        if key not in row or row[key] is None:
            raise SourceError(path, where, key, "missing: not a file of export_rollout")
        if not isinstance(row[key], str):
            raise SourceError(path, where, key, f"must be a string, got {_show(row[key])}")
    step = row.get(C.STEP_IDX)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problem = "missing" if step is None else f"must be an integer >= 0, got {_show(step)}"
        raise SourceError(path, where, C.STEP_IDX, problem)
    for key in (C.REWARD, C.EPISODE_REWARD):
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problem = "missing" if value is None else f"must be a number, got {_show(value)}"
            raise SourceError(path, where, key, problem)
        row[key] = number(value, path, where, key)
    done = row.get(C.DONE)
    if done is not None and not isinstance(done, bool):
        raise SourceError(path, where, C.DONE, f"must be true or false, got {_show(done)}")
    for key in OPTIONAL_TEXTS:
        if key in row and row[key] is not None and not isinstance(row[key], str):
            raise SourceError(path, where, key, f"must be a string, got {_show(row[key])}")
    for key in INT_LISTS:
        value = row.get(key)
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ):
            raise SourceError(path, where, key, f"must be a list of integers, got {_show(value)}")
    logprobs = row.get(C.BEHAVIOR_LOGPROBS)
    if logprobs is not None:
        if not isinstance(logprobs, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in logprobs
        ):
            raise SourceError(path, where, C.BEHAVIOR_LOGPROBS, f"must be a list of numbers, got {_show(logprobs)}")
        actions = row.get(C.ACTION_TOKEN_IDS)
        if actions is not None and len(actions) != len(logprobs):
            raise SourceError(
                path, where, C.BEHAVIOR_LOGPROBS, f"has {len(logprobs)} values for {len(actions)} action tokens"
            )
    extra = row.get("extra")
    if isinstance(extra, str):
        try:
            row["extra"] = json.loads(extra)
        except (ValueError, RecursionError):  # not JSON, or too large or deeply nested to read
            raise SourceError(path, where, "extra", "must be JSON text") from None
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
