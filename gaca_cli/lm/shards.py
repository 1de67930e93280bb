"""Sharding a `gaca score` run and merging it: trajectories split over the ranks (balanced by
their estimated tokens) and into chunks; the work directory beside OUT (`OUT.parts/`) where
finished chunks wait, checked against the run's fingerprint on `--resume`; and the merge of
every chunk back into the log's row order, as OUT's table."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gaca_cli import __version__
from gaca_cli.errors import GacaError
from gaca_cli.files import atomic_path
from gaca_cli.lm.score_config import ScoreConfig
from gaca_cli.log import columns as C

WORK_DIR_SUFFIX = ".parts"

_MANIFEST = "manifest.json"

#: a rank that stops on an error leaves this file in the work directory, so that the others
#: stop at their next chunk instead of scoring the rest of their share first
STOPPED = "stopped-rank{rank:05d}"

STOPPED_ANY = "stopped-rank*"

_CHUNK_META = "gaca.score.chunk"


def shard_trajectories(costs: np.ndarray, world: int) -> np.ndarray:
    """Rank of each trajectory: largest first onto the least-loaded rank (ties: lowest rank,
    then input order). Deterministic, so every rank computes the same assignment."""
    costs = np.asarray(costs, dtype=np.float64)
    rank_of = np.zeros(len(costs), dtype=np.int64)
    if world <= 1:
        return rank_of
    load = np.zeros(world, dtype=np.float64)
    for t in np.argsort(-costs, kind="stable"):
        r = int(np.argmin(load))
        rank_of[t] = r
        load[r] += costs[t]
    return rank_of


def chunk_trajectories(trajs: np.ndarray, traj_len: np.ndarray, chunk_rows: int) -> list[np.ndarray]:
    """Consecutive trajectories (whole ones) until a chunk holds ≥ chunk_rows steps."""
    chunks: list[np.ndarray] = []
    current: list[int] = []
    rows = 0
    for t in trajs:
        current.append(int(t))
        rows += int(traj_len[t])
        if rows >= chunk_rows:
            chunks.append(np.array(current, dtype=np.int64))
            current, rows = [], 0
    if current:
        chunks.append(np.array(current, dtype=np.int64))
    return chunks


def trajectory_costs(log, index) -> np.ndarray:
    """Estimated tokens to forward per trajectory, for balancing ranks: the longest step's
    context + action (what a packed trajectory costs), in token ids where the log has them,
    else in characters (proportional across a log)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from gaca_cli.log.grouping import contiguous_decoded

    table = log.table
    names = table.column_names
    n = table.num_rows

    def lengths(name: str) -> np.ndarray:
        col = contiguous_decoded(table.column(name))
        if pa.types.is_large_string(col.type) or pa.types.is_string(col.type):
            return pc.utf8_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        if name == C.MESSAGES:
            parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
            content = pc.utf8_length(pc.list_flatten(col).field("content")).fill_null(0)
            return np.bincount(parents, content.to_numpy(zero_copy_only=False), minlength=n)
        return pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)

    per_row = np.zeros(n, dtype=np.float64)
    for candidates in ((C.PROMPT_TOKEN_IDS, C.PROMPT, C.MESSAGES), (C.ACTION_TOKEN_IDS, C.ACTION)):
        name = next((c for c in candidates if c in names), None)  # the context's, then the action's
        if name is not None:
            per_row += lengths(name)
    sorted_cost = per_row[index.order]
    costs = np.zeros(index.n_traj, dtype=np.float64)
    np.maximum.at(costs, index.traj, sorted_cost)
    return costs + 1.0


_COUNTERS = (
    "rows",
    "trajectories",
    "packed_trajectories",
    "segments",
    "unique_sequences",
    "duplicate_sequences",
    "tokens",
    "padded_tokens",
    "forwards",
    "action_tokens",
    "empty_actions",
    "prefix_mismatch_rows",
    "from_token_ids",
    "from_prompt",
    "from_messages",
    "oom_backoffs",
    "forwarded_tokens",
    "shared_prefixes",
)


def new_stats() -> dict:
    return {k: 0 for k in _COUNTERS} | {"prefix_mismatch_examples": []}


def add_stats(total: dict, part: dict) -> dict:
    for k in _COUNTERS:
        total[k] += int(part.get(k, 0))
    room = 5 - len(total["prefix_mismatch_examples"])
    total["prefix_mismatch_examples"].extend(part.get("prefix_mismatch_examples", [])[: max(room, 0)])
    return total


