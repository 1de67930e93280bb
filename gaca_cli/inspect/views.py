"""What each view of `gaca inspect` computes, as a JSON-ready dict (`build_view` picks one): the
overview, the steps of a trajectory or group, the top-k steps, and --compare."""

from __future__ import annotations

import numpy as np

from gaca_cli.credit.config import METHODS
from gaca_cli.credit.summary import SIZE_BUCKETS
from gaca_cli.errors import GacaError
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import (
    CRITICAL_Z,
    AnnotatedLog,
    config_for,
    finite_float,
    method_advantages,
    select,
    selected_trajs,
    selection_record,
    step_records,
    trajectory_record,
)
from gaca_cli.log import columns as C
from gaca_cli.log.schema import COMMAND_NEEDS

N_BINS = 24  # bins of every histogram


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
    joined = v.get(C.HISTORY_GROUPS)  # hgpo: steps by their number of history groups
    out["history_groups"] = (
        None if joined is None else {str(k): int(c) for k, c in enumerate(np.bincount(joined.astype(np.int64)))}
    )
    if joined is not None:
        out["step_signal_share"] = float(np.mean(joined > 0))
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
    out: list[str] = []
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


SELECTION_MOVERS = 3  # movers marked in a --compare table of one trajectory or group


def descending_ranks(x: np.ndarray) -> np.ndarray:
    """Rank of each value, 1 = largest; tied values share their average rank. float64 [N]."""
    s = np.sort(x)
    lo = np.searchsorted(s, x, side="left")
    hi = np.searchsorted(s, x, side="right")
    return (len(x) - hi) + (hi - lo + 1) / 2.0


def _corr(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson correlation, None when either side is constant; computed on x / max|x| and
    y / max|y| (it does not change under scaling) so that huge values do not overflow."""
    if len(x) < 2 or mean_std(x)[1] == 0 or mean_std(y)[1] == 0:
        return None
    return finite_float(np.corrcoef(x / np.max(np.abs(x)), y / np.max(np.abs(y)))[0, 1])


def compare_view(a: AnnotatedLog, config: InspectConfig) -> dict:
    """--compare: each method's A_t on the same log, how far each moves from the first
    (the baseline), and the steps whose rank (over the whole log) changes the most."""
    methods = list(config.compare)
    adv = method_advantages(a, methods)
    base = methods[0]
    ranks = {m: descending_ranks(adv[m]) for m in methods}
    stacked = np.vstack([ranks[m] for m in methods])
    shift = stacked.max(axis=0) - stacked.min(axis=0)

    summary = []
    for m in methods:
        x = adv[m]
        mean, std = mean_std(x)
        row: dict[str, object] = {
            "method": m,
            "mean": mean,
            "std": std,
            "min": float(x.min()),
            "max": float(x.max()),
            "positive_share": float(np.mean(x > 0)),
            "mean_abs": float(np.mean(np.abs(x))),
        }
        if m != base:
            d = x - adv[base]
            row.update(
                corr_with_baseline=_corr(x, adv[base]),
                rank_corr_with_baseline=_corr(ranks[m], ranks[base]),
                sign_agreement_with_baseline=float(np.mean(np.sign(x) == np.sign(adv[base]))),
                mean_abs_diff_from_baseline=float(np.mean(np.abs(d))),
                max_abs_diff_from_baseline=float(np.max(np.abs(d))),
            )
        summary.append(row)

    def records(positions: np.ndarray) -> list[dict]:
        rows = step_records(a, positions)
        for p, row in zip(positions.tolist(), rows, strict=True):
            row["advantages"] = {m: float(adv[m][p]) for m in methods}
            row["diff_from_baseline"] = {m: float(adv[m][p] - adv[base][p]) for m in methods if m != base}
            row["ranks"] = {m: float(ranks[m][p]) for m in methods}
            row["rank_shift"] = float(shift[p])
        return rows

    selection = select(a, config.traj, config.group)
    pool = np.arange(a.index.n_rows, dtype=np.int64) if selection is None else selection
    n_movers = config.k if (selection is None or config.top is not None) else SELECTION_MOVERS
    movers = pool[np.lexsort((pool, -shift[pool]))][:n_movers]

    file_check = None
    if a.method in methods:
        diff = float(np.max(np.abs(adv[a.method] - a.values[C.ADVANTAGE])))
        file_check = {"method": a.method, "max_abs_diff": diff, "matches": diff <= 1e-9}

    params_used = config_for(a, base).as_metadata()
    params_used.pop("method")
    out = {"view": "compare", **a.header(), "selection": selection_record(config)}
    out.update(
        methods=methods,
        baseline=base,
        params_used=params_used,
        params_recorded=a.params is not None,
        steps=a.index.n_rows,
        summary=summary,
        file_check=file_check,
        rows=None if selection is None else records(selection),
        movers=records(movers),
    )
    return out


def steps_view(a: AnnotatedLog, config: InspectConfig) -> dict:
    """--traj / --group: every step of one trajectory, or of each trajectory of a group."""
    trajs = selected_trajs(a, config.traj, config.group)
    assert trajs is not None
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
