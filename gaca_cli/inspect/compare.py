"""`gaca inspect --compare`: each method's A_t recomputed on the same log, how far each moves
from the first method's ranking, and the steps that move the most."""

from __future__ import annotations

import numpy as np

from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import (
    AnnotatedLog,
    config_for,
    finite_float,
    method_advantages,
    select,
    selection_record,
    step_records,
)
from gaca_cli.inspect.overview import mean_std
from gaca_cli.log import columns as C

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
        row = {
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