def work_dir_for(out: str | os.PathLike) -> Path:
    """Where chunks of OUT are kept until OUT is complete: `OUT.parts/` beside it."""
    out = Path(out)
    return out.with_name(out.name + WORK_DIR_SUFFIX)


def chunk_path(work_dir: Path, rank: int, world: int, k: int) -> Path:
    return work_dir / f"rank{rank:05d}-of-{world:05d}.chunk{k:06d}.parquet"


def fingerprint(log, index, config: ScoreConfig, world: int, dtype: str) -> dict:
    """What must not change between a run and its --resume (`dtype` as resolved: fp32, bf16…)."""
    from gaca_cli.lm.models import model_fingerprint

    files = []
    for f in filter(os.path.isfile, log.files):  # a log held in memory (gaca_cli.score) has none
        st = os.stat(f)
        digest = hashlib.blake2b()
        with open(f, "rb") as handle:  # the bytes, not only size and mtime: an edit in place is caught
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        files.append([os.path.abspath(f), st.st_size, digest.hexdigest()[:32]])
    return {
        "tool": "gaca score",
        "files": files,
        "model_files": model_fingerprint(config.model, config.revision),
        "column_map": log.renamed,
        "rows": index.n_rows,
        "world_size": world,
        "options": {**config.plan_fingerprint(), "dtype": dtype},
    }


def check_work_dir(work_dir: Path, run_fingerprint: dict, resume: bool) -> int:
    """Check the work directory a previous run left, if any: it must be ours, continued only
    with --resume, and by a run with the same inputs and options. Returns its chunk count."""
    manifest = work_dir / _MANIFEST
    if work_dir.exists():
        if not manifest.exists():
            raise GacaError(
                "exists and is not a gaca score work directory; move it away or choose another -o", file=str(work_dir)
            )
        if not resume:
            raise GacaError(
                "holds the chunks of an interrupted run; add --resume to continue it, or delete "
                "the directory to start again",
                file=str(work_dir),
            )
        old = _flatten(json.loads(manifest.read_text(encoding="utf-8")))
        new = _flatten(json.loads(json.dumps(run_fingerprint)))
        if old != new:
            differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise GacaError(
                f"was started with other inputs or options (differing: {', '.join(d.removeprefix('options.') for d in differ)}); "
                "rerun with the same ones, or delete the directory to start again",
                file=str(work_dir),
            )
        return len(list(work_dir.glob("rank*.chunk*.parquet")))
    return 0


