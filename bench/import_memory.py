"""Benchmark: `gaca import` runs in bounded memory, whatever the size of the source.

Writes a chat-jsonl source of the requested sizes (whole multi-turn chats, one per line, as a
home-grown loop would log them; cached under bench/data/), then measures, each in a fresh
child process, the peak resident memory (RSS high-water mark) and wall time of

- `gaca import --from chat-jsonl SRC -o OUT` (streaming: records one at a time, batches of
  bounded size, checks on the id and reward columns only), and
- the baseline a user would otherwise write: the whole file read at once with
  `polars.read_ndjson` (which does not even split the chats into steps).

It prints one row per size with both peaks, the ratio baseline / import (> 1: import uses
less), and import's peak against the source's size.

    python bench/import_memory.py                 # 200 MB and 2 GB sources
    python bench/import_memory.py --mb 50 --no-baseline
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data"

TURNS = 8
GROUP = 8


def write_source(path: Path, megabytes: int, seed: int = 0) -> None:
    """Chats of TURNS assistant turns, GROUP rollouts per task, until the file has `megabytes`."""
    rng = random.Random(seed)
    target = megabytes << 20
    words = [f"w{i}" for i in range(2000)]
    tmp = path.with_suffix(".partial")
    with open(tmp, "w", encoding="utf-8") as fh:
        task = 0
        while fh.tell() < target:
            system = {"role": "system", "content": "You are an agent. " + " ".join(rng.choices(words, k=200))}
            for r in range(GROUP):
                messages = [system, {"role": "user", "content": f"task {task}: " + " ".join(rng.choices(words, k=60))}]
                anchors = []
                for _ in range(TURNS):
                    messages.append({"role": "assistant", "content": " ".join(rng.choices(words, k=40))})
                    obs = " ".join(rng.choices(words[:50], k=30))
                    messages.append({"role": "user", "content": obs})
                    anchors.append(obs)
                record = {
                    "group_id": f"task-{task}",
                    "traj_id": f"task-{task}/r{r}",
                    "messages": messages,
                    "reward": float(rng.random() < 0.5),
                    "anchor_obs": anchors,
                    "seed": rng.randrange(1 << 30),
                }
                fh.write(json.dumps(record) + "\n")
            task += 1
    os.replace(tmp, path)


def source(megabytes: int) -> Path:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"chats-{megabytes}mb.jsonl"
    if not path.exists():
        print(f"writing {path} ...", file=sys.stderr)
        write_source(path, megabytes)
    return path


def measure(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of a child process."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr}")
    return wall, _child_peak_mb()


def _child_peak_mb() -> float:
    """The peak RSS of the child that just ended (ru_maxrss of children is a running maximum,
    so each measurement runs in its own wrapper process that reports its own child's)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def isolated(argv: list[str]) -> tuple[float, float]:
    """Run `argv` from a fresh wrapper so that ru_maxrss is this child's alone."""
    wrapper = [sys.executable, __file__, "--measure-one", json.dumps(argv)]
    out = subprocess.run(wrapper, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    wall, peak = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, nargs="+", default=[200, 2048], help="source sizes in MB")
    parser.add_argument("--no-baseline", action="store_true", help="skip polars.read_ndjson")
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure(json.loads(args.measure_one))))
        return
    gaca = str(Path(sys.executable).with_name("gaca"))
    rows = []
    for mb in args.mb:
        src = source(mb)
        size_mb = src.stat().st_size / (1 << 20)
        with tempfile.TemporaryDirectory(dir=DATA) as tmp:
            out = Path(tmp) / "out.parquet"
            wall, peak = isolated([gaca, "import", "--from", "chat-jsonl", str(src), "-o", str(out), "--json"])
            out_mb = out.stat().st_size / (1 << 20)
        base_wall = base_peak = None
        if not args.no_baseline:
            code = f"import polars as pl; pl.read_ndjson({str(src)!r}, infer_schema_length=None)"
            base_wall, base_peak = isolated([sys.executable, "-c", code])
        rows.append((mb, size_mb, out_mb, wall, peak, base_wall, base_peak))
    print(
        f"{'source':>9} {'output':>8} | {'import s':>8} {'peak MB':>8} {'peak/src':>8} | "
        f"{'read_ndjson s':>13} {'peak MB':>8} | {'peak ratio':>10}"
    )
    for _mb, size_mb, out_mb, wall, peak, base_wall, base_peak in rows:
        base = (
            f"{base_wall:13.1f} {base_peak:8.0f} | {base_peak / peak:9.1f}x"
            if base_peak is not None
            else f"{'-':>13} {'-':>8} | {'-':>10}"
        )
        print(f"{size_mb:7.0f}MB {out_mb:6.0f}MB | {wall:8.1f} {peak:8.0f} {peak / size_mb:8.2f} | {base}")


if __name__ == "__main__":
    main()
