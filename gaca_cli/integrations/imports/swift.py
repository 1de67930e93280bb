"""`--from swift`: ms-swift's GRPO completions.jsonl (table lines of the trainer, lines of the
Ray driver), one row per completion, its reward the weighted sum of the reward functions' (args.json's reward_weights). The fields and the versions followed: docs/formats/swift.md."""

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
    iter_jsonl,
    keep_columns,
    locate,
    located,
    number,
    read_json,
    split_fields,
)

INFO = FormatInfo(
    name="swift",
    summary="ms-swift GRPO completions.jsonl (log_completions): one-step trajectories, grouped by prompt per logging step",
    suffixes=("completions.jsonl",),  # a run's directory also holds logging.jsonl, args.json, ...
    companions=("args.json",),
    carries="templated prompt, completion, per-function rewards, advantage, training step, extra logged columns",
    lacks="multi-step structure (a multi-turn rollout is logged as its last turn), anchors, token ids, log-probs",
    source="ms-swift 4.6.0, swift/rlhf_trainers/grpo_trainer.py (GRPOTrainer.log, _log_rollout); "
    "swift/megatron/trainers/grpo_trainer.py (_build_log_table); swift/ray/megatron/base_trainer.py "
    "(_maybe_log_completions)",
    mapped={
        "prompt": "prompt (the chat template applied)",
        "action": "completion",
        "reward": "the reward functions' columns (between completion and advantages), weighted by the run's "
        "reward_weights (args.json beside the file, or --reward-weights) and summed, NaN counted as 0 as ms-swift "
        "does; reward (Ray layout)",
        "episode_reward": "the same sum",
        "training_step": "step (gen_step in the Megatron and Ray layouts)",
        "source_advantage": "advantages",
        "reward_<function>": "each reward function's column",
    },
    derived={
        "group_id": "FILE:<line>:<hash of the prompt>: the completions of one prompt at one logging step "
        "(Ray layout: FILE:step <gen_step>:<hash>)",
        "traj_id": "FILE:<line>:<position in the line> (Ray layout: FILE:<line>)",
        "step_idx": "0: each completion is a one-step trajectory",
        "done": "true",
    },
)

#: the keys a table line starts with, before the reward functions' columns
HEAD = ("prompt", "completion")
STEP_KEYS = ("step", "gen_step")
ADVANTAGES = "advantages"
REWARD_PREFIX = "reward_"
#: the columns a row of this format has: a logged column of one of these names (or named
#: reward_*) is kept as source_<name>
WRITTEN = frozenset({*SCHEMA_COLUMNS, "training_step", "source_advantage"})
#: the arguments file ms-swift writes in the run's output directory
ARGS = INFO.companions[0]


def _prompt_key(prompt: str) -> str:
    return hashlib.blake2b(prompt.encode("utf-8"), digest_size=6).hexdigest()


