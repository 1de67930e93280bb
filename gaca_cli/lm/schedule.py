"""The schedule and batches of `gaca train-offline`: pure functions of (config, step), so that
every process builds the same batches and a resumed run continues where it stopped."""

from __future__ import annotations

import math

import numpy as np

from gaca_cli.lm.train_config import TrainConfig


def total_steps(n_sequences: int, config: TrainConfig) -> int:
    """`max_steps` if given, else epochs × ⌈S / batch_size⌉."""
    if config.max_steps is not None:
        return config.max_steps
    return config.epochs * math.ceil(n_sequences / config.batch_size)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr used by optimiser step `step` (0-based) out of `total`:

        step < W:   (step + 1) / W                                   (linear warm-up)
        else:       m + (1 − m) · ½ · (1 + cos(π · (step − W) / (total − W)))

    with W = warmup steps and m = min_ratio. The first step already moves (lr·1/W) and the last
    step's lr stays above m·lr. Example: total = 10, W = 2, m = 0: 0.5, 1, 1, 0.962, 0.854, …
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps(total: int, config: TrainConfig) -> int:
    return int(round(config.warmup_ratio * total))


class BatchPlan:
    """Which sequences make optimiser step k: epoch e = k // steps_per_epoch, a permutation of
    the sequences drawn from numpy's default_rng([seed, e]), cut into `batch_size` slices (the
    last one of an epoch may be shorter). A pure function of (seed, step): `--resume` needs no
    sampler state."""

    def __init__(self, n_sequences: int, batch_size: int, seed: int) -> None:
        self.n = n_sequences
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = math.ceil(n_sequences / batch_size)
        self._cache: tuple[int, np.ndarray] | None = None

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def batch(self, step: int) -> np.ndarray:
        epoch = self.epoch_of(step)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        k = step % self.steps_per_epoch
        return self._cache[1][k * self.batch_size : (k + 1) * self.batch_size]


def micro_batches(lengths: np.ndarray, max_batch_tokens: int, rank: int = 0, world: int = 1) -> list[np.ndarray]:
    """Split one optimiser step's sequences (given by their lengths) into micro-batches.

    Sequences are sorted by length (longest first) and dealt round-robin to the `world`
    processes; each process packs its share greedily so that (sequences × longest length)
    ≤ `max_batch_tokens` (a single longer sequence forms its own micro-batch). Returns
    positions into `lengths`; an empty list when this process gets no sequence.
    """
    order = np.argsort(-lengths, kind="stable")[rank::world]
    out: list[np.ndarray] = []
    current: list[int] = []
    longest = 0
    for pos in order:
        length = int(lengths[pos])
        if current and (len(current) + 1) * max(longest, length) > max_batch_tokens:
            out.append(np.asarray(current, dtype=np.int64))
            current, longest = [], 0
        current.append(int(pos))
        longest = max(longest, length)
    if current:
        out.append(np.asarray(current, dtype=np.int64))
    return out
