"""The views of `gaca inspect` by name (`build_view`), and the two that list steps: every step
of the chosen trajectories (steps) and the k largest or smallest by a column (top). The
overview and --compare have their own modules; `terminal.py` draws them all."""

from __future__ import annotations

import numpy as np

from gaca_cli.errors import GacaError
from gaca_cli.inspect.compare import compare_view
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import (
    CRITICAL_Z,
    AnnotatedLog,
    find_group,
    find_traj,
    finite_float,
    group_trajs,
    select,
    selection_record,
    step_records,
    trajectory_record,
)
from gaca_cli.inspect.overview import overview
from gaca_cli.log import columns as C


def steps_view(a: AnnotatedLog, config: InspectConfig) -> dict:
    """--traj / --group: every step of one trajectory, or of each trajectory of a group."""
    if config.traj is not None:
        trajs = [find_traj(a, config.traj)]
    else:
        assert config.group is not None
        trajs = [int(t) for t in group_trajs(a, find_group(a, config.group))]
    out = {"view": "steps", **a.header(), "selection": selection_record(config), "lambda_bar": a.lambda_bar}
    out["critical_threshold_z"] = CRITICAL_Z
    out["trajectories"] = [trajectory_record(a, t) for t in trajs]
    return out


def _sort_key(a: AnnotatedLog, by: str) -> np.ndarray:
    v = a.values
    if by == "nll":
        if "nll" not in v:
            raise GacaError(
                "--by nll needs an NLL column (nll_mean, nll_sum or behavior_logprobs); run `gaca score` first",
                file=a.log.source,
                column=C.NLL_MEAN,
            )
        return v["nll"]
    if by == "weight":
        if C.GACA_WEIGHT not in v:
            raise GacaError(
                f"--by weight needs the λ column written by `gaca advantages --method gaca` "
                f"(this file's method: {a.method or 'unknown'})",
                file=a.log.source,
                column=C.GACA_WEIGHT,
            )
        return v[C.GACA_WEIGHT]
    if by == "advantage":
        return v[C.ADVANTAGE]
    return np.abs(v[C.ADVANTAGE])


def top_view(a: AnnotatedLog, config: InspectConfig) -> dict:
    """--top K --by KEY: the K steps with the largest (or, with lowest, smallest) key; ties
    keep canonical order. Steps without a value (no action tokens for nll) are skipped."""
    by = config.by or "abs-advantage"
    key = _sort_key(a, by)
    candidates = select(a, config.traj, config.group)
    if candidates is None:
        candidates = np.arange(a.index.n_rows, dtype=np.int64)
    candidates = candidates[np.isfinite(key[candidates])]
    k = key[candidates]
    order = np.lexsort((candidates, k if config.lowest else -k))
    chosen = candidates[order[: config.k]]
    rows = step_records(a, chosen)
    for rank, row in enumerate(rows, start=1):
        row["rank"] = rank
        row["key"] = finite_float(key[chosen[rank - 1]])
    out = {"view": "top", **a.header(), "selection": selection_record(config), "lambda_bar": a.lambda_bar}
    out.update(by=by, lowest=config.lowest, k=config.k, candidates=int(len(candidates)), rows=rows)
    out["critical_threshold_z"] = CRITICAL_Z
    return out


def build_view(a: AnnotatedLog, config: InspectConfig) -> dict:
    """The JSON-ready data of the view `config` asks for."""
    view = config.view
    if view == "overview":
        return overview(a)
    if view == "steps":
        return steps_view(a, config)
    if view == "top":
        return top_view(a, config)
    return compare_view(a, config)
