"""Benchmark: gaca_cli.ray.advantages on a local Ray instance against the single-process CLI.

For each log size (bench/synth.py logs, cached under bench/data/):

- cli: `gaca advantages LOG --method gaca -o OUT` in a subprocess: wall time and peak RSS;
- ray: in a fresh Python process, `ray.init(num_cpus=WORKERS)`, then
  `ray.data.read_parquet(LOG)` -> `gaca_cli.ray.advantages` -> `write_parquet(DIR)`: wall
  time from before `import ray` to the written files ("ray s"), and the job's part of it, from
  the dataset's creation on a started Ray ("job s": on a cluster Ray is already running), and
  the peak RSS of each Ray worker process (RSS less shared pages: the object store is mapped
  into every worker; sampled every 0.2 s from the driver), whose largest value is reported.

The overhead ratios are ray / cli and job / cli. No speed-up is expected on a 2-core machine:
the point is bounded memory per worker (buckets of `--rows-per-call` rows of whole episode
groups) and the same bits, at most 3x the command's wall time. The Ray job reads and writes
every column; the command reads the columns the method uses and copies the others' pages.

    python bench/ray_advantages.py                 # 10M rows (and the 1M line)
    python bench/ray_advantages.py --rows 1000000  # one size
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synth import ensure_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

RAY_CHILD = """
import json, sys, threading, time, psutil
t0 = time.perf_counter()
import ray, gaca_cli.ray
log, out, workers, rows_per_call = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
ray.data.DataContext.get_current().enable_progress_bars = False
t_job = time.perf_counter()
peak = {}
done = False
def sample():
    me = psutil.Process()
    while not done:
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                line = " ".join(p.info["cmdline"] or [])
                if "default_worker.py" in line or line.startswith("ray::"):  # workers rename themselves
                    m = p.memory_info()  # private: the object store's shared pages left out
                    peak[p.pid] = max(peak.get(p.pid, 0), m.rss - m.shared)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        time.sleep(0.2)
threading.Thread(target=sample, daemon=True).start()
ds = gaca_cli.ray.advantages(ray.data.read_parquet(log), method="gaca", rows_per_call=rows_per_call)
ds.write_parquet(out)
wall, job = time.perf_counter() - t0, time.perf_counter() - t_job
done = True
print(json.dumps({"wall_s": wall, "job_s": job, "worker_peaks": sorted(peak.values(), reverse=True)}))
"""


def peak_rss_of(command: list[str], env: dict) -> tuple[float, int, str]:
    """Run `command`; its wall time, its peak RSS (its own, sampled) and stdout."""
    t0 = time.perf_counter()
    proc = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, err = proc.communicate()
    stop.set()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{err}")
    return wall, peak, out


def measure(rows: int, workers: int, rows_per_call: int, tmp: Path) -> dict:
    log = ensure_log(rows)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "gaca_cli", "advantages", str(log), "--method", "gaca", "-o", str(tmp / "cli.parquet")]
    cli_wall, cli_peak, _ = peak_rss_of(cli, env)
    ray_cmd = [sys.executable, "-c", RAY_CHILD, str(log), str(tmp / "ray"), str(workers), str(rows_per_call)]
    _, driver_peak, out = peak_rss_of(ray_cmd, env)
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "rows": rows,
        "cli_s": cli_wall,
        "cli_peak_gb": cli_peak / 2**30,
        "ray_s": result["wall_s"],
        "job_s": result["job_s"],
        "worker_peak_gb": (result["worker_peaks"] or [0])[0] / 2**30,
        "driver_peak_gb": driver_peak / 2**30,
        "ratio": result["wall_s"] / cli_wall,
        "job_ratio": result["job_s"] / cli_wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows-per-call", type=int, default=200_000)
    args = parser.parse_args(argv)
    print(f"gaca advantages --method gaca: the CLI vs gaca_cli.ray on {args.workers} local workers")
    print(
        f"{'rows':>12} {'cli s':>8} {'cli peak GB':>12} {'ray s':>8} {'job s':>8} {'worker peak GB':>15} "
        f"{'driver GB':>10} {'ray/cli':>8} {'job/cli':>8}"
    )
    for rows in args.rows:
        with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
            r = measure(rows, args.workers, args.rows_per_call, Path(tmp))
        print(
            f"{r['rows']:>12,} {r['cli_s']:>8.1f} {r['cli_peak_gb']:>12.2f} {r['ray_s']:>8.1f} {r['job_s']:>8.1f} "
            f"{r['worker_peak_gb']:>15.2f} {r['driver_peak_gb']:>10.2f} {r['ratio']:>7.2f}x {r['job_ratio']:>7.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
