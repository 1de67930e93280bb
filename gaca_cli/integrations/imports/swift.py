"""`--from swift`: ms-swift's GRPO completions.jsonl (table lines of the trainer, lines of the
Ray driver), one row per completion, its reward the weighted sum of the reward functions' (args.json's reward_weights). The fields and the versions followed: docs/formats/swift.md."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
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
    locate,
    located,
    number,
    objects,
    plain_chat,
    read_json,
    rest,
    with_extra,
)

INFO = FormatInfo(
    name="swift",
    summary="ms-swift GRPO completions.jsonl (log_completions): one-step trajectories, grouped by prompt per logging step",
    suffixes=("completions.jsonl",),  # a run's directory also holds logging.jsonl, args.json, ...
    companions=("args.json",),
    carries="templated prompt, completion, per-function rewards, advantage, training step, extra logged columns",
    lacks="multi-step structure (a multi-turn rollout is logged as its last turn), anchors, token ids, log-probs",
    source="ms-swift 4.6.0 and 3.1.1 to 3.12: swift/rlhf_trainers/grpo_trainer.py (3.x: swift/trainers/rlhf_trainer/; "
    "GRPOTrainer.log, _log_rollout); swift/megatron/trainers/grpo_trainer.py (_build_log_table); "
    "swift/ray/megatron/base_trainer.py (_maybe_log_completions)",
    mapped={
        "prompt": "prompt (the chat template applied)",
        "messages": "prompt, when it is chat messages (ms-swift 3.3 and 3.4); messages (3.1, 3.2)",
        "action": "completion",
        "reward": "the reward functions' columns (after completion, up to advantages), weighted by the run's "
        "reward_weights (args.json beside the file, or --reward-weights) and summed, NaN counted as 0 as ms-swift "
        "does; reward, the weighted total as logged (ms-swift 3.1, 3.2, Ray layout)",
        "episode_reward": "the same sum",
        "training_step": "step (gen_step in the Megatron and Ray layouts)",
        "source_advantage": "advantages (advantage in ms-swift 3.7; none before)",
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

STEP_KEYS = ("step", "gen_step")
ADVANTAGE_KEYS = ("advantages", "advantage")  # ms-swift 3.7 wrote `advantage`; before 3.7 a line has neither
REWARD_PREFIX = "reward_"
#: the columns a row of this format has: a logged column of one of these names (or named
#: reward_*) is kept as source_<name>
WRITTEN = frozenset({*SCHEMA_COLUMNS, "training_step", "source_advantage"})
#: the arguments file ms-swift writes in the run's output directory
ARGS = INFO.companions[0]


class _RayLine(msgspec.Struct):
    """A line of the Ray driver (`_maybe_log_completions`): one completion, its total reward."""

    prompt: str
    completion: str
    reward: float
    gen_step: int | str


def _row(prompt: str | list, completion: str, reward: float, step: int, ids: tuple[str, str]) -> dict[str, Any]:
    """The one-step row of a completion (a prompt of chat messages is the row's `messages`)."""
    row = {"group_id": ids[0], "traj_id": ids[1], "step_idx": 0, "reward": reward, "episode_reward": reward}
    context = {"prompt" if isinstance(prompt, str) else "messages": prompt}
    return row | context | {"done": True, "action": completion, "training_step": step}


def _prompt_key(prompt: str | list) -> str:
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=6).hexdigest()


def _training_step(value: Any, path: Path, where: str, key: str) -> int:
    """ms-swift writes `step` as text (str(global_step)); Megatron's `gen_step` is a number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise SourceError(path, where, key, f"must be an integer (or its text), got {value!r:.40}")


def _reward_value(value: Any, path: Path, where: str, key: str) -> float:
    """A reward function's value; None or NaN is 'not applicable' (ms-swift sums with nansum)."""
    return math.nan if value is None else number(value, path, where, key)


def _run_weights(path: Path) -> tuple[float, ...] | None:
    """The run's `reward_weights` from the `args.json` ms-swift saves in the output directory,
    beside `completions.jsonl` (None when there is no such file or it sets none)."""
    args_file = path.parent / ARGS
    args = read_json(args_file) if args_file.is_file() else None
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
        rule = f"{origin} gives {len(weights)} weights for the {len(functions)} reward functions "
        raise SourceError(path, where, None, rule + (", ".join(functions) or "(none)"))
    return weights


