"""`--from verifiers`: what `vf-eval` saves: `traces.jsonl` (verifiers 0.4: episodes whose
traces store their chat as a message graph; each sampled node is a step, its context the path
to it) and `results.jsonl` + `metadata.json` (verifiers 0.1-0.3: one rollout per line, a step
per assistant turn). In both, the rollouts of one example in one file form an episode group.
The fields and the versions followed: docs/formats/verifiers.md."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Container, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    after_last_turn,
    broken,
    chat_messages,
    chat_turn,
    declared,
    is_scalar,
    iter_jsonl,
    located,
    message_fields,
    number,
    plain_chat,
    read_json,
    rest,
    split_chat,
    split_fields,
    with_extra,
)

INFO = FormatInfo(
    name="verifiers",
    summary="verifiers vf-eval traces.jsonl (0.4) or results.jsonl (0.3): one row per model turn",
    suffixes=("traces.jsonl", "results.jsonl"),
    companions=("metadata.json",),
    carries=(
        "chats (message graphs in 0.4), per-function rewards and weights, metrics, task, completion flags;"
        " 0.4 with a renderer client: token ids and sampling log-probs"
    ),
    lacks="per-turn rewards, anchors; token ids and log-probs when the run used an API client or 0.3",
    source=(
        "verifiers 0.4.0, verifiers/v1/utils/trace_store.py (write_episode; Episode, Trace, MessageNode);"
        " verifiers 0.3.1, verifiers/legacy/utils/save_utils.py (state_to_output, save_outputs, save_metadata)"
    ),
    mapped={
        "messages": "0.4: the messages of the graph path before the sampled node; 0.3: prompt + completion before the turn",
        "prompt": "0.3 completion environments: prompt (a string)",
        "action": "the turn's content (tool calls appended as JSON) / completion string",
        "prompt_token_ids": "0.4: token_ids of the path's nodes + the sampled node's unmasked scaffold",
        "action_token_ids": "0.4: the sampled node's token_ids where mask is True",
        "behavior_logprobs": "0.4: the sampled node's logprobs (rounded to 4 decimals by verifiers)",
        "episode_reward": "0.4: sum of rewards[name].score x weight (Trace.reward); 0.3: reward",
        "reward_<name>, reward_weight_<name>": "0.4: rewards[<name>].score, .weight",
        "metric_<name>": "metrics[<name>]",
        "example_id": "0.3: example_id",
        "task_<field>": "0.4: task.data's scalar fields (idx, prompt, answer, ...); task_type, task_key, task_hash",
        "env_id, model": "0.4: env.id, the turn's model call's model; 0.3: metadata.json beside results.jsonl",
        "episode_id, run_id, trace_id, agent_name, finish_reason, ...": "0.4: the episode's, trace's and"
        " model call's scalar fields (is_completed, ok, stop_condition, timestamp, num_*_tokens, ...)",
        "extra": "nested fields: 0.4 the model call, input nodes, agent config, timing, tools, errors, info, ...;"
        " 0.3 info, timing, error, tool_defs, token_usage",
    },
    derived={
        "final_observation": "0.1-0.3: the messages after the last assistant turn, one `role: content` line each",
        "group_id": "file + task (0.4: episode group id, else task key/hash, and agent name; 0.1.6-0.3: example_id;"
        " 0.1.0-0.1.5: a hash of prompt, answer and info)",
        "traj_id": "file:line (0.4: file:line:trace index)",
        "step_idx": "the sampled nodes (0.4) / assistant turns (0.3) of a trajectory, in order",
        "reward": "the episode reward on the last step, 0.0 on the others",
        "done": "on the last step: is_completed (0.4: and not cut off by a limit or a length finish)",
        "is_truncated": "0.4: stop_condition is a limit (max_turns, max_*_tokens, compaction_failed)"
        " or the last model call finished with length",
    },
)

# fields mapped to step columns, or read to build them
_MAPPED = frozenset({"example_id", "prompt", "completion", "reward", "metrics"})
# the metadata.json fields written as columns on every row
_METADATA_COLUMNS = ("env_id", "model")


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """One row per model turn of each rollout: episodes of a traces.jsonl (0.4), rollouts of
    a results.jsonl (0.3); each line is read by its shape, so a renamed file still reads."""
    for path in files:
        run_columns: dict[str, Any] | None = None  # metadata.json, read at the first 0.3 line
        for line, record in iter_jsonl(path):
            if isinstance(record, Mapping) and "traces" in record and "example_id" not in record:
                yield from located(_episode_rows(path, line, record), path, f"line {line}")
                continue
            if run_columns is None:
                run_columns = _run_columns(path)
            yield from located(_rollout_rows(path, f"line {line}", line, record, run_columns), path, f"line {line}")


class _Rollout(msgspec.Struct):
    """A results.jsonl line (`state_to_output`): what the rows are built from."""

    reward: float
    example_id: int | str | None = None
    id: int | str | None = None  # verifiers 0.1.0-0.1.5: i // rollouts_per_example, not the example
    metrics: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.example_id is None and self.id is None:
            raise broken("example_id", "missing (nor verifiers 0.1's `id`)")


def _run_columns(path: Path) -> dict[str, Any]:
    metadata_path = path.parent / INFO.companions[0]
    if not metadata_path.is_file():
        return {}
    metadata = read_json(metadata_path)
    if not isinstance(metadata, Mapping):
        raise SourceError(metadata_path, None, None, f"expected a JSON object, got {type(metadata).__name__}")
    if "env_id" not in metadata and "env" in metadata:  # the name verifiers 0.1.0-0.1.5 wrote
        metadata = {**metadata, "env_id": metadata["env"]}
    return {key: metadata[key] for key in _METADATA_COLUMNS if isinstance(metadata.get(key), str)}


def _rollout_rows(path: Path, where: str, line: int, record: Any, run_columns: dict[str, Any]) -> Iterator[dict]:
    rollout = declared(_Rollout, record, path, where)
    reward, metrics = rollout.reward, rollout.metrics or {}
    common: dict[str, Any] = {"traj_id": f"{path}:{line}", "episode_reward": reward, **run_columns}
    if rollout.example_id is not None:
        common.update(group_id=f"{path}:{rollout.example_id}", example_id=rollout.example_id)
    else:  # 0.1.0-0.1.5 number the rollouts i // r in rollout-major order: the inputs name the example
        inputs = [record.get(k) for k in ("prompt", "answer", "info")]
        task = json.dumps(inputs, sort_keys=True, default=str).encode("utf-8")
        common["group_id"] = f"{path}:{hashlib.blake2b(task, digest_size=8).hexdigest()}"
    for name, value in metrics.items():
        common[f"metric_{name}"] = None if value is None else number(value, path, where, f"metrics.{name}")
    # the other fields (not mapped, nor a metric repeated at the top level); one named like a
    # column these rows have is kept as source_<name>
    items = ((k, v) for k, v in record.items() if k not in _MAPPED and not (k in metrics and v == metrics[k]))
    own, extra = rest(items, path, where, {*SCHEMA_COLUMNS, *common}, ("metric_",))
    common.update(own)
    done = record.get("is_completed") is not False

    steps = list(_steps(path, where, record.get("prompt"), record.get("completion")))
    if isinstance(record.get("prompt"), list):
        chat = [*record["prompt"], *(record.get("completion") or [])]
        if fields := message_fields(chat):
            extra = {**extra, "message_fields": fields}
        if steps[-1]["action"] or len(steps) > 1:  # (a rollout without a turn keeps its chat as context)
            steps[-1]["final_observation"] = after_last_turn(chat)
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        row = {**common, **step, "step_idx": i, "reward": reward if last else 0.0, "done": done and last}
        yield with_extra(row, extra if last else {})


def _decoded_tool_calls(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """verifiers saves each tool call as a JSON string (`sanitize_tool_calls`): parse them back."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(isinstance(c, str) for c in calls):
        return message
    parsed = []
    for call in calls:
        try:
            parsed.append(json.loads(call) if isinstance(call, str) else call)
        except (ValueError, RecursionError):  # not JSON (or too large to read): kept as text
            parsed.append(call)
    return {**message, "tool_calls": parsed}


