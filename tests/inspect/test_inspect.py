"""`gaca inspect`, library and rendering: the numbers shown come from the file, in the right
order, with the right marks; the view shows nothing that the JSON lacks.

Inputs are made from examples/rollouts.parquet with `gaca advantages` (as a library call);
expected values are read back from the annotated file independently (pyarrow / plain loops).
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import compute_advantages
from gaca_cli.errors import GacaError
from gaca_cli.inspect import terminal as V
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.inspect.data import CRITICAL_Z, closest_ids, load_annotated
from gaca_cli.inspect.views import build_view, descending_ranks
from gaca_cli.log.reading import read_log
from gaca_cli.log.writing import write_parquet_atomic
from tests.conftest import EXAMPLE_LOG

ESC = "\x1b"


def annotate_file(src, out, **options) -> str:
    run = compute_advantages(read_log([src]), AdvantagesConfig(**options))
    write_parquet_atomic(run.table, out, run.metadata)
    return str(out)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("inspect")
    return {m: annotate_file(EXAMPLE_LOG, d / f"{m}.parquet", method=m) for m in ("grpo", "gigpo", "gaca")}


@pytest.fixture(scope="module")
def gaca(files):
    return load_annotated([files["gaca"]])


def rows_of(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


def text_of(renderable, *, width: int = 140, color: bool = False) -> str:
    out = io.StringIO()
    console = Console(
        file=out,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
    )
    console.print(renderable)
    return out.getvalue()


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# --------------------------------------------------------------------------- overview


def test_overview_counts_success_and_parameters(files, gaca):
    rows = rows_of(files["gaca"])
    trajs = {r["traj_id"] for r in rows}
    success = {t: any(r["success"] for r in rows if r["traj_id"] == t) for t in trajs}
    view = build_view(gaca, InspectConfig())
    assert (view["rows"], view["trajectories"], view["groups"]) == (
        len(rows),
        len(trajs),
        len({r["group_id"] for r in rows}),
    )
    assert view["success"]["rate"] == pytest.approx(sum(success.values()) / len(trajs))
    assert view["method"] == "gaca" and view["params"]["beta"] == 0.1
    sizes = [r["step_group_size"] for r in rows]
    assert view["step_signal_share"] == pytest.approx(np.mean([s > 1 for s in sizes]))
    assert view["step_group_sizes"]["1"] == sum(s == 1 for s in sizes)
    adv = [r["advantage"] for r in rows]
    assert view["distributions"]["advantage"]["max"] == max(adv)
    assert sum(view["distributions"]["lambda"]["histogram"]["counts"]) == len(rows)

    text = text_of(V.render(view))
    assert f"{len(rows)}" in text and "78.1%" in text  # 50 of the 64 example rollouts succeed
    assert "β 0.1" in text and "NLL from behavior_logprobs" in text
    assert f"{max(adv):+.3f}" in text and f"{min(adv):+.3f}" in text
    assert "--traj task-00/r0" in text  # the hint names a real id


def test_overview_of_a_grpo_file_has_no_lambda(files):
    view = build_view(load_annotated([files["grpo"]]), InspectConfig())
    assert view["lambda"] is None and "lambda" not in view["distributions"]
    assert view["step_signal_share"] == 0.0
    assert "λ weight" not in text_of(V.render(view))


# --------------------------------------------------------------------------- one trajectory / group


def test_trajectory_rows_in_step_order_with_critical_marks(files, gaca):
    traj = "task-00/r0"
    expected = sorted((r for r in rows_of(files["gaca"]) if r["traj_id"] == traj), key=lambda r: r["step_idx"])
    view = build_view(gaca, InspectConfig(traj=traj))
    (record,) = view["trajectories"]
    assert [s["step"] for s in record["steps"]] == list(range(len(expected)))
    for got, row in zip(record["steps"], expected, strict=True):
        assert got["advantage"] == row["advantage"] and got["lambda"] == row["gaca_weight"]
        assert got["action"] == row["action"] and got["critical"] == (row["nll_z"] >= CRITICAL_Z)
    assert record["critical_steps"] == [r["step_idx"] for r in expected if r["nll_z"] >= CRITICAL_Z] != []

    text = text_of(V.render(view), color=True)
    lines = [
        ln
        for ln in text.splitlines()
        if "go to" in strip_ansi(ln)
        or "take key" in strip_ansi(ln)
        or "look around" in strip_ansi(ln)
        or "open door" in strip_ansi(ln)
    ]
    assert len(lines) == len(expected)
    for line, row in zip(lines, expected, strict=True):
        plain = strip_ansi(line)
        assert f"{row['advantage']:+.2f}" in plain and f"{row['gaca_weight']:.2f}" in plain
        critical = row["nll_z"] >= CRITICAL_Z
        assert plain.startswith(V.CRITICAL_MARK) == critical
        assert bool(re.search(r"\x1b\[1[;m]", line)) == critical  # critical rows are bold
        # the advantage is coloured by its sign (green 32, red 31)
        colour = "32" if row["advantage"] > 0 else "31"
        shown = re.escape(f"{row['advantage']:+.2f}")
        assert re.search(rf"\x1b\[(1;)?{colour}m{shown}", line)


def test_lambda_bar_colour_and_length():
    above, below, at = V.lambda_bar(0.75, 0.5), V.lambda_bar(0.25, 0.5), V.lambda_bar(0.5, 0.5)
    assert above.plain == "██████·· 0.75" and below.plain == "██······ 0.25" and at.plain == "████···· 0.50"
    assert [span.style for span in above.spans[:1] + below.spans[:1] + at.spans[:1]] == ["yellow", "bright_blue", "dim"]
    assert V.lambda_bar(0.3, 0.5).plain.startswith("██▍")  # 0.3 × 8 cells = 2.4 cells


def test_sparkline_and_width_sharing():
    assert V.sparkline([0, 1, 4, 8]) == " ▁▄█"
    assert V.sparkline([]) == ""
    assert V.share_width([5, 50], [3, 3], [1, 1], 40) == [5, 35]  # the short column gives its room away
    assert V.share_width([30, 30], [10, 8], [3, 2], 20) == [12, 8]
    assert V.common_start(["You are in the hall.", "You are in the kitchen."]) == "You are in the "
    assert V.common_start(["a b", "a c"]) == ""  # too short to be worth dropping


def test_group_view_lists_every_trajectory_of_the_group(files, gaca):
    rows = [r for r in rows_of(files["gaca"]) if r["group_id"] == "task-02"]
    view = build_view(gaca, InspectConfig(group="task-02"))
    assert [t["traj_id"] for t in view["trajectories"]] == sorted({r["traj_id"] for r in rows})
    assert sum(t["length"] for t in view["trajectories"]) == len(rows)
    text = text_of(V.render(view))
    assert text.index("task-02/r0") < text.index("task-02/r1") < text.index("task-02/r7")
    assert "anchors shown without their common start 'You are in the'" in text


# --------------------------------------------------------------------------- top K


@pytest.mark.parametrize(
    ("by", "lowest"),
    [("weight", False), ("advantage", False), ("advantage", True), ("abs-advantage", False), ("nll", False)],
)
def test_top_k_matches_a_plain_sort(files, gaca, by, lowest):
    rows = rows_of(files["gaca"])

    def key(r):
        if by == "weight":
            return r["gaca_weight"]
        if by == "nll":
            return -float(np.mean(r["behavior_logprobs"]))
        return abs(r["advantage"]) if by == "abs-advantage" else r["advantage"]

    # ties broken by (traj_id, step_idx), as the canonical order does
    expected = sorted(rows, key=lambda r: ((key(r) if lowest else -key(r)), r["traj_id"], r["step_idx"]))[:7]
    view = build_view(gaca, InspectConfig(top=7, by=by, lowest=lowest))
    assert [(s["traj_id"], s["step"]) for s in view["rows"]] == [(r["traj_id"], r["step_idx"]) for r in expected]
    assert [s["rank"] for s in view["rows"]] == list(range(1, 8))
    assert view["rows"][0]["key"] == pytest.approx(key(expected[0]), abs=1e-6)
    text = text_of(V.render(view))
    assert f"7 {'lowest' if lowest else 'highest'} steps" in text
    positions = [text.index(f"{s['traj_id']} ") for s in view["rows"] if s["traj_id"] != view["rows"][0]["traj_id"]]
    assert text.index(view["rows"][0]["traj_id"]) < min(positions, default=len(text))


def test_top_within_one_trajectory(gaca):
    view = build_view(gaca, InspectConfig(traj="task-01/r2", top=3, by="nll"))
    assert {s["traj_id"] for s in view["rows"]} == {"task-01/r2"} and view["candidates"] == 7
    nll = [s["nll"] for s in view["rows"]]
    assert nll == sorted(nll, reverse=True)


def test_top_by_nll_sum_skips_empty_actions(tmp_path):
    """With nll_reduce sum, a step without action tokens as gaca score writes it (nll_sum 0,
    nll_mean null) has no NLL: it is not among the lowest steps by NLL."""
    rows = [
        {"group_id": "g", "traj_id": t, "step_idx": s, "reward": float(s), "anchor_obs": f"s{s}"}
        for t in ("a", "b")
        for s in range(3)
    ]
    for row, nll_sum, nll_mean in zip(rows, [4.0, 0.0, 8.0] * 2, [2.0, None, 4.0] * 2):
        row["nll_sum"], row["nll_mean"] = nll_sum, nll_mean
    src = tmp_path / "scored.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    annotated = load_annotated([annotate_file(src, tmp_path / "gaca.parquet", method="gaca", nll_reduce="sum")])
    view = build_view(annotated, InspectConfig(top=6, by="nll", lowest=True))
    assert [(s["step"], s["nll"]) for s in view["rows"]] == [(0, 4.0), (0, 4.0), (2, 8.0), (2, 8.0)]


def test_top_by_weight_needs_a_gaca_file(files):
    with pytest.raises(GacaError, match="--method gaca.*this file's method: gigpo"):
        build_view(load_annotated([files["gigpo"]]), InspectConfig(top=3, by="weight"))


# --------------------------------------------------------------------------- compare


def slow_average_ranks(x: np.ndarray) -> np.ndarray:
    """1 = largest; tied values share the mean of the ranks they occupy."""
    out = np.empty(len(x))
    for i, v in enumerate(x):
        greater = sum(1 for w in x if w > v)
        equal = sum(1 for w in x if w == v)
        out[i] = greater + (equal + 1) / 2
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_descending_ranks_match_a_loop(seed):
    x = np.random.default_rng(seed).integers(-3, 4, size=40).astype(np.float64)
    np.testing.assert_array_equal(descending_ranks(x), slow_average_ranks(x))


def test_compare_recomputes_with_the_files_parameters(files, gaca):
    view = build_view(gaca, InspectConfig(compare=("grpo", "gigpo", "gaca")))
    assert view["file_check"] == {"method": "gaca", "max_abs_diff": pytest.approx(0, abs=1e-12), "matches": True}
    assert view["params_used"]["norm"] == "mean"  # the gaca file's norm, used for grpo too
    rows = {(r["traj_id"], r["step_idx"]): r for r in rows_of(files["gaca"])}
    for mover in view["movers"]:
        row = rows[(mover["traj_id"], mover["step"])]
        a = mover["advantages"]
        # same normalisation everywhere: grpo = A^E and gigpo − grpo = ω·A^S of the file
        assert a["grpo"] == pytest.approx(row["adv_episode"], abs=1e-12)
        assert a["gigpo"] - a["grpo"] == pytest.approx(row["adv_step"], abs=1e-12)
        assert a["gaca"] == pytest.approx(row["advantage"], abs=1e-12)
        assert mover["rank_shift"] == max(mover["ranks"].values()) - min(mover["ranks"].values())
    shifts = [m["rank_shift"] for m in view["movers"]]
    assert len(shifts) == 10 and shifts == sorted(shifts, reverse=True)
    assert view["rows"] is None
    text = text_of(V.render(view))
    top = view["movers"][0]
    assert f"{top['rank_shift']:g}" in text and top["traj_id"] in text
    assert "the 10 steps whose rank changes most" in text


def test_compare_on_a_trajectory_marks_the_biggest_movers(gaca):
    view = build_view(gaca, InspectConfig(traj="task-00/r1", compare=("grpo", "gaca")))
    assert [r["step"] for r in view["rows"]] == list(range(len(view["rows"])))
    assert len(view["movers"]) == 3
    biggest = max(view["rows"], key=lambda r: r["rank_shift"])
    text = text_of(V.render(view))
    line = next(ln for ln in text.splitlines() if f"{biggest['rank_shift']:g}" in ln and biggest["action"] in ln)
    assert line.startswith("▶")


# --------------------------------------------------------------------------- ids


def test_unknown_ids_list_the_closest(gaca):
    with pytest.raises(GacaError) as info:
        build_view(gaca, InspectConfig(traj="task-03/r5x"))
    message = str(info.value)
    assert "no step has traj_id 'task-03/r5x'; closest: 'task-03/r5'" in message
    with pytest.raises(GacaError, match="'task-03/r5' is a traj_id: use --traj"):
        build_view(gaca, InspectConfig(group="task-03/r5"))
    assert closest_ids("TASK-01/R2", gaca.traj_ids)[0] == "task-01/r2"


def test_integer_ids_compare_as_text(tmp_path):
    table = pq.read_table(EXAMPLE_LOG)
    codes = {t: i for i, t in enumerate(sorted(set(table.column("traj_id").to_pylist())))}
    groups = {g: 10 + i for i, g in enumerate(sorted(set(table.column("group_id").to_pylist())))}
    table = table.set_column(
        0, "group_id", pa.array([groups[g] for g in table.column("group_id").to_pylist()], pa.int64())
    )
    table = table.set_column(
        1, "traj_id", pa.array([codes[t] for t in table.column("traj_id").to_pylist()], pa.int32())
    )
    src = tmp_path / "int_ids.parquet"
    pq.write_table(table, src)
    a = load_annotated([annotate_file(src, tmp_path / "int_ids.gaca.parquet", method="gaca")])
    assert a.traj_ids[:3] == ("0", "1", "2")  # numeric order, not text order
    view = build_view(a, InspectConfig(traj="12"))
    assert view["trajectories"][0]["traj_id"] == "12" and view["trajectories"][0]["group_id"] == "11"
    assert build_view(a, InspectConfig(group="11"))["trajectories"][0]["traj_id"] == "8"
    with pytest.raises(GacaError, match="closest: '10'"):
        build_view(a, InspectConfig(traj="100"))


# --------------------------------------------------------------------------- JSON holds what is shown


@pytest.mark.parametrize(
    "config",
    [
        InspectConfig(),
        InspectConfig(traj="task-00/r0"),
        InspectConfig(group="task-05"),
        InspectConfig(top=5, by="nll"),
        InspectConfig(compare=("grpo", "gigpo", "gaca")),
        InspectConfig(group="task-01", compare=("gigpo", "gaca"), top=4),
    ],
    ids=["overview", "traj", "group", "top", "compare", "compare-group"],
)
def test_the_view_is_drawn_from_the_json_alone(gaca, config):
    """Rendering the parsed JSON gives exactly the same text as rendering the library's dict,
    so every field shown is in the JSON (and the JSON is strict: no NaN)."""
    view = build_view(gaca, config)
    parsed = json.loads(json.dumps(view, allow_nan=False))
    assert text_of(V.render(parsed), width=100) == text_of(V.render(view), width=100)
    assert ESC not in text_of(V.render(view), width=100)


def test_step_records_hold_every_column_of_the_table(gaca):
    (traj,) = build_view(gaca, InspectConfig(traj="task-00/r0"))["trajectories"]
    fields = {
        "step",
        "action",
        "anchor",
        "step_group_size",
        "nll",
        "nll_z",
        "lambda",
        "adv_episode",
        "adv_step",
        "advantage",
        "critical",
        "traj_id",
        "group_id",
        "reward",
        "return_to_go",
        "step_group_id",
    }
    assert fields <= set(traj["steps"][0])
    assert {"traj_id", "group_id", "length", "return", "success", "adv_episode", "critical_steps"} <= set(traj)


def test_consoles_honour_no_color(monkeypatch):
    text = V.signed(1.5)
    monkeypatch.setenv("FORCE_COLOR", "1")  # a "terminal" even under pytest
    monkeypatch.delenv("NO_COLOR", raising=False)
    console = V.stdout_console()
    with console.capture() as cap:
        console.print(text)
    assert ESC in cap.get()
    monkeypatch.setenv("NO_COLOR", "1")
    console = V.stdout_console()
    with console.capture() as cap:
        console.print(text)
    assert ESC not in cap.get() and "+1.500" in cap.get()


def test_long_output_goes_to_the_pager_on_a_terminal(monkeypatch):
    import pydoc

    paged: list[str] = []
    monkeypatch.setattr(pydoc, "pager", paged.append)
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=60, height=10, highlight=False)
    V.print_paged(console, "\n".join(f"line {i}" for i in range(30)))
    assert len(paged) == 1 and "line 29" in paged[0] and out.getvalue() == ""
    V.print_paged(console, "short")
    assert len(paged) == 1 and "short" in out.getvalue()
    V.print_paged(console, "\n".join(f"line {i}" for i in range(30)), use_pager=False)
    assert len(paged) == 1 and "line 29" in out.getvalue()


# --------------------------------------------------------------------------- ids and text of the rows shown


def test_ids_follow_the_index_when_group_and_trajectory_orders_disagree(tmp_path):
    """Group "b" holds trajectories a1 and a2, group "a" holds z1 and z2: sorted by group, z1
    comes first, sorted by trajectory id, a1 does. Each trajectory shown carries its own id,
    group, length and return (read back from the file's rows)."""
    spec = [("b", "a1", 3, 1.0), ("b", "a2", 1, 0.0), ("a", "z1", 2, 5.0), ("a", "z2", 2, -1.0)]
    rows = [
        {"group_id": g, "traj_id": t, "step_idx": s, "reward": r if s == n - 1 else 0.0, "anchor_obs": f"{g}-{s}"}
        for g, t, n, r in spec
        for s in range(n)
    ]
    src = tmp_path / "orders.parquet"
    pq.write_table(pa.Table.from_pylist(rows[::-1]), src)
    a = load_annotated([annotate_file(src, tmp_path / "orders.gigpo.parquet", method="gigpo")])
    assert a.traj_ids == ("z1", "z2", "a1", "a2") and a.group_ids == ("a", "b")
    for group, traj, length, ret in spec:
        (shown,) = build_view(a, InspectConfig(traj=traj))["trajectories"]
        assert (shown["traj_id"], shown["group_id"], shown["length"], shown["return"]) == (traj, group, length, ret)
        assert [s["anchor"] for s in shown["steps"]] == [f"{group}-{s}" for s in range(length)]
    assert [t["traj_id"] for t in build_view(a, InspectConfig(group="a"))["trajectories"]] == ["z1", "z2"]
    assert build_view(a, InspectConfig())["example_ids"] == {"traj": "z1", "group": "a"}


def test_text_is_read_from_the_files_for_the_rows_shown(tmp_path, files):
    """The action and anchor text stays on disk until a view shows rows; then it comes from
    the right rows of the right file, row group and page (three files, small row groups)."""
    table = pq.read_table(files["gaca"])
    cuts = [0, 100, 250, table.num_rows]
    paths = []
    for i in range(3):
        path = tmp_path / f"part{i}.parquet"
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]), path, row_group_size=17, data_page_size=512)
        paths.append(str(path))
    a = load_annotated(paths)
    assert "action" not in a.log.table.column_names and "anchor_obs" not in a.log.table.column_names
    expected = {(r["traj_id"], r["step_idx"]): (r["action"], r["anchor_obs"]) for r in table.to_pylist()}
    for config in (InspectConfig(group="task-02"), InspectConfig(top=12, by="nll")):
        view = build_view(a, config)
        shown = [s for t in view["trajectories"] for s in t["steps"]] if "trajectories" in view else view["rows"]
        assert len(shown) >= 12
        for s in shown:
            assert (s["action"], s["anchor"]) == expected[(s["traj_id"], s["step"])]
    # recomputing gigpo groups steps by the anchors, which are then read in full
    summary = build_view(a, InspectConfig(compare=("gaca", "gigpo")))["summary"]
    assert summary[0]["method"] == "gaca" and "max_abs_diff_from_baseline" in summary[1]
