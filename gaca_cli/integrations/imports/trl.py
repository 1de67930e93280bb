"""`--from trl`: TRL's GRPO completions tables (`log_completions=True`, Parquet), one row per
completion, its reward the weighted sum of the reward functions' columns. The fields and the
versions followed: docs/formats/trl.md."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    CHAT,
    SCHEMA_COLUMNS,
    FormatInfo,
    ImportOptions,
    SourceError,
    chat_messages,
    declared,
    file_labels,
    iter_parquet_rows,
    locate,
    number,
    plain_chat,
    rest,
    show,
    split_chat,
    with_extra,
)

STEP, PROMPT, COMPLETION, ADVANTAGE = "step", "prompt", "completion", "advantage"
REWARD_PREFIX = "reward_"  # a reward function's column `f` is kept as `reward_f`
SOURCE_ADVANTAGE = "source_advantage"
# the columns this format writes and the schema's own: a log_extra column of one of these names
# (or named reward_*) is kept as source_<name>
WRITTEN = frozenset({*SCHEMA_COLUMNS, STEP, SOURCE_ADVANTAGE})
_PLAIN_KEYS = frozenset({"role", "content"})
_ASSISTANT_KEYS = frozenset({"role", "content", "tool_calls"})  # what a step's action shows

INFO = FormatInfo(
    name="trl",
    summary="TRL GRPOTrainer completion tables (log_completions=True): one trajectory per completion",
    suffixes=(".parquet",),
    carries="prompt, completion, each reward function's reward, TRL's advantage, log_extra columns",
    lacks="anchors, multi-step structure (except tool-calling chats), token ids, log-probs",
    source="trl 1.16.0, trl/trainer/grpo_trainer.py (GRPOTrainer.log, GRPOTrainer._generate_and_score_completions)",
    mapped={
        "prompt": "prompt (plain-text datasets)",
        "messages": "prompt (conversational datasets), then the completion's messages before the assistant turn",
        "action": "completion (its text; in a chat completion, each assistant turn, tool calls as JSON)",
        "reward": "Σ_i w_i·r_i over the reward columns that hold a value (w from --reward-weights, default 1)",
    },
    derived={
        "group_id": "(file, step, prompt): the completions of one prompt at one logging step",
        "traj_id": "FILE/rowN: each completion is one trajectory",
        "step_idx": "0 for a plain completion; the assistant turn's position in a chat completion",
        "done": "true on a completion's last step",
    },
)


class _Row(msgspec.Struct):
    """The fixed columns of a row (the prompt and completion are checked by `_steps`)."""

    step: int
    advantage: float | None


def _columns(record: Mapping[str, Any], path: Path, n_weights: int | None) -> tuple[list[str], list[str]]:
    """(the reward columns, the other columns) of a table whose first row is `record`.

    The reward columns lie between `completion` and `advantage`: all of them, or, with N
    reward weights, the first N (the log_extra columns follow them)."""
    names = list(record)
    for required in (STEP, PROMPT, COMPLETION, ADVANTAGE):
        if required not in names:
            raise SourceError(path, "row 0", required, "missing: not a TRL completions table (log_completions=True)")
    between = names[names.index(COMPLETION) + 1 : names.index(ADVANTAGE)]
    if not between:
        raise SourceError(path, None, None, "no reward function column between 'completion' and 'advantage'")
    if n_weights is not None and n_weights > len(between):
        rule = f"--reward-weights gives {n_weights} weights but the table has {len(between)} column(s) "
        raise SourceError(path, None, None, rule + f"between 'completion' and 'advantage' ({', '.join(between)})")
    rewards = between[:n_weights]
    return rewards, [n for n in names if n not in {STEP, PROMPT, COMPLETION, ADVANTAGE, *rewards}]


def _captured(messages: Sequence[Mapping[str, Any]], keys: frozenset[str]) -> bool:
    """True when the messages hold string contents and no field outside `keys` (pandas writes a
    key that only some messages have as null in the others)."""
    return all(
        isinstance(m.get("content"), str) and all(v is None for k, v in m.items() if k not in keys) for m in messages
    )


def _reward(
    record: Mapping[str, Any], columns: Sequence[str], weights: Sequence[float], path: Path, where: str, hint: str
) -> tuple[float, dict[str, float | None]]:
    """TRL's aggregate reward Σ_i w_i·r_i over the functions that returned a value (nansum), and
    each function's value (None where it returned None)."""
    per_function: dict[str, float | None] = {}
    for i, name in enumerate(columns):
        value = record.get(name)
        if isinstance(value, bool) or not (value is None or isinstance(value, (int, float))):
            rule = f"must be a number (reward function {i + 1} of {len(columns)}), got {show(value)}"
            raise SourceError(path, where, name, rule + hint)
        per_function[name] = None if value is None or math.isnan(value) else number(value, path, where, name)
    scores = [(w, v) for w, v in zip(weights, per_function.values(), strict=True) if v is not None]
    if not scores:
        rule = f"every reward function returned None ({', '.join(columns)} all empty): TRL gave this completion "
        raise SourceError(path, where, None, rule + "no reward and no learning signal")
    return sum(w * v for w, v in scores), per_function


