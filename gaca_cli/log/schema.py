"""The trajectory log schema (log-schema.md, version 1) as data.

This module is the single source of truth for which columns exist, which Arrow types are
usable for each, which commands need them, and which columns each command writes.
`schemas/*.json` is an export of it (`python -m gaca_cli.log.schema` re-records them), and a test
keeps the two identical.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from gaca_cli.log import columns as C

SCHEMA_VERSION = 1


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def is_list_type(t: pa.DataType) -> bool:
    """A list of any layout Arrow reads from Parquet: list, large_list, their views, fixed size."""
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
        or pa.types.is_fixed_size_list(t)
    )


def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


#: kind name -> (predicate on the Arrow type, human description of accepted types)
KINDS: dict[str, tuple[Callable[[pa.DataType], bool], str]] = {
    "id": (lambda t: _is_text(_value_type(t)) or pa.types.is_integer(_value_type(t)), "string or integer"),
    "integer": (lambda t: pa.types.is_integer(t), "integer"),
    "number": (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "float64 (any float or integer accepted)"),
    "float": (lambda t: pa.types.is_floating(t), "floating point"),
    "bool": (lambda t: pa.types.is_boolean(t), "bool"),
    "text": (lambda t: _is_text(_value_type(t)), "string"),
    "key": (lambda t: _is_text(_value_type(t)) or pa.types.is_integer(_value_type(t)), "string (integer accepted)"),
    "token_ids": (
        lambda t: is_list_type(t) and pa.types.is_integer(t.value_type),
        "list<int32> (any integer list accepted)",
    ),
    "logprobs": (
        lambda t: is_list_type(t) and pa.types.is_floating(t.value_type),
        "list<float32> (any float list accepted)",
    ),
    "chat": (
        lambda t: (
            is_list_type(t)
            and pa.types.is_struct(t.value_type)
            and t.value_type.get_field_index("role") >= 0
            and t.value_type.get_field_index("content") >= 0
        ),
        "list<struct<role: string, content: string>>",
    ),
}


@dataclass(frozen=True)
class InputColumn:
    name: str
    kind: str
    required: bool
    nullable: bool
    needed_by: tuple[str, ...]
    meaning: str

    def accepts(self, dtype: pa.DataType) -> bool:
        return KINDS[self.kind][0](dtype)

    @property
    def accepted_types(self) -> str:
        return KINDS[self.kind][1]


_TOKENISED = ("score", "train-offline")  # the commands that tokenise the steps
_GROUPED_BY_ANCHOR = ("advantages:gigpo", "advantages:gaca", "advantages:hgpo")
_EVERY_METHOD = ("grpo", "gigpo", "gaca", "hgpo")

INPUT_COLUMNS: tuple[InputColumn, ...] = (
    InputColumn(C.GROUP_ID, "id", True, False, ("all",), "episode group: rollouts that share a task / initial state"),
    InputColumn(C.TRAJ_ID, "id", True, False, ("all",), "one rollout; unique across the whole log"),
    InputColumn(C.STEP_IDX, "integer", True, False, ("all",), "0-based position of the step in its trajectory"),
    InputColumn(C.REWARD, "number", True, False, ("all",), "reward received after this step"),
    InputColumn(C.PROMPT, "text", False, False, _TOKENISED, "exact text the policy was given (after chat templating)"),
    InputColumn(C.MESSAGES, "chat", False, False, _TOKENISED, "the chat before templating; alternative to prompt"),
    InputColumn(C.ACTION, "text", False, False, ("score", "train-offline", "inspect"), "text the policy produced"),
    InputColumn(
        C.ANCHOR_OBS, "text", False, False, _GROUPED_BY_ANCHOR, "environment observation at this step, without history"
    ),
    InputColumn(C.ANCHOR_KEY, "key", False, False, _GROUPED_BY_ANCHOR, "precomputed state id; wins over anchor_obs"),
    InputColumn(C.DONE, "bool", False, True, (), "true on the last step of a finished trajectory"),
    InputColumn(
        C.EPISODE_REWARD, "number", False, False, (), "the trajectory's return as logged; constant within a trajectory"
    ),
    InputColumn(C.PROMPT_TOKEN_IDS, "token_ids", False, True, (), "exact prompt tokens; used instead of re-tokenising"),
    InputColumn(C.ACTION_TOKEN_IDS, "token_ids", False, True, (), "exact action tokens; used instead of re-tokenising"),
    InputColumn(
        C.BEHAVIOR_LOGPROBS,
        "logprobs",
        False,
        True,
        (),
        "log-probability of each action token under the sampling policy",
    ),
    InputColumn(C.NLL_SUM, "float", False, True, ("advantages:gaca",), "action NLL in nats (written by gaca score)"),
    InputColumn(
        C.NLL_MEAN, "float", False, True, ("advantages:gaca",), "action NLL in nats per token (written by gaca score)"
    ),
)

INPUT_BY_NAME = {c.name: c for c in INPUT_COLUMNS}


@dataclass(frozen=True)
class OutputColumn:
    name: str
    arrow_type: str
    methods: tuple[str, ...]
    meaning: str


#: columns written by each command (the advantages ones by method)
OUTPUT_COLUMNS: dict[str, tuple[OutputColumn, ...]] = {
    "score": (
        OutputColumn(C.NLL_SUM, "double", (), "action NLL in nats"),
        OutputColumn(C.NLL_MEAN, "double", (), "action NLL in nats per token; null when the action has no tokens"),
        OutputColumn(C.N_ACTION_TOKENS, "int32", (), "number of action tokens"),
        OutputColumn(C.TOKEN_LOGPROBS, "list<float>", (), "per-token log-probabilities (with --token-logprobs)"),
    ),
    "advantages": (
        OutputColumn(C.RETURN_TO_GO, "double", _EVERY_METHOD, "discounted return-to-go G_t (Eq. 5)"),
        OutputColumn(
            C.ADV_EPISODE, "double", _EVERY_METHOD, "episode-level advantage A^E (Eq. 3); hgpo: with --base-group"
        ),
        OutputColumn(C.ADV_STEP, "double", ("grpo", "gigpo", "gaca"), "step-level advantage A^S (Eq. 7); 0 for grpo"),
        OutputColumn(C.STEP_GROUP_ID, "int64", ("gigpo", "gaca"), "dense id of the (group_id, anchor) step group"),
        OutputColumn(C.STEP_GROUP_SIZE, "int64", ("gigpo", "gaca"), "number of steps in the step group"),
        OutputColumn(C.NLL_Z, "double", ("gaca",), "standardised criticality z_t"),
        OutputColumn(C.GACA_WEIGHT, "double", ("gaca",), "mixing weight lambda_t"),
        OutputColumn(
            C.HISTORY_GROUPS, "int64", ("hgpo",), "number of history groups of two or more steps the step is in"
        ),
        OutputColumn(C.ADVANTAGE, "double", _EVERY_METHOD, "final advantage A_t"),
        OutputColumn(C.ADV_METHOD, "string", _EVERY_METHOD, "estimator that wrote the row"),
    ),
}

#: columns a command needs beyond the required ones: each entry is a tuple of alternatives
#: (any one of them is enough).
COMMAND_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "validate": (),
    "advantages:grpo": (),
    "advantages:gigpo": ((C.ANCHOR_KEY, C.ANCHOR_OBS),),
    "advantages:gaca": ((C.ANCHOR_KEY, C.ANCHOR_OBS), (C.NLL_MEAN, C.NLL_SUM, C.BEHAVIOR_LOGPROBS)),
    "advantages:hgpo": ((C.ANCHOR_KEY, C.ANCHOR_OBS),),
    "score": ((C.PROMPT, C.MESSAGES, C.PROMPT_TOKEN_IDS), (C.ACTION, C.ACTION_TOKEN_IDS)),
    "train-offline": ((C.PROMPT, C.MESSAGES, C.PROMPT_TOKEN_IDS), (C.ACTION, C.ACTION_TOKEN_IDS), (C.ADVANTAGE,)),
    "inspect": ((C.ADVANTAGE,),),
}

CHECKS: tuple[str, ...] = (
    "required columns present, with usable types; no null in them",
    "reward and episode_reward finite (no NaN, no ±inf)",
    "nll_mean, nll_sum and behavior_logprobs finite where present (nulls allowed in the NLL columns)",
    "(traj_id, step_idx) unique",
    "within a trajectory the steps are 0..T-1 with no gap",
    "each trajectory belongs to exactly one group_id",
    "episode_reward constant within a trajectory",
    "done true at most once per trajectory and only on its last step",
    "len(behavior_logprobs) == len(action_token_ids) where both are present",
    "the columns a command needs are present",
    "for train-offline, advantage is a finite number on every row, at most 3.4e38 in size (float32)",
)

WARNINGS: tuple[str, ...] = (
    "singleton_groups: episode groups of one trajectory",
    "differing_initial_anchors: groups whose step-0 anchors differ",
    "empty_anchors: steps whose anchor text is empty",
)


def schema_documents() -> dict[str, dict]:
    """The JSON documents stored under `schemas/`, keyed by file name."""
    log = {
        "title": "gaca trajectory log",
        "version": SCHEMA_VERSION,
        "row": "one agent step",
        "columns": [
            {
                "name": c.name,
                "accepted_types": c.accepted_types,
                "required": c.required,
                "nullable": c.nullable,
                "needed_by": list(c.needed_by),
                "meaning": c.meaning,
            }
            for c in INPUT_COLUMNS
        ],
        "needs": {cmd: [list(alt) for alt in needs] for cmd, needs in COMMAND_NEEDS.items()},
        "checks": list(CHECKS),
        "warnings": list(WARNINGS),
        "other_columns": "carried through to every output unchanged",
    }
    outputs = {
        "title": "columns written by gaca commands",
        "version": SCHEMA_VERSION,
        "commands": {
            cmd: [
                {"name": o.name, "arrow_type": o.arrow_type, "methods": list(o.methods), "meaning": o.meaning}
                for o in cols
            ]
            for cmd, cols in OUTPUT_COLUMNS.items()
        },
        "metadata_keys": {"score": C.META_SCORE, "advantages": C.META_ADVANTAGES, "train-offline": C.META_TRAIN},
    }
    return {"log.schema.json": log, "outputs.schema.json": outputs}


def write_schema_documents(directory: Path) -> list[Path]:
    """Re-record `schemas/` from the code (run `python -m gaca_cli.log.schema`)."""
    written = []
    for name, doc in schema_documents().items():
        path = directory / name
        path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover - re-recording helper
    target = Path(__file__).resolve().parents[2] / "schemas"
    for p in write_schema_documents(target):
        print(p)
