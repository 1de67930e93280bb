"""Benchmark: `gaca advantages` end to end (read, compute, write) against a baseline: a per-row
Python baseline, or (--against REV) the code of an earlier git revision, side by side.

For each method and log size the program runs one measurement per fresh child process
(so that the peak-memory figure, the child's RSS high-water mark from `os.wait4`, belongs to
that measurement alone):

- fast:     the library path the CLI uses, `read_for_advantages` -> `compute_advantages` ->
            `write_annotated` (the output spliced from the input's column chunks), timed
            phase by phase inside the child;
- cli:      (with --cli) the real `gaca advantages LOG --method M -o OUT --json` subprocess,
            wall time including interpreter start-up and imports; with --against, for the
            code of REV too (`cli base REV`), alternating with this tree's;
- baseline: bench/baseline_advantages.py (per-row Python in the style of the verl-agent
            reference code) on smaller logs (--baseline-rows), extrapolated linearly (per-row
            cost of the largest measured size) to sizes where it is too slow to run;
- base REV: (with --against REV, instead of the per-row baseline) the library path of the
            code at git revision REV, from a git worktree under the temporary directory,
            measured in the same way, cell by cell alternating with this tree's;
- held:     (with --held-anchors, in place of fast) the compute phase alone, the anchor
            column read into memory beforehand (`child_held`): the maths, apart from how the
            anchor column is read (a reader that leaves it on disk hashes and compares it
            during the compute phase);
- numpy, compiled: (with --paths) this tree's library path with GACA_KERNELS=0 (the numpy
            definitions) and =1 (their compiled twins), whatever the log's size: what the
            row count from which the compiled loops run (gaca_cli/credit/_compiled.py)
            is chosen by.

It first checks that the baseline and the fast code agree on a small log (max abs difference
of every output column, both normalisations) so that the comparison is honest.

The logs are synthetic (bench/synth.py: 8 rollouts per group, ~25 steps, ~30 % of steps in a
shared step group), cached under bench/data/. Peak memory is reported against the whole
log's in-memory Arrow size (`Table.nbytes` of every column, cached beside the log), although
`gaca advantages` reads only the columns it uses.

The phases (read, compute, write) are timed inside the child after it has imported the
library, so an import that one tree makes at import time and the other on first use (pandas,
which pyarrow imports at its first conversion between Arrow and numpy) counts for one tree
and not the other; the `process s` column (the child's whole wall time: interpreter, imports
and run) and the `cli` rows count every import, as a user waits for them.

Wall times on a shared machine are noisy; the CPU-seconds column (user + system of the child)
is the steadier figure, and the ratios are given for both.

    python bench/advantages.py --quick                      # ~1 minute: 200k rows
    python bench/advantages.py                              # 1M and 10M rows, all methods
    python bench/advantages.py --rows 10000000 --methods gaca --cli
    python bench/advantages.py --order canonical            # logs already sorted by group, traj, step
    python bench/advantages.py --baseline-style kind        # a kinder baseline: scatters back by index
    python bench/advantages.py --profile --rows 10000000 --methods gaca   # CPU hot spots
    python bench/advantages.py --against 595808a --rows 1000000,10000000 --methods gaca --repeat 3
    python bench/advantages.py --against 595808a --rows 1000000 --repeat 5 --cli   # and the CLI, both trees
    python bench/advantages.py --against 595808a --held-anchors --rows 1000000,10000000 --repeat 2
    python bench/advantages.py --paths --no-baseline --rows 30000,100000,300000,1000000 --methods gaca
    python bench/advantages.py --first-run --against main --rows 1000000 --methods gaca --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # synth, baseline_advantages; gaca_cli: the parent's tree or a child's (main)

import synth  # noqa: E402

METHODS = ("grpo", "gigpo", "gaca")
TARGET_ROWS_S = 10.0  # gaca on 10M rows end to end
TARGET_MEM_RATIO = 3.0
TARGET_SPEEDUP = 300.0  # at 1M rows


# ----------------------------------------------------------------------------- child side


def _rss_now_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def input_nbytes(log_path: str) -> int:
    """In-memory Arrow size of the whole log (every column), the reference of the peak-memory
    ratio; cached beside the log because reading 10M rows takes a few seconds."""
    cache = Path(f"{log_path}.nbytes")
    if cache.exists() and cache.stat().st_mtime >= Path(log_path).stat().st_mtime:
        return int(cache.read_text())
    import pyarrow.parquet as pq

    nbytes = pq.read_table(log_path).nbytes
    cache.write_text(str(nbytes))
    return nbytes


def child_fast(log_path: str, out_path: str, method: str) -> dict:
    """The path `gaca advantages` takes (cli/cmd_advantages.py), phase by phase."""
    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.reading import read_for_advantages
    from gaca_cli.credit.run import compute_advantages, gc_paused
    from gaca_cli.credit.writing import write_annotated

    rss0 = _rss_now_bytes()
    config = AdvantagesConfig(method=method)
    c0 = time.process_time()
    with gc_paused():  # as the command runs it
        t0 = time.perf_counter()
        log = read_for_advantages([log_path], {}, config)
        t1 = time.perf_counter()
        run = compute_advantages(log, config)
        t2 = time.perf_counter()
        how = write_annotated(run, out_path, [log_path], {})
    return {**_phases(c0, rss0, t0, t1, t2, time.perf_counter()), "write": how}


def child_held(log_path: str, out_path: str, method: str) -> dict:
    """The compute phase alone, with the anchor column held in memory: `read_log` reads the
    columns `gaca advantages` reads (the anchor by polars, so it is hashed and compared in
    memory), the compiled loops are loaded beforehand, and `compute_advantages` is timed (the
    better of two runs). This separates the maths from the way the anchor column is read,
    which `read_for_advantages` may leave to the compute phase. Nothing is written."""
    import pyarrow.parquet as pq

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.reading import columns_read
    from gaca_cli.credit.run import compute_advantages, gc_paused
    from gaca_cli.log.reading import read_log

    try:
        from gaca_cli.credit._compiled import warm_up

        warm_up(pq.read_metadata(log_path).num_rows)
    except ImportError:  # before the numpy definitions: the kernels, always
        from gaca_cli.credit import _kernels

        _kernels.warm_up()
    rss0 = _rss_now_bytes()
    config = AdvantagesConfig(method=method)
    c0 = time.process_time()
    with gc_paused():
        t0 = time.perf_counter()
        log = read_log([log_path], {}, columns=columns_read(config, pq.read_schema(log_path).names))
        t1 = time.perf_counter()
        best = float("inf")
        for _ in range(2):
            log.cache.clear()  # the anchors are built again, as in a run
            start = time.perf_counter()
            compute_advantages(log, config)
            best = min(best, time.perf_counter() - start)
    return _phases(c0, rss0, t0, t1, t1 + best, t1 + best)


def child_baseline(log_path: str, out_path: str, method: str, style: str = "kind") -> dict:
    import baseline_advantages
    import pyarrow as pa
    import pyarrow.parquet as pq

    rss0 = _rss_now_bytes()
    c0 = time.process_time()
    t0 = time.perf_counter()
    table = pq.read_table(log_path)
    t1 = time.perf_counter()
    cols = baseline_advantages.compute(table, method, recombine_per_row=style == "reference")
    out = table
    for name, values in cols.items():
        out = out.append_column(name, pa.array(values))
    out = out.append_column("adv_method", pa.array([method] * out.num_rows))
    t2 = time.perf_counter()
    pq.write_table(out, out_path, compression="zstd")
    return _phases(c0, rss0, t0, t1, t2, time.perf_counter())


def _phases(c0: float, rss0: int, t0: float, t1: float, t2: float, t3: float) -> dict:
    """A child's measurement: read t0..t1, compute t1..t2, write t2..t3, CPU since c0."""
    return {
        "read_s": t1 - t0,
        "compute_s": t2 - t1,
        "write_s": t3 - t2,
        "total_s": t3 - t0,
        "cpu_s": time.process_time() - c0,
        "rss_start_bytes": rss0,
    }


