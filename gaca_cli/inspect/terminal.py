"""Rich renderables for `gaca inspect` (stdout): the views of `gaca_cli/inspect/views.py` drawn as text.

Every function takes the JSON-ready dict that `--json` prints, so the terminal shows nothing
that the JSON lacks. Colour carries meaning but is never the only carrier: advantages are
signed numbers (green > 0, red < 0), λ is a bar whose length is λ (yellow above λ̄ = more
step-level credit, blue below), and critical steps carry a ★ as well as bold type.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

SPARK = " ▁▂▃▄▅▆▇█"  # level 0 (an empty bin) is a blank
EIGHTHS = " ▏▎▍▌▋▊▉█"
BAR_WIDTH = 8
CRITICAL_MARK = "★"
SIGN_STYLE = {1: "green", -1: "red", 0: "dim"}
ABOVE_STYLE, BELOW_STYLE = "yellow", "bright_blue"  # λ above / below λ̄

_BY_TITLE = {"nll": "NLL", "weight": "λ", "advantage": "advantage", "abs-advantage": "|advantage|"}


# --------------------------------------------------------------------------- consoles


def stdout_console(*, width: int | None = None) -> Console:
    """The console inspect prints its data on: colour only on a terminal and without
    NO_COLOR; otherwise plain text with no escape code at all."""
    console = Console(highlight=False, emoji=False, width=width)
    if os.environ.get("NO_COLOR", "") != "" or not console.is_terminal:
        console = Console(highlight=False, emoji=False, width=width, color_system=None, no_color=True)
    return console


def print_paged(console: Console, renderable: RenderableType, *, use_pager: bool = True) -> None:
    """Print `renderable`; on a terminal, output taller than the screen goes through the
    pager ($PAGER, else less; LESS defaults to -FRX so colours survive)."""
    if not (use_pager and console.is_terminal):
        console.print(renderable, crop=False)  # a line wider than the console is not cut
        return
    with console.capture() as capture:
        console.print(renderable, crop=False)
    text = capture.get()
    if text.count("\n") < console.height:
        console.file.write(text)
        console.file.flush()
        return
    import pydoc

    os.environ.setdefault("LESS", "-FRX")
    pydoc.pager(text)


# --------------------------------------------------------------------------- small pieces


#: from this magnitude on numbers are shown in scientific notation (1.234e+12), not 13 digits
SCIENTIFIC_FROM = 1e6


def fmt(x: float | None, digits: int = 3, sign: str = "") -> str:
    """`x` with `digits` decimals (`sign` "+": always signed), or in scientific notation when
    it is too large to read as a fixed-point number; "–" for None."""
    if x is None:
        return "–"
    kind = "e" if abs(x) >= SCIENTIFIC_FROM else "f"
    return f"{x:{sign}.{digits}{kind}}"


def signed(x: float | None, digits: int = 3) -> Text:
    """A signed number coloured by its sign."""
    if x is None:
        return Text("–", style="dim")
    sign = (x > 0) - (x < 0)
    return Text(fmt(x, digits, "+"), style=SIGN_STYLE[sign])


def sparkline(counts: Sequence[int]) -> str:
    """One character per bin, height ∝ count (an empty bin is a blank)."""
    if not counts:
        return ""
    top = max(counts)
    if top == 0:
        return " " * len(counts)
    levels = len(SPARK) - 1
    return "".join(SPARK[0 if c == 0 else max(1, -(-c * levels // top))] for c in counts)


def lambda_bar(lam: float | None, lam_bar: float | None, width: int = BAR_WIDTH) -> Text:
    """λ ∈ [0, 1] as a horizontal bar of `width` cells (eighth-cell resolution) and its value,
    yellow where λ > λ̄ (more step-level credit), blue where λ < λ̄, dim at λ̄; the value
    itself stays uncoloured."""
    if lam is None:
        return Text("–", style="dim")
    eighths = round(min(max(lam, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (EIGHTHS[part] if part else "")
    bar = bar + "·" * (width - len(bar))
    if lam_bar is None or abs(lam - lam_bar) <= 1e-12:
        style = "dim"
    else:
        style = ABOVE_STYLE if lam > lam_bar else BELOW_STYLE
    filled = bar.rstrip("·")
    text = Text()
    text.append(filled, style=style)
    text.append(bar[len(filled) :], style="dim")
    text.append(f" {lam:.2f}")
    return text


def _short(text: str | None) -> Text:
    return Text("–", style="dim") if text is None else Text(" ".join(text.split()))


def params_line(method: str | None, params: dict | None) -> Text:
    """The parameters that matter for the method, in the notation of the spec."""
    line = Text()
    line.append("method ", style="dim")
    line.append(method or "unknown", style="bold")
    if params is None:
        line.append("  (no gaca.advantages metadata: parameters unknown)", style="dim")
        return line
    items = [("γ", params.get("gamma")), ("norm", params.get("norm")), ("episode stats", params.get("episode_stats"))]
    if method in ("gigpo", "gaca", "hgpo"):
        sim = params.get("anchor_similarity")
        items += [("ω", params.get("step_weight") if method != "hgpo" else None)]
        items += [("anchors", "exact" if sim is None else f"similarity ≥ {sim:g}")]
    if method == "hgpo":
        items += [("K", params.get("history_length")), ("α", params.get("length_weight_alpha"))]
        items.append(("base group", "A^E" if params.get("base_group") else "none"))
    if method == "gaca":
        items += [
            ("β", params.get("beta")),
            ("NLL", f"{params.get('nll_reduce')} per {params.get('nll_scope')}"),
            ("λ ∈", f"[{params.get('lambda_min')}, {params.get('lambda_max')}]"),
        ]
    for name, value in items:
        if value is None:
            continue
        line.append("  ·  ", style="dim")
        line.append(f"{name} ", style="dim")
        line.append(f"{value:g}" if isinstance(value, (int, float)) else str(value))
    return line


def _title(view: dict, what: str) -> Text:
    t = Text()
    t.append("gaca inspect", style="bold")
    t.append(f"  {view['source']}", style="cyan")
    if what:
        t.append(f"  ·  {what}", style="bold")
    return t


def _source_line(view: dict) -> Text | None:
    parts = []
    if view.get("written_by"):
        parts.append(f"written by {view['written_by']}")
    if view.get("criticality_column"):
        parts.append(f"NLL from {view['criticality_column']} ({view.get('nll_unit')})")
    return Text("  ·  ".join(parts), style="dim") if parts else None


def _preamble(view: dict, what: str) -> list[RenderableType]:
    parts: list[RenderableType] = [_title(view, what), params_line(view["method"], view["params"])]
    src = _source_line(view)
    if src is not None:
        parts.append(src)
    return parts


# --------------------------------------------------------------------------- overview


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _spread(counts: dict) -> str:
    return f"min {counts['min']}  ·  mean {counts['mean']:.1f}  ·  max {counts['max']}"


def overview(view: dict) -> RenderableType:
    parts = _preamble(view, "overview")

    counts = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False)
    for _ in range(4):
        counts.add_column()
    counts.columns[1].justify = "right"
    counts.columns[0].min_width, counts.columns[2].min_width = len("episode groups"), len("trajectories per group")
    counts.columns[3].overflow = "fold"  # words wrap; one too long for the column folds, never …
    success = view["success"]
    success_text = (
        "– (no success column)"
        if success is None
        else f"{_pct(success['rate'])}  ({success['successes']:,} of {success['known']:,} trajectories)"
    )
    rows = [
        ("rows", f"{view['rows']:,}", "steps per trajectory", _spread(view["steps_per_trajectory"])),
        (
            "trajectories",
            f"{view['trajectories']:,}",
            "trajectories per group",
            _spread(view["trajectories_per_group"]),
        ),
        ("episode groups", f"{view['groups']:,}", "success rate", success_text),
        ("", "", "mean return R(τ)", fmt(view["mean_return"])),
    ]
    for label, value, label2, value2 in rows:
        counts.add_row(Text(label, style="bold"), value, Text(label2, style="dim"), value2)
    parts += [Text(), counts]

    dists = view["distributions"]
    labels = {
        "advantage": "advantage A",
        "adv_episode": "episode A^E",
        "adv_step": "step A^S",
        "lambda": "λ weight",
        "nll": "NLL",
    }
    stats = ("min", "median", "mean", "max")
    rows_of_numbers = []
    for key, dist in dists.items():
        if dist is None or (key == "adv_step" and dist["min"] == dist["max"] == 0.0):
            continue  # grpo writes A^S = 0 everywhere
        signed_cols = key in ("advantage", "adv_episode", "adv_step")
        cells = [signed(dist[k]) if signed_cols else Text(fmt(dist[k])) for k in stats]
        rows_of_numbers.append((labels[key], cells, Text(sparkline(dist["histogram"]["counts"]), style="magenta")))
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    label_width = max(len(label) for label in ["distribution", *(r[0] for r in rows_of_numbers)])
    table.add_column("distribution", style="bold", no_wrap=True, min_width=label_width)
    for i, name in enumerate(stats):  # a number is never cut: the line grows instead (see print_paged)
        width = max([len(name)] + [cells[i].cell_len for _, cells, _ in rows_of_numbers])
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    table.add_column("histogram, min → max", no_wrap=True)
    for label, cells, histogram in rows_of_numbers:
        table.add_row(label, *cells, histogram)
    parts += [Text(), table]
    signs = view["advantage_signs"]
    notes = Text(style="dim")
    notes.append(f"A > 0 on {_pct(signs['positive'])} of steps, < 0 on {_pct(signs['negative'])}")
    lam = view["lambda"]
    if lam is not None and lam.get("bar") is not None:
        notes.append(f"  ·  λ̄ = {lam['bar']:.3f}; λ above λ̄ on {_pct(lam.get('above_bar'))}")
        if lam.get("corr_with_nll") is not None:
            notes.append(f"  ·  corr(λ, NLL) {lam['corr_with_nll']:+.2f}")
    if view.get("nll_unit"):
        notes.append(f"  ·  NLL in {view['nll_unit']}")
    parts.append(notes)

    sizes: dict[str, int] | None = view["step_group_sizes"]
    share = view["step_signal_share"]
    line = Text()
    line.append("steps with a step-level signal ", style="bold")
    joined = view.get("history_groups")
    if joined is not None:
        line.append(_pct(share))
        by_count = "  ·  ".join(f"{k}: {n:,}" for k, n in joined.items())
        line.append(f"  (in a history group of two or more steps; steps by groups joined {by_count})", style="dim")
    elif sizes is None:
        line.append("none", style="dim")
        why = f"method {view['method']}" if view.get("method") else "no step groups in the file"
        line.append(f"  ({why}: episode-level credit only)", style="dim")
    else:
        line.append(_pct(share))
        line.append("  (their anchor state is shared with another step of the group)", style="dim")
    parts += [Text(), line]
    if sizes is not None:
        total = max(sum(sizes.values()), 1)
        bars = Table(box=None, show_header=True, padding=(0, 1), pad_edge=False)
        # the numbers keep their width (the bars shrink first, then the line grows)
        bars.add_column("step-group size", justify="right", style="bold", no_wrap=True, min_width=15)
        count_width = max([len("steps"), *(len(f"{n:,}") for n in sizes.values())])
        bars.add_column("steps", justify="right", no_wrap=True, min_width=count_width)
        bars.add_column("", justify="right", no_wrap=True, min_width=4)
        bars.add_column("", no_wrap=True)
        top = max(sizes.values()) or 1
        for label, n in sizes.items():
            style = "cyan" if label != "1" else "dim"
            bars.add_row(label, f"{n:,}", f"{100 * n / total:.0f}%", Text("█" * round(30 * n / top), style=style))
        parts += [Text(), bars]

    crit = view["critical_steps"]
    if crit["z_from"] is not None:
        line = Text()
        line.append(f"{CRITICAL_MARK} critical steps ", style="bold yellow")
        line.append(f"{crit['count']:,} ({_pct(crit['share'])})")
        z_from = "from the file" if crit["z_from"] == "file" else "within the trajectory"
        line.append(f"  NLL z ≥ {crit['threshold_z']:g} (z {z_from})", style="dim")
        parts += [Text(), line]

    ex = view["example_ids"]
    by = "weight" if view["lambda"] is not None else ("nll" if "nll" in dists else "abs-advantage")
    hint = Text(style="dim")
    hint.append(
        f"\nmore: --traj {shlex.quote(str(ex['traj']))}  ·  --group {shlex.quote(str(ex['group']))}  ·  "
        f"--top 10 --by {by}"
    )
    if len(comparable := view["comparable_methods"]) > 1:  # one method has nothing to compare with
        hint.append(f"  ·  --compare {','.join(comparable)}")
    parts.append(hint)
    return Group(*parts)


# --------------------------------------------------------------------------- step tables


def share_width(natural: Sequence[int], minimum: Sequence[int], weight: Sequence[int], available: int) -> list[int]:
    """Widths for text columns that share `available` cells: each gets its natural width if
    all fit, else space in proportion to its weight (a column never gets more than it needs,
    nor less than its minimum; what a short column leaves goes to the others)."""
    widths = [0] * len(natural)
    open_cols = list(range(len(natural)))
    left = available
    while open_cols:
        total = sum(weight[i] for i in open_cols)
        fits = [i for i in open_cols if natural[i] <= left * weight[i] // total]
        if not fits:
            for i in open_cols:
                widths[i] = max(minimum[i], left * weight[i] // total)
            break
        for i in fits:
            widths[i] = natural[i]
            left -= natural[i]
            open_cols.remove(i)
    return widths


class FitTable:
    """A table whose number columns keep their width while the text columns (action,
    anchor) share what is left of the console's width: truncated with …, or folded in full
    (wide). Rendered as a plain rich Table once the width is known."""

    def __init__(
        self, columns: Sequence[tuple[str, dict]], flexible: dict[int, tuple[int, int]], *, wide: bool
    ) -> None:
        self.columns = list(columns)  # (header, rich Column options)
        self.flexible = flexible  # column position -> (minimum width, weight)
        self.wide = wide
        self.rows: list[tuple[list[Text], str | None]] = []

    def add_row(self, cells: Sequence[Text], style: str | None = None) -> None:
        self.rows.append((list(cells), style))

    def __rich_console__(self, console: Console, options):
        natural = [
            max([Text(header).cell_len, opts.get("width") or 0] + [row[i].cell_len for row, _ in self.rows])
            for i, (header, opts) in enumerate(self.columns)
        ]
        flex = sorted(self.flexible)
        fixed = sum(w for i, w in enumerate(natural) if i not in self.flexible)
        minimum = [self.flexible[i][0] for i in flex]
        gap = 2  # one cell of padding and the (blank) divider; 1 on narrow consoles
        available = options.max_width - fixed - gap * (len(self.columns) - 1)
        if available < sum(minimum):
            gap = 1
            available += len(self.columns) - 1
        widths = share_width([natural[i] for i in flex], minimum, [self.flexible[i][1] for i in flex], available)
        table = Table(box=box.SIMPLE_HEAD, padding=(0, gap - 1), pad_edge=False, show_edge=False, collapse_padding=True)
        text_opts = {"overflow": "fold"} if self.wide else {"overflow": "ellipsis", "no_wrap": True}
        for i, (header, opts) in enumerate(self.columns):
            if i in self.flexible:
                table.add_column(header, width=widths[flex.index(i)], **text_opts)
            else:  # a number is never cut: on a console too narrow, the line is longer (see print_paged)
                table.add_column(header, no_wrap=True, min_width=natural[i], **opts)
        for cells, style in self.rows:
            table.add_row(*cells, style=style)
        yield table


_STEP_COLUMNS: dict[str, Any] = {
    "mark": ("", {"width": 1}),
    "rank": ("#", {"justify": "right"}),
    "traj": ("traj", {}),
    "step": ("step", {"justify": "right"}),
    "action": ("action", {}),
    "anchor": ("anchor", {}),
    "size": ("|S|", {"justify": "right"}),
    "history": ("|H|", {"justify": "right"}),
    "nll": ("NLL", {"justify": "right"}),
    "z": ("z", {"justify": "right"}),
    "lambda": ("λ", {}),
    "adv_episode": ("A^E", {"justify": "right"}),
    "adv_step": ("A^S", {"justify": "right"}),
    "advantage": ("A", {"justify": "right"}),
}
_FLEXIBLE = {"action": (10, 3), "anchor": (8, 2)}  # minimum width, weight


def _step_table(wide: bool, *, columns: Sequence[str]) -> FitTable:
    flexible = {i: _FLEXIBLE[c] for i, c in enumerate(columns) if c in _FLEXIBLE}
    return FitTable([_STEP_COLUMNS[c] for c in columns], flexible, wide=wide)


def common_start(texts: Sequence[str | None], minimum: int = 6) -> str:
    """The words every text starts with (e.g. "You are in the "), when at least `minimum`
    characters long: anchors are shown without it, so the part that differs is visible."""
    present = [" ".join(t.split()) for t in texts if t]
    if len(present) < 2:
        return ""
    prefix = os.path.commonprefix(present)
    cut = prefix.rfind(" ") + 1
    return prefix[:cut] if cut >= minimum else ""


def _anchor(text: str | None, drop: str) -> Text:
    if text is None:
        return Text("–", style="dim")
    text = " ".join(text.split())
    return Text("…" + text[len(drop) :]) if drop and text.startswith(drop) else Text(text)


def _step_cells(step: dict, columns: Sequence[str], lam_bar: float | None, drop: str = "") -> list[Text]:
    cells: dict[str, Text] = {
        "mark": Text(CRITICAL_MARK, style="bold yellow") if step["critical"] else Text(""),
        "rank": Text(str(step.get("rank", ""))),
        "traj": Text(step["traj_id"]),
        "step": Text(str(step["step"])),
        "action": _short(step["action"]),
        "anchor": _anchor(step["anchor"], drop),
        "size": Text("–" if step["step_group_size"] is None else str(step["step_group_size"])),
        "history": Text("–" if step["history_groups"] is None else str(step["history_groups"])),
        "nll": Text(fmt(step["nll"])),
        "z": Text("–" if step["nll_z"] is None else f"{step['nll_z']:+.2f}"),
        "lambda": lambda_bar(step["lambda"], lam_bar),
        "adv_episode": signed(step["adv_episode"], 2),
        "adv_step": signed(step["adv_step"], 2),
        "advantage": signed(step["advantage"], 2),
    }
    return [cells[c] for c in columns]


def _available(steps: Sequence[dict]) -> dict[str, bool]:
    """Whether any of `steps` has a value for each optional column (by the step field it shows)."""
    fields = {"anchor": "anchor", "size": "step_group_size", "history": "history_groups", "nll": "nll"}
    fields |= {"lambda": "lambda", "adv_episode": "adv_episode", "adv_step": "adv_step"}
    return {column: any(s[key] is not None for s in steps) for column, key in fields.items()}


def _columns(base: Sequence[str], available: dict[str, bool]) -> list[str]:
    return [c for c in base if available.get(c, True) and not (c == "z" and not available["nll"])]


def _legend(view: dict, drop: str = "", *, sizes: bool = True, critical: bool = True, history: bool = False) -> Text:
    pieces: list[Text] = []
    if critical:  # (a file without NLL marks no step critical)
        pieces.append(Text.assemble((CRITICAL_MARK, "yellow"), f" critical: NLL z ≥ {view['critical_threshold_z']:g}"))
    if view.get("lambda_bar") is not None:
        pieces.append(
            Text.assemble(
                "λ: share of the step-level signal, ",
                ("yellow", ABOVE_STYLE),
                f" above λ̄ = {view['lambda_bar']:.2f}, ",
                ("blue", BELOW_STYLE),
                " below",
            )
        )
    if sizes:
        pieces.append(Text("|S|: steps sharing the anchor state"))
    pieces += [Text("|H|: history groups of two or more steps the step is in")] if history else []
    if drop:
        pieces.append(Text(f"anchors shown without their common start {drop.strip()!r}"))
    t = Text("  ·  ").join(pieces)
    t.stylize("dim")
    return t


def _traj_header(traj: dict) -> Text:
    t = Text()
    t.append(traj["traj_id"], style="bold cyan")
    t.append(f"  group {traj['group_id']}  ·  {traj['length']} steps  ·  R = {fmt(traj['return'])}", style="")
    if traj["success"] is not None:
        t.append("  ·  ")
        t.append("success" if traj["success"] else "failure", style="green" if traj["success"] else "red")
    if traj["adv_episode"] is not None:
        t.append("  ·  A^E = ")
        t.append_text(signed(traj["adv_episode"]))
    if traj["critical_steps"]:
        t.append("  ·  ")
        t.append(f"{CRITICAL_MARK} steps {', '.join(str(s) for s in traj['critical_steps'])}", style="yellow")
    lam = [s["lambda"] for s in traj["steps"]]
    if all(x is not None for x in lam) and lam:
        t.append("  ·  λ by step ")
        t.append(_profile(lam), style="yellow")
    return t


def _profile(values: Sequence[float]) -> str:
    """One block per step, height ∝ value on a [0, 1] scale."""
    return "".join(SPARK[max(1, min(8, round(v * 8)))] for v in values)


def steps(view: dict, *, wide: bool = False) -> RenderableType:
    sel = view["selection"]
    what = f"trajectory {sel['traj']}" if sel["traj"] is not None else f"group {sel['group']}"
    parts = _preamble(view, what)
    all_steps = [s for traj in view["trajectories"] for s in traj["steps"]]
    cols = _columns(
        "mark step action anchor size history nll z lambda adv_episode adv_step advantage".split(),
        _available(all_steps),
    )
    drop = "" if wide else common_start([s["anchor"] for s in all_steps])
    for traj in view["trajectories"]:
        table = _step_table(wide, columns=cols)
        for step in traj["steps"]:
            table.add_row(_step_cells(step, cols, view["lambda_bar"], drop), style="bold" if step["critical"] else None)
        parts += [Text(), _traj_header(traj), table]
        if traj.get("final_observation"):
            parts.append(Text(f"after the last step: {traj['final_observation']}", style="dim"))
    parts.append(_legend(view, drop, sizes="size" in cols, critical="z" in cols, history="history" in cols))
    return Group(*parts)


def _where(sel: dict, preposition: str) -> str:
    """ " of trajectory T" / " of group G" (with `preposition`), or "" for the whole log."""
    if sel["traj"] is not None:
        return f" {preposition} trajectory {sel['traj']}"
    if sel["group"] is not None:
        return f" {preposition} group {sel['group']}"
    return ""


def top(view: dict, *, wide: bool = False) -> RenderableType:
    order = "lowest" if view["lowest"] else "highest"
    where = _where(view["selection"], "of")
    what = f"{len(view['rows'])} {order} steps by {_BY_TITLE[view['by']]}{where} (of {view['candidates']:,})"
    parts = _preamble(view, what)
    cols = _columns(
        ["mark", "rank", "traj", "step", "action", "nll", "z", "lambda", "adv_episode", "adv_step", "advantage"],
        _available(view["rows"]),
    )
    table = _step_table(wide, columns=cols)
    key_col = {"nll": "nll", "weight": "lambda", "advantage": "advantage", "abs-advantage": "advantage"}[view["by"]]
    if key_col in cols:
        header, opts = table.columns[cols.index(key_col)]
        table.columns[cols.index(key_col)] = (header, {**opts, "header_style": "bold underline"})
    for row in view["rows"]:
        table.add_row(_step_cells(row, cols, view["lambda_bar"]), style="bold" if row["critical"] else None)
    parts += [Text(), table, _legend(view, sizes=False, critical="z" in cols)]
    return Group(*parts)


# --------------------------------------------------------------------------- compare


def _rank_text(ranks: dict, methods: Sequence[str]) -> Text:
    return Text(" → ".join(f"{ranks[m]:g}" for m in methods))


def _ranks_title(what: str, methods: Sequence[str]) -> Text:
    t = Text(what, style="bold")
    t.append(f"  (rank among all steps, 1 = largest A: {' → '.join(methods)}; shift = max − min)", style="dim")
    return t


def _compare_table(view: dict, rows: Sequence[dict], *, wide: bool, with_traj: bool, marked: set) -> FitTable:
    methods = view["methods"]
    columns: list[tuple[str, dict]] = [("", {"width": 1})]
    if with_traj:
        columns.append(("traj", {}))
    columns += [("step", {"justify": "right"}), ("action", {})]
    flexible = {len(columns) - 1: _FLEXIBLE["action"]}
    columns += [(f"A {m}", {"justify": "right"}) for m in methods]
    columns += [("rank", {"justify": "right"}), ("shift", {"justify": "right"})]
    table = FitTable(columns, flexible, wide=wide)
    for row in rows:
        key = (row["traj_id"], row["step"])
        cells: list[Text] = [Text("▶", style="bold magenta") if key in marked else Text("")]
        if with_traj:
            cells.append(Text(row["traj_id"]))
        cells += [Text(str(row["step"])), _short(row["action"])]
        cells += [signed(row["advantages"][m], 2) for m in methods]
        cells += [_rank_text(row["ranks"], methods), Text(f"{row['rank_shift']:g}", style="magenta")]
        table.add_row(cells, style="bold" if key in marked else None)
    return table


def compare(view: dict, *, wide: bool = False) -> RenderableType:
    methods = view["methods"]
    base = view["baseline"]
    sel = view["selection"]
    parts = _preamble(view, f"compare {', '.join(methods)}{_where(sel, 'on')}")
    used = Text(style="dim")
    used.append(
        "recomputed from this log with the file's parameters: "
        if view["params_recorded"]
        else "recomputed with default parameters (the file records none): "
    )
    p = view["params_used"]
    used.append(
        f"γ {p['gamma']:g} · norm {p['norm']} · ω {p['step_weight']:g} · β {p['beta']:g} · "
        f"NLL {p['nll_reduce']} per {p['nll_scope']}"
    )
    parts.append(used)
    check = view["file_check"]
    if check is not None and not check["matches"]:
        note = (
            f"note: the file's advantage column differs from the recomputed {check['method']} "
            f"(max |Δ| = {check['max_abs_diff']:.3g}); was it written with other options?"
        )
        parts.append(Text(note, style="yellow"))

    title = Text(f"all {view['steps']:,} steps", style="bold")
    title.append(f"  (|Δ|, corr, rank corr and same sign: against {base})", style="dim")
    columns = [("method", {"style": "bold"})] + [
        (name, {"justify": "right"})
        for name in ("mean", "std", "min", "max", "A > 0", "mean |Δ|", "corr", "rank corr", "same sign")
    ]
    summary = FitTable(columns, {}, wide=False)
    for row in view["summary"]:
        cells = [Text(row["method"]), signed(row["mean"], 2), Text(fmt(row["std"], 2))]
        cells += [signed(row["min"], 2), signed(row["max"], 2), Text(_pct(row["positive_share"]))]
        if row["method"] == base:
            cells += [Text("baseline", style="dim"), Text(""), Text(""), Text("")]
        else:
            cells += [
                Text(fmt(row["mean_abs_diff_from_baseline"], 2)),
                Text(fmt(row["corr_with_baseline"], 3)),
                Text(fmt(row["rank_corr_with_baseline"], 3)),
                Text(_pct(row["sign_agreement_with_baseline"])),
            ]
        summary.add_row(cells)
    parts += [Text(), title, summary]

    movers = view["movers"]
    marked = {(r["traj_id"], r["step"]) for r in movers}
    if view["rows"] is not None:
        table = _compare_table(view, view["rows"], wide=wide, with_traj=sel["group"] is not None, marked=marked)
        parts += [Text(), _ranks_title("per step", methods), table]
        parts.append(Text(f"▶ the {len(movers)} steps whose rank changes most", style="dim"))
    else:
        table = _compare_table(view, movers, wide=wide, with_traj=True, marked=set())
        parts += [Text(), _ranks_title(f"the {len(movers)} steps whose rank changes most", methods), table]
    return Group(*parts)


RENDERERS = {"overview": overview, "steps": steps, "top": top, "compare": compare}

#: control characters (C0 but tab and newline, DEL, C1) as the escapes Python writes for them,
#: so that text from a log (an action holding ESC [2J, an OSC title) never drives the terminal
_CONTROLS = {c: ascii(chr(c))[1:-1] for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\t\n"}


def _inert(value: Any) -> Any:
    """`value` (a view, or part of one) with every string's control characters escaped."""
    if isinstance(value, str):
        return value.translate(_CONTROLS)
    if isinstance(value, dict):
        return {k: _inert(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_inert(v) for v in value)
    return value


def render(view: dict, *, wide: bool = False) -> RenderableType:
    """The renderable of any inspect view (its text made inert: see `_CONTROLS`)."""
    view = _inert(view)
    if view["view"] == "overview":
        return overview(view)
    renderer: Any = RENDERERS[view["view"]]
    return renderer(view, wide=wide)
