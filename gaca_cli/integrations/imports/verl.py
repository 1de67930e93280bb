"""`--from verl`: verl's rollout dumps (`trainer.rollout_data_dir`: one sample per line, the
TransferQueue trainer's `{uid}_{session}_{index}` keys as multi-step sessions) and agent-loop
trajectories (`AgentLoopOutput` lines: each run of 1s in `response_mask` is a step). The
fields and the versions followed: docs/formats/verl.md."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    broken,
    declared,
    file_labels,
    is_scalar,
    locate,
    located,
    mask_runs,
    objects,
    rest,
    show,
    token_steps,
    with_extra,
)
from gaca_cli.log import columns as C

INPUT, OUTPUT, GTS, SCORE, STEP, UID = "input", "output", "gts", "score", "step", "uid"
RESPONSE_MASK, RESPONSE_LOGPROBS = "response_mask", "response_logprobs"
REWARD_SCORE, EXTRA_FIELDS, TURN_SCORES, TOOL_REWARDS = "reward_score", "extra_fields", "turn_scores", "tool_rewards"
TURN_SCORE, TOOL_REWARD = "turn_score", "tool_reward"  # the per-step columns they become
# the columns this format writes and the schema's own: a source field of one of these names is
# kept as source_<name>
WRITTEN = frozenset({*SCHEMA_COLUMNS, INPUT, GTS, STEP, UID, REWARD_SCORE, TURN_SCORE, TOOL_REWARD})

INFO = FormatInfo(
    name="verl",
    summary="verl rollout dumps (trainer.rollout_data_dir JSONL) and agent-loop trajectories (response_mask runs as steps)",
    suffixes=(".jsonl",),
    carries="dumps: decoded prompt and response, score, ground truth, reward extra info; "
    "agent loop: token ids, log-probs, per-turn tool rewards and turn scores",
    lacks="anchors; dumps: group ids (derived from the prompt), exact prompt text (decoded without special "
    "tokens), multi-step structure; agent loop: text (token ids only)",
    source="verl 0.9.1, verl/trainer/ppo/ray_trainer.py (RayPPOTrainer._log_rollout_data, _write_generations), "
    "verl/trainer/ppo/v1/trainer_base.py (PPOTrainer._log_rollout_data), "
    "verl/experimental/agent_loop/agent_loop.py (AgentLoopOutput)",
    mapped={
        "action": "output (dumps)",
        "action_token_ids": "response_ids[run] (agent loop)",
        "prompt_token_ids": "prompt_ids + response_ids before the run (agent loop)",
        "behavior_logprobs": "response_logprobs[run] (agent loop)",
        "reward": "score (dumps; a session's last output with v1 uid keys); "
        "reward_score on the last step + turn_scores[k] + tool_rewards[k] (agent loop)",
        "episode_reward": "score (dumps)",
        "group_id": "uid (agent loop; v1 dumps: the uid part of {uid}_{session}_{index})",
    },
    derived={
        "group_id": "dumps without uid: (file, input): the samples of one prompt at one step",
        "traj_id": "FILE/lineN; v1 dumps: {uid}_{session}",
        "step_idx": "0; v1 dumps: index; agent loop: the run's position in response_mask",
        "done": "true on a trajectory's last step",
        "input": "input, kept as its own column (`--map prompt=input` to score it: no special tokens)",
    },
)


class _Dump(msgspec.Struct):
    """A rollout dump record (`_write_generations`): the fields the row is built from."""

    input: str
    output: str
    score: float
    step: int


class _AgentLoop(msgspec.Struct):
    """An agent-loop record (`AgentLoopOutput.model_dump` + uid, step)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    uid: str | int | None = None
    response_logprobs: list[float] | None = None
    reward_score: float | None = None
    score: float | None = None
    step: int | None = None
    extra_fields: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if self.uid is None:
            raise broken(UID, "missing: add the sample's uid when writing the record")
        for name, values in ((RESPONSE_MASK, self.response_mask), (RESPONSE_LOGPROBS, self.response_logprobs)):
            if values is not None and len(values) != n:
                raise broken(name, f"has {len(values)} values for {n} response_ids")
        if (bad := next((i for i, m in enumerate(self.response_mask) if m not in (0, 1)), None)) is not None:
            raise broken(RESPONSE_MASK, f"must hold 0s and 1s, got {self.response_mask[bad]} at position {bad}")
        if 1 not in self.response_mask:
            raise broken(RESPONSE_MASK, "no generated token (no 1 in the mask): no step to import")
        if self.reward_score is None and self.score is None:
            raise broken(REWARD_SCORE, "is null and the record has no 'score': add the trajectory's reward as 'score'")


