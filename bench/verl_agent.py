"""Time per training batch: GACA's verl-agent adapter against verl-agent's GiGPO.

The batch is a verl-agent training batch of 16 groups x 8 rollouts x 50 steps (6,400 rows,
256 response tokens each, right-padded responses, rows shuffled as balance_batch leaves
them). The adapter is `gaca_cli.integrations.verl_agent.compute_gaca_outcome_advantage` (GACA,
β = 0.1, verl-agent's conventions); the baseline is the test suite's torch reference of
verl-agent's `compute_gigpo_outcome_advantage` (tests/integrations/verl_agent_reference.py,
which keeps verl-agent's per-row loops). Both get the same batch, on CPU tensors and, when
torch sees a GPU, on CUDA tensors. The adapter at β = 0 is also checked against the baseline.

    python bench/verl_agent.py [--repeats 5] [--groups 16 --rollouts 8 --steps 50 --tokens 256]

Prints one line per case: the median seconds per batch of each, and the ratio adapter /
baseline (target: at most 1).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gaca_cli.integrations.verl_agent import compute_gaca_outcome_advantage  # noqa: E402
from tests.integrations.verl_agent_reference import gigpo_reference  # noqa: E402

PLACES = ["kitchen", "hall", "cellar", "attic", "garden", "study"]
HELD = ["nothing", "a key", "a lamp", "a key and a lamp"]


def make_batch(groups: int, rollouts: int, steps: int, tokens: int, seed: int = 0) -> dict:
    """The batch's tensors and arrays (CPU), rows shuffled."""
    rng = np.random.default_rng(seed)
    n = groups * rollouts * steps
    index = np.repeat([f"uid-{g}" for g in range(groups)], rollouts * steps).astype(object)
    traj = np.repeat([f"traj-{k}" for k in range(groups * rollouts)], steps).astype(object)
    step = np.tile(np.arange(steps), groups * rollouts)
    place = rng.integers(0, len(PLACES), n)
    held = np.minimum(step // 12, len(HELD) - 1)
    anchors = np.array(
        [f"You are in the {PLACES[p]}. You hold {HELD[h]}. Exits: north, south." for p, h in zip(place, held)],
        dtype=object,
    )
    reward = rng.integers(0, 3, n) / 4.0
    G = np.zeros(n)
    for start in range(0, n, steps):  # rows are still in trajectory order here
        running = 0.0
        for t in reversed(range(start, start + steps)):
            running = reward[t] + 0.95 * running
            G[t] = running
    R = np.add.reduceat(reward, np.arange(0, n, steps)).repeat(steps)
    valid = rng.integers(1, tokens + 1, n)
    order = rng.permutation(n)
    mask = torch.from_numpy((np.arange(tokens)[None, :] < valid[order, None]).astype(np.int64))
    tlr = torch.zeros(n, tokens, dtype=torch.float32)
    tlr[torch.arange(n), torch.from_numpy(valid[order] - 1)] = torch.from_numpy(R[order]).float()
    return {
        "token_level_rewards": tlr,
        "step_rewards": torch.from_numpy(G[order]).float(),
        "response_mask": mask,
        "anchor_obs": anchors[order],
        "index": index[order],
        "traj_index": traj[order],
        "old_log_prob": -torch.from_numpy(rng.gamma(1.0, 0.7, (n, tokens))).float(),
    }


def on(batch: dict, device: str) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def timed(fn, repeats: int, device: str) -> tuple[float, torch.Tensor]:
    """Median seconds of `repeats` calls, and the advantages of the last."""
    times, out = [], None
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()[0]
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    assert out is not None
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-similarity", action="store_true", help="skip the (slow) similarity case")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu_batch = make_batch(args.groups, args.rollouts, args.steps, args.tokens)
    n = len(cpu_batch["index"])
    cases = [("exact anchors, mean_norm", {}), ("exact anchors, mean_std_norm", {"mode": "mean_std_norm"})]
    if not args.no_similarity:
        cases.append(("similarity 0.95, mean_norm", {"enable_similarity": True, "similarity_thresh": 0.95}))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"batch: {n} rows x {args.tokens} tokens ({args.groups} groups x {args.rollouts} x {args.steps} steps)")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, median of {args.repeats}")
    print("| device | case | GiGPO reference s | GACA adapter s | ratio | max abs diff at β = 0 |")
    print("|---|---|---:|---:|---:|---:|")
    for device in devices:
        batch = on(cpu_batch, device)
        gigpo_args = {k: v for k, v in batch.items() if k != "old_log_prob"}
        for name, options in cases:
            repeats = 1 if options.get("enable_similarity") else args.repeats
            compute_gaca_outcome_advantage(**batch, **options)  # imports and first-call set-up, not timed
            ref_s, ref = timed(functools.partial(gigpo_reference, **gigpo_args, **options), repeats, device)
            gaca = functools.partial(compute_gaca_outcome_advantage, **batch, **options)
            gaca_s, _ = timed(gaca, repeats, device)
            beta0 = compute_gaca_outcome_advantage(**batch, **options, beta=0.0)[0]
            diff = float((beta0 - ref).abs().max())
            print(f"| {device} | {name} | {ref_s:.3f} | {gaca_s:.3f} | {gaca_s / ref_s:.3f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
