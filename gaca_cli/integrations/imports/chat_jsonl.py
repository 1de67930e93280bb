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

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    after_last_turn,
    chat_messages,
    declared,
    locate,
    located,
    message_fields,
    objects,
    plain_chat,
    rest,
    split_chat,
    text_of,
    with_extra,
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


Id = str | int | None


class _Record(msgspec.Struct):
    """The fields of a record, under gaca's names (`_declaration` renames them as --map says)."""

    messages: Any = None  # checked by chat_messages
    prompt: Any = None
    action: Any = None
    group_id: Id = None
    traj_id: Id = None
    step_idx: int | None = None
    reward: float | None = None
    rewards: list[float] | None = None
    episode_reward: float | None = None
    anchor_obs: Any = None
    done: bool | None = None


def _declaration(options: ImportOptions) -> type[msgspec.Struct]:
    """`_Record` reading each field under the name --map gives it."""
    if not options.field_map:
        return _Record
    fields = [(name, _Record.__annotations__[name], None) for name in _Record.__struct_fields__]
    return msgspec.defstruct("Record", fields, rename=dict(options.field_map))


def _rest(record: Mapping[str, Any], used: set[str], path: Path, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record's fields this kind of record does not read (`used`: the source names it
    read): scalars as their own columns, nested values in `extra`. One named like a column of
    the log (a `prompt` beside `messages`, a `step_idx` in a whole chat, a scalar `extra`, a
    `reward` that --map replaced) is kept as `source_<name>`; one beside a field
    `source_<name>` is an error (see `keep_columns`)."""
    null = {key for key, value in record.items() if value is None and key in SCHEMA_COLUMNS}  # as if absent
    items = ((key, value) for key, value in record.items() if key not in used and key not in null)
    return rest(items, path, where, SCHEMA_COLUMNS)


def _trajectory(r: _Record, record: Mapping[str, Any], path: Path, line: int, f: Mapping[str, str]) -> Iterator[dict]:
    where = f"line {line}"
    messages = chat_messages(r.messages, path, where, f["messages"])
    turns = list(split_chat(messages))
    if not turns:
        raise SourceError(path, where, f["messages"], "has no assistant turn (nothing the policy did)")
    n = len(turns)
    if r.rewards is not None:
        if len(r.rewards) != n:
            raise SourceError(path, where, f["rewards"], f"must be a list of {n} numbers (one per assistant turn)")
        step_rewards, outcome = r.rewards, sum(r.rewards)
        # the outcome too: it must agree, or one would be lost (float32 rewards summed in float64
        # differ from their float32 sum by ~1e-8)
        if r.reward is not None and not math.isclose(r.reward, outcome, rel_tol=1e-6, abs_tol=1e-9):
            rule = f"is {r.reward!r}, but `{f['rewards']}` sums to {outcome!r}: give one of the two, or both in "
            raise SourceError(path, where, f["reward"], rule + "agreement")
    elif r.reward is not None:
        outcome, step_rewards = r.reward, [0.0] * (n - 1) + [r.reward]
    else:
        raise SourceError(path, where, f["reward"], f"missing (give `{f['reward']}` or `{f['rewards']}`)")
    anchors = r.anchor_obs
    if anchors is not None and (not isinstance(anchors, list) or len(anchors) != n):
        raise SourceError(path, where, f["anchor_obs"], f"must be a list of {n} strings (one per assistant turn)")
    task = repr([(m.get("role"), text_of(m.get("content"))) for m in turns[0][0]]).encode("utf-8")
    group_id = hashlib.blake2b(task, digest_size=8).hexdigest() if r.group_id is None else str(r.group_id)
    used = {f[name] for name in ("group_id", "traj_id", "messages", "reward", "rewards", "episode_reward")}
    own, extra = _rest(record, used | {f["anchor_obs"], f["done"]}, path, where)
    fields, final = message_fields(messages), after_last_turn(messages)
    if fields:  # every field of every message is kept: those besides role and content here
        extra = {**extra, "message_fields": fields}
    for i, (context, action, _message) in enumerate(turns):
        row = {
            "group_id": group_id,
            "traj_id": f"{path}:{line}" if r.traj_id is None else str(r.traj_id),
            "step_idx": i,
            "reward": step_rewards[i],
            "episode_reward": outcome if r.episode_reward is None else r.episode_reward,
            "done": r.done is not False and i == n - 1,
            "messages": context,
            "action": action,
        }
        if anchors is not None:
            row["anchor_obs"] = text_of(anchors[i])
        if final is not None and i == n - 1:
            row["final_observation"] = final
        yield with_extra({**row, **own}, extra)


def _step(
    r: _Record, record: Mapping[str, Any], path: Path, line: int, f: Mapping[str, str], counters: dict[str, int]
) -> dict[str, Any]:
    where = f"line {line}"
    for key in ("traj_id", "group_id", "reward"):
        if getattr(r, key) is None:
            raise SourceError(path, where, f[key], "missing (a step record needs traj_id, group_id and reward)")
    if r.action is None:
        raise SourceError(path, where, f["action"], "is null (a step record's action is text, possibly empty)")
    traj_id = str(r.traj_id)
    step = r.step_idx
    if step is None:
        step = counters[traj_id] = counters.get(traj_id, -1) + 1
    row: dict[str, Any] = {"group_id": str(r.group_id), "traj_id": traj_id, "reward": r.reward}
    row.update(action=text_of(r.action), step_idx=step)
    used = {f[name] for name in ("group_id", "traj_id", "reward", "action", "step_idx", "episode_reward")}
    used |= {f["anchor_obs"], f["done"]}
    fields: dict[str, Any] = {}
    if r.messages is not None:
        messages = chat_messages(r.messages, path, where, f["messages"])
        row["messages"] = plain_chat(messages)
        used.add(f["messages"])
        fields = message_fields(messages)
    elif r.prompt is not None:
        row["prompt"] = text_of(r.prompt)
        used.add(f["prompt"])
    else:
        rule = f"missing (a step record needs `{f['messages']}` or `{f['prompt']}`)"
        raise SourceError(path, where, f["messages"], rule)
    for key in ("episode_reward", "done"):
        if getattr(r, key) is not None:
            row[key] = getattr(r, key)
    if r.anchor_obs is not None:
        row["anchor_obs"] = text_of(r.anchor_obs)
    own, extra = _rest(record, used, path, where)
    if fields:
        extra["message_fields"] = fields
    return with_extra({**row, **own}, extra)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per step: trajectory records are split at their assistant turns."""
    counters: dict[str, int] = {}
    f = {name: options.field_map.get(name, name) for name in _Record.__struct_fields__}
    declaration = _declaration(options)
    for path in files:
        for line, where, record in objects(path):
            if f["action"] in record:
                r = declared(declaration, record, path, where)
                yield locate(_step(r, record, path, line, f, counters), path, where)
            elif f["messages"] in record:
                r = declared(declaration, record, path, where)
                yield from located(_trajectory(r, record, path, line, f), path, where)
            else:
                rule = f"missing: a record needs `{f['messages']}` (a whole chat) or `{f['action']}` (one step)"
                raise SourceError(path, where, f["messages"], rule)
