"""`--from art`: OpenPipe ART's trajectory files (Parquet, and the older JSONL), one row per
assistant turn. The layout, the fields and the versions followed: docs/formats/art.md."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    declared,
    iter_parquet_rows,
    json_text,
    located,
    objects,
    rest,
    split_chat,
    with_extra,
)

INFO = FormatInfo(
    name="art",
    summary="OpenPipe ART trajectory files (trajectories/<split>/<step>.parquet, or the older .jsonl): one step per assistant turn",
    suffixes=(".parquet", ".jsonl", ".yaml"),
    carries="whole chats with tool calls, trajectory reward, group membership, metrics and metadata",
    lacks="per-step rewards, anchors, token ids, log-probs (ART's files drop the Choices' logprobs)",
    source="openpipe-art 0.5.18, art/utils/trajectory_logging.py (write_trajectory_groups_parquet, called by "
    "art/model.py Model.log); art/utils/trajectory_migration.py (serialize_trajectory_groups, JSONL before 0.5)",
    mapped={
        "messages": "messages (jsonl: messages_and_choices) before each assistant turn",
        "action": "each assistant turn: content, then its tool_calls as JSON",
        "episode_reward": "reward",
        "trainable": "messages[].trainable (jsonl: the turn is a Choice): the policy sampled it",
        "finish_reason": "a Choice's finish_reason (jsonl only)",
        "group_index": "group_index (jsonl: the line's position in the file)",
        "extra": "metrics, metadata, tools, logs, group_metadata, group_metrics, group_logs, "
        "additional_histories, the context's tool_call_ids, messages' other fields (message_fields, "
        "context_message_fields)",
    },
    derived={
        "group_id": "FILE:g<group_index>: the trajectories of one TrajectoryGroup",
        "traj_id": "FILE:g<group_index>/t<k>, k the trajectory's position in its group",
        "step_idx": "the assistant turn's position in the chat",
        "reward": "the trajectory's reward on its last step, 0 before",
        "done": "true on the last assistant turn",
        "split": "the file's folder in ART's layout, trajectories/<split>/<step>.parquet",
        "training_step": "the file's name in ART's layout, trajectories/<split>/<step>.parquet",
    },
)

#: the metrics log `Model.log` writes in the model directory, next to `trajectories/`
HISTORY = "history.jsonl"

#: what to do with ART's YAML files (`trajectories/<split>/<step>.yaml`, openpipe-art before 0.4)
YAML = (
    "a YAML trajectory file (openpipe-art before 0.4), which gaca does not read; convert it to JSON lines beside it: "
    'python -c "import json, sys, yaml; print(*map(json.dumps, yaml.safe_load(open(sys.argv[1]))), sep=chr(10))" '
    "{} > {}, then import again (a .yaml file with its .jsonl beside it is passed over)"
)
#: the trajectory-level fields kept in `extra` (JSON text in the Parquet files, objects in JSONL)
KEPT = ("metrics", "metadata", "tools", "logs", "group_metadata", "group_metrics", "group_logs")
#: the columns the rows get: a source column of one of these names is kept as source_<name>
WRITTEN = SCHEMA_COLUMNS | {"group_index", "split", "training_step", "trainable", "finish_reason"}
#: the message fields read as the chat; a message's others are kept in `extra`
MESSAGE_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id", "trainable"})


class _Message(msgspec.Struct):
    """A message as ART's Parquet writer flattens it (tool_calls as JSON text)."""

    role: str
    content: str | None = None
    tool_calls: str | None = None


class _Row(msgspec.Struct):
    """A row of ART's Parquet file: one trajectory."""

    group_index: int
    reward: float
    messages: list[_Message]


_READ = frozenset({*KEPT, *_Row.__struct_fields__})  # the fields read into a row's own columns or extra


class _Trajectory(msgspec.Struct):
    """A trajectory of a line of the older JSONL files (`serialize_trajectory_groups`)."""

    reward: float
    messages_and_choices: list[Any]


def _layout(path: Path) -> dict[str, Any]:
    """`split` and `training_step` from ART's `trajectories/<split>/<step:04d>.<ext>` layout."""
    if path.stem.isdigit() and path.parent.name:
        return {"split": path.parent.name, "training_step": int(path.stem)}
    return {}


def _message(m: Mapping[str, Any], trainable: bool, **fields: Any) -> dict[str, Any]:
    """A chat message with `trainable`, its other fields (an OpenAI `name`, `refusal`, ...) as
    `message_fields`, so that the step keeps them in `extra`."""
    message = {k: m[k] for k in MESSAGE_FIELDS & m.keys() if m[k]} | {"content": m.get("content")}
    message.update(role=m.get("role") or "assistant", trainable=trainable, **fields)
    if other := {k: v for k, v in m.items() if k not in MESSAGE_FIELDS and v is not None}:
        message["message_fields"] = other
    return message


