"""Benchmark: `gaca advantages --method hgpo` against `--method gigpo` on the same log, and
verl-agent's HGPO recipe on the largest log it finishes within a time budget.

- gaca: the library path the CLI takes (bench/advantages.py's `fast` child: read, compute,
  write, each in a fresh process), `--method gigpo` and `--method hgpo` (K = 2 unless
  --history-length) alternating on the same synthetic log (bench/synth.py), the median of
  --repeat runs each; the target is hgpo within 3x of gigpo, end to end;
- the recipe: `hgpo_advantage_estimate` of the unmodified recipe file kept as a test
  fixture (tests/credit/verl_agent_hgpo/core_hgpo.py), called on each log's rows as a
  verl-agent batch (one response token a row; step_rewards the returns G_t as float32), in a
  child process killed at the budget; sizes grow until one does not finish. On every size it
  finishes, its advantages are compared with gaca's (γ = 0.5 there, so that every return is
  exact in float32 and the recipe's rule on zero items sees what gaca sees).

    python bench/hgpo.py                                   # 10M rows, recipe budget 60 s
    python bench/hgpo.py --rows 1000000 --repeat 3 --recipe-rows 1000,3000,10000,30000
    python bench/hgpo.py --rows 0 --recipe-rows 300000,400000,500000   # the recipe alone
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import advantages as bench  # bench/advantages.py: the child protocol and the machine line
import numpy as np
import synth

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 3.0  # hgpo's end-to-end time within 3x gigpo's
RECIPE_GAMMA = 0.5


def recipe_child(log_path: str, history_length: int) -> dict:
    """Time the recipe on the log's rows, then gaca's hgpo on the same rows for the check."""
    sys.path.insert(0, str(ROOT))
    import pyarrow.parquet as pq
    import torch

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.reading import read_log
    from tests.credit.test_hgpo_recipe import RECIPE

    torch.set_num_threads(1)
    config = AdvantagesConfig(method="hgpo", gamma=RECIPE_GAMMA, history_length=history_length)
    config = AdvantagesConfig(**{**config.__dict__, "episode_stats": "steps", "singleton_groups": "raw"})
    gaca = compute_advantages(read_log([log_path]), config).result
    table = pq.read_table(log_path, columns=["group_id", "traj_id", "anchor_obs"])
    n = table.num_rows
    objects = {name: np.array(table.column(name).to_pylist(), dtype=object) for name in table.column_names}
    args = {
        "token_level_rewards": torch.zeros(n, 1),
        "step_rewards": torch.from_numpy(gaca.return_to_go.astype(np.float32)),
        "response_mask": torch.ones(n, 1, dtype=torch.long),
        "anchor_obs": objects["anchor_obs"],
        "index": objects["group_id"],
        "traj_index": objects["traj_id"],
    }
    t0 = time.perf_counter()
    scores = RECIPE.hgpo_advantage_estimate(**args, history_length=history_length)
    seconds = time.perf_counter() - t0
    diff = float(np.max(np.abs(scores[:, 0].numpy().astype(np.float64) - gaca.advantage)))
    return {"seconds": seconds, "max_abs_diff": diff}


def time_recipe(sizes: list[int], budget: float, history_length: int, data_dir: Path) -> list[tuple[int, dict | None]]:
    out: list[tuple[int, dict | None]] = []
    for rows in sizes:
        path = synth.ensure_log(rows, data_dir=data_dir)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_recipe", str(path), str(history_length)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 60, cwd=ROOT)
        except subprocess.TimeoutExpired:
            out.append((rows, None))
            break
        if proc.returncode != 0:
            raise SystemExit(f"recipe on {rows:,} rows failed:\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        out.append((rows, result))
        print(f"  recipe {rows:>11,} rows: {result['seconds']:8.2f} s", file=sys.stderr, flush=True)
        if result["seconds"] > budget:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_recipe":
        print(json.dumps(recipe_child(argv[1], int(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(
        description="Benchmark `gaca advantages --method hgpo` against gigpo and the recipe."
    )
    parser.add_argument(
        "--rows", type=int, default=10_000_000, help="log size of the gaca comparison (default 10M; 0: the recipe only)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per method; the table shows the median")
    parser.add_argument("--history-length", type=int, default=2, help="K (default 2, the recipe's)")
    parser.add_argument("--recipe-budget", type=float, default=60.0, help="seconds the recipe may take (default 60)")
    parser.add_argument(
        "--recipe-rows", default="10000,30000,100000,300000,1000000", help="log sizes tried for the recipe, in order"
    )
    parser.add_argument("--data-dir", type=Path, default=synth.DATA_DIR, help="cache of synthetic logs")
    args = parser.parse_args(argv)
    print(f"machine: {bench.machine_text()}", flush=True)
    print("timings on a shared machine are noisy\n", flush=True)
    gaca_rate = compare_with_gigpo(args) if args.rows else None

    sizes = [int(float(x)) for x in args.recipe_rows.split(",") if x.strip()]
    print(f"verl-agent's recipe (hgpo_advantage_estimate, K = {args.history_length}), budget {args.recipe_budget:g} s:")
    recipe = time_recipe(sizes, args.recipe_budget, args.history_length, args.data_dir)
    print(f"{'rows':>11s} {'recipe s':>9s} {'rows/s':>9s} {'max |Δ| vs gaca':>16s}")
    for rows, result in recipe:
        if result is None:
            print(f"{rows:>11,} {'killed':>9s}")
            continue
        print(f"{rows:>11,} {result['seconds']:9.2f} {rows / result['seconds']:9,.0f} {result['max_abs_diff']:16.1e}")
    finished = [(rows, r) for rows, r in recipe if r is not None and r["seconds"] <= args.recipe_budget]
    if finished:
        rows, r = finished[-1]
        gaca = "" if gaca_rate is None else f"; gaca hgpo end to end: {gaca_rate:,.0f} rows/s"
        print(
            f"largest log within {args.recipe_budget:g} s: {rows:,} rows in {r['seconds']:.1f} s "
            f"({rows / r['seconds']:,.0f} rows/s{gaca})"
        )
    return 0


def compare_with_gigpo(args: argparse.Namespace) -> float:
    """gigpo and hgpo on the same log, alternating, `args.repeat` times; prints the table and
    returns hgpo's rows per second, end to end."""
    path = synth.ensure_log(args.rows, data_dir=args.data_dir)
    runs: dict[str, list[bench.Measurement]] = {"gigpo": [], "hgpo": []}
    with tempfile.TemporaryDirectory(dir=args.data_dir, prefix="run-") as tmp:
        for _ in range(args.repeat):
            for method in runs:
                m = bench.measure("fast", path, method, args.rows, Path(tmp))
                runs[method].append(m)
                print(f"  {method:5s} {args.rows:>11,} rows: {m.total_s:7.2f} s", file=sys.stderr, flush=True)
    best = {method: bench.median_run(cell) for method, cell in runs.items()}
    print(f"gaca advantages on {args.rows:,} rows (bench/synth.py), median of {args.repeat}; hgpo K = 2:")
    print(
        f"{'method':8s} {'read s':>8s} {'compute s':>10s} {'write s':>8s} {'total s':>8s} {'CPU s':>7s} {'peak GB':>8s}"
    )
    for method, m in best.items():
        peak = (m.peak_rss_bytes or 0) / 1e9
        print(
            f"{method:8s} {m.read_s:8.2f} {m.compute_s:10.2f} {m.write_s:8.2f} {m.total_s:8.2f} "
            f"{m.extra['cpu_s']:7.2f} {peak:8.2f}"
        )
    ratio = best["hgpo"].total_s / best["gigpo"].total_s
    compute_ratio = best["hgpo"].compute_s / best["gigpo"].compute_s
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(
        f"hgpo / gigpo: {ratio:.2f}x end to end, {compute_ratio:.2f}x compute (target ≤ {TARGET_RATIO:g}x: {verdict})\n"
    )
    return args.rows / best["hgpo"].total_s


if __name__ == "__main__":
    raise SystemExit(main())