def prepare_work_dir(work_dir: Path, run_fingerprint: dict, resume: bool) -> int:
    """Check (see `check_work_dir`) and create the work directory with its manifest.
    Returns the number of chunk files already there. A work directory left empty, or with
    only the manifest's temporary file, by a run killed while it created it is removed first."""
    manifest = work_dir / _MANIFEST
    tmp = manifest.with_suffix(".tmp")
    if work_dir.is_dir() and {p.name for p in work_dir.iterdir()} <= {tmp.name}:
        # a run killed while it created the directory (before its manifest): nothing to keep
        shutil.rmtree(work_dir)
    found = check_work_dir(work_dir, run_fingerprint, resume)
    if work_dir.exists():
        for marker in work_dir.glob(STOPPED_ANY):  # of a run killed while it stopped: not this one's
            marker.unlink(missing_ok=True)
        return found
    work_dir.mkdir(parents=True)
    tmp.write_text(json.dumps(run_fingerprint, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, manifest)
    return 0


def _flatten(doc: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def write_chunk(
    path: Path,
    pos: np.ndarray,
    nll_sum: np.ndarray,
    n_tokens: np.ndarray,
    token_lps: list[np.ndarray] | None,
    stats: dict,
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {
        "pos": pa.array(pos, pa.int64()),
        C.NLL_SUM: pa.array(nll_sum, pa.float64()),
        C.N_ACTION_TOKENS: pa.array(n_tokens, pa.int32()),
    }
    if token_lps is not None:
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in token_lps])]).astype(np.int32)
        values = np.concatenate(token_lps).astype(np.float32) if token_lps else np.zeros(0, np.float32)
        cols[C.TOKEN_LOGPROBS] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()))
    table = pa.table(cols).replace_schema_metadata({_CHUNK_META: json.dumps(stats)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


@dataclass(frozen=True)
class Scores:
    """Merged per-row results in the ORIGINAL row order of the log."""

    nll_sum: np.ndarray  # float64 [N]
    n_action_tokens: np.ndarray  # int32 [N]
    token_logprobs: Any  # pa.Array list<float32> [N], or None
    stats: dict
    chunks: int


def merge_work_dir(log, index, config: ScoreConfig, work_dir: Path, world: int) -> Scores:
    """Read every rank's chunks and put the results back in the log's row order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = sorted(work_dir.glob(f"rank*-of-{world:05d}.chunk*.parquet"))
    stats = new_stats()
    tables = []
    for p in paths:
        t = pq.read_table(p)
        add_stats(stats, json.loads((t.schema.metadata or {})[_CHUNK_META.encode()]))
        tables.append(t.replace_schema_metadata(None))
    if not tables:
        raise GacaError("holds no finished chunk", file=str(work_dir))
    table = pa.concat_tables(tables)
    pos = table.column("pos").to_numpy()
    covered = np.bincount(pos, minlength=index.n_rows)
    if len(pos) != index.n_rows or covered.max() != 1:
        raise GacaError(
            f"the chunks cover {int(np.sum(covered > 0)):,} of {index.n_rows:,} rows; "
            "a rank did not finish (rerun with --resume)",
            file=str(work_dir),
        )
    original_row = index.order[pos]
    table = table.take(pa.array(np.argsort(original_row)))
    tlp = table.column(C.TOKEN_LOGPROBS).combine_chunks() if config.token_logprobs else None
    return Scores(
        nll_sum=table.column(C.NLL_SUM).to_numpy(),
        n_action_tokens=table.column(C.N_ACTION_TOKENS).to_numpy().astype(np.int32),
        token_logprobs=tlp,
        stats=stats,
        chunks=len(paths),
    )


def output_table(log, config: ScoreConfig, scores: Scores, model_meta: dict):
    """Every input column (original names, previous score columns dropped) plus the scores,
    and the key/value metadata to write."""
    import pyarrow as pa

    from gaca_cli.log.reading import restore_column_names

    owned = set(C.SCORE_OUTPUTS)
    table = log.table.select([n for n in log.table.column_names if n not in owned])
    table = restore_column_names(table, log.renamed)
    n = scores.n_action_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = scores.nll_sum / n
    table = table.append_column(C.NLL_SUM, pa.array(scores.nll_sum, pa.float64()))
    table = table.append_column(C.NLL_MEAN, pa.array(mean, pa.float64(), mask=n == 0))
    table = table.append_column(C.N_ACTION_TOKENS, pa.array(n, pa.int32()))
    if scores.token_logprobs is not None:
        table = table.append_column(C.TOKEN_LOGPROBS, scores.token_logprobs)
    metadata = dict(log.metadata)
    metadata[C.META_SCORE] = json.dumps({"tool": "gaca", "version": __version__, **model_meta}, sort_keys=True)
    return table, metadata


class Agree(Protocol):
    def __call__(self, values: list[int], op: str = "max") -> list[int]: ...


def agree_alone(values: list[int], op: str = "max") -> list[int]:
    return values


@contextmanager
def distributed_from_env() -> Iterator[tuple[int, int, Callable[[], None], Agree]]:
    """(rank, world size, barrier, agree) from torchrun / accelerate's environment (RANK,
    WORLD_SIZE); a gloo process group carries them. `agree(values, op)` is a barrier that
    returns each value's maximum (op "max": every rank learns whether any stopped on an error)
    or sum (op "sum": counters of the whole run) over the ranks. One process: (0, 1, no-op,
    the values as they are)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        yield 0, 1, lambda: None, agree_alone
        return
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.nn  # noqa: F401  (see below)

    # gloo's worker threads let go of a collective's tensors a moment after the call returns.
    # Were that the last reference, the thread would take the GIL to free the Python object,
    # and during interpreter shutdown that aborts the process ("terminate called without an
    # active exception", seen on rank 1, which exits first). The tensors are therefore kept
    # here until the process group is gone, and it does go: torch.distributed.nn, which
    # transformers imports while loading a model, keeps the group it finds at import in
    # default arguments, so it is imported above, before there is one.
    sent: list[torch.Tensor] = []

    def agree(values: list[int], op: str = "max") -> list[int]:
        t = torch.tensor(values, dtype=torch.int64)
        sent.append(t)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return [int(x) for x in t.tolist()]

    made_here = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(days=7))  # shards may take hours
        made_here = True
    try:
        yield dist.get_rank(), dist.get_world_size(), dist.barrier, agree
    finally:
        if made_here:
            dist.destroy_process_group()  # joins gloo's threads
            sent.clear()
