"""The offline improvement loop on TextWorld: collect → score → advantages → train-offline → …

    python examples/textworld/loop.py --out examples/textworld/runs/loop            # defaults
    python examples/textworld/loop.py --out /tmp/tw-loop --games 4 --rollouts 8 \\
        --iterations 3 --methods grpo,gigpo,gaca --seeds 0,1 --bc-steps 300

For each method and seed, starting from the same model (a tiny Llama fitted to the games'
walkthroughs by behaviour cloning, `bc.py`, or --start-model), repeat K times:

  1. collect   N rollouts per game with the current model (collect seed = 1000·seed + k, the
               same for every method, so iteration 0 is shared);
  2. score     `gaca score LOG --model CURRENT` (nll_* columns; gaca reads them);
  3. advantages `gaca advantages SCORED --method M`;
  4. train     `gaca train-offline ADV --model CURRENT -o NEXT` (ppo on the logged
               behavior_logprobs by default); skipped, keeping CURRENT, when every
               advantage is 0 (no group had both wins and losses: nothing to learn from).

and collect once more with the final model. Success rate = fraction of rollouts that win.
The gaca steps run as subprocesses, exactly as a user types them. Results go to
OUT/results.json, a table on stdout and OUT/success.png (with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from gaca_cli.demo import textworld_games as tw  # noqa: E402

GACA = [sys.executable, "-m", "gaca_cli"]


def run(cmd: list[str], log_file: Path) -> None:
    """Run one pipeline command; its output goes to log_file; a failure stops the loop."""
    with open(log_file, "a") as fh:
        fh.write("$ " + shlex.join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"})
    if proc.returncode != 0:
        tail = log_file.read_text().splitlines()[-15:]
        raise RuntimeError(f"command failed ({proc.returncode}): {shlex.join(cmd)}\n" + "\n".join(tail))


def collect_log(model: Path, games, args, seed: int, out: Path) -> float:
    """Collect with the LM at `model` into `out` (skipped when it exists); return success rate."""
    import pyarrow.parquet as pq

    if not out.exists():
        policy = tw.LMPolicy(model, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=seed)
        table = tw.collect(games, policy, args.rollouts, args.max_steps, seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(out)
    return tw.success_rate(pq.read_table(out, columns=["step_idx", "success"]))


def has_signal(annotated: Path) -> bool:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    advantage = pq.read_table(annotated, columns=["advantage"])["advantage"]
    return bool(pc.any(pc.not_equal(advantage, 0.0)).as_py())


def update(model: Path, log: Path, method: str, work: Path, args) -> Path:
    """score → advantages → train-offline; returns the new model directory."""
    scored, adv, new_model = work / "scored.parquet", work / "advantages.parquet", work / "model"
    if (new_model / "config.json").exists():
        return new_model
    cmdlog = work / "commands.log"
    source = log
    if not args.skip_score:
        run([*GACA, "score", str(log), "--model", str(model), "-o", str(scored)], cmdlog)
        source = scored
    run([*GACA, "advantages", str(source), "--method", method, "-o", str(adv), *args.advantages_args], cmdlog)
    if not has_signal(adv):
        return model  # A = 0 on every step (e.g. no group with both wins and losses): no update
    run(
        [
            *GACA,
            "train-offline",
            str(adv),
            "--model",
            str(model),
            "-o",
            str(new_model),
            "--loss",
            args.loss,
            "--lr",
            str(args.lr),
            "--epochs",
            str(args.epochs),
            "--batch-size",
            str(args.batch_size),
            "--seed",
            str(args.train_seed),
            *args.train_args,
        ],
        cmdlog,
    )
    return new_model


def summarise(results: dict) -> list[str]:
    import numpy as np

    lines = []
    methods = sorted(results)
    k = max(len(v) for per_seed in results.values() for v in per_seed.values())
    header = "method  " + "  ".join(f"iter {i:<10d}" for i in range(k))
    lines.append(header)
    for m in methods:
        cells = []
        for i in range(k):
            vals = [v[i] for v in results[m].values() if len(v) > i]
            mean = float(np.mean(vals))
            spread = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
            cells.append(f"{mean:.3f} ± {spread:.3f}")
        lines.append(f"{m:<7s} " + "  ".join(f"{c:<15s}" for c in cells))
    return lines


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m, per_seed in sorted(results.items()):
        k = max(len(v) for v in per_seed.values())
        means = [np.mean([v[i] for v in per_seed.values() if len(v) > i]) for i in range(k)]
        lo = [np.min([v[i] for v in per_seed.values() if len(v) > i]) for i in range(k)]
        hi = [np.max([v[i] for v in per_seed.values() if len(v) > i]) for i in range(k)]
        ax.plot(range(k), means, marker="o", label=m)
        ax.fill_between(range(k), lo, hi, alpha=0.15)
    ax.set_xlabel("iteration (0 = start model)")
    ax.set_ylabel("success rate")
    ax.set_title("TextWorld: offline improvement loop")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "runs" / "loop", help="working directory (resumable)")
    p.add_argument("--games", type=int, default=4)
    p.add_argument("--first-game-seed", type=int, default=0)
    p.add_argument("--rooms", type=int, default=3)
    p.add_argument("--objects", type=int, default=4)
    p.add_argument("--quest-length", type=int, default=3)
    p.add_argument("--games-dir", type=Path, default=HERE / "games")
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per game and iteration")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--iterations", type=int, default=3, help="K: updates per method and seed")
    p.add_argument("--methods", default="grpo,gigpo,gaca")
    p.add_argument("--seeds", default="0", help="comma-separated loop seeds (collection seeds derive from them)")
    p.add_argument("--start-model", type=Path, default=None, help="skip behaviour cloning and start from this model")
    p.add_argument("--bc-steps", type=int, default=300)
    p.add_argument("--bc-lr", type=float, default=5e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--skip-score", action="store_true", help="no `gaca score` (gaca then reads behavior_logprobs)")
    p.add_argument("--loss", default="ppo")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--train-seed", type=int, default=0)
    p.add_argument("--advantages-args", default="", help="extra options for gaca advantages, one string")
    p.add_argument("--train-args", default="", help="extra options for gaca train-offline, one string")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.advantages_args = shlex.split(args.advantages_args)
    args.train_args = shlex.split(args.train_args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    specs = tw.game_specs(
        args.games, args.first_game_seed, rooms=args.rooms, objects=args.objects, quest_length=args.quest_length
    )
    games = [(s.name, tw.make_game(s, args.games_dir)) for s in specs]
    start = args.start_model
    if start is None:
        start = out / "start-model"
        if not (start / "config.json").exists():
            from gaca_cli.demo import textworld_bc as bc

            say(f"behaviour cloning on {len(games)} walkthroughs ({args.bc_steps} steps)")
            bc.warm_start(start, games, args.bc_steps, lr=args.bc_lr, max_steps=args.max_steps)

    results: dict[str, dict[str, list[float]]] = {m: {} for m in methods}
    for seed in seeds:
        for method in methods:
            model, curve = start, []
            for k in range(args.iterations + 1):
                collect_seed = 1000 * seed + k
                # iteration 0 is the start model with the same seed for every method: shared
                log = (
                    out / f"seed{seed}" / "iter0.parquet"
                    if k == 0
                    else out / f"seed{seed}" / method / f"iter{k}" / "rollouts.parquet"
                )
                t0 = time.perf_counter()
                curve.append(collect_log(model, games, args, collect_seed, log))
                say(f"seed {seed} {method} iter {k}: success {curve[-1]:.3f} (collect {time.perf_counter() - t0:.0f}s)")
                if k == args.iterations:
                    break
                work = out / f"seed{seed}" / method / f"iter{k}"
                work.mkdir(parents=True, exist_ok=True)
                t0 = time.perf_counter()
                new_model = update(model, log, method, work, args)
                say(
                    f"seed {seed} {method} iter {k}: "
                    + (
                        f"updated in {time.perf_counter() - t0:.0f}s"
                        if new_model != model
                        else "no step has a non-zero advantage: model unchanged"
                    )
                )
                model = new_model
            results[method][str(seed)] = curve
            (out / "results.json").write_text(
                json.dumps(
                    {
                        "success": results,
                        "games": [g for g, _ in games],
                        "rollouts": args.rollouts,
                        "iterations": args.iterations,
                        "seeds": seeds,
                        "start_model": str(start),
                        "loss": args.loss,
                        "lr": args.lr,
                        "epochs": args.epochs,
                    },
                    indent=2,
                )
            )
    for line in summarise(results):
        print(line)
    plot(results, out / "success.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