def _steps(prompt: Any, completion: Any, path: Path, where: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The completion's steps as (context, action) fields, and what the steps cannot hold (for `extra`)."""
    if isinstance(prompt, str):
        if not isinstance(completion, str):
            raise SourceError(path, where, COMPLETION, "must be a string when the prompt is a string")
        return [{PROMPT: prompt, "action": completion}], {}
    prompt_messages = chat_messages(prompt, path, where, PROMPT, f"must be a string or {CHAT}")
    completion_messages = chat_messages(completion, path, where, COMPLETION, f"must be {CHAT} when the prompt is one")
    context = plain_chat(prompt_messages)
    steps = [{"messages": context + before, "action": text} for before, text, _ in split_chat(completion_messages)]
    if not steps:
        raise SourceError(path, where, COMPLETION, "has no assistant message")
    # the raw messages go to `extra` where the steps cannot show all of them (tool names,
    # reasoning fields, content parts, tool results after the last assistant turn)
    extra: dict[str, Any] = {}
    if not _captured(prompt_messages, _PLAIN_KEYS):
        extra[PROMPT] = prompt
    if completion_messages[-1]["role"] != "assistant" or not _captured(completion_messages, _ASSISTANT_KEYS):
        extra[COMPLETION] = completion
    return steps, extra


def _group_key(step: int, prompt: Any) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return f"step{step}/{hashlib.sha1(text.encode('utf-8')).hexdigest()[:12]}"


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """One row per step of each completion, file by file, row by row (Parquet record batches)."""
    labels, weights = file_labels(files), options.reward_weights
    hint = "; if the run logged log_extra columns, give --reward-weights (one weight per reward function): only "
    hint = "" if weights is not None else hint + "that many columns are then read as rewards"
    for path in files:
        columns: tuple[list[str], list[str]] | None = None
        for row, record in iter_parquet_rows(path):
            where = f"row {row}"
            functions, others = columns = columns or _columns(record, path, None if weights is None else len(weights))
            head = declared(_Row, record, path, where)
            total, per_function = _reward(record, functions, weights or (1.0,) * len(functions), path, where, hint)
            steps, extra = _steps(record[PROMPT], record[COMPLETION], path, where)
            own, nested = rest(((name, record[name]) for name in others), path, where, WRITTEN, (REWARD_PREFIX,))
            extra.update(nested)
            group_id, last = f"{labels[path]}/{_group_key(head.step, record[PROMPT])}", len(steps) - 1
            # the completion's columns: its step, each reward function's value, TRL's advantage
            common = {STEP: head.step, **{f"{REWARD_PREFIX}{n}": v for n, v in per_function.items()}}
            common.update({SOURCE_ADVANTAGE: head.advantage, **own})
            for k, fields in enumerate(steps):
                out = {"group_id": group_id, "traj_id": f"{labels[path]}/row{row}", "step_idx": k}
                out.update({"reward": total if k == last else 0.0, "done": k == last, **fields, **common})
                yield locate(with_extra(out, extra if k == last else {}), path, where)
