"""Experiment: does the offline loop improve a policy, and which estimator helps most?

Paired seeds (every method of a seed starts from the same behaviour-cloned model and plays
the same games with the same sampling seeds), training and held-out key quests, methods
start / filtered-bc / grpo / gigpo / gaca / gaca:1, K offline iterations of
collect → advantages → train-offline → collect, with one shared update for all methods.
The design and the statistics are in bench/harness/experiment.py and statistics.py;
docs/evidence.md has the results and what they show.

Prints, per split, mean success per iteration with 95 % Student-t intervals over seeds, and
the paired differences (last iteration) against the start model and against GiGPO; writes
bench/results/experiment.json and bench/results/experiment.png (with matplotlib).

    python bench/experiment.py --quick                 # 3 seeds, 48 rollouts per iteration (2 min)
    python bench/experiment.py                         # 6 seeds, 128 rollouts per iteration (26 min)
    python bench/experiment.py --workers 1 --seeds 0,1,2,3,4,5,6,7 --iterations 3
    python bench/experiment.py --from-json bench/results/experiment.json   # table and plot again

The working directory (--work, default bench/results/experiment-work) makes a run
resumable: finished collections and updates are kept and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.experiment import (  # noqa: E402
    SPLITS,
    ExperimentConfig,
    ExperimentResult,
    quick,
    result_json,
    run_experiment,
    summarise,
    write_json,
)

RESULTS = ROOT / "bench" / "results"


def _interval(d: dict, signed: bool = False) -> str:
    if d["mean"] is None:
        return "n/a"
    mean = f"{d['mean']:+.3f}" if signed else f"{d['mean']:.3f}"
    if d["low"] is None:
        return mean
    mark = "*" if signed and (d["low"] > 0 or d["high"] < 0) else " "
    return (
        f"{mean} [{d['low']:+.3f}, {d['high']:+.3f}]{mark}" if signed else f"{mean} [{d['low']:.3f}, {d['high']:.3f}]"
    )


def table(doc: dict) -> list[str]:
    summary = doc["summary"]
    k = summary["iterations"]
    lines = []
    for split in SPLITS:
        part = summary["splits"][split]
        n = doc["rollouts_per_iteration"][split]
        lines.append(
            f"## {split} games: {n} rollouts per iteration and method, {len(summary['seeds'])} seeds; "
            "mean success [95 % CI over seeds]; Δ = paired difference at the last iteration (* : CI excludes 0)"
        )
        header = f"{'method':<12s}" + "".join(f"{'iter ' + str(i):<24s}" for i in range(k + 1))
        header += f"{'Δ vs start':<26s}{'Δ vs gigpo':<26s}"
        lines.append(header)
        for label in summary["methods"]:
            row = f"{label:<12s}" + "".join(f"{_interval(d):<24s}" for d in part["success"][label])
            vs_start = part["vs_start"].get(label)
            vs_gigpo = part["vs_gigpo"].get(label)
            row += f"{_interval(vs_start[-1], True) if vs_start else '':<26s}"
            row += f"{_interval(vs_gigpo[-1], True) if vs_gigpo else '':<26s}"
            lines.append(row.rstrip())
        lines.append("")
    power = summary.get("power", {})
    for split, p in power.items():
        if p.get("detectable_effect") is not None:
            lines.append(
                f"# power ({split}): sd over seeds of the start model's success {p['sd_start_over_seeds']:.3f}, "
                f"of the paired difference {p['sd_paired_difference']:.3f}; {len(summary['seeds'])} seeds detect "
                f"{p['detectable_effect']:.3f} with power 0.8; a 0.05 difference needs {p['seeds_for_5_points']} seeds"
            )
    return lines


def plot(doc: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    summary = doc["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, split in zip(axes, SPLITS):
        for label in summary["methods"]:
            # iterations that were not measured (held-out games between 0 and K) are left out
            cells = [(k, c) for k, c in enumerate(summary["splits"][split]["success"][label]) if c["mean"] is not None]
            x = [k for k, _ in cells]
            mean = [c["mean"] for _, c in cells]
            low = [c["low"] if c["low"] is not None else c["mean"] for _, c in cells]
            high = [c["high"] if c["high"] is not None else c["mean"] for _, c in cells]
            style = "--" if label == "start" else "-"
            (line,) = ax.plot(x, mean, style, marker="o", label=label)
            ax.fill_between(x, low, high, alpha=0.15, color=line.get_color())
        ax.set_title(f"{split} games ({doc['rollouts_per_iteration'][split]} rollouts / iteration)")
        ax.set_xlabel("offline iteration (0 = start model)")
        ax.set_xticks(list(range(summary["iterations"] + 1)))
    axes[0].set_ylabel(f"success rate (mean, 95 % CI over {len(summary['seeds'])} seeds)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 seeds, 8 + 4 games × 6 rollouts (a few minutes)")
    p.add_argument("--work", type=Path, default=None, help="working directory (default bench/results/experiment-work)")
    p.add_argument("--json-out", type=Path, default=None, help="results file (default bench/results/experiment.json)")
    p.add_argument("--seeds", type=_ints, default=None, help="comma-separated seeds (default 0,1,2,3,4,5)")
    p.add_argument(
        "--methods", default=None, help="comma-separated methods (default start,filtered-bc,grpo,gigpo,gaca,gaca:1)"
    )
    p.add_argument("--iterations", type=int, default=None, help="offline iterations K (default 2)")
    p.add_argument("--train-games", type=int, default=None)
    p.add_argument("--heldout-games", type=int, default=None)
    p.add_argument("--rollouts", type=int, default=None, help="rollouts per game and iteration (default 8)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--kl-coef", type=float, default=None)
    p.add_argument("--workers", type=int, default=2, help="seeds run in parallel processes (default 2)")
    p.add_argument("--from-json", type=Path, default=None, help="print the table and plot of a finished run")
    args = p.parse_args()
    say = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    if args.from_json:
        doc = json.loads(args.from_json.read_text())
        json_out = args.from_json
    else:
        name = "experiment-quick" if args.quick else "experiment"
        config = ExperimentConfig(out=args.work or RESULTS / f"{name}-work")
        if args.quick:
            config = quick(config)
        overrides = {
            "seeds": args.seeds,
            "methods": tuple(m.strip() for m in args.methods.split(",")) if args.methods else None,
            "iterations": args.iterations,
            "train_games": args.train_games,
            "heldout_games": args.heldout_games,
            "rollouts": args.rollouts,
            "lr": args.lr,
            "epochs": args.epochs,
            "kl_coef": args.kl_coef,
        }
        try:
            config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
        except ValueError as exc:
            p.error(str(exc))
        result: ExperimentResult = run_experiment(config, say, workers=args.workers)
        doc = result_json(result, summarise(result))
        json_out = args.json_out or RESULTS / f"{name}.json"
        write_json(json_out, doc)
        say(f"finished in {result.seconds / 60:.1f} min; wrote {json_out}")
    for line in table(doc):
        print(line)
    png = json_out.with_suffix(".png")
    if plot(doc, png):
        print(f"# plot: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
