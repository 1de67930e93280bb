"""The training data of `gaca train-offline`: the steps that carry a gradient, in canonical
(group, trajectory, step) order, their advantages, behaviour log-probs μ and tokens (tokenised
exactly as `gaca score` tokenises them)."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli.errors import GacaError
from gaca_cli.lm.train_config import TrainConfig
from gaca_cli.log import columns as C
from gaca_cli.log.checks import output_column_problem, row_violation
from gaca_cli.log.grouping import contiguous_decoded
from gaca_cli.log.index import TrajectoryIndex
from gaca_cli.log.reading import Log
from gaca_cli.log.schema import is_list_type


@dataclass(frozen=True)
class TrainData:
    """The steps that take part in training, in canonical (group, trajectory, step) order.

    input_ids:  S arrays int64 [len_i]  context tokens then action tokens
    n_context:  int64 [S]               number of context tokens of each sequence
    advantage:  float32 [S]
    behavior:   S arrays float32 [n_action_i], or None (μ's log-prob of each action token)
    rows:       int64 [S]               original row of each sequence in the log
    """

    input_ids: list[np.ndarray]
    n_context: np.ndarray
    advantage: np.ndarray
    behavior: list[np.ndarray] | None
    behavior_source: str | None
    rows: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self.input_ids))

    @property
    def n_action(self) -> np.ndarray:
        return self.lengths - self.n_context

    def fingerprint(self) -> str:
        """sha256 over tokens, context lengths, advantages and the behaviour log-probs (the
        columns the updates read): `--resume` refuses other data."""
        h = hashlib.sha256()
        h.update(np.asarray(len(self), dtype=np.int64).tobytes())
        h.update(self.n_context.astype(np.int64).tobytes())
        h.update(self.advantage.astype(np.float32).tobytes())
        h.update(self.lengths.tobytes())
        for ids in self.input_ids:
            h.update(ids.astype(np.int64).tobytes())
        h.update(f"behavior:{self.behavior_source}".encode())
        for logprobs in self.behavior or []:
            h.update(np.asarray(logprobs, dtype=np.float32).tobytes())
        return h.hexdigest()[:16]


def read_advantages(log: Log, index: TrajectoryIndex) -> np.ndarray:
    """float64 [N] advantages in canonical order; a GacaError names null, non-finite or
    beyond-float32 rows (`checks.output_column_problem`, which `gaca validate --for
    train-offline` runs too)."""
    problem = output_column_problem(log, float32=True)
    if problem is not None:
        raise problem
    return (
        contiguous_decoded(log.table.column(C.ADVANTAGE)).cast(pa.float64()).to_numpy(zero_copy_only=False)[index.order]
    )


def _warn_other_temperature(log: Log, config: TrainConfig) -> None:
    """A warning when `token_logprobs` were scored at another -T (the file's gaca.score
    metadata) than this run divides the logits by: π/μ would compare two temperatures."""
    try:
        scored = json.loads(log.metadata.get(C.META_SCORE, "{}")).get("temperature")
    except (ValueError, AttributeError):
        return
    if isinstance(scored, (int, float)) and float(scored) != config.temperature:
        warnings.warn(
            f"{log.source}: token_logprobs were scored with -T {scored:g} (gaca.score metadata), this run uses "
            f"-T {config.temperature:g}: the ratios π/μ compare two temperatures; give -T {scored:g} to match",
            stacklevel=2,
        )


def choose_behavior(
    log: Log,
    index: TrajectoryIndex,
    n_action: np.ndarray,
    kept: np.ndarray,
    config: TrainConfig,
) -> tuple[str | None, list | None]:
    """Pick the column that gives μ's per-token log-probs, aligned with the action tokens.

    `auto`: `behavior_logprobs` if every kept step has as many values as action tokens, else
    `token_logprobs` under the same rule (written by `gaca score --token-logprobs` with the
    starting model). A column named explicitly must align. Returns (column, lists in canonical
    order) or (None, None) when the objective does not need μ and no column aligns.
    """
    required = config.needs_behavior
    names = (C.BEHAVIOR_LOGPROBS, C.TOKEN_LOGPROBS) if config.behavior == "auto" else (config.behavior,)
    present = [c for c in names if c in log.table.column_names]
    problems: list[GacaError] = []
    for name in present:
        col = contiguous_decoded(log.table.column(name))
        if not (is_list_type(col.type) and pa.types.is_floating(col.type.value_type)):
            rule = f"type {col.type} is not usable here; expected list<float32>"
            problems.append(GacaError(rule, file=log.source, column=log.original_name(name)))
            continue
        values = index.sorted_column(log.table, name)
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        lengths = np.where(np.isnan(lengths.astype(np.float64)), -1, lengths).astype(np.int64)
        nulls = np.flatnonzero(kept & (lengths < 0))
        if len(nulls):
            problems.append(row_violation(log, name, "is null on steps that are trained on", index.order[nulls]))
            continue
        bad = np.flatnonzero(kept & (lengths != n_action))
        if len(bad):
            hint = (
                "; run `gaca score --token-logprobs --model <the starting model>` and use --behavior token_logprobs"
                if name == C.BEHAVIOR_LOGPROBS
                else "; score with the same tokenizer as --model"
            )
            rule = (
                f"has a different number of log-probs than the action has tokens under this tokenizer "
                f"(first: {lengths[bad[0]]} vs {n_action[bad[0]]}){hint}"
            )
            problems.append(row_violation(log, name, rule, index.order[bad]))
            continue
        lists = values.to_pylist()
        nonfinite = [i for i in np.flatnonzero(kept) if not np.all(np.isfinite(np.asarray(lists[i], dtype=np.float64)))]
        if nonfinite:
            rows = index.order[np.asarray(nonfinite)]
            problems.append(row_violation(log, name, "must be finite (no NaN, no ±inf, no null)", rows))
            continue
        if name == C.TOKEN_LOGPROBS:
            _warn_other_temperature(log, config)
        return name, lists
    if not required:
        return None, None
    if problems:
        raise problems[0]
    if config.behavior != "auto":
        raise GacaError(
            f"--behavior {config.behavior}: the log has no such column", file=log.source, column=config.behavior
        )
    raise GacaError(
        f"--loss {config.loss} needs the behavior policy's per-token log-probs: the log has neither "
        f"'{C.BEHAVIOR_LOGPROBS}' nor '{C.TOKEN_LOGPROBS}'; run `gaca score --token-logprobs --model "
        "<the starting model>` first, or use --loss pg, awr or filtered-bc",
        file=log.source,
        column=C.BEHAVIOR_LOGPROBS,
    )


def build_train_data(
    log: Log,
    index: TrajectoryIndex,
    tokenizer,
    config: TrainConfig,
    vocab_size: int | None = None,
    position_limit: int | None = None,
) -> TrainData:
    """Keep the steps that carry a gradient, tokenise them as `gaca score` does
    (`tokenization.tokenize_steps`, same --context / --add-special-tokens / --strict-prefix)
    and align μ with their action tokens. Steps kept must fit the model's `position_limit`
    (models.position_limit; --max-length skips longer ones)."""
    from gaca_cli.lm.tokenization import check_positions, tokenize_steps

    advantage = read_advantages(log, index)
    useful = config.carries_gradient(advantage)
    candidates = np.flatnonzero(useful)
    tokens = tokenize_steps(log, index.order[candidates], tokenizer, config, vocab_size=vocab_size)
    n = index.n_rows
    n_ctx = np.zeros(n, dtype=np.int64)
    n_act = np.zeros(n, dtype=np.int64)
    n_ctx[candidates] = [len(c) for c in tokens.context]
    n_act[candidates] = [len(a) for a in tokens.action]
    empty_action = useful & (n_act == 0)
    too_long = useful & ~empty_action & (n_ctx + n_act > config.max_length) if config.max_length else np.zeros(n, bool)
    kept = useful & ~empty_action & ~too_long
    counts = {
        "rows": int(n),
        "no_gradient": int(np.sum(~useful)),
        "empty_action": int(np.sum(empty_action)),
        "too_long": int(np.sum(too_long)),
        "prefix_mismatch": int(np.sum(tokens.prefix_mismatch)),
    }
    behavior_source, behavior_lists = choose_behavior(log, index, n_act, kept, config)
    keep_idx = np.flatnonzero(kept)
    counts["trained"] = int(len(keep_idx))
    if len(keep_idx) == 0:
        why = {
            "ppo": "A = 0 on every step (ppo and pg get no gradient from it)",
            "pg": "A = 0 on every step (ppo and pg get no gradient from it)",
            "filtered-bc": f"no step has A > {config.bc_threshold:g} (--bc-threshold)",
            "awr": "no step has action tokens",
        }[config.loss]
        if useful.any() and not (config.loss == "awr" and empty_action.all()):
            why = "every step with a gradient was skipped"
            if counts["too_long"]:
                why += f" (--max-length {config.max_length})"
        detail = ", ".join(
            f"{k.replace('_', ' ')}: {v}" for k, v in counts.items() if v and k not in ("rows", "trained")
        )
        raise GacaError(
            f"no step to train on: {why} ({detail})", file=log.source, column=log.original_name(C.ADVANTAGE)
        )
    position_of = np.full(n, -1, dtype=np.int64)
    position_of[candidates] = np.arange(len(candidates))
    check_positions(
        log,
        index.order[keep_idx],
        (n_ctx + n_act)[keep_idx],
        tokens.source[position_of[keep_idx]],
        position_limit,
        f"; skip such steps with --max-length {position_limit}",
    )
    input_ids = [np.concatenate([tokens.context[j], tokens.action[j]]).astype(np.int64) for j in position_of[keep_idx]]
    behavior = None
    if behavior_lists is not None:
        behavior = [np.asarray(behavior_lists[i], dtype=np.float32) for i in keep_idx]
    return TrainData(
        input_ids=input_ids,
        n_context=n_ctx[keep_idx],
        advantage=advantage[keep_idx].astype(np.float32),
        behavior=behavior,
        behavior_source=behavior_source,
        rows=index.order[keep_idx],
        counts=counts,
    )
