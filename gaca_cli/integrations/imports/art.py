"""`--from art`: OpenPipe ART's trajectory files (Parquet, and the older JSONL), one row per
assistant turn. The layout, the fields and the versions followed: docs/formats/art.md."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    iter_jsonl,
    iter_parquet_rows,
    keep_columns,
    located,
    number,
    split_chat,
    split_fields,
)

INFO = FormatInfo(
    name="art",
    summary="OpenPipe ART trajectory files (trajectories/<split>/<step>.parquet, or the older .jsonl): one step per assistant turn",
    suffixes=(".parquet", ".jsonl"),
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

#: the trajectory-level fields kept in `extra` (JSON text in the Parquet files, objects in JSONL)
KEPT = ("metrics", "metadata", "tools", "logs", "group_metadata", "group_metrics", "group_logs")
#: the Parquet columns read above; any other is kept as it is (in `_read_parquet`)
READ_COLUMNS = frozenset({"group_index", "reward", "messages", *KEPT})
#: the columns the rows get: a source column of one of these names is kept as source_<name>
WRITTEN = SCHEMA_COLUMNS | {"group_index", "split", "training_step", "trainable", "finish_reason"}
#: the message fields read as the chat; a message's others are kept in `extra`
MESSAGE_FIELDS = frozenset({"role", "content", "tool_calls", "tool_call_id", "trainable"})


def _layout(path: Path) -> dict[str, Any]:
    """`split` and `training_step` from ART's `trajectories/<split>/<step:04d>.<ext>` layout."""
    if path.stem.isdigit() and path.parent.name:
        return {"split": path.parent.name, "training_step": int(path.stem)}
    return {}


