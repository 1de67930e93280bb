"""`--from chat-jsonl`: the generic case every home-grown loop can write, one JSON object per
line: a whole chat (`messages` + reward(s)), split at its assistant turns, or one step
(`messages`/`prompt` + `action`). Field names are gaca's; `--map FIELD=SOURCE` reads another
name. What each field becomes: docs/formats/chat-jsonl.md."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    after_last_turn,
    chat_messages,
    iter_jsonl,
    keep_columns,
    locate,
    located,
    message_fields,
    number,
    split_chat,
    split_fields,
    text_of,
)

FIELDS = (
    "group_id",
    "traj_id",
    "step_idx",
    "messages",
    "prompt",
    "action",
    "reward",
    "rewards",
    "episode_reward",
    "anchor_obs",
    "done",
)

INFO = FormatInfo(
    name="chat-jsonl",
    summary="one JSON line per step or per trajectory: OpenAI-format messages, reward(s), ids (--map renames fields)",
    suffixes=(".jsonl",),
    carries="chat messages or prompt + action, rewards (outcome or per turn), ids; anchors when logged",
    lacks="whatever the loop did not log; group ids are derived from the task prompt when absent",
    source="gaca's own generic format (docs/formats/chat-jsonl.md)",
    mapped={
        "group_id": "group_id; when absent, a hash of the chat before the first assistant turn (the task)",
        "traj_id": "traj_id; when absent (trajectory records), FILE:LINE",
        "step_idx": "step_idx; when absent, the assistant turn's position or the step's order in its traj_id",
        "messages": "messages: for a whole chat, everything before each assistant turn",
        "prompt": "prompt (step records)",
        "action": "each assistant turn (its text, then its tool calls as JSON), or action (step records)",
        "reward": "rewards[i] per assistant turn, or reward on the last turn (0 before it)",
        "episode_reward": "episode_reward, or the trajectory's reward (the sum of rewards)",
        "anchor_obs": "anchor_obs (a list, one per assistant turn, in trajectory records)",
        "done": "done (step records); whole chats: true on the last assistant turn, unless the record says done: false",
    },
    derived={
        "final_observation": "whole chats: the messages after the last assistant turn, one `role: content` line each",
        "extra.message_fields": "the messages' fields besides role, content and tool_calls, by position in the chat",
    },
)


EXTRA = "extra"


def _field(options: ImportOptions, name: str) -> str:
    return options.field_map.get(name, name)


def _id(value: Any, path: Path, where: str, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SourceError(path, where, key, f"must be a string or an integer, got {value!r:.40}")
    return str(value)


def _rest(record: Mapping[str, Any], used: set[str], path: Path, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record's fields this kind of record does not read (`used`: the source names it
    read): scalars as their own columns, nested values in `extra`. One named like a column of
    the log (a `prompt` beside `messages`, a `step_idx` in a whole chat, a scalar `extra`, a
    `reward` that --map replaced) is kept as `source_<name>`; one beside a field
    `source_<name>` is an error (see `keep_columns`)."""
    own, nested = split_fields(
        (key, value)
        for key, value in record.items()
        if key not in used and not (value is None and key in SCHEMA_COLUMNS)  # a null field is an absent one
    )
    return keep_columns(own, path, where, SCHEMA_COLUMNS), nested


