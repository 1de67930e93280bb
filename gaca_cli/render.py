"""Rich renderables for the run summaries of `validate` and `advantages` (stderr)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

_WARNING_TEXT = {
    "singleton_groups": "episode groups with a single trajectory (A^E = 0 there)",
    "differing_initial_anchors": "groups whose step-0 anchors differ (rollouts may not share a start)",
    "empty_anchors": "steps with an empty anchor text",
}


def _warnings_table(warnings: dict[str, int]) -> Table | None:
    shown = {k: v for k, v in warnings.items() if v}
    if not shown:
        return None
    table = Table(title="warnings", show_header=False, box=None, title_justify="left")
    for key, count in shown.items():
        table.add_row(Text(f"{count:,}", style="yellow"), _WARNING_TEXT.get(key, key))
    return table


def validation_report(report: dict) -> Group:
    parts: list = []
    if report["ok"]:
        parts.append(Text(f"OK: {report['source']}: {report['rows']:,} rows pass every check", style="green"))
    else:
        parts.append(Text(f"{len(report['violations'])} rule(s) broken in {report['source']}:", style="bold red"))
        for v in report["violations"]:
            line = f"- {v['file']}: column '{v['column']}': {v['rule']}"
            if v["rows"]:
                more = v["n_rows"] - len(v["rows"])
                line += "; rows (traj_id, step_idx): " + ", ".join(v["rows"])
                if more > 0:
                    line += f" and {more:,} more"
            parts.append(Text(line))
    table = _warnings_table(report.get("warnings", {}))
    if table is not None:
        parts.append(table)
    return Group(*parts)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def advantages_summary(summary: dict) -> Group:
    table = Table(title=f"gaca advantages --method {summary['method']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("output", summary["output"])
    table.add_row("rows", f"{summary['rows']:,}")
    table.add_row("trajectories", f"{summary['trajectories']:,}")
    table.add_row("episode groups", f"{summary['groups']:,}")
    table.add_row("singleton episode groups", f"{summary['singleton_groups']:,}")
    if "steps_by_step_group_size" in summary:
        hist = summary["steps_by_step_group_size"]
        table.add_row("steps by step-group size", "  ".join(f"{k}: {v:,}" for k, v in hist.items()))
    table.add_row("steps with a step-level signal", f"{100 * summary['step_signal_share']:.1f}%")
    table.add_row("mean |A^E|", _fmt(summary["mean_abs_adv_episode"]))
    table.add_row("mean |ω·A^S|", _fmt(summary["mean_abs_weighted_adv_step"]))
    lam = summary.get("lambda")
    if lam:
        table.add_row("λ mean / min / max", f"{lam['mean']:.4f} / {lam['min']:.4f} / {lam['max']:.4f}  (λ̄ = {lam['bar']:.4f})")
        table.add_row("corr(λ, NLL)", _fmt(lam["corr_with_nll"], 3))
        if summary.get("criticality_column"):
            table.add_row("criticality from", summary["criticality_column"])
    diag = summary.get("diagnostics", {})
    if diag:
        table.add_row("diagnostics", "  ".join(f"{k}: {v:,}" for k, v in diag.items()))
    parts: list = [table]
    warn = _warnings_table(summary.get("warnings", {}))
    if warn is not None:
        parts.append(warn)
    return Group(*parts)


def demo_report(success: dict[str, list[float]], quality: list[dict], out: str, seconds: dict[str, float]) -> Group:
    """The end of `gaca demo`: success per method and iteration, and the quality table."""
    parts: list = []
    parts.append(Text("TextWorld success rate per iteration (0 = the start model)", style="italic"))
    loop = Table(box=None)
    loop.add_column("method", style="bold")
    k = max((len(v) for v in success.values()), default=0)
    for i in range(k):
        loop.add_column(f"iter {i}", justify="right")
    for method, curve in success.items():
        loop.add_row(method, *(f"{x:.3f}" for x in curve))
    parts.append(loop)
    from gaca_cli.demo.quality import SCORE_HEADERS

    shown = ("spearman_pivotal", "sign_pivotal", "spearman_slips", "sign_slips", "gradient_cosine")
    from rich import box

    table = Table(
        title="estimators against exact Q − V (mean ± std over seeds)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("estimator", style="bold", no_wrap=True)
    keys = [k for k in shown if any(f"{k}_mean" in row for row in quality)]
    for key in keys:
        table.add_column(SCORE_HEADERS[key], justify="right", no_wrap=True)
    for row in quality:
        cells = []
        for key in keys:
            mean, std = row.get(f"{key}_mean"), row.get(f"{key}_std")
            cells.append("–" if mean is None else f"{mean:.2f}±{(std or 0):.2f}")
        table.add_row(row["label"].replace(" (reference)", " (ref.)"), *cells)
    parts.append(table)
    parts.append(
        Text(
            "forks: pivotal steps; slips: routine steps where the policy took a rare action; "
            "grad cos: cosine between the policy-gradient update from the estimate and from the truth",
            style="dim",
        )
    )
    timing = "  ".join(f"{k} {v:.0f}s" for k, v in seconds.items())
    parts.append(Text(f"every file is in {out}  ·  {timing}", style="dim"))
    return Group(*parts)