def _jsonl_message(m: Any, path: Path, where: str) -> dict[str, Any]:
    """A `messages_and_choices` item: a Choice (`{finish_reason, index, message}`) or a message."""
    if not isinstance(m, Mapping) or not isinstance(m.get("message", m), Mapping):
        raise SourceError(path, where, "messages_and_choices", "each item must be an object (a Choice's message too)")
    if "message" in m:
        return _message(m["message"], True, finish_reason=m.get("finish_reason"))
    if not isinstance(m.get("role"), str):
        raise SourceError(path, where, "messages_and_choices", "each message needs a string 'role'")
    return _message(m, False)


def _steps(
    messages: list, reward: float, ids: tuple[str, str], row: dict, extra: dict, path: Path, where: str, field: str
) -> Iterator[dict[str, Any]]:
    """One row per assistant turn (`row`: the columns every step has)."""
    turns = list(split_chat(messages))
    if not turns:
        raise SourceError(path, where, field, "has no assistant turn (nothing the policy did)")
    tool_call_ids: list[str] = []
    context_fields: dict[str, Any] = {}  # position in the chat -> a context message's other fields
    seen = 0
    for i, (context, action, message) in enumerate(turns):
        # the ids of the tool results in this turn's context, and its messages' other fields
        # (the context keeps role and content only)
        for position in range(seen, len(context)):
            m = messages[position]
            if m.get("tool_call_id"):
                tool_call_ids.append(str(m["tool_call_id"]))
            if m.get("message_fields"):
                context_fields[str(position)] = m["message_fields"]
        seen, last = len(context), i == len(turns) - 1
        step = {"group_id": ids[0], "traj_id": ids[1], "step_idx": i, "reward": reward if last else 0.0}
        step.update(episode_reward=reward, done=last, messages=context, action=action, trainable=message["trainable"])
        if "finish_reason" in message:
            step["finish_reason"] = message["finish_reason"]
        more: dict[str, Any] = {"tool_call_ids": list(tool_call_ids), "context_message_fields": dict(context_fields)}
        more["message_fields"] = message.get("message_fields")
        yield with_extra({**step, **row}, {**extra, **{k: v for k, v in more.items() if v}})


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    layout = _layout(path)
    in_group: dict[int, int] = {}
    for row_number, record in iter_parquet_rows(path):
        where = f"row {row_number}"
        if record.get("reward") is None:
            if record.get("messages") is None:
                continue  # ART's own reader skips such rows (an empty batch's placeholder)
            raise SourceError(path, where, "reward", "missing")
        row = declared(_Row, record, path, where)
        messages = [
            _message(m, bool(m.get("trainable")), tool_calls=json_text(m.get("tool_calls"), path, where, "messages"))
            for m in record["messages"]
        ]
        group = row.group_index
        k = in_group[group] = in_group.get(group, -1) + 1
        extra: dict[str, Any] = {}
        for key in KEPT:
            value = record.get(key)
            parsed = (list(value) if value else None) if key.endswith("logs") else json_text(value, path, where, key)
            if parsed:
                extra[key] = parsed
        items = ((n, v) for n, v in record.items() if n not in _READ)
        own, nested = rest(items, path, where, WRITTEN)
        ids = (f"{path}:g{group}", f"{path}:g{group}/t{k}")
        columns = {"group_index": group, **layout, **own}
        rows = _steps(messages, row.reward, ids, columns, {**extra, **nested}, path, where, "messages")
        yield from located(rows, path, where)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    layout = _layout(path)
    for group, (_, where, record) in enumerate(objects(path)):
        if not isinstance(record.get("trajectories"), list):
            raise SourceError(path, where, "trajectories", "missing (a line is one group: {'trajectories': [...]})")
        group_fields = {key: value for key, value in record.items() if key != "trajectories"}
        for k, raw in enumerate(record["trajectories"]):
            here = f"{where}, trajectory {k}"
            trajectory = declared(_Trajectory, raw, path, here)
            messages = [_jsonl_message(m, path, here) for m in trajectory.messages_and_choices]
            extra = {key: value for key, value in raw.items() if key not in _Trajectory.__struct_fields__}
            extra = {key: value for key, value in extra.items() if value or key not in (*KEPT, "additional_histories")}
            if group_fields:
                extra["group_fields"] = group_fields
            ids = (f"{path}:g{group}", f"{path}:g{group}/t{k}")
            columns = {"group_index": group, **layout}
            rows = _steps(messages, trajectory.reward, ids, columns, extra, path, here, "messages_and_choices")
            yield from located(rows, path, where)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per assistant turn of every trajectory, file by file (Parquet by record batches,
    JSONL line by line). ART's `history.jsonl` (aggregate metrics), other YAML files (a
    checkpoint's `info.yaml`) and a YAML file converted to the `.jsonl` beside it are passed over."""
    for path in files:
        if path.suffix == ".yaml" and _layout(path) and not (converted := path.with_suffix(".jsonl")).exists():
            raise SourceError(path, None, None, YAML.format(path, converted))
        if path.name == HISTORY or path.suffix == ".yaml":
            continue
        yield from _read_jsonl(path) if path.suffix == ".jsonl" else _read_parquet(path)