def _steps(path: Path, where: str, prompt: Any, completion: Any) -> Iterator[dict[str, Any]]:
    """The steps of one rollout: `messages` (or `prompt`) and `action` of each assistant turn."""
    if prompt is None or isinstance(prompt, str):
        if not (completion is None or isinstance(completion, str)):
            raise SourceError(path, where, "completion", "must be a string when the prompt is a string")
        yield {"prompt": prompt or "", "action": completion or ""}
        return
    chat_messages(prompt, path, where, "prompt")
    completion = [_decoded_tool_calls(m) for m in chat_messages(completion or [], path, where, "completion")]
    prior_turns = sum(1 for m in prompt if m.get("role") == "assistant")  # few-shot turns are context
    turns = list(split_chat([*prompt, *completion]))[prior_turns:]
    if not turns:  # no assistant turn (an error before the first): the rollout is one empty step
        turns = [(plain_chat([*prompt, *completion]), "", {})]
    yield from ({"messages": context, "action": action} for context, action, _ in turns)


# --- verifiers 0.4: traces.jsonl ----------------------------------------------------------

# Trace.is_truncated: the stop conditions that are limits, not an ending (verifiers/v1/trace.py)
_LIMIT_STOPS = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)
# node fields mapped to step columns (the rest of a node goes to `extra`)
_NODE_MAPPED = frozenset({"parent", "message", "sampled", "token_ids", "mask", "logprobs", "timestamp"})
# the scalar fields of a ModelCall written as columns
_CALL_COLUMNS = ("model", "endpoint", "finish_reason")


