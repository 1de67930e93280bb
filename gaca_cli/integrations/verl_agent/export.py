"""Write a verl-agent rollout as gaca log rows, from inside verl-agent's rollout loop.

verl-agent (https://github.com/langfengQ/verl-agent) keeps what gaca needs only in memory:
`TrajectoryCollector.vanilla_multi_turn_loop` (agent_system/multi_turn_rollout/rollout_loop.py)
returns `total_batch_list`, one list per environment of one dict per step (`to_list_of_dict` of
the step's DataProto), and `episode_rewards`, one per environment; `gather_rollout_data` then
drops the inactive steps and flattens the lists into the training batch, which the trainer pads,
reorders and balances. `export_rollout` is called between the two, in `multi_turn_loop`
(examples/verl_agent/export.patch), and writes one file per call:

docs/formats/verl-agent.md lists which step-dict key fills each gaca column; other scalars
become columns of their names, other values go to the JSON column `extra`.

Values may be numpy arrays and scalars or torch tensors; torch is never imported here.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["export_rollout"]

# step-dict keys this exporter reads, and the tensors it leaves out because the columns hold them
UID, TRAJ_UID, ANCHOR_OBS, REWARDS, ACTIVE_MASKS = "uid", "traj_uid", "anchor_obs", "rewards", "active_masks"
PROMPTS, RESPONSES, ATTENTION_MASK, ROLLOUT_LOG_PROBS = "prompts", "responses", "attention_mask", "rollout_log_probs"
READ = frozenset(
    {UID, TRAJ_UID, ANCHOR_OBS, REWARDS, ACTIVE_MASKS, PROMPTS, RESPONSES, ATTENTION_MASK, ROLLOUT_LOG_PROBS}
)
LEFT_OUT = frozenset({"input_ids", "position_ids", "response_mask", "raw_prompt_ids", "multi_modal_inputs"})
# the columns the rows hold: a step-dict key of one of these names is kept as source_<name>
COLUMNS = frozenset(
    {
        "group_id",
        "traj_id",
        "step_idx",
        "reward",
        "episode_reward",
        "done",
        "anchor_obs",
        "prompt",
        "action",
        "messages",
        "anchor_key",
        "prompt_token_ids",
        "action_token_ids",
        "behavior_logprobs",
        "global_step",
        "extra",
    }
)
FORMATS = ("parquet", "jsonl")


def _numpy(value: Any) -> Any:
    """A torch tensor as a numpy array (without importing torch); anything else as it is."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        if str(getattr(value, "dtype", "")) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return value


