"""Synthetic trajectory logs for the benchmarks (log-schema.md, version 1).

The shape follows a verl-agent style training run on a text environment:

- episode groups of 8 rollouts (`group_id`, a uuid-like string, like verl-agent's `uid`);
- trajectories of 20..30 steps (mean 25), `traj_id` a uuid-like string;
- rows written batch by batch, and inside a batch interleaved by step (all active rollouts'
  step 0, then step 1, ...), the order in which a rollout worker appends them
  (`order="interleaved"`, the default); `order="canonical"` writes them already sorted by
  (group_id, traj_id, step_idx), the order `gaca` computes in, so no gather is needed;
- `anchor_obs`: a 100..300 character observation. Every rollout of a group shares the
  initial state; later steps revisit one of two shared states per 3-step window of their group
  with probability `SHARED_P`, so that about 30 % of all steps have a step group of size > 1;
  every other step has its own text;
- `reward`: sparse, 1.0 on the last step of a successful rollout, else 0.0;
- `done`: true on the last step unless the rollout hit the step limit;
- `nll_mean`: action NLL in nats per token (gamma distributed), null on ~2 % of steps.

Everything is built with numpy / pyarrow kernels (no per-row Python), in batches, and written
with zstd. `ensure_log(rows)` caches the file under bench/data/ (git-ignored).

    python bench/synth.py --rows 1000000            # writes bench/data/synth-v1-1000000-s0.parquet
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DATA_DIR = Path(__file__).resolve().parent / "data"
VERSION = 1  # bump when the generator changes, so cached files are rebuilt
ROLLOUTS = 8
MIN_STEPS, MAX_STEPS = 20, 30
SHARED_P = 0.29  # chance that a step after step 0 lands on a shared state of its group
NLL_NULL_P = 0.02
GROUPS_PER_BATCH = 2000  # ~400k rows per batch (one Parquet row group each)

_ROOMS = (
    "kitchen",
    "hallway",
    "bedroom",
    "garage",
    "cellar",
    "study",
    "attic",
    "bathroom",
    "pantry",
    "living room",
    "laundry room",
    "garden shed",
)
_THINGS = (
    "a countertop 1",
    "a drawer 2",
    "a cabinet 3",
    "a fridge 1",
    "a microwave 1",
    "a sinkbasin 1",
    "a stoveburner 2",
    "a toaster 1",
    "a shelf 4",
    "a desk 1",
    "a bed 1",
    "a safe 1",
    "a garbagecan 1",
    "a coffeemachine 1",
    "a dresser 1",
    "a sidetable 2",
    "a laundryhamper 1",
    "a armchair 1",
)
_INVENTORY = (
    "You are carrying nothing.",
    "You are carrying: a mug 1.",
    "You are carrying: a knife 2.",
    "You are carrying: a key 1 and a lamp 1.",
    "You are carrying: a cloth 3, which is wet.",
    "You are carrying: a potato 1, which is hot.",
)


def _templates(n: int = 48, seed: int = 12345) -> list[str]:
    """Room descriptions of 80..240 characters (made once, in Python: n is small)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        room = _ROOMS[i % len(_ROOMS)]
        k = int(rng.integers(2, 10))
        things = ", ".join(_THINGS[j] for j in rng.choice(len(_THINGS), size=k, replace=False))
        text = f"You are in the {room}. Looking quickly around you, you see {things}."
        out.append(text[:240])
    return out


TEMPLATES = _templates()