def child_main(kind: str, log_path: str, out_path: str, method: str, style: str = "kind", tree: str = "") -> int:
    sys.path.insert(0, tree or str(ROOT))  # the gaca_cli to measure
    if kind == "fast":
        result = child_fast(log_path, out_path, method)
    elif kind == "held":
        result = child_held(log_path, out_path, method)
    else:
        result = child_baseline(log_path, out_path, method, style)
    print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- parent side


@dataclass
class Measurement:
    method: str
    rows: int
    impl: str  # fast | cli | baseline | baseline (extrapolated)
    total_s: float
    read_s: float | None = None
    compute_s: float | None = None
    write_s: float | None = None
    peak_rss_bytes: int | None = None
    input_bytes: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.total_s if self.total_s > 0 else float("inf")


def run_child(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> tuple[int, float, float, int, str, str]:
    """Run `cmd` (with `env` added to the environment) in `cwd`; return (exit status, wall
    seconds, CPU seconds (user + system), peak RSS bytes of that child alone, stdout, stderr)."""
    full_env = {**os.environ, **(env or {})}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=full_env)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            proc.kill()
            raise
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4, tell Popen
        out.seek(0)
        err.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        return proc.returncode, wall, cpu, usage.ru_maxrss * 1024, out.read().decode(), err.read().decode()


