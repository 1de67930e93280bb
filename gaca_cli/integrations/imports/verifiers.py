"""Prime Intellect verifiers: the `results.jsonl` (+ `metadata.json`) that `vf-eval -s` writes.

Followed: verifiers 0.3.1, `verifiers/legacy/utils/save_utils.py` (`state_to_output`,
`save_outputs`, `save_metadata`) and `verifiers/legacy/types.py` (`RolloutOutput`,
`GenerateMetadata`). One line is one rollout: `example_id`, `prompt` and `completion` (chat
messages, or strings for completion environments), `answer`, `info`, `reward`, `metrics` (one
score per rubric function, also repeated as top-level keys), `is_completed`, `is_truncated`,
`stop_condition`, `error`, `timing`, `tool_defs`, `token_usage`, and the run's `state_columns`.

A chat rollout becomes one step per assistant turn of its completion; the context of a turn is
the prompt and the completion before it. The rollouts of one example in one results file form
an episode group. verifiers 0.4 writes `traces.jsonl` (message graphs) instead, which this
format does not read.
"""

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
    number,
    read_json,
    split_chat,
    text_of,
)

INFO = FormatInfo(
    name="verifiers",
    summary="verifiers vf-eval results.jsonl (+ metadata.json): one row per assistant turn",
    suffixes=("results.jsonl",),
    carries="prompt and completion chats, answer, reward, per-rubric-function metrics, info, example id",
    lacks="per-turn rewards, anchors, token ids, log-probs",
    source="verifiers 0.3.1, verifiers/legacy/utils/save_utils.py (state_to_output, save_outputs, save_metadata)",
    mapped={
        "messages": "prompt + completion messages before the turn",
        "prompt": "prompt (completion environments: a string)",
        "action": "the assistant turn's content (tool calls appended as JSON) / completion string",
        "episode_reward": "reward",
        "example_id": "example_id",
        "metric_<name>": "metrics[<name>]",
        "env_id, model": "metadata.json beside results.jsonl",
        "extra": "info, timing, error, tool_defs, token_usage (nested fields)",
    },
    derived={
        "group_id": "results file + example_id: the rollouts of one example in one run",
        "traj_id": "results file:line",
        "step_idx": "the assistant turns of the completion, in order",
        "reward": "reward on the last turn, 0.0 on the others",
        "done": "is_completed, on the last turn",
    },
)

# fields mapped to step columns, or read to build them
_MAPPED = frozenset({"example_id", "prompt", "completion", "reward", "metrics"})
# the metadata.json fields written as columns on every row
_METADATA_COLUMNS = ("env_id", "model")


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """One row per assistant turn of each rollout in each results.jsonl."""
    for path in files:
        run_columns = _run_columns(path)
        for line, record in iter_jsonl(path):
            yield from _rollout_rows(path, f"line {line}", line, record, run_columns)


def _run_columns(path: Path) -> dict[str, Any]:
    metadata_path = path.parent / "metadata.json"
    if not metadata_path.is_file():
        return {}
    metadata = read_json(metadata_path)
    if not isinstance(metadata, Mapping):
        raise SourceError(metadata_path, None, None, f"expected a JSON object, got {type(metadata).__name__}")
    return {key: metadata[key] for key in _METADATA_COLUMNS if isinstance(metadata.get(key), str)}


def _rollout_rows(path: Path, where: str, line: int, record: Any, run_columns: dict[str, Any]) -> Iterator[dict]:
    if not isinstance(record, Mapping):
        raise SourceError(path, where, None, f"expected a JSON object, got {type(record).__name__}")
    if "traces" in record and "example_id" not in record:
        raise SourceError(
            path, where, "traces", "a verifiers 0.4 traces.jsonl episode; this format reads vf-eval results.jsonl"
        )
    if "example_id" not in record or record["example_id"] is None:
        raise SourceError(path, where, "example_id", "missing")
    example_id = record["example_id"]
    if isinstance(example_id, bool) or not isinstance(example_id, (int, str)):
        raise SourceError(path, where, "example_id", f"must be an integer or a string, got {json.dumps(example_id)}")
    if "reward" not in record:
        raise SourceError(path, where, "reward", "missing")
    reward = number(record["reward"], path, where, "reward")
    metrics = record.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise SourceError(path, where, "metrics", "must be an object of rubric function scores")

    common: dict[str, Any] = {
        "group_id": f"{path}:{example_id}",
        "traj_id": f"{path}:{line}",
        "episode_reward": reward,
        "example_id": example_id,
        **run_columns,
    }
    for name, value in metrics.items():
        common[f"metric_{name}"] = None if value is None else number(value, path, where, f"metrics.{name}")
    extra: dict[str, Any] = {}
    for key, value in record.items():
        if key in _MAPPED or (key in metrics and value == metrics[key]):
            continue  # mapped, or a metric repeated at the top level
        if value is None or isinstance(value, (str, int, float, bool)):
            common[key] = value
        else:
            extra[key] = value
    completed = record.get("is_completed", True)
    done = completed if isinstance(completed, bool) else True

    steps = list(_steps(path, where, record.get("prompt"), record.get("completion")))
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        row = {**common, **step, "step_idx": i, "reward": reward if last else 0.0, "done": done and last}
        if last and extra:
            row["extra"] = extra
        yield row


def _decoded_tool_calls(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """verifiers saves each tool call as a JSON string (`sanitize_tool_calls`): parse them back."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(isinstance(c, str) for c in calls):
        return message
    parsed = []
    for call in calls:
        try:
            parsed.append(json.loads(call) if isinstance(call, str) else call)
        except json.JSONDecodeError:
            parsed.append(call)
    return {**message, "tool_calls": parsed}


def _steps(path: Path, where: str, prompt: Any, completion: Any) -> Iterator[dict[str, Any]]:
    """The steps of one rollout: `messages` (or `prompt`) and `action` of each assistant turn."""
    if prompt is None or isinstance(prompt, str):
        if not (completion is None or isinstance(completion, str)):
            raise SourceError(path, where, "completion", "must be a string when the prompt is a string")
        yield {"prompt": prompt or "", "action": completion or ""}
        return
    for field, value in (("prompt", prompt), ("completion", completion)):
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(m, Mapping) and "role" in m for m in value)
        ):
            raise SourceError(path, where, field, "must be a list of chat messages with a role")
    completion = [_decoded_tool_calls(m) for m in completion or []]
    prior_turns = sum(1 for m in prompt if m.get("role") == "assistant")  # few-shot turns are context
    turns = list(split_chat([*prompt, *completion]))[prior_turns:]
    if not turns:  # no assistant turn (an error before the first): the rollout is one empty step
        context = [{"role": str(m["role"]), "content": text_of(m.get("content"))} for m in [*prompt, *completion]]
        yield {"messages": context, "action": ""}
        return
    for context, action, _message in turns:
        yield {"messages": context, "action": action}