def _training_step(value: Any, path: Path, where: str, key: str) -> int:
    """ms-swift writes `step` as text (str(global_step)); Megatron's `gen_step` is a number."""
    if isinstance(value, bool):
        raise SourceError(path, where, key, f"must be an integer, got {value!r:.40}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise SourceError(path, where, key, f"must be an integer (or its text), got {value!r:.40}")


def _reward_value(value: Any, path: Path, where: str, key: str) -> float:
    """A reward function's value; None or NaN is 'not applicable' (ms-swift sums with nansum)."""
    if value is None:
        return math.nan
    return number(value, path, where, key)


def _run_weights(path: Path) -> tuple[float, ...] | None:
    """The run's `reward_weights` from the `args.json` ms-swift saves in the output directory,
    beside `completions.jsonl` (None when there is no such file or it sets none)."""
    args_file = path.parent / ARGS
    if not args_file.is_file():
        return None
    args = read_json(args_file)
    weights = args.get("reward_weights") if isinstance(args, Mapping) else None
    if weights is None:
        return None
    if not isinstance(weights, list):
        raise SourceError(args_file, None, "reward_weights", f"must be a list of numbers, got {weights!r:.40}")
    values = tuple(number(w, args_file, None, "reward_weights") for w in weights)
    if not all(math.isfinite(w) for w in values):
        raise SourceError(args_file, None, "reward_weights", f"must be finite numbers, got {weights!r:.40}")
    return values


def _weights(
    options: ImportOptions, run: tuple[float, ...] | None, functions: list[str], path: Path, where: str
) -> tuple[float, ...]:
    """--reward-weights, else the run's args.json, else 1 for every function."""
    weights, origin = options.reward_weights, "--reward-weights"
    if weights is None:
        weights, origin = run, f"{path.parent / ARGS} (reward_weights)"
    if weights is None:
        return (1.0,) * len(functions)
    if len(weights) != len(functions):
        raise SourceError(
            path,
            where,
            None,
            f"{origin} gives {len(weights)} weights for the {len(functions)} reward functions "
            f"{', '.join(functions) or '(none)'}",
        )
    return weights


def _table(
    record: Mapping[str, Any], path: Path, line: int, options: ImportOptions, run: tuple[float, ...] | None
) -> Iterator[dict[str, Any]]:
    """One line of GRPOTrainer.log (or the Megatron trainer): a table of equal-length lists."""
    where = f"line {line}"
    keys = list(record)
    step_key = next((k for k in STEP_KEYS if k in record), None)
    if step_key is None:
        raise SourceError(path, where, "step", "missing")
    for key in HEAD:
        if key not in record:
            raise SourceError(path, where, key, "missing")
    n = len(record["prompt"]) if isinstance(record["prompt"], list) else -1
    for key, value in record.items():
        if not isinstance(value, list) or len(value) != n:
            raise SourceError(path, where, key, f"must be a list of {max(n, 0)} values, one per completion")
    if ADVANTAGES not in record:
        raise SourceError(
            path, where, ADVANTAGES, "missing: without it the reward functions' columns cannot be told apart"
        )
    start, end = keys.index("completion") + 1, keys.index(ADVANTAGES)
    functions = keys[start:end]
    if not functions:
        raise SourceError(path, where, None, "no reward function column between 'completion' and 'advantages'")
    weights = _weights(options, run, functions, path, where)
    others = [k for k in keys[end + 1 :] if k not in (step_key, *HEAD)]
    groups: dict[str, str] = {}
    for i in range(n):
        here = f"{where}, completion {i}"
        prompt, completion = record["prompt"][i], record["completion"][i]
        for key, value in (("prompt", prompt), ("completion", completion)):
            if not isinstance(value, str):
                raise SourceError(path, here, key, f"must be text, got {value!r:.40}")
        values = [_reward_value(record[f][i], path, here, f) for f in functions]
        reward = math.fsum(w * v for w, v in zip(weights, values) if not math.isnan(v))
        key = groups.setdefault(prompt, _prompt_key(prompt))
        row: dict[str, Any] = {
            "group_id": f"{path}:{line}:{key}",
            "traj_id": f"{path}:{line}:{i}",
            "step_idx": 0,
            "reward": reward,
            "episode_reward": reward,
            "done": True,
            "prompt": prompt,
            "action": completion,
            "training_step": _training_step(record[step_key][i], path, here, step_key),
            "source_advantage": _reward_value(record[ADVANTAGES][i], path, here, ADVANTAGES),
        }
        for f, v in zip(functions, values):
            row[f"{REWARD_PREFIX}{f}"] = v
        own, extra = split_fields((key_, record[key_][i]) for key_ in others)
        row.update(keep_columns(own, path, here, WRITTEN, (REWARD_PREFIX,)))
        if extra:
            row["extra"] = extra
        yield row


def _row(record: Mapping[str, Any], path: Path, line: int) -> dict[str, Any]:
    """One line of the Ray driver: one completion, its total reward."""
    where = f"line {line}"
    for key in ("prompt", "completion"):
        if not isinstance(record.get(key), str):
            raise SourceError(path, where, key, "missing" if record.get(key) is None else "must be text")
    if record.get("reward") is None:
        raise SourceError(path, where, "reward", "missing")
    reward = number(record["reward"], path, where, "reward")
    step = _training_step(record.get("gen_step"), path, where, "gen_step")
    row: dict[str, Any] = {
        "group_id": f"{path}:step {step}:{_prompt_key(record['prompt'])}",
        "traj_id": f"{path}:{line}",
        "step_idx": 0,
        "reward": reward,
        "episode_reward": reward,
        "done": True,
        "prompt": record["prompt"],
        "action": record["completion"],
        "training_step": step,
    }
    own, extra = split_fields(
        (key, value) for key, value in record.items() if key not in ("gen_step", "prompt", "completion", "reward")
    )
    row.update(keep_columns(own, path, where, WRITTEN, (REWARD_PREFIX,)))
    if extra:
        row["extra"] = extra
    return row


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per completion, line by line. A table line equal to the line before it is
    the trainer logging the same completions again (its log buffer is kept between logging
    calls, and the end of training logs once more): it is passed over."""
    for path in files:
        run = _run_weights(path) if options.reward_weights is None else None
        previous: Any = None
        for line, record in iter_jsonl(path):
            if not isinstance(record, Mapping):
                raise SourceError(path, f"line {line}", None, f"expected a JSON object, got {type(record).__name__}")
            if isinstance(record.get("prompt"), list):
                if record == previous:
                    continue
                previous = record
                yield from located(_table(record, path, line, options, run), path, f"line {line}")
            else:
                yield locate(_row(record, path, line), path, f"line {line}")