def measure(
    kind: str,
    log_path: Path,
    method: str,
    rows: int,
    workdir: Path,
    style: str = "kind",
    tree: Path = ROOT,
    env: dict[str, str] | None = None,
    label: str | None = None,
) -> Measurement:
    """One measurement in a fresh child: `kind` fast, cli or baseline; `tree` the working tree
    whose gaca_cli is measured; `env` added to the child's environment; `label` the table's
    name for it (default: `kind`)."""
    out_path = workdir / f"out-{kind}-{method}-{rows}.parquet"
    if kind == "cli":
        cmd = [
            sys.executable,
            "-m",
            "gaca_cli",
            "advantages",
            str(log_path),
            "--method",
            method,
            "-o",
            str(out_path),
            "--json",
        ]
        env = {**(env or {}), "PYTHONPATH": str(tree)}
        cwd = workdir  # `python -m` puts its working directory first on the path: not a tree
    else:
        cwd = ROOT
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--_child",
            kind,
            str(log_path),
            str(out_path),
            method,
            style,
            str(tree),
        ]
    rc, wall, cpu, peak, stdout, stderr = run_child(cmd, env, cwd)
    out_path.unlink(missing_ok=True)
    if rc != 0:
        raise SystemExit(f"{kind} {method} {rows} rows failed (exit {rc}):\n{stderr[-3000:]}")
    if kind == "cli":
        return Measurement(
            method, rows, label or "cli", wall, peak_rss_bytes=peak, extra={"process_cpu_s": cpu, "cpu_s": cpu}
        )
    res = json.loads(stdout.strip().splitlines()[-1])
    return Measurement(
        method,
        rows,
        label or kind,
        res["total_s"],
        res["read_s"],
        res["compute_s"],
        res["write_s"],
        peak,
        input_nbytes(str(log_path)),
        {
            "process_wall_s": wall,
            "process_cpu_s": cpu,
            "cpu_s": res["cpu_s"],
            "rss_start_bytes": res["rss_start_bytes"],
        },
    )


def extrapolate(measured: list[Measurement], rows: int) -> Measurement:
    """Linear extrapolation from the largest measured size (per-row cost × rows)."""
    ref = max(measured, key=lambda m: m.rows)
    k = rows / ref.rows
    scale = lambda x: None if x is None else x * k  # noqa: E731
    return Measurement(
        ref.method,
        rows,
        "baseline (extrap.)",
        ref.total_s * k,
        scale(ref.read_s),
        scale(ref.compute_s),
        scale(ref.write_s),
        extra={"from_rows": ref.rows, "cpu_s": scale(ref.extra.get("cpu_s"))},
    )


def scaling_exponent(measured: list[Measurement]) -> float | None:
    """Slope of log(CPU time) against log(rows) between the smallest and largest baseline runs
    (CPU time, because wall time on a shared machine is noisy)."""
    import math

    if len(measured) < 2:
        return None
    a, b = min(measured, key=lambda m: m.rows), max(measured, key=lambda m: m.rows)
    if a.rows == b.rows:
        return None
    return math.log(b.extra["cpu_s"] / a.extra["cpu_s"]) / math.log(b.rows / a.rows)


# ----------------------------------------------------------------------------- agreement


def agreement(rows: int, data_dir: Path) -> list[tuple[str, str, float, bool]]:
    """Max abs difference between the baseline and the fast code, every output column."""
    import baseline_advantages
    import numpy as np
    import pyarrow.parquet as pq

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.run import compute_advantages
    from gaca_cli.log.reading import read_log

    path = synth.ensure_log(rows, data_dir=data_dir)
    table = pq.read_table(path)
    log = read_log([path])
    out = []
    for method in METHODS:
        for norm in ("std", "mean"):
            slow = baseline_advantages.compute(table, method, norm=norm)
            fast = compute_advantages(log, AdvantagesConfig(method=method, norm=norm)).table
            worst = 0.0
            for name, values in slow.items():
                if name == "step_group_id":
                    continue
                worst = max(worst, float(np.max(np.abs(fast.column(name).to_numpy() - values))))
            same_groups = True
            if "step_group_id" in slow:
                # ids differ in numbering; the partition of rows must be the same
                f = fast.column("step_group_id").to_numpy()
                pairs = np.unique(np.stack([f, slow["step_group_id"]]), axis=1)
                same_groups = len(np.unique(pairs[0])) == pairs.shape[1] == len(np.unique(pairs[1]))
            out.append((method, norm, worst, same_groups))
    return out


