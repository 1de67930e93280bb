"""Several ranks (torchrun / accelerate): each scores its share, rank 0 merges.

The ranks are run one after another in this process, exactly as `run_score` runs them
under torchrun, with the barrier as the point where rank 0 waits: rank 0 prepares the work
directory, the "barrier" lets rank 1 score its share, rank 0 scores its own, and the second
barrier hands over to the merge. The result must equal a single-process run (to float
rounding: the ranks batch different sequences together).

`test_torchrun_two_cpu_processes` also runs the README's command with two real CPU
processes (gloo barriers), resuming a run both ranks had begun: ~16 s on an idle 2-core
machine, most of it starting torch twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from tests.lm.test_score import loaded, make_rows, one_thread, score_lib, write_log  # noqa: F401 (fixture)


def run_two_ranks(log: Path, model_dir: Path, out: Path, **options):
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    config = ScoreConfig(model=str(model_dir), dtype="fp32", device="cpu", **options)
    calls = []
    rank1_runs = []

    def barrier_of_rank0() -> None:
        calls.append(len(calls))
        if len(calls) == 1:  # the work directory exists: rank 1 may score now
            rank1_runs.append(run_score(read_log([log]), config, out, rank=1, world=2, loaded=loaded(model_dir)))

    run0 = run_score(read_log([log]), config, out, rank=0, world=2, barrier=barrier_of_rank0, loaded=loaded(model_dir))
    assert len(calls) == 2 and len(rank1_runs) == 1
    return run0, rank1_runs[0]


def test_two_ranks_equal_one_process(tiny_llama, tmp_path):
    rows = make_rows(groups=3, trajs=3, steps=3, seed=21)
    log = write_log(tmp_path / "log.parquet", rows)
    score_lib(log, tiny_llama, tmp_path / "single.parquet", token_logprobs=True)
    run0, run1 = run_two_ranks(log, tiny_llama, tmp_path / "ranks.parquet", chunk_rows=4, token_logprobs=True)
    assert run1.table is None and run1.summary["rank"] == 1 and run1.summary["chunks"] > 0
    assert run0.summary["world_size"] == 2 and run0.summary["rows"] == len(rows)
    assert run0.summary["chunks"] > run1.summary["chunks"]  # rank 0 merged both ranks' chunks
    a, b = pq.read_table(tmp_path / "single.parquet"), pq.read_table(tmp_path / "ranks.parquet")
    inputs = [n for n in a.column_names if n not in C.SCORE_OUTPUTS]
    assert b.select(inputs).equals(a.select(inputs))
    assert b.column(C.N_ACTION_TOKENS).equals(a.column(C.N_ACTION_TOKENS))
    np.testing.assert_allclose(b.column(C.NLL_SUM).to_numpy(), a.column(C.NLL_SUM).to_numpy(), atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        np.concatenate(b.column(C.TOKEN_LOGPROBS).to_pylist()),
        np.concatenate(a.column(C.TOKEN_LOGPROBS).to_pylist()),
        atol=1e-6,
        rtol=0,
    )
    assert pq.read_schema(tmp_path / "ranks.parquet").metadata == pq.read_schema(tmp_path / "single.parquet").metadata
    assert not (tmp_path / "ranks.parquet.parts").exists()


def test_merge_refuses_a_missing_rank(tiny_llama, tmp_path):
    """Rank 0 alone (rank 1 never ran): no output, a message saying what is missing."""
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    rows = make_rows(groups=2, trajs=2, steps=2, seed=22)
    log = write_log(tmp_path / "log.parquet", rows)
    config = ScoreConfig(model=str(tiny_llama), dtype="fp32", device="cpu")
    with pytest.raises(GacaError, match="did not finish"):
        run_score(read_log([log]), config, tmp_path / "out.parquet", rank=0, world=2, loaded=loaded(tiny_llama))
    assert not (tmp_path / "out.parquet").exists()


def test_a_rank_stops_at_its_next_chunk_when_another_stopped(tiny_llama, tmp_path):
    """A rank that stops on an error leaves a marker in the work directory; the others stop
    at their next chunk (here rank 0, before its first) instead of scoring the rest of their
    share, then learn at the barrier that a rank failed."""
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    rows = make_rows(groups=2, trajs=2, steps=2, seed=24)
    log = write_log(tmp_path / "log.parquet", rows)
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"

    def rank1_stops() -> None:
        (parts / "stopped-rank00001").touch()  # what rank 1 leaves when it stops on an error

    config = ScoreConfig(model=str(tiny_llama), dtype="fp32", device="cpu", chunk_rows=2)
    with pytest.raises(GacaError, match="another process stopped"):
        run_score(read_log([log]), config, out, rank=0, world=2, barrier=rank1_stops, loaded=loaded(tiny_llama))
    assert not list(parts.glob("*.chunk*.parquet")) and not list(parts.glob("stopped-*")) and not out.exists()


TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")


def interrupt_two_ranks_after_one_chunk(log: Path, model_dir: Path, out: Path, **options) -> None:
    """Both ranks score their first chunk, then are stopped as Ctrl-C stops them."""
    from gaca_cli.lm.scoring import ScoreConfig, run_score
    from gaca_cli.log.reading import read_log

    config = ScoreConfig(model=str(model_dir), dtype="fp32", device="cpu", **options)

    def stop_after_first(k: int) -> None:
        if k == 0:
            raise KeyboardInterrupt

    def barrier_of_rank0() -> None:
        with pytest.raises(KeyboardInterrupt):
            run_score(
                read_log([log]), config, out, rank=1, world=2, on_chunk=stop_after_first, loaded=loaded(model_dir)
            )

    with pytest.raises(KeyboardInterrupt):
        run_score(
            read_log([log]),
            config,
            out,
            rank=0,
            world=2,
            barrier=barrier_of_rank0,
            on_chunk=stop_after_first,
            loaded=loaded(model_dir),
        )


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
def test_torchrun_two_cpu_processes(tiny_llama, tmp_path):
    """The README's command resumes a run both ranks had begun; its summary counts the
    chunks and tokens of both ranks."""
    rows = make_rows(groups=2, trajs=3, steps=3, seed=23)
    log = write_log(tmp_path / "log.parquet", rows)
    single = score_lib(log, tiny_llama, tmp_path / "single.parquet")
    interrupt_two_ranks_after_one_chunk(log, tiny_llama, tmp_path / "ranks.parquet", chunk_rows=4)
    assert len(list((tmp_path / "ranks.parquet.parts").glob("*.parquet"))) == 2
    torchrun = TORCHRUN
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        torchrun,
        "--nproc-per-node",
        "2",
        "-m",
        "gaca_cli",
        "score",
        str(log),
        "--model",
        str(tiny_llama),
        "-o",
        str(tmp_path / "ranks.parquet"),
        "--chunk-rows",
        "4",
        "--device",
        "cpu",
        "--resume",
        "--json",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # rank 0 alone reports
    assert summary["world_size"] == 2 and summary["resumed_chunks"] == 2 and summary["chunks"] > 2
    assert summary["tokens_per_s"] > 0
    a, b = single.table, pq.read_table(tmp_path / "ranks.parquet")
    np.testing.assert_allclose(b.column(C.NLL_SUM).to_numpy(), a.column(C.NLL_SUM).to_numpy(), atol=1e-6, rtol=0)


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed")
def test_torchrun_a_data_error_on_one_rank_stops_both_cleanly(tiny_llama, tmp_path):
    """Bad token ids in a trajectory that rank 1 scores: rank 1 reports the error, rank 0
    learns of it at the next barrier (it used to crash there, 'Connection closed by peer', exit
    3), both exit 1, and the work directory is removed as in one process (it used to stay, and
    --resume then refused it)."""
    from gaca_cli.lm.shards import shard_trajectories, trajectory_costs
    from gaca_cli.log.checks import prepare_log
    from gaca_cli.log.reading import read_log
    from tests.lm.test_score import add_token_ids

    rows = add_token_ids(make_rows(groups=2, trajs=3, steps=3, seed=23), loaded(tiny_llama)[1])
    clean = write_log(tmp_path / "clean.parquet", rows)
    log = read_log([clean])
    index, _ = prepare_log(log, "score")
    rank_of = shard_trajectories(trajectory_costs(log, index), 2)
    traj = log.table.column(C.TRAJ_ID).take([int(index.order[index.traj_start[np.flatnonzero(rank_of == 1)[0]]])])
    bad_traj = traj.to_pylist()[0]
    for row in rows:
        if row["traj_id"] == bad_traj:
            row["action_token_ids"] = [99999]
    bad = write_log(tmp_path / "bad.parquet", rows)
    out = tmp_path / "ranks.parquet"
    cmd = [TORCHRUN, "--nproc-per-node", "2", "-m", "gaca_cli", "score", str(bad), "--model", str(tiny_llama)]
    cmd += ["-o", str(out), "--chunk-rows", "4", "--device", "cpu"]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 2, done.stderr
    assert any("token ids must lie in" in e and bad_traj in e for e in errors), errors
    assert any("another process stopped on the error above" in e for e in errors), errors
    assert "unexpected error" not in done.stderr and "Connection closed" not in done.stderr
    assert not out.exists() and not (tmp_path / "ranks.parquet.parts").exists()


GLOO_EXIT_SCRIPT = """
import os, sys
from gaca_cli.lm.models import load_causal_lm
from gaca_cli.lm.shards import distributed_from_env

