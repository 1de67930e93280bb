"""The overview of `gaca inspect` (its default view): counts, the method and its parameters,
and the distribution of every numeric output of the whole log, with the methods `--compare`
can recompute from it."""

from __future__ import annotations

import numpy as np

from gaca_cli.credit.config import METHODS
from gaca_cli.errors import GacaError
from gaca_cli.inspect.data import CRITICAL_Z, AnnotatedLog, config_for, finite_float
from gaca_cli.log import columns as C
from gaca_cli.log.schema import COMMAND_NEEDS

N_BINS = 24  # bins of every histogram


SIZE_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, 4, "3-4"), (5, 8, "5-8"), (9, 16, "9-16"), (17, None, "17+"))


def histogram(values: np.ndarray, bins: int = N_BINS) -> dict:
    """Equal-width bins between the finite minimum and maximum: {lo, hi, counts}."""
    x = values[np.isfinite(values)]
    if len(x) == 0:
        return {"lo": None, "hi": None, "counts": []}
    lo, hi = float(x.min()), float(x.max())
    if hi == lo:
        return {"lo": lo, "hi": hi, "counts": [int(len(x))]}
    counts, _ = np.histogram(x, bins=bins, range=(lo, hi))
    return {"lo": lo, "hi": hi, "counts": [int(c) for c in counts]}


def mean_std(x: np.ndarray) -> tuple[float, float]:
    """Mean and population std of finite values, computed on x / max|x| so that values near
    the float64 limit (rewards × 1e200) do not overflow to inf when squared or summed."""
    scale = float(np.max(np.abs(x))) if len(x) else 0.0
    if scale == 0.0:
        return 0.0, 0.0
    y = x / scale
    return float(y.mean()) * scale, float(y.std()) * scale


def distribution(values: np.ndarray) -> dict | None:
    """Summary statistics (finite values only) and a histogram."""
    x = values[np.isfinite(values)]
    if len(x) == 0:
        return None
    mean, std = mean_std(x)
    return {
        "n": int(len(x)),
        "min": float(x.min()),
        "mean": mean,
        "median": float(np.median(x)),
        "max": float(x.max()),
        "std": std,
        "histogram": histogram(x),
    }


def _size_buckets(size: np.ndarray) -> dict[str, int]:
    out = {}
    for lo, hi, label in SIZE_BUCKETS:
        mask = size >= lo if hi is None else (size >= lo) & (size <= hi)
        out[label] = int(np.sum(mask))
    return out


def _min_mean_max(x: np.ndarray) -> dict:
    return {"min": int(x.min()), "mean": float(x.mean()), "max": int(x.max())}


def overview(a: AnnotatedLog) -> dict:
    """Counts, method, parameters and distributions of the whole log."""
    idx = a.index
    v = a.values
    adv = v[C.ADVANTAGE]
    n = idx.n_rows
    out: dict = {"view": "overview", **a.header()}
    out.update(
        rows=n,
        trajectories=idx.n_traj,
        groups=idx.n_groups,
        steps_per_trajectory=_min_mean_max(idx.traj_len),
        trajectories_per_group=_min_mean_max(np.bincount(idx.traj_group, minlength=idx.n_groups)),
        mean_return=finite_float(a.traj_return.mean()),
    )
    if a.traj_success is not None and np.isfinite(a.traj_success).any():
        known = np.isfinite(a.traj_success)
        out["success"] = {
            "rate": float(a.traj_success[known].mean()),
            "successes": int(a.traj_success[known].sum()),
            "known": int(known.sum()),
        }
    else:
        out["success"] = None
    out["advantage_signs"] = {
        "positive": float(np.mean(adv > 0)),
        "negative": float(np.mean(adv < 0)),
        "zero": float(np.mean(adv == 0)),
    }
    out["distributions"] = {
        name: distribution(v[col])
        for name, col in (
            ("advantage", C.ADVANTAGE),
            ("adv_episode", C.ADV_EPISODE),
            ("adv_step", C.ADV_STEP),
            ("lambda", C.GACA_WEIGHT),
            ("nll", "nll"),
        )
        if col in v
    }
    lam = v.get(C.GACA_WEIGHT)
    if lam is not None:
        lam_bar = a.lambda_bar
        info: dict = {"bar": lam_bar, "corr_with_nll": None}
        if lam_bar is not None:
            info["above_bar"] = float(np.mean(lam > lam_bar + 1e-12))
            info["below_bar"] = float(np.mean(lam < lam_bar - 1e-12))
        nll = v.get("nll")
        if nll is not None:
            ok = np.isfinite(nll)
            if ok.sum() >= 2 and np.std(lam[ok]) > 0 and np.std(nll[ok]) > 0:
                info["corr_with_nll"] = finite_float(np.corrcoef(lam[ok], nll[ok])[0, 1])
        out["lambda"] = info
    else:
        out["lambda"] = None
    size = v.get(C.STEP_GROUP_SIZE)
    out["step_group_sizes"] = None if size is None else _size_buckets(size)
    out["step_signal_share"] = 0.0 if size is None else float(np.mean(size > 1))
    critical = a.critical
    out["critical_steps"] = {
        "threshold_z": CRITICAL_Z,
        "z_from": "file" if a.z_from_file else ("trajectory" if "nll" in v else None),
        "count": int(critical.sum()),
        "share": float(critical.mean()),
    }
    out["example_ids"] = {"traj": a.traj_ids[0], "group": a.group_ids[0]}
    out["comparable_methods"] = comparable_methods(a)
    return out


def comparable_methods(a: AnnotatedLog) -> list[str]:
    """The methods `--compare` can recompute from this file's columns, with the parameters it
    records: grpo always, gigpo and gaca with an anchor column, gaca with an NLL it reads."""
    from gaca_cli.credit.run import nll_source

    names = set(a.log.file_schema.names)
    out = []
    for m in METHODS:
        if not all(names.intersection(alternatives) for alternatives in COMMAND_NEEDS[f"advantages:{m}"]):
            continue
        try:
            config = config_for(a, m)
        except GacaError:
            continue
        if m == "gaca" and nll_source(names, config.nll_reduce) is None:
            continue
        out.append(m)
    return out