def _spread(record: Mapping[str, Any], prefix: str, columns: dict, extra: dict, skip: Container[str] = ()) -> None:
    """Scalar fields of `record` to `columns[prefix + key]`, nested non-empty ones to `extra`."""
    for key, value in record.items():
        if key in skip:
            continue
        if is_scalar(value):
            columns[f"{prefix}{key}"] = value
        elif value:
            extra[f"{prefix}{key}"] = value


class _Reward(msgspec.Struct):
    score: float
    weight: float = 1.0


class _Message(msgspec.Struct):
    role: str


class _Node(msgspec.Struct):
    """A MessageNode (verifiers/v1/graph.py)."""

    message: _Message
    parent: int | None = None
    token_ids: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []
    sampled: bool | None = None

    def __post_init__(self) -> None:
        if len(self.mask) != len(self.token_ids):
            raise broken("mask", "must be as long as token_ids")
        if self.sampled and self.message.role != "assistant":
            raise broken("message", f"a sampled node must be an assistant message, got {self.message.role!r}")


class _Trace(msgspec.Struct):
    nodes: list[_Node] = []
    rewards: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    agent: dict[str, Any] = {}
    calls: list[dict[str, Any]] = []
    verifiers: dict[str, Any] = {}

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            if node.parent is not None and not 0 <= node.parent < i:
                raise broken(f"nodes[{i}].parent", f"must be the index of an earlier node, got {node.parent!r}")


class _Episode(msgspec.Struct):
    """An Episode line of traces.jsonl (verifiers/v1/episode.py): what the rows are built from."""

    task: dict[str, Any]
    traces: list[_Trace]
    env: dict[str, Any] | None = None
    run: dict[str, Any] | None = None
    group: dict[str, Any] | None = None


