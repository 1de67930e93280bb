"""The run summaries of every command, as rich renderables: `validate`, `advantages`, `score` and
`train-offline` (shown on stderr) and the closing report of `demo` (on stdout).

Each takes the dict that the command's `--json` prints, so the two always hold the same facts.
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

_WARNING_TEXT = {
    "singleton_groups": "episode groups with a single trajectory (A^E = 0 there)",
    "differing_initial_anchors": "groups whose step-0 anchors differ (rollouts may not share a start)",
    "empty_anchors": "steps with an empty anchor text",
}


def _warnings_table(warnings: dict[str, int]) -> list[Table]:
    """The warnings that occurred as a table, in a list ([] when none did)."""
    shown = {k: v for k, v in warnings.items() if v}
    if not shown:
        return []
    table = Table(title="warnings", show_header=False, box=None, title_justify="left")
    for key, count in shown.items():
        table.add_row(Text(f"{count:,}", style="yellow"), _WARNING_TEXT.get(key, key))
    return [table]


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
    parts += _warnings_table(report.get("warnings", {}))
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
    for key, label in (("step_group_size", "step-group size"), ("history_groups", "history groups joined")):
        if (hist := summary.get(f"steps_by_{key}")) is not None:
            table.add_row(f"steps by {label}", "  ".join(f"{k}: {v:,}" for k, v in hist.items()))
    table.add_row("steps with a step-level signal", f"{100 * summary['step_signal_share']:.1f}%")
    hgpo = summary["method"] == "hgpo"
    if not hgpo or summary["params"].get("base_group"):
        table.add_row("mean |A^E|", _fmt(summary["mean_abs_adv_episode"]))
    if not hgpo:
        table.add_row("mean |ω·A^S|", _fmt(summary["mean_abs_weighted_adv_step"]))
    lam = summary.get("lambda")
    if lam:
        table.add_row(
            "λ mean / min / max", f"{lam['mean']:.4f} / {lam['min']:.4f} / {lam['max']:.4f}  (λ̄ = {lam['bar']:.4f})"
        )
        table.add_row("corr(λ, NLL)", _fmt(lam["corr_with_nll"], 3))
        if summary.get("criticality_column"):
            table.add_row("criticality from", summary["criticality_column"])
    diag = summary.get("diagnostics", {})
    if diag:
        table.add_row("diagnostics", "  ".join(f"{k}: {v:,}" for k, v in diag.items()))
    return Group(table, *_warnings_table(summary.get("warnings", {})))


def score_summary(s: dict) -> Text:
    """`gaca score`: what was written, how much was scored, how fast, and any warnings."""
    lines = [
        f"wrote {s['output']}: {s['rows']:,} rows, {s['action_tokens']:,} action tokens scored with "
        f"{s['model']} ({s['dtype']}, T={s['temperature']:g}) on {s['device']}",
        f"  {s['trajectories']:,} trajectories, {s['packed_trajectories']:,} packed into one forward; "
        f"{s['unique_sequences']:,} sequences ({s['duplicate_sequences']:,} duplicates skipped), "
        f"{s['tokens']:,} tokens in {s['forwards']:,} forwards, {s['forwarded_tokens']:,} forwarded "
        f"({s['shared_prefixes']:,} shared prefixes run once)",
        f"  {s['wall_s']:.1f} s"
        + (f", {s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "")
        + (f"; resumed {s['resumed_chunks']} of {s['chunks']} chunks" if s["resumed_chunks"] else ""),
    ]
    if s["mean_nll_per_token"] is not None:
        lines.append(f"  mean NLL {s['mean_nll_per_token']:.4f} nats/token")
    if s["empty_actions"]:
        lines.append(f"  {s['empty_actions']:,} empty actions (nll_sum 0, nll_mean null)")
    if s["prefix_mismatch_rows"]:
        lines.append(
            f"  warning: {s['prefix_mismatch_rows']:,} rows where the context's tokens are not a prefix of "
            f"context + action's; their action was tokenised on its own "
            f"(rows {', '.join(s['prefix_mismatch_examples'])})"
        )
    if s["oom_backoffs"]:
        lines.append(f"  {s['oom_backoffs']} out-of-memory back-offs (lower --max-batch-tokens to avoid them)")
    lines += _warning_lines(s.get("warnings", {}))
    return Text("\n".join(lines))


def train_summary(s: dict) -> Text:
    """`gaca train-offline`: the run, the rows used, the last optimiser step, the throughput."""
    rows, final = s["rows"], s["final"]
    resumed = f" (resumed at step {s['resumed_from_step']})" if s.get("resumed_from_step") else ""
    if s.get("already_finished"):
        return Text(
            f"{s['output']}: the run had finished ({s['steps']} optimiser steps); nothing was trained again, "
            "the model there is the run's"
        )
    lines = [
        f"wrote {s['output']}: {s['mode']} fine-tuning with --loss {s['loss']}, {s['steps']} optimiser steps "
        f"over {s['sequences']:,} steps of the log{resumed}",
        f"  rows: {rows['rows']:,} read, {rows['trained']:,} trained on, {rows['no_gradient']:,} carry no gradient"
        + (f", {rows['empty_action']:,} empty actions" if rows.get("empty_action") else "")
        + (f", {rows['too_long']:,} longer than --max-length" if rows.get("too_long") else ""),
        f"  behavior log-probs: {s['behavior_source'] or 'none'}",
        f"  final step: loss {_dash(final['loss'])}, policy loss {_dash(final['policy_loss'])}, "
        f"KL {_dash(final['kl'])}, ratio mean {_dash(final['ratio_mean'])}, "
        f"clip fraction {_dash(final['clip_frac'])}, grad norm {_dash(final['grad_norm'])}",
        f"  {s['tokens']:,} tokens in {s['wall_s']:.1f} s"
        + (f" ({s['tokens_per_s']:,.0f} tokens/s)" if s.get("tokens_per_s") else "")
        + f" on {s['processes']} process(es), {s['device']}, mixed precision {s['mixed_precision']}",
        f"  metrics: {Path(s['output']) / 'metrics.jsonl'}",
    ]
    if rows.get("prefix_mismatch"):
        lines.append(
            f"  warning: {rows['prefix_mismatch']:,} rows whose context tokens are not a prefix of context + "
            "action's (their action was tokenised on its own, as `gaca score` does)"
        )
    lines += _warning_lines(s.get("warnings", {}))
    return Text("\n".join(lines))


def _dash(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def _warning_lines(warnings: dict[str, int]) -> list[str]:
    return [f"  warning: {count:,} {key.replace('_', ' ')}" for key, count in warnings.items() if count]


def demo_report(summary: dict) -> Group:
    """The end of `gaca demo`: success per method and iteration, and the quality table."""
    from gaca_cli.demo.quality import SCORE_HEADERS
    from gaca_cli.demo.run import Z_975, wilson_interval

    success, quality, n = summary["success"], summary["quality"], summary["rollouts"]
    parts: list = [
        Text(
            f"TextWorld success rate per iteration (0 = the start model), of {n} rollouts each [95 % Wilson interval]",
            style="italic",
        )
    ]
    loop = Table(box=None)
    loop.add_column("method", style="bold")
    k = max((len(v) for v in success.values()), default=0)
    for i in range(k):
        loop.add_column(f"iter {i}", justify="right")
    for method, curve in success.items():
        cells = []
        for x in curve:
            low, high = wilson_interval(round(x * n), n)
            cells.append(f"{x:.3f} [{low:.2f}, {high:.2f}]")
        loop.add_row(method, *cells)
    parts.append(loop)
    parts.append(
        Text(
            f"At {n} rollouts two rates closer than about {Z_975 * (0.5 / n) ** 0.5:.2f} can differ by chance "
            "alone: this table shows the loop running end to end, not which estimator is better. "
            "The table below compares the estimators against exact advantages.",
            style="dim",
        )
    )
    shown = ("spearman_pivotal", "sign_pivotal", "spearman_slips", "sign_slips", "gradient_cosine")
    title = "estimators against exact Q − V (mean ± std over seeds)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
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
    timing = "  ".join(f"{k} {v:.0f}s" for k, v in summary["seconds"].items())
    parts.append(Text(f"every file is in {summary['out']}  ·  {timing}", style="dim"))
    return Group(*parts)


def import_summary(s: dict) -> Group:
    """`gaca import`: what was written, and what was mapped, derived, kept and is missing."""
    title = f"gaca import --from {s['format']}"
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    if "output" in s:
        table.add_row("output", s["output"])
    table.add_row(
        "read",
        f"{s['files']:,} file(s): {s['rows']:,} steps, {s['trajectories']:,} trajectories, {s['groups']:,} episode groups",
    )
    for column, source in s["mapped"].items():
        table.add_row(f"{column}", f"from {source}")
    for column, how in s["derived"].items():
        table.add_row(f"{column}", f"derived: {how}")
    if s["kept"]:
        table.add_row("kept as they are", ", ".join(s["kept"]))
    for field, column in s.get("renamed", {}).items():
        table.add_row(f"{column}", f"the source's {field} (gaca writes a column of that name)")
    parts: list = [table]
    for note in s["missing"]:
        parts.append(Text(f"missing: {note}", style="yellow"))
    parts += _warnings_table(s.get("warnings", {}))
    return Group(*parts)


def format_list(formats: list[dict]) -> Table:
    """`gaca import --list`: one line per format."""
    table = Table(show_header=True, box=None, pad_edge=False)
    table.add_column("--from", style="bold")
    table.add_column("what it reads")
    for f in formats:
        table.add_row(f["name"], f["summary"])
    return table
