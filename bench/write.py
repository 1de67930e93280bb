"""Benchmark: the two ways `gaca advantages` writes its output, side by side.

- splice: the input's compressed column chunks copied byte for byte, only the method's new
  columns encoded (`gaca_cli/log/_splice/`);
- plain:  the whole log read back and rewritten by `pyarrow.parquet.write_table` (zstd), the
  path taken when the splice is refused or `GACA_NO_SPLICE=1` is set.

Both are timed through `write_annotated`, the function the command calls, each in a fresh
child process: the child reads the log and computes gaca's advantages (not timed), then times
the write alone (wall and CPU seconds of the process) and reports its RSS high-water mark
before and after the write. The parent reports the output's size and the ratios
plain / splice (> 1: the splice is better). The logs come from bench/synth.py (cached under
bench/data/); both children find the input in the page cache, so the figures are those of a
warm disk.

The splice never decodes the columns it copies; those the command did not read (prompts,
observations) it reads back from the output before renaming it into place, so that a damaged
page is an error and not a broken output (`check_copied_columns` in gaca_cli/log/writing.py,
called by gaca_cli/credit/writing.py). `--carried-text` adds such a column (a copy of anchor_obs named `observation`)
to the log, and the "read-back s" column shows the part of the splice's time that check took.

The house rule this measures (our own code must earn its place by >= 2x on a figure users
feel) is checked on the write time at the largest size: the program exits 1 when the splice's
wall-time gain there is under 2x.

    python bench/write.py                        # 30k, 1M and 10M rows, one run each
    python bench/write.py --rows 30000 1000000 --repeat 3 --check
    python bench/write.py --rows 1000000 --carried-text   # the read-back's cost
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import synth  # noqa: E402

PATHS = ("splice", "plain")
TARGET_GAIN = 2.0


# ----------------------------------------------------------------------------- child side


def child(log_path: str, out_path: str, method: str) -> dict:
    """Read and compute (untimed), then write once through `write_annotated`; GACA_NO_SPLICE
    in the environment chooses the path."""
    from gaca_cli.credit import writing
    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.reading import read_for_advantages
    from gaca_cli.credit.run import compute_advantages, gc_paused
    from gaca_cli.credit.writing import write_annotated

    check = writing.check_copied_columns
    check_s = [0.0]

    def timed_check(*args):
        t = time.perf_counter()
        try:
            check(*args)
        finally:
            check_s[0] += time.perf_counter() - t

    writing.check_copied_columns = timed_check  # the name write_annotated calls
    config = AdvantagesConfig(method=method)
    with gc_paused():  # as the command runs it
        log = read_for_advantages([log_path], {}, config)
        run = compute_advantages(log, config)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        c0, t0 = time.process_time(), time.perf_counter()
        how = write_annotated(run, out_path, [log_path], {})
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "how": how,
        "wall_s": wall,
        "cpu_s": cpu,
        "check_s": check_s[0],
        "rss_before": rss_before,
        "rss_after": rss_after,
    }


# ----------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    rows: int
    path: str
    wall_s: float
    cpu_s: float
    check_s: float
    size_bytes: int
    rss_before: int
    rss_after: int


def measure(log_path: Path, path: str, rows: int, method: str, out_path: Path) -> Measurement:
    env = dict(os.environ)
    env.pop("GACA_NO_SPLICE", None)
    if path == "plain":
        env["GACA_NO_SPLICE"] = "1"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", str(log_path), str(out_path), method]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{path} write of {rows:,} rows failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    want = {"splice": "spliced", "plain": "rewritten"}[path]
    if res["how"] != want:
        raise SystemExit(f"the {path} child wrote the output {res['how']!r}, not {want!r}:\n{proc.stderr[-3000:]}")
    size = out_path.stat().st_size
    return Measurement(
        rows, path, res["wall_s"], res["cpu_s"], res["check_s"], size, res["rss_before"], res["rss_after"]
    )


def same_content(a: Path, b: Path) -> bool:
    """Both outputs read back by pyarrow hold the same schema, metadata and values (one column
    at a time, so that 10M rows fit in memory; the two files' row groups differ)."""
    import pyarrow.parquet as pq

    fa, fb = pq.ParquetFile(a), pq.ParquetFile(b)
    if not fa.schema_arrow.equals(fb.schema_arrow, check_metadata=True):
        return False
    return all(
        pq.read_table(a, columns=[name]).column(0).equals(pq.read_table(b, columns=[name]).column(0))
        for name in fa.schema_arrow.names
    )


def with_carried_text(log_path: Path, dest: Path) -> Path:
    """The log with a copy of its anchor_obs column named `observation`, which
    `gaca advantages` does not read and carries to its output (written once, not timed)."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(log_path)
    table = source.read()
    table = table.append_column("observation", table.column("anchor_obs"))
    rows_per_group = source.metadata.row_group(0).num_rows
    pq.write_table(table, dest, row_group_size=rows_per_group, compression="zstd")
    return dest


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f}"


def report(results: list[Measurement], log_sizes: dict[int, int]) -> tuple[str, dict[int, dict[str, float]]]:
    head = ("rows", "path", "write s", "read-back s", "cpu s", "output MB", "input MB", "RSS before MB", "peak RSS MB")
    lines = [head]
    ratios: dict[int, dict[str, float]] = {}
    for rows in sorted({m.rows for m in results}):
        best = {p: min((m for m in results if m.rows == rows and m.path == p), key=lambda m: m.wall_s) for p in PATHS}
        for p in PATHS:
            m = best[p]
            lines.append(
                (
                    f"{rows:,}",
                    p,
                    f"{m.wall_s:.2f}",
                    f"{m.check_s:.2f}",
                    f"{m.cpu_s:.2f}",
                    _mb(m.size_bytes),
                    _mb(log_sizes[rows]),
                    _mb(m.rss_before),
                    _mb(m.rss_after),
                )
            )
        s, q = best["splice"], best["plain"]
        ratios[rows] = {
            "wall": q.wall_s / s.wall_s,
            "cpu": q.cpu_s / s.cpu_s,
            "size": q.size_bytes / s.size_bytes,
            "peak": q.rss_after / s.rss_after,
        }
        r = ratios[rows]
        lines.append(
            (
                f"{rows:,}",
                "plain/splice",
                f"{r['wall']:.1f}x",
                "",
                f"{r['cpu']:.1f}x",
                f"{r['size']:.2f}x",
                "",
                "",
                f"{r['peak']:.2f}x",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "\n".join(
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
        for line in lines
    )
    return text, ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[30_000, 1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=1, help="runs per path and size (the fastest is shown)")
    parser.add_argument("--method", default="gaca", choices=("grpo", "gigpo", "gaca"))
    parser.add_argument("--check", action="store_true", help="also check that both outputs read back the same")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON on stdout")
    parser.add_argument(
        "--carried-text",
        action="store_true",
        help="add a text column the command does not read (the splice reads it back to check it)",
    )
    parser.add_argument("--_child", nargs=3, metavar=("LOG", "OUT", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        print(json.dumps(child(*args._child)))
        return 0

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        file=sys.stderr,
    )
    results: list[Measurement] = []
    log_sizes: dict[int, int] = {}
    with tempfile.TemporaryDirectory(dir=synth.DATA_DIR.parent, prefix="write-bench-") as tmp:
        for rows in args.rows:
            log_path = synth.ensure_log(rows)
            if args.carried_text:
                log_path = with_carried_text(log_path, Path(tmp) / f"carried-{rows}.parquet")
            log_sizes[rows] = log_path.stat().st_size
            outs = {p: Path(tmp) / f"{p}-{rows}.parquet" for p in PATHS}
            for i in range(args.repeat):
                for p in PATHS if i % 2 == 0 else PATHS[::-1]:  # alternate which path runs first
                    m = measure(log_path, p, rows, args.method, outs[p])
                    results.append(m)
                    print(f"  {rows:,} rows, {p}: {m.wall_s:.2f} s, {_mb(m.size_bytes)} MB", file=sys.stderr)
            if args.check:
                same = same_content(outs["splice"], outs["plain"])
                print(f"  {rows:,} rows: outputs read back {'the same' if same else 'DIFFERENT'}", file=sys.stderr)
                if not same:
                    return 1
            for out in outs.values():
                out.unlink()
    text, ratios = report(results, log_sizes)
    if args.json:
        print(json.dumps({"measurements": [m.__dict__ for m in results], "ratios": ratios}, indent=2))
    else:
        print(text)
    largest = max(args.rows)
    gain = ratios[largest]["wall"]
    verdict = "kept" if gain >= TARGET_GAIN else "NOT earned"
    print(
        f"splice write-time gain at {largest:,} rows: {gain:.1f}x (target {TARGET_GAIN:.0f}x): {verdict}",
        file=sys.stderr,
    )
    return 0 if gain >= TARGET_GAIN else 1


if __name__ == "__main__":
    raise SystemExit(main())