def _episode_rows(path: Path, line: int, episode: Mapping[str, Any]) -> Iterator[dict]:
    """The rows of one `Episode` line: one trajectory per trace."""
    where = f"line {line}"
    declared(_Episode, episode, path, where)
    task, traces = episode["task"], episode["traces"]
    data = declared(dict[str, Any], task.get("data", {}), path, where, "task.data")

    columns: dict[str, Any] = {}
    extra: dict[str, Any] = {}  # the episode's nested fields, on the last row of its last trace
    _spread(task, "task_", columns, extra, ("data",))
    # task.data's fields beside task_type/key/hash; one named like them goes to extra as it is
    clashes = frozenset(k for k in data if f"task_{k}" in columns)
    _spread(data, "task_", columns, extra, clashes)
    if clashes:
        extra["task_data"] = {k: data[k] for k in clashes}
    for key, prefix in (("env", "env_"), ("run", "run_"), ("group", "episode_group_")):
        if episode.get(key) is not None:
            _spread(episode[key], prefix, columns, extra)
    skip = frozenset({"task", "traces", "env", "run", "group"})
    _spread({k: v for k, v in episode.items() if k not in skip}, "episode_", columns, extra)
    group = columns.get("episode_group_id") or task.get("key") or task.get("hash") or json.dumps(data, sort_keys=True)

    if not traces:  # the task failed before any agent ran: one empty step keeps the episode
        row = {**columns, "group_id": f"{path}:{group}", "traj_id": f"{path}:{line}", "step_idx": 0}
        yield with_extra(row | {"messages": [], "action": "", "reward": 0.0, "done": False}, extra)
    for t, trace in enumerate(traces):
        yield from _trace_rows(path, line, t, str(group), trace, task, columns, extra if t == len(traces) - 1 else {})