# ----------------------------------------------------------------------------- profile


def profile(log_path: Path, methods: list[str], top: int) -> int:
    """cProfile the library path with a CPU-time clock (less sensitive to a busy machine than
    wall time), phase by phase, and print the functions with the most own time."""
    import cProfile
    import io
    import pstats

    from gaca_cli.credit.config import AdvantagesConfig
    from gaca_cli.credit.reading import read_for_advantages
    from gaca_cli.credit.run import compute_advantages, gc_paused
    from gaca_cli.credit.writing import write_annotated

    def phase(prof: cProfile.Profile, phases: dict, name: str, fn, *args):
        """fn(*args) under the profiler; its CPU and wall seconds and the RSS after it in phases[name]."""
        c0, w0 = time.process_time(), time.perf_counter()
        prof.enable()
        try:
            return fn(*args)
        finally:
            prof.disable()
            phases[name] = (time.process_time() - c0, time.perf_counter() - w0, _rss_now_bytes())

    with tempfile.TemporaryDirectory(dir=log_path.parent, prefix="prof-") as tmp:
        for method in methods:
            prof = cProfile.Profile(time.process_time)
            phases: dict[str, tuple[float, float, int]] = {}
            config = AdvantagesConfig(method=method)
            with gc_paused():  # as the command runs it
                log = phase(prof, phases, "read", read_for_advantages, [log_path], {}, config)
                run = phase(prof, phases, "compute", compute_advantages, log, config)
                how = phase(prof, phases, "write", write_annotated, run, Path(tmp) / "out.parquet", [log_path], {})
            print(
                f"\n=== {method}, {log.table.num_rows:,} rows, columns read {log.table.nbytes / 2**30:.2f} GiB in "
                f"memory, output {how}"
            )
            for name, (cpu, wall, rss) in phases.items():
                print(f"  {name:8s} cpu {cpu:7.2f} s  wall {wall:7.2f} s  RSS after {rss / 2**30:.2f} GiB")
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(top)
                text = buf.getvalue()
                print(f"\n--- by {key} (CPU seconds)")
                print(text[text.find("ncalls") - 3 :].rstrip())
            del log, run
    return 0


# ----------------------------------------------------------------------------- first run


CACHE_FILLED = "from gaca_cli.credit._kernels import cached; raise SystemExit(0 if cached() else 1)"


def wait_for_cache(tree: Path, cache: Path, timeout_s: float = 900.0) -> float:
    """Wait until numba's cache `cache` holds every kernel of `tree` (filled by the background
    compilation a cold first run starts), so that it does not run beside the next
    measurement; returns the seconds waited. A tree without `cached` fills it in the run."""
    env = {**os.environ, "PYTHONPATH": str(tree), "NUMBA_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        done = subprocess.run(
            [sys.executable, "-c", CACHE_FILLED], env=env, cwd=cache.parent, capture_output=True, check=False
        )
        if done.returncode == 0 or b"ImportError" in done.stderr:
            return time.perf_counter() - t0
        time.sleep(2.0)
    raise SystemExit(f"numba's cache {cache} was not filled within {timeout_s:.0f} s")