def _table(
    record: Mapping[str, Any], path: Path, line: int, options: ImportOptions, run: tuple[float, ...] | None
) -> Iterator[dict[str, Any]]:
    """One line of GRPOTrainer.log (or the Megatron trainer): a table of equal-length lists."""
    where = f"line {line}"
    step_key = next((k for k in STEP_KEYS if k in record), "step")
    total = "prompt" not in record  # ms-swift 3.1, 3.2: `messages`, and `reward` the weighted total (no function's own)
    prompt_key = "messages" if total else "prompt"
    for key in (step_key, prompt_key, "completion", *(["reward"] if total else [])):
        if key not in record:
            raise SourceError(path, where, key, "missing")
    n = len(record[prompt_key])
    for key, value in record.items():
        if not isinstance(value, list) or len(value) != n:
            raise SourceError(path, where, key, f"must be a list of {n} values, one per completion")
    keys = list(record)
    advantages = next((k for k in ADVANTAGE_KEYS if k in record), None)
    if not total:
        end = keys.index(advantages) if advantages else len(keys)  # no advantages: the rest are reward functions
        functions = keys[keys.index("completion") + 1 : end]
        if not functions:
            raise SourceError(path, where, None, "no reward function column after 'completion'")
        weights = _weights(options, run, functions, path, where)
    else:
        functions, end, weights = ["reward"], keys.index("reward"), ()
    others = [k for k in keys[end + 1 :] if k not in (step_key, prompt_key, "completion")]
    for i in range(n):
        here = f"{where}, completion {i}"
        prompt, completion = record[prompt_key][i], record["completion"][i]
        if not isinstance(completion, str):
            raise SourceError(path, here, "completion", f"must be text, got {completion!r:.40}")
        if not isinstance(prompt, str):  # ms-swift 3.1 to 3.4 log the chat messages, not the templated text
            prompt = plain_chat(chat_messages(prompt, path, here, prompt_key, f"must be text or {CHAT}"))
        values = [_reward_value(record[f][i], path, here, f) for f in functions]
        reward = values[0] if total else math.fsum(w * v for w, v in zip(weights, values) if not math.isnan(v))
        step = _training_step(record[step_key][i], path, here, step_key)
        row = _row(prompt, completion, reward, step, (f"{path}:{line}:{_prompt_key(prompt)}", f"{path}:{line}:{i}"))
        if advantages:
            row["source_advantage"] = _reward_value(record[advantages][i], path, here, advantages)
        row.update((f"{REWARD_PREFIX}{f}", v) for f, v in zip(functions, values) if not total)
        own, extra = rest(((key, record[key][i]) for key in others), path, here, WRITTEN, (REWARD_PREFIX,))
        yield with_extra({**row, **own}, extra)


def _ray_row(record: Mapping[str, Any], path: Path, line: int, where: str) -> dict[str, Any]:
    ray = declared(_RayLine, record, path, where)
    step = _training_step(ray.gen_step, path, where, "gen_step")
    ids = (f"{path}:step {step}:{_prompt_key(ray.prompt)}", f"{path}:{line}")
    row = _row(ray.prompt, ray.completion, ray.reward, step, ids)
    items = ((key, value) for key, value in record.items() if key not in _RayLine.__struct_fields__)
    own, extra = rest(items, path, where, WRITTEN, (REWARD_PREFIX,))
    return with_extra({**row, **own}, extra)


def read(files: list[Path], options: ImportOptions) -> Iterator[dict[str, Any]]:
    """One row per completion, line by line. A table line equal to the line before it is
    the trainer logging the same completions again (its log buffer is kept between logging
    calls, and the end of training logs once more): it is passed over."""
    for path in files:
        run = _run_weights(path) if options.reward_weights is None else None
        previous: Any = None
        for line, where, record in objects(path):
            if not isinstance(record.get("prompt", record.get("messages")), list):
                yield locate(_ray_row(record, path, line, where), path, where)
            elif record != previous:
                previous = record
                yield from located(_table(record, path, line, options, run), path, where)