def _rewards(path: Path, where: str, field: str, trace: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """Trace.reward (the sum of score x weight over the rewards that ran) and the columns."""
    total = 0.0
    columns: dict[str, Any] = {}
    for name, value in trace.get("rewards", {}).items():
        reward = declared(_Reward | None, value, path, where, f"{field}.rewards.{name}")
        if reward is None:  # scoring did not run
            columns[f"reward_{name}"] = columns[f"reward_weight_{name}"] = None
            continue
        columns[f"reward_{name}"], columns[f"reward_weight_{name}"] = reward.score, reward.weight
        total += reward.score * reward.weight
    for name, value in trace.get("metrics", {}).items():
        columns[f"metric_{name}"] = None if value is None else number(value, path, where, f"{field}.metrics.{name}")
    return total, columns


def _trace_rows(
    path: Path, line: int, t: int, group: str, trace: Mapping[str, Any], task: Any, columns: dict, extra: dict
) -> Iterator[dict]:
    """One row per sampled node of trace `t` of line `line`; a row's context is its node's graph path."""
    where, field, traj_id = f"line {line}", f"traces[{t}]", f"{path}:{line}:{t}"
    nodes = trace.get("nodes", [])
    reward, reward_columns = _rewards(path, where, field, trace)
    agent, calls = trace.get("agent", {}), trace.get("calls", [])

    common: dict[str, Any] = {**columns, "episode_reward": reward, **reward_columns}
    trace_extra: dict[str, Any] = {}
    skip = frozenset({"nodes", "calls", "rewards", "metrics", "agent", "verifiers", "task", "id", "version"})
    _spread({k: v for k, v in trace.items() if k not in skip}, "", common, trace_extra)
    common["trace_id"], common["trace_version"] = trace.get("id"), trace.get("version")
    _spread(trace.get("verifiers", {}), "verifiers_", common, trace_extra)
    _spread(agent, "agent_", common, trace_extra)
    if trace.get("task", task) != task:
        trace_extra["trace_task"] = trace["task"]
    group_id = f"{path}:{group}:{common.get('agent_name', 'agent')}"

    by_node = {c["node"]: c for c in calls if isinstance(c.get("node"), int)}
    loose_calls = [c for c in calls if not isinstance(c.get("node"), int)]
    last_call = next((c for c in reversed(calls) if c.get("error") is None), None)
    length = last_call is not None and last_call.get("finish_reason") == "length"
    common["is_truncated"] = truncated = trace.get("stop_condition") in _LIMIT_STOPS or length
    done = trace.get("is_completed") is True and not truncated

    sampled = [i for i, node in enumerate(nodes) if node.get("sampled") is True]
    on_path: set[int] = set()
    steps: list[dict[str, Any]] = []
    turns = [chat_turn(node["message"]) for node in nodes] if sampled else []  # each rendered once
    for i in sampled:
        chain = _path(nodes, i)
        on_path.update(chain)
        steps.append(_step(path, where, f"{field}.nodes[{i}]", nodes, chain, turns, by_node.get(i)))
    if not steps:  # no model turn (an error before the first): one empty step with the chat so far
        chain = _path(nodes, len(nodes) - 1) if nodes else []
        on_path.update(chain)
        context = plain_chat(nodes[n]["message"] for n in chain)
        steps.append({"messages": context, "action": "", "extra": {"input_nodes": [nodes[n] for n in chain]}})

    last_extra = {**trace_extra, **extra}
    if loose_calls:
        last_extra["calls_without_node"] = loose_calls
    if unsampled := {str(n): nodes[n] for n in range(len(nodes)) if n not in on_path}:
        last_extra["nodes_after"] = unsampled  # e.g. a tool result the agent never read back
    for k, step in enumerate(steps):
        last = k == len(steps) - 1
        row = {**common, **step, "group_id": group_id, "traj_id": traj_id, "step_idx": k}
        row.update(reward=reward if last else 0.0, done=done and last)
        yield with_extra(row, {**row.get("extra", {}), **(last_extra if last else {})})


def _path(nodes: list[Mapping[str, Any]], i: int) -> list[int]:
    chain = [i]
    while (parent := nodes[chain[-1]].get("parent")) is not None:
        chain.append(parent)
    return chain[::-1]


def _step(
    path: Path,
    where: str,
    field: str,
    nodes: list[Mapping[str, Any]],
    chain: list[int],
    turns: list[dict[str, str]],
    call: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The row of the sampled node `chain[-1]` (an assistant turn): context, action, tokens, and
    its model call. `turns`: each node's message as context holds it (`chat_turn`)."""
    node = nodes[chain[-1]]
    context, action = [turns[n] for n in chain[:-1]], turns[chain[-1]]["content"]
    step: dict[str, Any] = {"messages": context, "action": action, "timestamp": node.get("timestamp")}
    extra: dict[str, Any] = {}

    own, nested = split_fields((k, v) for k, v in node["message"].items() if k not in ("role", "content", "tool_calls"))
    step.update(own)
    if nested := {k: v for k, v in nested.items() if v}:
        extra["message"] = nested
    if node_extra := {k: v for k, v in node.items() if k not in _NODE_MAPPED and (v or v is False or v == 0)}:
        extra["node"] = node_extra

    tokens, mask, logprobs = node.get("token_ids", []), node.get("mask", []), node.get("logprobs", [])
    n_sampled = sum(mask)
    canonical = n_sampled > 0 and all(mask[len(mask) - n_sampled :]) and not any(mask[: len(mask) - n_sampled])
    if canonical and all(nodes[n].get("token_ids") for n in chain[:-1]):
        scaffold = len(tokens) - n_sampled
        step["prompt_token_ids"] = [t for n in chain[:-1] for t in nodes[n]["token_ids"]] + tokens[:scaffold]
        step["action_token_ids"] = tokens[scaffold:]
        if logprobs and len(logprobs) != n_sampled:
            rule = f"must hold one value per sampled token ({n_sampled}), got {len(logprobs)}"
            raise SourceError(path, where, f"{field}.logprobs", rule)
        if logprobs:  # numbers: the node is declared
            step["behavior_logprobs"] = [float(v) for v in logprobs]
    elif tokens:  # tokens the mask does not split into scaffold then sample: kept as written
        extra["node_tokens"] = {"token_ids": tokens, "mask": mask, "logprobs": logprobs}

    # the input nodes since the previous model turn on this path: their text is in `messages`,
    # their tokens (all scaffold or input, mask False) in `prompt_token_ids` when it is there
    start = max((j for j, n in enumerate(chain[:-1]) if nodes[n].get("sampled") is True), default=-1) + 1
    covered = ("token_ids", "mask", "logprobs") if "prompt_token_ids" in step else ()
    inputs = [{k: v for k, v in nodes[n].items() if k not in covered} for n in chain[start:-1]]
    if inputs:
        extra["input_nodes"] = inputs
    if call is not None:
        step.update((key, call[key]) for key in _CALL_COLUMNS if key in call)
        if other := {k: v for k, v in call.items() if k not in (*_CALL_COLUMNS, "node")}:
            extra["call"] = other
    return with_extra(step, extra)