def _python_value(value: Any) -> Any:
    """A numpy or torch scalar (or 0-d array) as the Python value; arrays as nested lists."""
    value = _numpy(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def _vector(value: Any, key: str, where: str) -> list:
    import numpy as np

    array = np.asarray(_numpy(value))
    if array.ndim != 1:
        raise ValueError(f"{where}: '{key}' must be one row's 1-D tensor, got shape {array.shape}")
    return array.tolist()


def _required(step: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in step:
        raise ValueError(f"{where}: the step has no '{key}' (keys: {', '.join(sorted(step))})")
    return step[key]


def _anchor(value: Any) -> str | None:
    value = _python_value(value)
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _step_row(
    step: Mapping[str, Any], where: str, tokenizer: Any, step_idx: int, episode_reward: float, done: bool
) -> dict[str, Any]:
    prompts = _vector(_required(step, PROMPTS, where), PROMPTS, where)
    responses = _vector(_required(step, RESPONSES, where), RESPONSES, where)
    mask = _vector(_required(step, ATTENTION_MASK, where), ATTENTION_MASK, where)
    if len(mask) != len(prompts) + len(responses):
        raise ValueError(
            f"{where}: '{ATTENTION_MASK}' has {len(mask)} values for {len(prompts)} prompt and "
            f"{len(responses)} response tokens"
        )
    prompt_keep = [bool(m) for m in mask[: len(prompts)]]
    response_keep = [bool(m) for m in mask[len(prompts) :]]
    prompt_ids = [int(t) for t, keep in zip(prompts, prompt_keep, strict=True) if keep]
    action_ids = [int(t) for t, keep in zip(responses, response_keep, strict=True) if keep]
    reward = _python_value(_required(step, REWARDS, where))
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise ValueError(f"{where}: '{REWARDS}' must be a number, got {reward!r}")
    row: dict[str, Any] = {
        "group_id": str(_python_value(_required(step, UID, where))),
        "traj_id": str(_python_value(_required(step, TRAJ_UID, where))),
        "step_idx": step_idx,
        "reward": float(reward),
        "episode_reward": episode_reward,
        "done": done,
        "prompt_token_ids": prompt_ids,
        "action_token_ids": action_ids,
    }
    anchor = _anchor(step.get(ANCHOR_OBS))
    if anchor is not None:
        row["anchor_obs"] = anchor
    if tokenizer is not None:
        row["prompt"] = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        row["action"] = tokenizer.decode(action_ids, skip_special_tokens=True)
    if step.get(ROLLOUT_LOG_PROBS) is not None:
        logprobs = _vector(step[ROLLOUT_LOG_PROBS], ROLLOUT_LOG_PROBS, where)
        if len(logprobs) != len(responses):
            raise ValueError(
                f"{where}: '{ROLLOUT_LOG_PROBS}' has {len(logprobs)} values for {len(responses)} response tokens"
            )
        row["behavior_logprobs"] = [float(v) for v, keep in zip(logprobs, response_keep, strict=True) if keep]
    extra: dict[str, Any] = {}
    for key, value in step.items():
        if key in READ or key in LEFT_OUT:
            continue
        name = f"source_{key}" if key in COLUMNS else key
        python_value = _python_value(value)
        if python_value is None or isinstance(python_value, (str, int, float, bool)):
            row[name] = python_value
        else:
            extra[name] = python_value
    if extra:
        row["extra"] = json.dumps(extra, sort_keys=True, default=str, ensure_ascii=False)
    return row


def _rows(
    total_batch_list: Sequence[Sequence[Mapping[str, Any]]], episode_rewards: Any, tokenizer: Any, max_steps: int | None
) -> list[dict]:
    returns = _python_value(episode_rewards)
    if not isinstance(returns, list) or len(returns) != len(total_batch_list):
        n = len(returns) if isinstance(returns, list) else "not a list of"
        raise ValueError(f"episode_rewards has {n} values for {len(total_batch_list)} environments")
    rows = []
    for env, steps in enumerate(total_batch_list):
        active = [bool(_python_value(step.get(ACTIVE_MASKS, True))) for step in steps]
        n_active = sum(active)
        if active[:n_active] != [True] * n_active:
            raise ValueError(f"environment {env}: an active step follows an inactive one (active_masks)")
        # the loop stops early once every environment is done: then each one ended
        ended = n_active < len(steps) or (max_steps is not None and len(steps) < max_steps)
        for k in range(n_active):
            where = f"environment {env}, step {k}"
            rows.append(_step_row(steps[k], where, tokenizer, k, float(returns[env]), ended and k == n_active - 1))
    return rows


def _write(rows: list[dict], path: Path, file_format: str, metadata: Mapping[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if file_format == "jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            names = list(dict.fromkeys(name for row in rows for name in row))
            table = pa.table({name: [row.get(name) for row in rows] for name in names})
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
            pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _export_dir(out_dir: str | os.PathLike) -> Path:
    """The export folder, made if missing; an OSError with one line when it cannot be written."""
    directory = Path(out_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as err:
        raise OSError(f"gaca export: cannot write to {str(directory)!r} ({err.strerror or err})") from None
    return directory


def export_rollout(
    out_dir: str | os.PathLike,
    total_batch_list: Sequence[Sequence[Mapping[str, Any]]],
    episode_rewards: Any,
    tokenizer: Any = None,
    *,
    global_step: int | None = None,
    file_format: str = "parquet",
    max_steps: int | None = None,
) -> Path:
    """Write one verl-agent rollout as gaca log rows, one row per active step; returns the file.

    `total_batch_list[i][t]`: the step dict of environment i at loop step t, as
    `vanilla_multi_turn_loop` collects them; `episode_rewards[i]`: environment i's return
    (numpy array or torch tensor). `tokenizer` (optional): decodes the prompt and action text.
    `global_step`, when given, is written as a column and in the file's name. `max_steps`
    (verl-agent's `env.max_steps`), when given, tells an environment that ended at the loop's
    last step (done) from one cut there: a loop shorter than it stopped because all were done.

    The file `<out_dir>/rollout-<global_step>-<random>.<parquet|jsonl>` (a time stamp instead of
    the step when none is given) is written to a temporary name and renamed when complete, so a
    reader never sees half a file. Import it with `gaca import --from verl-agent OUT_DIR`.
    A folder that cannot be made or written raises OSError before anything else is done.
    """
    if file_format not in FORMATS:
        raise ValueError(f"file_format must be one of {', '.join(FORMATS)}, got {file_format!r}")
    directory = _export_dir(out_dir)  # before any work: a misconfigured export fails at the first rollout
    rows = _rows(total_batch_list, episode_rewards, tokenizer, max_steps)
    if global_step is not None:
        for row in rows:
            row["global_step"] = int(global_step)
    stamp = f"{int(global_step):06d}" if global_step is not None else f"t{time.time_ns()}"
    path = directory / f"rollout-{stamp}-{uuid.uuid4().hex[:8]}.{file_format}"
    metadata = {"gaca.export": json.dumps({"source": "verl-agent", "rows": len(rows), "global_step": global_step})}
    _write(rows, path, file_format, metadata)
    return path