def first_run(args: argparse.Namespace, sizes: list[int], methods: list[str]) -> int:
    """The real `gaca advantages` command as a new install runs it: numba's cache empty (a new
    NUMBA_CACHE_DIR), then again with the cache filled, and with the numpy code forced
    (GACA_KERNELS=0); for this tree and, with --against, the code of REV, alternating."""
    trees = [("this", ROOT)] + ([(f"base {args.against}", worktree(args.against))] if args.against else [])
    rows_out: list[tuple[int, str, str, dict[str, float]]] = []
    args.data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.data_dir, prefix="first-") as tmp:
        work = Path(tmp)
        for rows in sizes:
            path = synth.ensure_log(rows, data_dir=args.data_dir, order=args.order)
            for method in methods:
                runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
                for rep in range(args.repeat):
                    for k, (name, tree) in enumerate(trees):
                        cache = work / f"numba-{k}-{rows}-{method}-{rep}"
                        cells = [("first", {"NUMBA_CACHE_DIR": str(cache)})]
                        cells += [("warm", {"NUMBA_CACHE_DIR": str(cache)}), ("numpy", {"GACA_KERNELS": "0"})]
                        for cell, env in cells:
                            m = measure("cli", path, method, rows, work, tree=tree, env=env)
                            runs.setdefault((name, cell), []).append((m.total_s, m.extra["cpu_s"]))
                            print(
                                f"  {name:12s} {cell:6s} {method:5s} {rows:>11,} rows: {m.total_s:6.2f} s",
                                file=sys.stderr,
                            )
                            if cell == "first":
                                waited = wait_for_cache(tree, cache)
                                print(f"  {'':12s} (cache filled {waited:.0f} s later)", file=sys.stderr, flush=True)
                for name, _ in trees:
                    for i, unit in enumerate(("wall", "cpu")):
                        cells = {c: sorted(r[i] for r in runs[(name, c)]) for c in ("first", "warm", "numpy")}
                        rows_out.append((rows, method, f"{name} {unit}", {c: v[len(v) // 2] for c, v in cells.items()}))
    print(f"`gaca advantages LOG --method M -o OUT --json`, seconds, median of {args.repeat} (a shared machine):")
    print(
        f"{'rows':>11} {'method':6} {'code':19} {'first':>7} {'warm':>7} {'numpy':>7} {'first/warm':>10} {'first/numpy':>11}"
    )
    for rows, method, name, med in rows_out:
        print(
            f"{rows:>11,} {method:6} {name:19} {med['first']:7.2f} {med['warm']:7.2f} {med['numpy']:7.2f} "
            f"{med['first'] / med['warm']:9.2f}× {med['first'] / med['numpy']:10.2f}×"
        )
    print("first: numba's cache empty, as after an install; warm: the cache filled; numpy: GACA_KERNELS=0;")
    print("cpu: user + system of the command's process (not of the compilation it leaves in the background).")
    return 0


# ----------------------------------------------------------------------------- report


def _fmt_s(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _fmt_gb(x: int | None) -> str:
    return "" if x is None else f"{x / 2**30:.2f}"


def _fmt_ratio(base: float, this: float) -> str:
    """How many times faster `this` is than `base` (2 decimals below 10×)."""
    r = base / this
    return f"{r:.2f}×" if r < 10 else f"{r:.0f}×"


def median_run(runs: list[Measurement]) -> Measurement:
    """The run with the median total time (of an even number, the upper one), its `best_s` the
    fastest run's total."""
    ordered = sorted(runs, key=lambda m: m.total_s)
    chosen = ordered[len(ordered) // 2]
    chosen.extra["best_s"] = ordered[0].total_s
    return chosen


def table_text(
    results: list[Measurement],
    baseline_at: dict[tuple[str, int], Measurement],
    cli_base_at: dict[tuple[str, int], Measurement] | None = None,
) -> str:
    """The results as a table; the ratios of a `cli` row are against REV's CLI (`cli_base_at`)."""
    head = (
        "method",
        "rows",
        "impl",
        "read s",
        "compute s",
        "write s",
        "total s",
        "best s",
        "process s",
        "cpu s",
        "rows/s",
        "peak GiB",
        "peak/input",
        "× base",
        "× base cpu",
        "× base compute",
    )
    lines = [head]
    for m in results:
        base = baseline_at.get((m.method, m.rows))
        if m.impl == "cli" and cli_base_at:
            base = cli_base_at.get((m.method, m.rows))
        ratio = ratio_cpu = ratio_c = ""
        cpu = m.extra.get("cpu_s")
        if base is not None and m is not base and not m.impl.startswith(("baseline", "cli base")):
            ratio = _fmt_ratio(base.total_s, m.total_s)
            if cpu and base.extra.get("cpu_s"):
                ratio_cpu = _fmt_ratio(base.extra["cpu_s"], cpu)
            if m.compute_s and base.compute_s:
                ratio_c = _fmt_ratio(base.compute_s, m.compute_s)
        mem_ratio = ""
        if m.peak_rss_bytes and m.input_bytes:
            mem_ratio = f"{m.peak_rss_bytes / m.input_bytes:.2f}"
        lines.append(
            (
                m.method,
                f"{m.rows:,}",
                m.impl,
                _fmt_s(m.read_s),
                _fmt_s(m.compute_s),
                _fmt_s(m.write_s),
                _fmt_s(m.total_s),
                _fmt_s(m.extra.get("best_s")),
                _fmt_s(m.total_s if m.impl.startswith("cli") else m.extra.get("process_wall_s")),
                _fmt_s(cpu),
                f"{m.rows_per_s:,.0f}",
                _fmt_gb(m.peak_rss_bytes),
                mem_ratio,
                ratio,
                ratio_cpu,
                ratio_c,
            )
        )
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    out = []
    for j, row in enumerate(lines):
        cells = (str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        out.append("  ".join(cells))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def machine_text() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy
    import polars
    import pyarrow

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "gaca_cli"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        commit = f"gaca_cli at {commit}{' + local changes' if dirty else ''}; " if commit else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return (
        f"{commit}{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {numpy.__version__}, "
        f"pyarrow {pyarrow.__version__}, polars {polars.__version__}; load average {os.getloadavg()[0]:.1f}"
    )


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_child":
        return child_main(*argv[1:7])
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description="Benchmark `gaca advantages` end to end against a baseline.")
    parser.add_argument("--rows", default="1000000,10000000", help="comma-separated log sizes (default: 1M,10M)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of grpo,gigpo,gaca")
    parser.add_argument(
        "--baseline-rows",
        default="100000,200000,400000",
        help="sizes the baseline really runs on; larger sizes are extrapolated linearly",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline runs")
    parser.add_argument(
        "--baseline-style",
        choices=("kind", "reference"),
        default="reference",
        help="reference (default): one np.where over the batch per row to scatter the returns back, "
        "as the verl-agent code does; kind: results scattered back by index (~3x faster)",
    )
    parser.add_argument("--cli", action="store_true", help="also time the real `gaca advantages` subprocess")
    parser.add_argument("--check-rows", type=int, default=20_000, help="log size of the agreement check")
    parser.add_argument("--quick", action="store_true", help="small run: 200k rows, baseline on 50k and 100k")
    parser.add_argument("--data-dir", type=Path, default=synth.DATA_DIR, help="cache of synthetic logs")
    parser.add_argument(
        "--order",
        choices=synth.ORDERS,
        default="interleaved",
        help="row order of the benchmark logs: interleaved by step as a rollout worker writes "
        "them (default), or canonical (already sorted by group, trajectory, step)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement to this JSON file")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the benchmark: profile the fast path (CPU time, cProfile) on the first "
        "--rows size and --methods, and print the hot spots",
    )
    parser.add_argument("--top", type=int, default=25, help="rows of the --profile listing")
    parser.add_argument(
        "--against",
        metavar="REV",
        default=None,
        help="compare with the code of this git revision (e.g. 595808a), side by side, instead of the per-row baseline",
    )
    parser.add_argument(
        "--paths",
        action="store_true",
        help="also time this tree's numpy definitions and compiled loops, each forced (GACA_KERNELS=0 and 1)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; the table shows the median")
    parser.add_argument(
        "--first-run",
        action="store_true",
        help="instead of the benchmark: time the command with numba's cache empty (a new install), "
        "filled, and with the numpy code forced, for this tree and --against REV",
    )
    parser.add_argument(
        "--held-anchors",
        action="store_true",
        help="time the compute phase alone, the anchor column read and held in memory beforehand "
        "(no write; total = read + compute): the maths apart from how anchors are read",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.baseline_rows = "200000", "50000,100000"
        args.check_rows = min(args.check_rows, 10_000)
    sizes = _ints(args.rows)
    base_sizes = [] if args.no_baseline or args.against else _ints(args.baseline_rows)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"--methods: unknown {', '.join(sorted(unknown))}; use grpo, gigpo, gaca")

    print(f"machine: {machine_text()}", flush=True)
    if args.first_run:
        return first_run(args, sizes, methods)
    if args.profile:
        return profile(synth.ensure_log(sizes[0], data_dir=args.data_dir, order=args.order), methods, args.top)
    against = f"the code at {args.against}" if args.against else f"per-row, {args.baseline_style} style"
    print(
        f"logs: bench/synth.py, rows {args.order}; baseline: {against}; median of {args.repeat} run(s) per cell; "
        "timings on a shared machine are noisy.\n",
        flush=True,
    )
    # this tree, and what it is compared with: (label, tree, environment)
    variants: list[tuple[str, Path, dict[str, str]]] = [("fast", ROOT, {})]
    if args.paths:
        variants += [("numpy", ROOT, {"GACA_KERNELS": "0"}), ("compiled", ROOT, {"GACA_KERNELS": "1"})]
    base_label = None
    if args.against:
        base_label = f"base {args.against}"
        variants.insert(0, (base_label, worktree(args.against), {}))
        for _label, tree, env in variants:  # unmeasured: numba's cache filled in each tree
            measure(
                "fast",
                synth.ensure_log(args.check_rows, data_dir=args.data_dir),
                "gaca",
                args.check_rows,
                args.data_dir,
                tree=tree,
                env={**env, "GACA_KERNELS": "1"},
            )

    checks = [] if args.against else agreement(args.check_rows, args.data_dir)
    if checks:
        print(f"agreement, baseline vs fast on {args.check_rows:,} rows (max abs difference over all columns):")
    ok = True
    for method, norm, worst, same_groups in checks:
        good = worst <= 1e-9 and same_groups
        ok &= good
        print(
            f"  {method:5s} --norm {norm:4s}  {worst:.2e}  step groups {'identical' if same_groups else 'DIFFER'}"
            f"  {'ok' if good else 'MISMATCH'}"
        )
    if not ok:
        print("the baseline and the fast code disagree: the comparison would not be honest", file=sys.stderr)
        return 1
    print(flush=True)

    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(dir=args.data_dir, prefix="run-") as tmp:
        work = Path(tmp)
        base_runs: dict[str, list[Measurement]] = {m: [] for m in methods}
        cli_base_at: dict[tuple[str, int], Measurement] = {}  # the CLI of REV, for the `cli` rows
        for rows in base_sizes:
            path = synth.ensure_log(rows, data_dir=args.data_dir, order=args.order)
            for method in methods:
                m = measure("baseline", path, method, rows, work, args.baseline_style)
                base_runs[method].append(m)
                results.append(m)
                print(f"  baseline {method:5s} {rows:>11,} rows: {m.total_s:7.2f} s", file=sys.stderr, flush=True)
        for rows in sizes:
            path = synth.ensure_log(rows, data_dir=args.data_dir, order=args.order)
            for method in methods:
                runs: dict[str, list[Measurement]] = {}
                for _ in range(args.repeat):  # the variants alternate, so that drift hits them alike
                    for label, tree, env in variants:
                        kind = "held" if args.held_anchors else "fast"
                        cells = [(kind, label)]
                        if args.cli and label in ("fast", base_label):  # the real command, both trees
                            cells.append(("cli", "cli" if label == "fast" else f"cli {label}"))
                        for kind, name in cells:
                            m = measure(kind, path, method, rows, work, tree=tree, env=env, label=name)
                            runs.setdefault(name, []).append(m)
                            print(
                                f"  {name:12s} {method:5s} {rows:>11,} rows: {m.total_s:7.2f} s",
                                file=sys.stderr,
                                flush=True,
                            )
                chosen = {name: median_run(cell) for name, cell in runs.items()}
                for c in chosen.values():
                    c.input_bytes = c.input_bytes or chosen["fast"].input_bytes
                results.extend(chosen.values())
                if base_label is not None:
                    base_runs[method].append(chosen[base_label])
                    if f"cli {base_label}" in chosen:
                        cli_base_at[(method, rows)] = chosen[f"cli {base_label}"]

    baseline_at: dict[tuple[str, int], Measurement] = {}
    extrapolated: list[Measurement] = []
    for method, runs in base_runs.items():
        for m in runs:
            baseline_at[(method, m.rows)] = m
        if not runs or base_label is not None:
            continue
        for rows in sizes:
            if (method, rows) not in baseline_at:
                e = extrapolate(runs, rows)
                baseline_at[(method, rows)] = e
                extrapolated.append(e)
    results.extend(extrapolated)
    order = {m: i for i, m in enumerate(METHODS)}
    impl_order = {"baseline": 0, "baseline (extrap.)": 1, base_label: 1, "fast": 2, "numpy": 3, "compiled": 4}
    impl_order.update({f"cli {base_label}": 5, "cli": 6})
    results.sort(key=lambda m: (order[m.method], m.rows, impl_order[m.impl]))
    print(table_text(results, baseline_at, cli_base_at))
    print()
    for method, runs in base_runs.items():
        exp = None if base_label else scaling_exponent(runs)
        if exp is not None:
            print(
                f"baseline {method}: compute time grows as rows^{exp:.2f} between "
                f"{min(r.rows for r in runs):,} and {max(r.rows for r in runs):,} rows (1.00 = linear)"
            )
    print(
        f"each cell: the median of {args.repeat} run(s) (by total s); best s = the fastest; process s = the "
        "child's whole wall time (interpreter start, imports, run);"
    )
    print("peak = RSS high-water mark of the measuring child process (interpreter and imports included);")
    print("input = in-memory Arrow size of the whole log (every column); × compute compares the compute phases only.")
    if base_label is None:
        _print_targets(results, baseline_at, args.baseline_style)
    else:
        _print_targets_against(results, baseline_at, cli_base_at, args.against, args.held_anchors)
    if args.json:
        args.json.write_text(json.dumps([m.__dict__ | {"rows_per_s": m.rows_per_s} for m in results], indent=1))
    return 0


def worktree(rev: str) -> Path:
    """A detached git worktree of `rev` under the temporary directory, made once and reused
    (bench/startup.py uses it too); `rev` may also name a directory holding a checkout."""
    if (Path(rev) / "gaca_cli").is_dir():
        return Path(rev).resolve()
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"gaca-bench-{sha}"
    if not (path / "gaca_cli").is_dir():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True, capture_output=True
        )
    return path


def _print_targets_against(
    results: list[Measurement],
    baseline_at: dict[tuple[str, int], Measurement],
    cli_base_at: dict[tuple[str, int], Measurement],
    rev: str,
    held: bool = False,
) -> None:
    """Issue 12's targets against the code at `rev`: 1M rows end to end no slower, 10M rows
    within 1.5× of its time and under 1.5× the input's in-memory size at peak (with `held`,
    the compute phase alone against the same limits); medians. End to end is given three
    ways: the phases after the imports, the measuring process's whole wall time, and (with
    --cli) the real command's."""
    lines = []
    for m in results:
        if m.impl == "cli" and (m.method, m.rows) in cli_base_at and m.rows in (1_000_000, 10_000_000):
            that = cli_base_at[(m.method, m.rows)].total_s
            limit = 1.0 if m.rows == 1_000_000 else 1.5
            r = m.total_s / that
            lines.append(
                f"{m.method}, {m.rows:,} rows, the `gaca advantages` command: {m.total_s:.2f} s = {r:.2f}× "
                f"the time of {rev}'s ({that:.2f} s; target ≤ {limit:.1f}×): {'met' if r <= limit else 'NOT met'}"
            )
        base = baseline_at.get((m.method, m.rows))
        if m.impl != "fast" or base is None or m.rows not in (1_000_000, 10_000_000):
            continue
        limit = 1.0 if m.rows == 1_000_000 else 1.5
        if held:
            this, that, what = m.compute_s or 0.0, base.compute_s or 0.0, "compute phase, anchors held"
        else:
            this, that, what = m.total_s, base.total_s, "end to end"
        r = this / that
        lines.append(
            f"{m.method}, {m.rows:,} rows {what}: {this:.2f} s = {r:.2f}× the time of {rev} "
            f"(target ≤ {limit:.1f}×): {'met' if r <= limit else 'NOT met'}"
            + ("" if held else f"; compute phase {m.compute_s:.2f} s vs {base.compute_s:.2f} s")
        )
        this_process, that_process = m.extra.get("process_wall_s"), base.extra.get("process_wall_s")
        if not held and this_process and that_process:
            r = this_process / that_process
            lines.append(
                f"{m.method}, {m.rows:,} rows, the measuring process (imports included): {this_process:.2f} s = "
                f"{r:.2f}× the time of {rev}'s ({that_process:.2f} s): {'met' if r <= limit else 'NOT met'}"
            )
        if m.rows == 10_000_000 and m.peak_rss_bytes and m.input_bytes and not held:  # held: the text is in memory
            p = m.peak_rss_bytes / m.input_bytes
            lines.append(
                f"{m.method}, {m.rows:,} rows peak memory: {p:.2f}× the input (target < 1.5×): "
                f"{'met' if p < 1.5 else 'NOT met'}"
            )
    if lines:
        print("\ntargets (2-core machine):")
        for line in lines:
            print(f"  {line}")


def _print_targets(results: list[Measurement], baseline_at: dict[tuple[str, int], Measurement], style: str) -> None:
    fast = {(m.method, m.rows): m for m in results if m.impl == "fast"}
    lines = []
    big = fast.get(("gaca", 10_000_000))
    if big is not None:
        lines.append(
            f"gaca, 10M rows end to end: {big.total_s:.2f} s (target < {TARGET_ROWS_S:.0f} s): "
            f"{'met' if big.total_s < TARGET_ROWS_S else 'NOT met'}"
        )
        if big.peak_rss_bytes and big.input_bytes:
            r = big.peak_rss_bytes / big.input_bytes
            lines.append(
                f"gaca, 10M rows peak memory: {r:.2f}× input (target < {TARGET_MEM_RATIO:.0f}×): "
                f"{'met' if r < TARGET_MEM_RATIO else 'NOT met'}"
            )
    for method in METHODS:
        one = fast.get((method, 1_000_000))
        base = baseline_at.get((method, 1_000_000))
        if one is not None and base is not None and one.compute_s and base.compute_s:
            r = base.compute_s / one.compute_s
            lines.append(
                f"{method}, 1M rows vs baseline: {r:.0f}× on the compute phase (target ≥ {TARGET_SPEEDUP:.0f}× "
                f"against the reference-style baseline: {'met' if r >= TARGET_SPEEDUP else 'NOT met'}"
                f"{'' if style == 'reference' else '; this run used the kind baseline'}), "
                f"{base.total_s / one.total_s:.0f}× end to end"
            )
    if lines:
        print("\ntargets (2-core machine):")
        for line in lines:
            print(f"  {line}")


if __name__ == "__main__":
    raise SystemExit(main())
