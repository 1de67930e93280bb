"""Benchmark: the commands a training loop calls on one batch, where start-up dominates.

Times, as a user waits for them (a fresh `python -m gaca_cli` process, interpreter start and
imports included, wall clock), on a synthetic log of one training batch (bench/synth.py,
30k rows by default):

- `gaca advantages LOG --method gaca -o OUT` (target: ≤ 1.0 s on 2 cores),
- `gaca --help` (target: ≤ 0.3 s), `gaca validate LOG`, and `gaca inspect OUT` on the annotated output,
- `gaca inspect` on the bundled example (examples/rollouts.parquet, annotated by
  `gaca advantages --method gaca` in each tree; target: ≤ 0.3 s),
- the floor under `gaca inspect`: a bare interpreter importing the libraries it runs on (typer
  with the pydantic it parses options with, numpy, pyarrow, rich, and pandas where it is
  installed, which pyarrow then imports at its first conversion from numpy), and nothing else; one row per tree is the same
  command, for a like-for-like reading of the noise,
- with --score: `gaca score` on a one-row log with a tiny local Llama (tests/lm/tiny_models.py),
  beside its floors: a bare interpreter importing torch and transformers, one importing the model
  classes too (transformers' modeling stack imports torch._dynamo and torch.distributed.tensor),
  and one that has transformers load that model and tokenizer (what any caller of transformers pays),

for this working tree and, side by side in the same run, for the code of a git revision
(`--against`, default 595808a, the last layout before the numpy definitions; a git worktree
under the system's temporary directory). Commands alternate between the two trees, each is
run `--repeat` times after one unmeasured run (which fills numba's cache, writes the bytecode
caches an install would have written, and fills the OS's file cache), and the table gives the
median and the best wall time with the ratio to the baseline's median.

    python bench/startup.py                       # 30k rows, against 595808a, 7 runs each
    python bench/startup.py --rows 100000 --repeat 5 --against HEAD
    python bench/startup.py --no-baseline         # this tree only
    # as users run it: an environment with gaca's runtime dependencies only (no pandas,
    # which the dev extra installs and pyarrow imports whenever it is there: ~0.2 s)
    python -m venv /tmp/rt && /tmp/rt/bin/pip install -e .   # (torch: see the README)
    python bench/startup.py --python /tmp/rt/bin/python
    python bench/startup.py --score --repeat 5     # and `gaca score` on one row, beside its floors

Wall times on a busy machine mislead; the CPU seconds of each command (user + system, from
the kernel's accounting of the finished child) are given beside them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import synth  # noqa: E402
from advantages import worktree  # noqa: E402  (the same worktree cache as bench/advantages.py)

DEFAULT_AGAINST = "595808a"
TARGET_ADVANTAGES_S = 1.0
TARGET_START_S = 0.3  # `gaca --help` and `gaca inspect`
EXAMPLE_LOG = ROOT / "examples" / "rollouts.parquet"
#: what `gaca inspect` cannot start without (see the docstring)
FLOOR_IMPORTS = (
    "import importlib.util, typer._adapters, numpy, pyarrow.parquet, pyarrow.compute, rich.console, rich.table; "
    "importlib.util.find_spec('pandas') and __import__('pandas')"  # pyarrow loads it when it is installed
)


def wall_time(tree: Path, args: list[str], cwd: Path, python: str = sys.executable) -> tuple[float, float]:
    """Wall and CPU seconds one `python -m gaca_cli ARGS` takes with `tree` first on the import path (`cwd`
    must not hold a gaca_cli: `python -m` puts it first); `args` starting with "-c" run
    `python -c CODE` instead. `python`: the interpreter (and so the installed libraries)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("GACA_KERNELS", None)  # the path the command chooses itself
    # an installed package has its bytecode compiled: without this, a shell that sets it would
    # time the compilation of gaca's own modules on every run (~0.2 s on 2 cores)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    argv = [python, *args] if args[:1] == ["-c"] else [python, "-m", "gaca_cli", *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"`gaca {' '.join(args)}` failed in {tree} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


SCORE_FLOORS = (
    "floor: import torch, transformers",
    "floor: import the model classes",  # + transformers' modeling stack (torch._dynamo, torch.distributed.tensor)
    "floor: transformers loads the model",
)
ONE_ROW = pa.table(
    {
        "group_id": ["g"],
        "traj_id": ["t"],
        "step_idx": pa.array([0], pa.int64()),
        "reward": [1.0],
        "prompt": ["You are in the hall."],
        "action": ["take key"],
    }
)