def _with_rest(row: dict[str, Any], own: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`row` plus the record's other fields (none of which is named like a column of the row)."""
    row.update(own)
    if extra:
        row["extra"] = extra
    return row


def _done(record: Mapping[str, Any], key: str, path: Path, where: str) -> bool | None:
    """The record's `done`, None when absent or null."""
    done = record.get(key)
    if done is not None and not isinstance(done, bool):
        raise SourceError(path, where, key, f"must be true or false, got {done!r:.40}")
    return done


def _trajectory(record: Mapping[str, Any], path: Path, line: int, options: ImportOptions) -> Iterator[dict]:
    where = f"line {line}"
    f = {name: _field(options, name) for name in FIELDS}
    messages = chat_messages(record[f["messages"]], path, where, f["messages"])
    turns = list(split_chat(messages))
    if not turns:
        raise SourceError(path, where, f["messages"], "has no assistant turn (nothing the policy did)")
    n = len(turns)
    rewards = record.get(f["rewards"])
    if rewards is not None:
        if not isinstance(rewards, list) or len(rewards) != n:
            raise SourceError(path, where, f["rewards"], f"must be a list of {n} numbers (one per assistant turn)")
        step_rewards = [number(r, path, where, f["rewards"]) for r in rewards]
        outcome = sum(step_rewards)
        if record.get(f["reward"]) is not None:  # the outcome too: it must agree, or one would be lost
            given = number(record[f["reward"]], path, where, f["reward"])
            # (float32 rewards summed in float64 differ from their float32 sum by ~1e-8)
            if not math.isclose(given, outcome, rel_tol=1e-6, abs_tol=1e-9):
                raise SourceError(
                    path,
                    where,
                    f["reward"],
                    f"is {given!r}, but `{f['rewards']}` sums to {outcome!r}: give one of the two, or both "
                    "in agreement",
                )
    elif record.get(f["reward"]) is not None:
        outcome = number(record[f["reward"]], path, where, f["reward"])
        step_rewards = [0.0] * (n - 1) + [outcome]
    else:
        raise SourceError(path, where, f["reward"], f"missing (give `{f['reward']}` or `{f['rewards']}`)")
    episode = record.get(f["episode_reward"])
    episode_reward = outcome if episode is None else number(episode, path, where, f["episode_reward"])
    anchors = record.get(f["anchor_obs"])
    if anchors is not None and (not isinstance(anchors, list) or len(anchors) != n):
        raise SourceError(path, where, f["anchor_obs"], f"must be a list of {n} strings (one per assistant turn)")
    traj = record.get(f["traj_id"])
    traj_id = f"{path}:{line}" if traj is None else _id(traj, path, where, f["traj_id"])
    group = record.get(f["group_id"])
    if group is None:
        task = repr([(m.get("role"), text_of(m.get("content"))) for m in turns[0][0]])
        group_id = hashlib.blake2b(task.encode("utf-8"), digest_size=8).hexdigest()
    else:
        group_id = _id(group, path, where, f["group_id"])
    done = _done(record, f["done"], path, where) is not False
    used = {f[name] for name in ("group_id", "traj_id", "messages", "reward", "rewards", "episode_reward")}
    own, extra = _rest(record, used | {f["anchor_obs"], f["done"]}, path, where)
    fields, final = message_fields(messages), after_last_turn(messages)
    if fields:  # every field of every message is kept: those besides role and content here
        extra = {**extra, "message_fields": fields}
    for i, (context, action, _message) in enumerate(turns):
        row = {
            "group_id": group_id,
            "traj_id": traj_id,
            "step_idx": i,
            "reward": step_rewards[i],
            "episode_reward": episode_reward,
            "done": done and i == n - 1,
            "messages": context,
            "action": action,
        }
        if anchors is not None:
            row["anchor_obs"] = text_of(anchors[i])
        if final is not None and i == n - 1:
            row["final_observation"] = final
        yield _with_rest(row, own, extra)


def _step(
    record: Mapping[str, Any], path: Path, line: int, options: ImportOptions, counters: dict[str, int]
) -> dict[str, Any]:
    where = f"line {line}"
    f = {name: _field(options, name) for name in FIELDS}
    for key in ("traj_id", "group_id", "reward"):
        if record.get(f[key]) is None:
            raise SourceError(path, where, f[key], "missing (a step record needs traj_id, group_id and reward)")
    traj_id = _id(record[f["traj_id"]], path, where, f["traj_id"])
    if record[f["action"]] is None:
        raise SourceError(path, where, f["action"], "is null (a step record's action is text, possibly empty)")
    row: dict[str, Any] = {
        "group_id": _id(record[f["group_id"]], path, where, f["group_id"]),
        "traj_id": traj_id,
        "reward": number(record[f["reward"]], path, where, f["reward"]),
        "action": text_of(record[f["action"]]),
    }
    used = {f[name] for name in ("group_id", "traj_id", "reward", "action", "step_idx", "episode_reward")}
    used |= {f["anchor_obs"], f["done"]}
    step = record.get(f["step_idx"])
    if step is None:
        step = counters.get(traj_id, 0)
        counters[traj_id] = step + 1
    elif isinstance(step, bool) or not isinstance(step, int):
        raise SourceError(path, where, f["step_idx"], f"must be an integer, got {step!r:.40}")
    row["step_idx"] = step
    fields: dict[str, Any] = {}
    if record.get(f["messages"]) is not None:
        messages = chat_messages(record[f["messages"]], path, where, f["messages"])
        row["messages"] = [{"role": m["role"], "content": text_of(m.get("content"))} for m in messages]
        used.add(f["messages"])
        fields = message_fields(messages)
    elif record.get(f["prompt"]) is not None:
        row["prompt"] = text_of(record[f["prompt"]])
        used.add(f["prompt"])
    else:
        raise SourceError(
            path, where, f["messages"], f"missing (a step record needs `{f['messages']}` or `{f['prompt']}`)"
        )
    if record.get(f["episode_reward"]) is not None:
        row["episode_reward"] = number(record[f["episode_reward"]], path, where, f["episode_reward"])
    if record.get(f["anchor_obs"]) is not None:
        row["anchor_obs"] = text_of(record[f["anchor_obs"]])
    done = _done(record, f["done"], path, where)
    if done is not None:
        row["done"] = done
    own, extra = _rest(record, used, path, where)
    if fields:
        extra["message_fields"] = fields
    return _with_rest(row, own, extra)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per step: trajectory records are split at their assistant turns."""
    counters: dict[str, int] = {}
    action = _field(options, "action")
    messages = _field(options, "messages")
    for path in files:
        for line, record in iter_jsonl(path):
            if not isinstance(record, Mapping):
                raise SourceError(path, f"line {line}", None, f"expected a JSON object, got {type(record).__name__}")
            if action in record:
                yield locate(_step(record, path, line, options, counters), path, f"line {line}")
            elif messages in record:
                yield from located(_trajectory(record, path, line, options), path, f"line {line}")
            else:
                raise SourceError(
                    path,
                    f"line {line}",
                    messages,
                    f"missing: a record needs `{messages}` (a whole chat) or `{action}` (one step)",
                )