def _json_field(value: Any, path: Path, where: str, key: str) -> Any:
    """A field ART's Parquet writer stored as JSON text (None and "" when it was empty)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SourceError(path, where, key, f"must be JSON text, got {type(value).__name__}")
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise SourceError(path, where, key, f"not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):  # an integer of too many digits, nesting too deep
        raise SourceError(path, where, key, "not valid JSON (too large or too deeply nested to read)") from None


def _parquet_message(m: Any, path: Path, where: str) -> dict[str, Any]:
    """A flattened Parquet message back to a chat message (tool_calls parsed), plus `trainable`."""
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        raise SourceError(path, where, "messages", "each message needs a string 'role'")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
        raise SourceError(path, where, "messages", f"a message's content must be text, got {type(content).__name__}")
    message: dict[str, Any] = {"role": m["role"], "content": content, "trainable": bool(m.get("trainable"))}
    calls = _json_field(m.get("tool_calls"), path, where, "messages")
    if calls:
        message["tool_calls"] = calls
    if m.get("tool_call_id"):
        message["tool_call_id"] = m["tool_call_id"]
    return _with_fields(message, m)


def _with_fields(message: dict[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """`message` with the source message's other fields (an OpenAI `name`, `refusal`, ...) as
    `message_fields`, so that the step keeps them in `extra`."""
    rest = {k: v for k, v in source.items() if k not in MESSAGE_FIELDS and v is not None}
    if rest:
        message["message_fields"] = rest
    return message


def _jsonl_message(m: Any, path: Path, where: str) -> dict[str, Any]:
    """A `messages_and_choices` item: a Choice (`{finish_reason, index, message}`) or a message."""
    if not isinstance(m, Mapping):
        raise SourceError(path, where, "messages_and_choices", f"each item must be an object, got {type(m).__name__}")
    if "message" in m:
        inner = m["message"]
        if not isinstance(inner, Mapping):
            raise SourceError(path, where, "messages_and_choices", "a Choice's 'message' must be an object")
        rest = {k: v for k, v in inner.items() if k not in ("role", "content", "tool_calls") and v is not None}
        message = {
            "role": inner.get("role") or "assistant",
            "content": inner.get("content"),
            "trainable": True,
            "finish_reason": m.get("finish_reason"),
        }
        if inner.get("tool_calls"):
            message["tool_calls"] = inner["tool_calls"]
        if rest:
            message["message_fields"] = rest
        return message
    if not isinstance(m.get("role"), str):
        raise SourceError(path, where, "messages_and_choices", "each message needs a string 'role'")
    return _with_fields({k: m[k] for k in MESSAGE_FIELDS & m.keys()} | {"trainable": False}, m)


def _steps(
    messages: list[dict[str, Any]],
    reward: float,
    ids: tuple[str, str],
    columns: dict[str, Any],
    extra: dict[str, Any],
    path: Path,
    where: str,
    field: str,
) -> Iterator[dict[str, Any]]:
    turns = list(split_chat(messages))
    if not turns:
        raise SourceError(path, where, field, "has no assistant turn (nothing the policy did)")
    group_id, traj_id = ids
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
        seen = len(context)
        last = i == len(turns) - 1
        row: dict[str, Any] = {
            "group_id": group_id,
            "traj_id": traj_id,
            "step_idx": i,
            "reward": reward if last else 0.0,
            "episode_reward": reward,
            "done": last,
            "messages": context,
            "action": action,
            "trainable": message["trainable"],
            **columns,
        }
        if "finish_reason" in message:
            row["finish_reason"] = message["finish_reason"]
        step_extra = dict(extra)
        if tool_call_ids:
            step_extra["tool_call_ids"] = list(tool_call_ids)
        if message.get("message_fields"):
            step_extra["message_fields"] = message["message_fields"]
        if context_fields:
            step_extra["context_message_fields"] = dict(context_fields)
        if step_extra:
            row["extra"] = step_extra
        yield row


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    layout = _layout(path)
    in_group: dict[int, int] = {}
    for row_number, record in iter_parquet_rows(path):
        where = f"row {row_number}"
        if record.get("reward") is None and record.get("messages") is None:
            continue  # ART's own reader skips such rows (an empty batch's placeholder)
        group = record.get("group_index")
        if isinstance(group, bool) or not isinstance(group, int):
            raise SourceError(path, where, "group_index", f"must be an integer, got {group!r:.40}")
        if record.get("reward") is None:
            raise SourceError(path, where, "reward", "missing")
        reward = number(record["reward"], path, where, "reward")
        raw = record.get("messages")
        if not isinstance(raw, list):
            raise SourceError(path, where, "messages", "must be a list of messages")
        messages = [_parquet_message(m, path, where) for m in raw]
        k = in_group.get(group, 0)
        in_group[group] = k + 1
        extra: dict[str, Any] = {}
        for key in KEPT:
            value = record.get(key)
            if key in ("logs", "group_logs"):
                if value:
                    extra[key] = list(value)
            else:
                parsed = _json_field(value, path, where, key)
                if parsed:
                    extra[key] = parsed
        own, nested = split_fields((key, value) for key, value in record.items() if key not in READ_COLUMNS)
        columns = {"group_index": group, **layout, **keep_columns(own, path, where, WRITTEN)}
        extra.update(nested)
        ids = (f"{path}:g{group}", f"{path}:g{group}/t{k}")
        rows = _steps(messages, reward, ids, columns, extra, path, where, "messages")
        yield from located(rows, path, where)


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    layout = _layout(path)
    for group, (line, record) in enumerate(iter_jsonl(path)):
        where = f"line {line}"
        if not isinstance(record, Mapping) or not isinstance(record.get("trajectories"), list):
            raise SourceError(path, where, "trajectories", "missing (a line is one group: {'trajectories': [...]})")
        group_fields = {key: value for key, value in record.items() if key != "trajectories"}
        for k, trajectory in enumerate(record["trajectories"]):
            here = f"{where}, trajectory {k}"
            if not isinstance(trajectory, Mapping):
                raise SourceError(path, here, None, f"expected an object, got {type(trajectory).__name__}")
            if trajectory.get("reward") is None:
                raise SourceError(path, here, "reward", "missing")
            reward = number(trajectory["reward"], path, here, "reward")
            raw = trajectory.get("messages_and_choices")
            if not isinstance(raw, list):
                raise SourceError(path, here, "messages_and_choices", "must be a list of messages and choices")
            messages = [_jsonl_message(m, path, here) for m in raw]
            extra = {key: trajectory[key] for key in KEPT if trajectory.get(key)}
            if trajectory.get("additional_histories"):
                extra["additional_histories"] = trajectory["additional_histories"]
            extra.update(
                {
                    key: value
                    for key, value in trajectory.items()
                    if key not in (*KEPT, "reward", "messages_and_choices", "additional_histories")
                }
            )
            if group_fields:
                extra["group_fields"] = group_fields
            ids = (f"{path}:g{group}", f"{path}:g{group}/t{k}")
            columns = {"group_index": group, **layout}
            rows = _steps(messages, reward, ids, columns, extra, path, here, "messages_and_choices")
            yield from located(rows, path, where)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per assistant turn of every trajectory, file by file (Parquet by record batches,
    JSONL line by line). ART's `history.jsonl` (aggregate metrics, beside `trajectories/`) is
    not a trajectory file and is passed over."""
    for path in files:
        if path.name == HISTORY:
            continue
        if path.suffix == ".jsonl":
            yield from _read_jsonl(path)
        else:
            yield from _read_parquet(path)