def _uuid_strings(rng: np.random.Generator, n: int, sort: bool = False) -> pa.Array:
    """n random uuid4-like strings ('8-4-4-4-12' lowercase hex), built from buffers;
    `sort` returns them in ascending (byte) order."""
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # variant
    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    nibbles = np.empty((n, 32), dtype=np.uint8)
    nibbles[:, 0::2] = hexdigits[raw >> 4]
    nibbles[:, 1::2] = hexdigits[raw & 0x0F]
    chars = np.full((n, 36), ord("-"), dtype=np.uint8)
    for dst, src in (
        (slice(0, 8), slice(0, 8)),
        (slice(9, 13), slice(8, 12)),
        (slice(14, 18), slice(12, 16)),
        (slice(19, 23), slice(16, 20)),
        (slice(24, 36), slice(20, 32)),
    ):
        chars[:, dst] = nibbles[:, src]
    if sort:
        chars = np.sort(chars.view("S36").ravel()).view(np.uint8).reshape(n, 36)
    offsets = np.arange(0, 36 * (n + 1), 36, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def _lengths(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Trajectory lengths summing to exactly `rows` (the last one may be shorter)."""
    n = rows // MIN_STEPS + 1
    lengths = rng.integers(MIN_STEPS, MAX_STEPS + 1, size=n)
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, rows)) + 1
    lengths = lengths[:k].copy()
    lengths[-1] -= int(ends[k - 1] - rows)
    return lengths


def _batch(
    rng: np.random.Generator,
    lengths: np.ndarray,
    first_traj: int,
    traj_ids: pa.Array,
    group_ids: pa.Array,
    templates: pa.Array,
    inventory: pa.Array,
    interleave: bool,
) -> pa.Table:
    """One rollout batch: trajectories first_traj .. first_traj + len(lengths) - 1."""
    n_traj = len(lengths)
    traj_global = first_traj + np.arange(n_traj, dtype=np.int64)
    group_global = traj_global // ROLLOUTS
    total = int(lengths.sum())
    traj_local = np.repeat(np.arange(n_traj, dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    step = np.arange(total, dtype=np.int64) - starts[traj_local]
    last = step == (lengths - 1)[traj_local]

    # sparse reward at the end: success probability varies by task (group)
    p_success = rng.beta(2.0, 2.0, size=int(group_global[-1] - group_global[0]) + 1)
    success = rng.random(n_traj) < p_success[group_global - group_global[0]]
    reward = np.where(last & success[traj_local], 1.0, 0.0)
    done = last & (lengths < MAX_STEPS)[traj_local]

    # anchor states: shared initial state, shared states per 3-step window, else unique
    g = group_global[traj_local]
    shared = rng.random(total) < SHARED_P
    shared_state = g * 1000 + (step // 3) * 2 + rng.integers(0, 2, size=total)
    # unique states: 10^12 + a number no other row uses (a batch has < 64 rows per trajectory)
    unique_state = 10**12 + first_traj * 64 + np.arange(total)
    state = np.where(step == 0, g * 1000 + 999, np.where(shared, shared_state, unique_state))
    mix = (state.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    tpl = (mix % np.uint64(len(templates))).astype(np.int64)
    inv = ((mix >> np.uint64(8)) % np.uint64(len(inventory))).astype(np.int64)
    anchor = pc.binary_join_element_wise(
        templates.take(pa.array(tpl)),
        inventory.take(pa.array(inv)),
        pa.scalar("You stand on tile", pa.large_string()),
        pc.cast(pa.array(state), pa.large_string()),
        pa.scalar(" ", pa.large_string()),
    )

    nll = rng.gamma(2.0, 0.2, size=total)
    nll_null = rng.random(total) < NLL_NULL_P

    # rows in logging order: step-major within the batch (or trajectory-major)
    order = np.lexsort((traj_local, step)) if interleave else np.arange(total)
    take = pa.array(order)
    return pa.table(
        {
            "group_id": group_ids.take(pa.array(group_global[traj_local[order]])),
            "traj_id": traj_ids.take(pa.array(traj_global[traj_local[order]])),
            "step_idx": pa.array(step[order]),
            "reward": pa.array(reward[order]),
            "done": pa.array(done[order]),
            "anchor_obs": anchor.take(take),
            "nll_mean": pa.array(nll[order], mask=nll_null[order]),
        }
    )


ORDERS = ("interleaved", "canonical")


def generate(rows: int, path: str | Path, seed: int = 0, order: str = "interleaved") -> Path:
    """Write a synthetic log of exactly `rows` rows to `path` (atomically)."""
    if order not in ORDERS:
        raise ValueError(f"order = {order!r}; use one of {', '.join(ORDERS)}")
    canonical = order == "canonical"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lengths = _lengths(rng, rows)
    n_traj = len(lengths)
    n_groups = (n_traj + ROLLOUTS - 1) // ROLLOUTS
    traj_ids = _uuid_strings(rng, n_traj, sort=canonical)
    group_ids = _uuid_strings(rng, n_groups, sort=canonical)
    templates = pa.array(TEMPLATES, type=pa.large_string())
    inventory = pa.array(_INVENTORY, type=pa.large_string())
    tmp = path.with_name(f".{path.name}.tmp")
    writer = None
    try:
        per_batch = GROUPS_PER_BATCH * ROLLOUTS
        for first in range(0, n_traj, per_batch):
            table = _batch(
                rng,
                lengths[first : first + per_batch],
                first,
                traj_ids,
                group_ids,
                templates,
                inventory,
                interleave=not canonical,
            )
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=table.num_rows)
        assert writer is not None
        writer.close()
        writer = None
        tmp.replace(path)
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    return path


def cached_path(rows: int, seed: int = 0, data_dir: Path = DATA_DIR, order: str = "interleaved") -> Path:
    suffix = "" if order == "interleaved" else f"-{order}"
    return Path(data_dir) / f"synth-v{VERSION}-{rows}-s{seed}{suffix}.parquet"


def ensure_log(rows: int, seed: int = 0, data_dir: Path = DATA_DIR, order: str = "interleaved") -> Path:
    """The cached synthetic log of `rows` rows, generated on first use."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    ignore = data_dir / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# generated benchmark logs (bench/synth.py)\n*\n")
    path = cached_path(rows, seed, data_dir, order)
    if not path.exists():
        t0 = time.perf_counter()
        print(f"generating {rows:,} rows -> {path} ...", file=sys.stderr, flush=True)
        generate(rows, path, seed, order)
        print(f"  done in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--order",
        choices=ORDERS,
        default="interleaved",
        help="row order in the file (canonical = already sorted by group, trajectory, step)",
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="default: the cache under bench/data/")
    args = parser.parse_args(argv)
    if args.output is None:
        print(ensure_log(args.rows, args.seed, order=args.order))
    else:
        print(generate(args.rows, args.output, args.seed, args.order))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