def _kept(
    record: Mapping[str, Any], consumed: frozenset[str], path: Path, where: str, drop_null: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record's fields not in `consumed`, as `rest` splits them against this format's columns;
    `drop_null`: null fields left out first (AgentLoopOutput's unset fields)."""
    items = ((k, v) for k, v in record.items() if k not in consumed and not (drop_null and v is None))
    return rest(items, path, where, WRITTEN)


# --- rollout dumps -------------------------------------------------------------------------


def _session(uid: Any) -> tuple[str, str, int] | None:
    """(prompt uid, trajectory id, output index) of a v1 sample key `{uid}_{session}_{index}`."""
    if not isinstance(uid, str):
        return None
    parts = uid.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return parts[0], f"{parts[0]}_{parts[1]}", int(parts[2])


def _dump_row(record: Mapping[str, Any], path: Path, where: str, label: str, line: int) -> dict[str, Any]:
    """One dump record as a one-step row (the v1 session fields are set by the caller)."""
    dump = declared(_Dump, record, path, where)
    own, nested = _kept(record, frozenset({INPUT, OUTPUT, SCORE, STEP, GTS, UID}), path, where)
    if record.get(GTS) is not None:  # verl < 0.6 writes none, later verl null without a ground truth
        (own if is_scalar(record[GTS]) else nested)[GTS] = record[GTS]
    digest = hashlib.sha1(dump.input.encode("utf-8")).hexdigest()[:12]
    row = {C.GROUP_ID: f"{label}/{digest}", C.TRAJ_ID: f"{label}/line{line}", C.STEP_IDX: 0, C.REWARD: dump.score}
    row.update({C.EPISODE_REWARD: dump.score, C.DONE: True, C.ACTION: dump.output, INPUT: dump.input, STEP: dump.step})
    row.update(own)
    if UID in record:
        row[UID] = record[UID] if isinstance(record[UID], (str, int)) else show(record[UID])
    return with_extra(row, nested)


Lines = Iterable[tuple[int, str, Mapping[str, Any]]]


def _read_dump(path: Path, label: str, lines: Lines) -> Iterator[dict]:
    """The rows of one dump file. Rows of a v1 session (uid `{uid}_{session}_{index}`) are held
    until the session ends, to put its score on its last output."""
    pending: list[dict[str, Any]] = []
    finished: set[str] = set()

    def flush() -> Iterator[dict]:
        if pending:
            finished.add(pending[0][C.TRAJ_ID])
        for k, row in enumerate(pending):
            last = k == len(pending) - 1
            row.update({C.REWARD: row[C.EPISODE_REWARD] if last else 0.0, C.DONE: last})
            yield row
        pending.clear()

    for line, where, record in lines:
        if RESPONSE_MASK in record:
            rule = "an agent-loop record in a rollout dump file: keep them in files apart"
            raise SourceError(path, where, None, rule)
        row = locate(_dump_row(record, path, where, label, line), path, where)
        session = _session(record.get(UID))
        if session is None:
            if UID in record:
                row[C.GROUP_ID] = str(record[UID])
            yield from flush()
            yield row
            continue
        group, traj, index = session
        if pending and traj != pending[0][C.TRAJ_ID]:
            yield from flush()
        if traj in finished:
            rule = f"the outputs of session {traj!r} are not on consecutive lines (verl sorts them)"
            raise SourceError(path, where, UID, rule)
        if index != len(pending):
            raise SourceError(path, where, UID, f"output index {index} of session {traj!r}: expected {len(pending)}")
        row.update({C.GROUP_ID: group, C.TRAJ_ID: traj, C.STEP_IDX: index})
        pending.append(row)
    yield from flush()


# --- agent-loop trajectories ---------------------------------------------------------------


def _per_turn(values: list[float] | None, n_steps: int) -> list[float] | None:
    """Per-turn values as one per step, when they line up with the turns: one per turn, or one
    per turn but the last (the turn that ended the episode without a tool call or a reply)."""
    if values and len(values) == n_steps:
        return values
    return [*values, 0.0] if values and len(values) == n_steps - 1 else None


def _read_trajectory(record: Mapping[str, Any], path: Path, where: str, label: str, line: int) -> Iterator[dict]:
    loop = declared(_AgentLoop, record, path, where)
    fields = loop.extra_fields or {}
    runs = mask_runs(loop.response_mask)
    per_step: dict[str, list[float]] = {}
    extra_fields = dict(fields)
    for key, column in ((TURN_SCORES, TURN_SCORE), (TOOL_REWARDS, TOOL_REWARD)):
        values = fields.get(key)
        if values is None:
            continue
        aligned = _per_turn(declared(list[float], values, path, where, f"{EXTRA_FIELDS}.{key}"), len(runs))
        if aligned is not None:
            per_step[column] = aligned
            del extra_fields[key]
        elif not values:
            del extra_fields[key]

    own, nested = _kept(record, frozenset(_AgentLoop.__struct_fields__), path, where, drop_null=True)
    if extra_fields:
        nested[EXTRA_FIELDS] = extra_fields
    last, outcome = len(runs) - 1, float(loop.reward_score if loop.reward_score is not None else loop.score or 0.0)
    if loop.step is not None:
        own[STEP] = loop.step
    steps = token_steps(loop.prompt_ids, loop.response_ids, runs, loop.response_logprobs)
    for k, tokens in enumerate(steps):
        reward = sum(values[k] for values in per_step.values()) + (outcome if k == last else 0.0)
        row = {C.GROUP_ID: str(loop.uid), C.TRAJ_ID: f"{label}/line{line}", C.STEP_IDX: k, C.REWARD: reward}
        row.update({C.DONE: k == last, **tokens, REWARD_SCORE: outcome})
        row.update({column: values[k] for column, values in per_step.items()})
        yield with_extra({**row, **own}, nested if k == last else {})


def _read_trajectories(path: Path, label: str, lines: Lines) -> Iterator[dict]:
    for line, where, record in lines:
        if RESPONSE_MASK not in record:
            rule = "missing: a rollout dump record in an agent-loop file: keep them apart"
            raise SourceError(path, where, RESPONSE_MASK, rule)
        yield from located(_read_trajectory(record, path, where, label, line), path, where)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """One row per step, file by file, line by line. A file's first record says which kind the
    file is: an agent-loop trajectory when it has `response_mask`, a rollout dump otherwise. One
    import takes files of one kind (dump rows have text, agent-loop rows token ids)."""
    labels = file_labels(files)
    kinds: dict[str, Path] = {}
    for path in files:
        lines = objects(path)
        first = next(lines, None)
        if first is None:
            continue
        record = first[2]
        if RESPONSE_MASK not in record and INPUT not in record and OUTPUT not in record:
            rule = "neither a rollout dump record (input, output, score, step) nor an agent-loop record "
            raise SourceError(path, first[1], None, rule + "(prompt_ids, response_ids, response_mask)")
        kind = "agent-loop trajectories" if RESPONSE_MASK in record else "rollout dumps"
        kinds.setdefault(kind, path)
        if len(kinds) > 1:
            other = next(p for k, p in kinds.items() if k != kind)
            rule = f"holds {kind} but {other} holds the other kind: import rollout dumps and agent-loop trajectories"
            raise SourceError(path, None, None, rule + " separately")
        reader = _read_trajectories if kind == "agent-loop trajectories" else _read_dump
        yield from reader(path, labels[path], itertools.chain([first], lines))