def score_commands(work: Path, tree: str) -> dict[str, list[str]]:
    """`gaca score` on the one-row log with the tiny model in `work`, and its two floors."""
    model = str(work / "tiny-llama")
    load = f"AutoTokenizer.from_pretrained({model!r}); AutoModelForCausalLM.from_pretrained({model!r})"
    return {
        "score (one row)": [
            "score",
            str(work / "one-row.parquet"),
            "--model",
            model,
            "-o",
            str(work / f"{tree}-s.parquet"),
        ],
        SCORE_FLOORS[0]: ["-c", "import torch, transformers"],
        SCORE_FLOORS[1]: ["-c", "from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM"],
        SCORE_FLOORS[2]: ["-c", f"from transformers import AutoModelForCausalLM, AutoTokenizer; {load}"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_000, help="rows of the synthetic log (default 30k)")
    parser.add_argument("--repeat", type=int, default=7, help="measured runs of each command in each tree")
    parser.add_argument("--against", default=DEFAULT_AGAINST, help="git revision to compare with")
    parser.add_argument("--no-baseline", action="store_true", help="time this working tree only")
    parser.add_argument("--data-dir", type=Path, default=synth.DATA_DIR, help="cache of synthetic logs")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter that runs the commands (default: this one); e.g. one of a virtual environment "
        "with gaca's runtime dependencies only, as `pip install gaca-cli` leaves it (no pandas, no test tools)",
    )
    parser.add_argument("--score", action="store_true", help="also time `gaca score` on one row with a tiny model")
    args = parser.parse_args(argv)

    log = synth.ensure_log(args.rows, data_dir=args.data_dir).resolve()
    trees = {"current": ROOT}
    if not args.no_baseline:
        trees[f"base {args.against}"] = worktree(args.against)
    with tempfile.TemporaryDirectory(prefix="gaca-startup-") as tmp:
        work = Path(tmp)
        commands = {}
        for name in trees:
            out = work / f"{name.split()[0]}.parquet"
            example = work / f"{name.split()[0]}-example.parquet"
            commands[name] = {
                "advantages --method gaca": ["advantages", str(log), "--method", "gaca", "-o", str(out)],
                "--help": ["--help"],
                "validate": ["validate", str(log)],
                "inspect (annotated)": ["inspect", str(out), "--no-pager"],
                "inspect (example)": ["inspect", str(example), "--no-pager"],
                "floor: imports only": ["-c", FLOOR_IMPORTS],
            }
            if args.score:
                commands[name] |= score_commands(work, name.split()[0])
        times: dict[tuple[str, str], list[float]] = {}
        cpu_times: dict[tuple[str, str], list[float]] = {}
        if args.score:
            sys.path.insert(0, str(ROOT))
            from tests.lm.tiny_models import build_model

            build_model(work / "tiny-llama")
            pq.write_table(ONE_ROW, work / "one-row.parquet")
        for name, tree in trees.items():  # unmeasured: caches filled, the annotated files written
            example = work / f"{name.split()[0]}-example.parquet"
            wall_time(tree, ["advantages", str(EXAMPLE_LOG), "--method", "gaca", "-o", str(example)], work, args.python)
            for cmd in commands[name].values():
                wall_time(tree, cmd, work, args.python)
        for _ in range(args.repeat):
            for what in commands["current"]:
                for name, tree in trees.items():
                    wall, cpu = wall_time(tree, commands[name][what], work, args.python)
                    times.setdefault((name, what), []).append(wall)
                    cpu_times.setdefault((name, what), []).append(cpu)

    print(f"interpreter: {args.python}")
    print(
        f"start-up benchmark: {args.rows:,} rows ({log.name}), {args.repeat} runs per cell after one unmeasured run,"
        f" {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; wall seconds of `python -m gaca_cli ...`"
    )
    head = ("command", "tree", "median s", "best s", "× base (median)", "cpu s", "cpu × base")
    lines = [head]
    base = next((n for n in trees if n.startswith("base")), None)
    for what in commands["current"]:
        for name in trees:
            runs, cpu = times[(name, what)], statistics.median(cpu_times[(name, what)])
            ratio = cpu_ratio = ""
            if base is not None and name != base:
                ratio = f"{statistics.median(runs) / statistics.median(times[(base, what)]):.2f}"
                cpu_ratio = f"{cpu / statistics.median(cpu_times[(base, what)]):.2f}"
            lines.append(
                (what, name, f"{statistics.median(runs):.2f}", f"{min(runs):.2f}", ratio, f"{cpu:.2f}", cpu_ratio)
            )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    for j, row in enumerate(lines):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print("\ntargets (2-core machine), medians of this tree:")
    for what, label, limit in (
        ("advantages --method gaca", f"`gaca advantages` (gaca) on {args.rows:,} rows", TARGET_ADVANTAGES_S),
        ("--help", "`gaca --help`", TARGET_START_S),
        ("inspect (example)", "`gaca inspect` on the bundled example", TARGET_START_S),
    ):
        median = statistics.median(times[("current", what)])
        print(f"  {label} ≤ {limit:.1f} s: {median:.2f} s, {'met' if median <= limit else 'NOT met'}")
    floor = statistics.median(times[("current", "floor: imports only")])
    print(f"  (the libraries `gaca inspect` runs on take {floor:.2f} s to import, before any gaca code)")
    if args.score:
        score, torch_floor, classes, hf_floor = (
            statistics.median(cpu_times[("current", what)]) for what in ("score (one row)", *SCORE_FLOORS)
        )
        print(
            f"  `gaca score` on one row: {score:.2f} CPU s, {score - torch_floor:.2f} s over importing torch and "
            f"transformers (target: ≤ 0.8 s): {classes - torch_floor:.2f} s importing transformers' model classes, "
            f"{hf_floor - classes:.2f} s more for transformers to load the model, {score - hf_floor:.2f} s gaca's own"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