with distributed_from_env() as (rank, world, barrier, agree):
    load_causal_lm(sys.argv[1], dtype="fp32", device="cpu")  # transformers imports torch.distributed.nn
    agree([rank], "sum")
tasks = "/proc/self/task"
names = [open(f"{tasks}/{t}/comm").read().strip() for t in os.listdir(tasks)]
with open(os.path.join(sys.argv[2], f"rank{rank}.txt"), "w") as f:  # stdout would interleave
    f.write(f"{sum(n.startswith('pt_gloo') for n in names)} gloo threads after the group")
"""


@pytest.mark.skipif(TORCHRUN is None or not Path("/proc/self/task").is_dir(), reason="needs torchrun and /proc")
def test_torchrun_ranks_exit_without_gloo_threads(tiny_llama, tmp_path):
    """Leaving `distributed_from_env` ends gloo's worker threads, after a model load as score
    does one. They used to outlive it (torch.distributed.nn, imported by transformers while
    loading, kept the group in default arguments), and one that freed a collective's tensor
    while the interpreter shut down aborted the process: rank 1's SIGABRT ("terminate called
    without an active exception") failed 8 of 40 torchrun resumes on this machine, 0 of 40
    since."""
    script = tmp_path / "gloo_exit.py"
    script.write_text(GLOO_EXIT_SCRIPT, encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [TORCHRUN, "--nproc-per-node", "2", str(script), str(tiny_llama), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "0 gloo threads after the group", rank
