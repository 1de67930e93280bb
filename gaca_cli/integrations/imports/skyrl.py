"""`--from skyrl`: SkyRL's eval dumps (one line per rollout) and generator-output rows (token
ids, loss masks, per-token or scalar rewards; step-wise rows continue a trajectory). The
fields and the versions followed: docs/formats/skyrl.md."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.integrations.imports.base import (
    SCHEMA_COLUMNS,
    File,
    FormatInfo,
    ImportOptions,
    SourceError,
    broken,
    declared,
    locate,
    located,
    mask_runs,
    objects,
    rest,
    token_steps,
    with_extra,
)

INFO = FormatInfo(
    name="skyrl",
    summary="SkyRL eval dumps (dumped_evals/*.jsonl) and generator output rows (write_generator_output)",
    suffixes=(".jsonl",),
    carries="eval dumps: prompt and response text, score; generator output: token ids, loss-mask steps, "
    "per-token rewards, rollout log-probs, trajectory ids",
    lacks="anchors; eval dumps: prompt uids (grouped by prompt text), steps within a rollout; generator output: text",
    source="skyrl 0.4.0, skyrl/train/utils/trainer_utils.py (dump_per_dataset_eval_results), "
    "skyrl/train/generators/base.py (GeneratorOutput), skyrl/train/generators/skyrl_gym_generator.py (generate)",
    mapped={
        "prompt": "input_prompt (eval dump)",
        "action": "output_response (eval dump)",
        "reward": "score (eval dump; summed when per-token) / rewards summed over the step's tokens (generator output)",
        "prompt_token_ids": "prompt_token_ids + response_ids before the step (generator output)",
        "action_token_ids": "response_ids under one run of loss_masks == 1 (generator output)",
        "behavior_logprobs": "rollout_logprobs under that run (generator output)",
        "stop_reason": "stop_reason / stop_reasons",
        "env_class": "env_class",
        "data_source": "data_source (eval dump)",
        "extra": "env_extras, per-token score (eval dump); env_metrics (generator output)",
    },
    derived={
        "group_id": "eval dump: file + hash of input_prompt; generator output: global_step + uid "
        "(trajectory_ids.instance_id)",
        "traj_id": "eval dump: file:line; generator output: file, global_step, instance_id_repetition_id "
        "(file:line for rows without trajectory ids)",
        "step_idx": "eval dump: 0; generator output: the loss-mask runs of the trajectory's rows, in order",
        "done": "true on the last step of each rollout (the last run of a row with is_last_step, or of a "
        "non-step-wise row)",
        "loss_mask_empty": "true on a generator-output row whose loss mask is all 0 (e.g. overlong "
        "filtering): its whole response is one step",
    },
)

_EVAL_FIELDS = ("input_prompt", "output_response", "score")
_AGGREGATED = "aggregated_results.jsonl"
# GeneratorOutput per-row fields that `write_generator_output` writes (tensors are left out).
_ROW_FIELDS = (
    "prompt_token_ids response_ids rewards loss_masks stop_reasons rollout_logprobs is_last_step env_metrics".split()
)
_ROW_FIELDS.append("trajectory_generation_times")
# fields that become step columns, and scalar fields kept under another name
_GENERATOR_MAPPED = frozenset(
    {"prompt_token_ids", "response_ids", "rewards", "loss_masks", "rollout_logprobs", "is_last_step", "trajectory_ids"}
)
_GENERATOR_RENAMED = {"stop_reasons": "stop_reason", "trajectory_generation_times": "generation_time_s"}
# the columns a generator-output row gets: a source field of one of these names is kept as source_<name>
_GENERATOR_WRITTEN = SCHEMA_COLUMNS | {"loss_mask_empty", "instance_id", "repetition_id", *_GENERATOR_RENAMED.values()}


def read(files: list[Path], options: ImportOptions) -> Iterator[dict]:
    """One row per eval-dump line, or per loss-mask run of each generator-output row."""
    kind_seen: str | None = None
    for path in files:
        if path.name == _AGGREGATED:
            continue  # the run's aggregate metrics: no rollout in it
        # traj_id -> (steps already yielded, line of its last row, its trajectory id as SkyRL
        # writes it), while its rows continue
        open_steps: dict[str, tuple[int, int, str]] = {}
        ended: dict[str, int] = {}  # trajectory key -> how many of its trajectories have ended
        for line, where, record in objects(path):
            if "response_ids" in record:
                kind = "generator output"
            elif "output_response" in record or "input_prompt" in record:
                kind = "eval dump"
            else:
                rule = "neither a SkyRL eval dump line (input_prompt, output_response, score) nor a generator "
                raise SourceError(path, where, None, rule + "output row (response_ids, loss_masks, rewards)")
            if kind != (kind_seen := kind_seen or kind):
                rule = f"a {kind} record after {kind_seen} records: import the two kinds separately"
                raise SourceError(path, where, None, rule)
            if kind == "eval dump":
                yield locate(_eval_row(path, where, line, record), path, where)
            else:
                yield from located(_generator_rows(path, line, record, open_steps, ended), path, where)
        for _, line, name in open_steps.values():
            # SkyRL writes every turn of a trajectory in one batch: rows out of order (or a file
            # cut short) would otherwise split it silently
            rule = f"is false, and no later row continues trajectory {name}: the rows of a step-wise "
            rule += "trajectory must be in turn order, its last with is_last_step true"
            raise SourceError(path, f"line {line}", "is_last_step", rule)


class _EvalLine(msgspec.Struct):
    """A line of an eval dump (`dump_per_dataset_eval_results`)."""

    input_prompt: str
    output_response: str
    score: float | list[float]


class _TrajectoryIds(msgspec.Struct):
    instance_id: Any
    repetition_id: Any


class _GeneratorRow(msgspec.Struct):
    """One row of a GeneratorOutput (one trajectory, or one turn of a step-wise one)."""

    prompt_token_ids: list[int]
    response_ids: list[int]
    loss_masks: list[int]
    rewards: float | list[float]
    rollout_logprobs: list[float] | None = None
    is_last_step: bool | None = None
    trajectory_ids: _TrajectoryIds | None = None

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        for name in ("loss_masks", "rewards", "rollout_logprobs"):
            values = getattr(self, name)
            if isinstance(values, list) and len(values) != n:
                raise broken(name, f"has {len(values)} values for {n} response_ids")


def _eval_row(path: Path, where: str, line: int, record: Mapping[str, Any]) -> dict:
    line_ = declared(_EvalLine, record, path, where)
    prompt, response = line_.input_prompt, line_.output_response
    score = float(sum(line_.score)) if isinstance(line_.score, list) else line_.score
    group = hashlib.sha1(prompt.encode("utf-8")).hexdigest()[:16]
    row: dict[str, Any] = {"group_id": f"{path}:{group}", "traj_id": f"{path}:{line}"}
    row.update(step_idx=0, reward=score, done=True, prompt=prompt, action=response)
    # a field named like a column: source_<name>
    own, extra = rest(((k, v) for k, v in record.items() if k not in _EVAL_FIELDS), path, where, SCHEMA_COLUMNS)
    if isinstance(record["score"], list):
        extra = {"score": record["score"], **extra}
    return with_extra({**row, **own}, extra)


def _generator_rows(
    path: Path, line: int, record: Mapping[str, Any], open_steps: dict[str, tuple[int, int, str]], ended: dict[str, int]
) -> Iterator[dict]:
    where = f"line {line}"
    generated = declared(_GeneratorRow, record, path, where)
    response_ids, rewards, traj = generated.response_ids, generated.rewards, generated.trajectory_ids
    step = record.get("global_step")
    step_tag = "" if step is None else f"step{step}:"
    uid = record.get("uid")
    if traj is not None:
        key = f"{path}:{step_tag}{traj.instance_id}_{traj.repetition_id}"
        uid = traj.instance_id if uid is None else uid
        traj_id = key if not ended.get(key) else f"{key}#{ended[key] + 1}"
        last_row = generated.is_last_step is not False  # a step-wise row continues its trajectory until then
    else:
        key = traj_id = f"{path}:{line}"
        last_row = True
    group_id = traj_id if uid is None else f"{step_tag}{uid}"  # no uid: nothing says which rollouts share a prompt

    runs = mask_runs(generated.loss_masks)
    common: dict[str, Any] = {"loss_mask_empty": not runs}
    runs = runs or [(0, len(response_ids))]
    first_step = open_steps.pop(traj_id, (0,))[0]
    common.update((new, record[k]) for k, new in _GENERATOR_RENAMED.items() if k in record)  # in a fixed order
    # a field named like a column the rows get (`reward`, `done`, ...) is kept as source_<name>
    items = ((k, v) for k, v in record.items() if k not in _GENERATOR_MAPPED and k not in _GENERATOR_RENAMED)
    own, extra = rest(items, path, where, _GENERATOR_WRITTEN)
    common.update(own)
    if traj is not None:
        common.update(instance_id=str(traj.instance_id), repetition_id=traj.repetition_id)
    steps = token_steps(generated.prompt_token_ids, response_ids, runs, generated.rollout_logprobs)
    for i, ((start, _), tokens) in enumerate(zip(runs, steps)):
        # the step's reward: the per-token rewards from its first token to the next step's first
        # token (the first step also takes any before it); a scalar reward sits on the last step
        last = i == len(runs) - 1
        if isinstance(rewards, list):
            reward = float(sum(rewards[0 if i == 0 else start : len(response_ids) if last else runs[i + 1][0]]))
        else:
            reward = rewards if last else 0.0
        row = {"group_id": group_id, "traj_id": traj_id, "step_idx": first_step + i, "reward": reward}
        yield with_extra({**row, "done": last and last_row, **tokens, **common}, extra if last else {})
    if traj is None:
        return
    if last_row:
        ended[key] = ended.get(key, 0) + 1
    else:
        open_steps[traj_id] = (first_step + len(runs), line, f"{traj.instance_id}_{traj.repetition_id}")


def write_generator_output(
    path: File, generator_output: Mapping[str, Any], uids: Sequence[str] | None = None, global_step: int | None = None
) -> int:
    """Append a SkyRL `GeneratorOutput` to the JSONL file `path`, one line per row, for
    `gaca import --from skyrl`. Returns the number of lines written.

    Call it in the trainer right after generation, with the batch's `uids` (one per row, as
    `prepare_generator_input` returns them) and the global step, e.g. in `RayPPOTrainer.train`::

        write_generator_output(Path(self.cfg.trainer.export_path) / "gaca_rollouts.jsonl",
                               generator_output, uids, global_step=self.global_step)

    Per row it writes the list fields of `GeneratorOutput` that hold plain values (token ids,
    masks, rewards, log-probs, stop reasons, `is_last_step`, env metrics, generation times), the
    `TrajectoryID` as `{"instance_id", "repetition_id"}`, the row's uid and the step. Batch-level
    `rollout_metrics` and tensors (expert routes, sample support, pixel values) are not written.
    """
    n = len(generator_output["response_ids"])
    if uids is not None and len(uids) != n:
        raise ValueError(f"uids has {len(uids)} entries for {n} generator output rows")
    trajectory_ids = generator_output.get("trajectory_ids")
    with open(path, "a", encoding="utf-8") as fh:
        for i in range(n):
            line: dict[str, Any] = {"global_step": global_step}
            if uids is not None:
                line["uid"] = uids[i]
            line.update((key, values[i]) for key in _ROW_FIELDS if (values := generator_output.get(key)) is not None)
            if trajectory_ids is not None:
                tid = trajectory_ids[i]
                line["trajectory_ids"] = {"instance_id": tid.instance_id, "repetition_id": tid.repetition_id}
            fh.write(json.dumps(line, ensure_ascii=False) + "\n")
    return n
