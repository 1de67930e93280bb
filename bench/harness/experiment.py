"""The offline-improvement experiment: does `gaca train-offline` make a policy better, and which
advantage estimator helps most? Paired seeds, held-out games, 95 % intervals.

Design (`bench/experiment.py` runs it):
* Games: key quests (`key_quests.py` beside this module): several rooms, distractor objects, one decisive step
  (take the key whose colour the quest names). Training games and held-out games are
  different generation seeds.
* Start model: a tiny Llama fitted by behaviour cloning to the training games' walkthroughs
  (`textworld_bc.warm_start`), shared by every method and seed.
* For each seed s, each method M from the same start model, K iterations of
      collect (training games, N rollouts each, sampling seed 1000·s + k)
      → advantages (`compute_advantages`, as `gaca advantages --method M`)
      → train-offline (`train`, as `gaca train-offline`)
  and a final collect; the held-out games are played by the start model and by each final
  model (sampling seed 1000·s + 500 + k, k = 0 and K). Iteration 0's collections are the
  start model's and are shared by all methods of the seed, so every method learns from the
  same first log.
* `gaca score` is not run: the logs are sampled at temperature 1 from the model being
  updated, so their `behavior_logprobs` are that model's log-probabilities, which is what
  `gaca score` would add (GACA reads its NLL from them; the PPO ratio uses them as μ).
* Methods: "start" (no update), "filtered-bc" (advantage 1 on every step of a successful
  rollout, 0 elsewhere: behaviour cloning on the successes), "grpo", "gigpo", "gaca" (β of
  AdvantagesConfig) and "gaca:B" (β = B). Every method uses the same update (loss, lr,
  epochs, batch size, KL to the start model): only the advantage column differs.
* An update is skipped (the model kept) when every advantage is 0: nothing to learn from.
  (`train` itself skips the logged steps whose advantage is 0, so filtered-bc takes fewer
  optimiser steps than the estimators: only the successes have a non-zero advantage.)

The library returns plain data (`ExperimentResult`); statistics over seeds live in
`statistics.py` and `summarise` below.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from bench.harness import key_quests as kq
from bench.harness.statistics import detectable_effect, mean_ci, seeds_needed
from gaca_cli.config import ConfigError
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.lm.train_config import Loss

#: progress callback: one line for people
Say = Callable[[str], None]

START = "start"
FILTERED_BC = "filtered-bc"
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Method:
    """One arm of the experiment: how the advantage column of an update is made."""

    label: str
    estimator: str | None  # an estimator of gaca advantages; None for start and filtered-bc
    beta: float | None = None


def parse_method(text: str) -> Method:
    """ "start", "filtered-bc", an estimator name ("grpo", "gigpo", "gaca") or "gaca:B"."""
    from gaca_cli.credit.config import METHODS

    name, _, beta = text.strip().partition(":")
    if name in (START, FILTERED_BC) and not beta:
        return Method(name, None)
    if name in METHODS and not beta:
        return Method(name, name)
    if name == "gaca" and beta:
        try:
            value = float(beta)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return Method(f"gaca:{value:g}", "gaca", value)
    raise ConfigError(
        "methods",
        f"method {text!r} is not valid; use start, filtered-bc, {', '.join(METHODS)} or gaca:B (B = β ≥ 0)",
    )


@dataclass(frozen=True)
class ExperimentConfig:
    """Sizes and the shared update of the experiment (defaults: the full run of
    `bench/experiment.py`)."""

    out: Path
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    methods: tuple[str, ...] = (START, FILTERED_BC, "grpo", "gigpo", "gaca", "gaca:1")
    train_games: int = 16
    heldout_games: int = 16
    rollouts: int = 8  # per game and iteration
    iterations: int = 2
    max_steps: int = 20
    rooms: int = 4
    keys: int = 2
    distractors: int = 4
    # the start model: fitted to the walkthroughs of the first bc_games quests (≥ train_games:
    # the training games and more of the same kind, never the held-out ones)
    bc_games: int = 32
    bc_steps: int = 1500
    bc_lr: float = 3e-3
    # sampling
    temperature: float = 1.0
    max_new_tokens: int = 8
    # the update, the same for every method
    loss: Loss = "ppo"
    lr: float = 3e-4
    epochs: int = 1
    batch_size: int = 32
    kl_coef: float = 0.05
    gamma: float = 0.95
    threads: int = 1  # torch threads per worker

    def __post_init__(self) -> None:
        for name in ("train_games", "heldout_games", "max_steps", "bc_steps", "epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"{name} = {getattr(self, name)!r} is not valid; use an integer ≥ 1")
        if self.rollouts < 2:
            raise ConfigError(
                "rollouts", f"rollouts = {self.rollouts} is not valid; use ≥ 2 (a group needs a baseline)"
            )
        if self.iterations < 1:
            raise ConfigError("iterations", f"iterations = {self.iterations} is not valid; use an integer ≥ 1")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("seeds", f"seeds = {self.seeds} is not valid; use distinct integers")
        labels = [parse_method(m).label for m in self.methods]
        if len(set(labels)) != len(labels):
            raise ConfigError("methods", f"methods = {','.join(self.methods)!r} is not valid; name each method once")
        if not self.lr > 0:
            raise ConfigError("lr", f"lr = {self.lr!r} is not valid; use a learning rate > 0, e.g. 1e-4")

    @property
    def arms(self) -> list[Method]:
        return [parse_method(m) for m in self.methods]

    def games(self, split: str) -> list[tuple[str, kq.QuestSpec]]:
        """(name, spec) of the training games (seeds 0..), of the behaviour-cloning games
        ("bc", seeds 0.., a superset) or of the held-out games (seeds 10000..)."""
        n, first = {
            "train": (self.train_games, 0),
            "bc": (max(self.bc_games, self.train_games), 0),
            "heldout": (self.heldout_games, 10_000),
        }[split]
        specs = kq.quest_specs(n, first, rooms=self.rooms, keys=self.keys, distractors=self.distractors)
        return [(s.name, s) for s in specs]


# ---------------------------------------------------------------------------- the loop


def start_model(config: ExperimentConfig, say: Say | None = None) -> Path:
    """The behaviour-cloned start model in OUT/start-model (kept when it exists)."""
    from gaca_cli.demo import textworld_bc as bc

    path = Path(config.out) / "start-model"
    if not (path / "config.json").exists():
        if say:
            say(f"behaviour cloning on {config.bc_games} walkthroughs ({config.bc_steps} steps)")
        bc.warm_start(
            path, config.games("bc"), config.bc_steps, noisy_rollouts=8, max_steps=config.max_steps,
            lr=config.bc_lr, seed=0,
        )  # fmt: skip
    return path


def collect(model: Path, games, config: ExperimentConfig, seed: int, out: Path) -> float:
    """Play every game `rollouts` times with the model (kept when `out` exists); success rate."""
    import pyarrow.parquet as pq

    from gaca_cli.demo import textworld_games as tw
    from gaca_cli.log.writing import write_parquet_atomic

    if not out.exists():
        policy = tw.LMPolicy(model, temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=seed)
        table = tw.collect_lockstep(games, policy, config.rollouts, config.max_steps, seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(table, out, {})
    return tw.success_rate(pq.read_table(out, columns=["step_idx", "success"]))


def success_advantages(log: Path, out: Path) -> None:
    """filtered-bc's advantage column: 1.0 on every step of a successful rollout, else 0.0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gaca_cli.log.writing import write_parquet_atomic

    table = pq.read_table(log)
    advantage = table["success"].cast(pa.float64())
    write_parquet_atomic(table.append_column("advantage", advantage), out, {})


def estimator_advantages(log: Path, method: Method, config: ExperimentConfig, out: Path) -> None:
    """`gaca advantages LOG --method M [--beta B] --gamma G -o OUT`, in process."""
    from gaca_cli.credit.reading import read_for_advantages
    from gaca_cli.credit.run import compute_advantages, gc_paused
    from gaca_cli.credit.writing import write_annotated

    assert method.estimator is not None
    options: dict = {"method": method.estimator, "gamma": config.gamma}
    if method.beta is not None:
        options["beta"] = method.beta
    advantages_config = AdvantagesConfig(**options)
    with gc_paused():
        log_ = read_for_advantages([str(log)], {}, advantages_config)
        write_annotated(compute_advantages(log_, advantages_config), str(out), [str(log)], {})


def has_signal(annotated: Path) -> bool:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    advantage = pq.read_table(annotated, columns=["advantage"])["advantage"]
    return bool(pc.any(pc.not_equal(advantage, 0.0)).as_py())


def train_config(model: Path, config: ExperimentConfig, seed: int):
    from gaca_cli.lm.train_config import TrainConfig

    return TrainConfig(
        model=str(model),
        loss=config.loss,
        lr=config.lr,
        epochs=config.epochs,
        batch_size=config.batch_size,
        kl_coef=config.kl_coef,
        seed=seed,
        device="cpu",
        save_every=0,
    )


def update(model: Path, start: Path, log: Path, method: Method, work: Path, config: ExperimentConfig, seed: int):
    """advantages → train-offline; returns (new model, whether it was updated)."""
    from gaca_cli.lm.training import train
    from gaca_cli.log.reading import read_log

    new_model = work / "model"
    if (new_model / "config.json").exists():
        return new_model, True
    work.mkdir(parents=True, exist_ok=True)
    annotated = work / "advantages.parquet"
    if not annotated.exists():
        if method.label == FILTERED_BC:
            success_advantages(log, annotated)
        else:
            estimator_advantages(log, method, config, annotated)
    if not has_signal(annotated):
        return model, False
    train(read_log([str(annotated)]), train_config(model, config, seed), new_model)
    return new_model, True


def run_seed(config: ExperimentConfig, seed: int, say: Say | None = None) -> dict:
    """Every method on one seed: {"success": {method: {split: [iteration 0..K]}},
    "updated": {method: [bool per update]}, "seconds": float}."""
    import torch

    from gaca_cli.lm.models import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(config.threads)
    clock = time.perf_counter()
    out = Path(config.out) / f"seed{seed}"
    start = start_model(config)
    games = {split: config.games(split) for split in SPLITS}

    def play(model: Path, k: int, where: Path) -> dict[str, float]:
        """Success on the training games; on the held-out ones only at iterations 0 and K
        (NaN in between: held-out collections cost time and are read at the end)."""
        seeds = {"train": 1000 * seed + k, "heldout": 1000 * seed + 500 + k}
        return {
            split: collect(model, games[split], config, seeds[split], where / f"{split}.parquet")
            if split == "train" or k in (0, config.iterations)
            else math.nan
            for split in SPLITS
        }

    first = play(start, 0, out / "iter0")
    success: dict[str, dict[str, list[float]]] = {}
    updated: dict[str, list[bool]] = {}
    for method in config.arms:
        curves = {split: [first[split]] for split in SPLITS}
        flags: list[bool] = []
        model = start
        for k in range(config.iterations):
            if method.label != START:
                log = out / "iter0" / "train.parquet" if k == 0 else out / method.label / f"iter{k}" / "train.parquet"
                work = out / method.label / f"update{k}"
                model, changed = update(model, start, log, method, work, config, seed)
                flags.append(changed)
                now = play(model, k + 1, out / method.label / f"iter{k + 1}")
            else:
                now = first  # the start model does not change: its iteration-0 numbers hold
            for split in SPLITS:
                curves[split].append(now[split])
            if say:
                say(f"seed {seed} {method.label} iteration {k + 1}: success train {now['train']:.3f}, "
                    f"held-out {now['heldout']:.3f}")  # fmt: skip
        success[method.label] = curves
        updated[method.label] = flags
    return {"success": success, "updated": updated, "seconds": time.perf_counter() - clock}


@dataclass
class ExperimentResult:
    config: ExperimentConfig
    per_seed: dict[int, dict] = field(default_factory=dict)
    seconds: float = 0.0


def run_experiment(config: ExperimentConfig, say: Say | None = None, workers: int = 1) -> ExperimentResult:
    """The start model, then every seed (in `workers` processes); resumable from config.out."""
    from gaca_cli.lm.models import quiet_transformers

    quiet_transformers()
    clock = time.perf_counter()
    Path(config.out).mkdir(parents=True, exist_ok=True)
    start_model(config, say)
    result = ExperimentResult(config)
    if workers <= 1:
        for seed in config.seeds:
            result.per_seed[seed] = run_seed(config, seed, say)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(run_seed, config, seed): seed for seed in config.seeds}
            for future in as_completed(futures):
                seed = futures[future]
                result.per_seed[seed] = future.result()
                if say:
                    say(f"seed {seed} done in {result.per_seed[seed]['seconds']:.0f} s")
    result.seconds = time.perf_counter() - clock
    return result


# ---------------------------------------------------------------------------- statistics


def summarise(result: ExperimentResult, reference: str = "gigpo") -> dict:
    """Per split, method and iteration: mean success with its 95 % interval over seeds; the
    paired differences against the start model and against `reference` (when present); and
    the power estimate from the spread of the paired differences at the last iteration."""
    config = result.config
    seeds = sorted(result.per_seed)
    labels = [m.label for m in config.arms]
    k_max = config.iterations

    def values(split: str, label: str, k: int) -> np.ndarray:
        return np.array([result.per_seed[s]["success"][label][split][k] for s in seeds], dtype=np.float64)

    def interval(x: np.ndarray) -> dict:
        """mean_ci of the seeds' values; all None where the iteration was not measured (NaN)."""
        if np.isnan(x).all():
            return {"mean": None, "low": None, "high": None, "half_width": None, "sd": None, "n": 0}
        return mean_ci(x).as_dict()

    summary: dict = {"seeds": seeds, "methods": labels, "iterations": k_max, "splits": {}}
    for split in SPLITS:
        table: dict = {"success": {}, "vs_start": {}, f"vs_{reference}": {}}
        for label in labels:
            table["success"][label] = [interval(values(split, label, k)) for k in range(k_max + 1)]
            if label != START and START in labels:
                table["vs_start"][label] = [
                    interval(values(split, label, k) - values(split, START, k)) for k in range(k_max + 1)
                ]
            if label != reference and reference in labels:
                table[f"vs_{reference}"][label] = [
                    interval(values(split, label, k) - values(split, reference, k)) for k in range(k_max + 1)
                ]
        summary["splits"][split] = table
    summary["power"] = power_estimate(result, seeds)
    summary["updated"] = {
        label: [bool(all(result.per_seed[s]["updated"][label][k] for s in seeds)) for k in range(k_max)]
        for label in labels
        if label != START
    }
    return summary


def power_estimate(result: ExperimentResult, seeds: list[int]) -> dict:
    """From the measured spread: the standard deviation over seeds of the start model's
    success (sampling noise of one collection), of the paired difference method − start at the
    last iteration (pooled over methods: sampling + training noise), the effect n seeds detect
    with power 0.8, and the seeds needed for a 5-point difference."""
    config = result.config
    if len(seeds) < 2:
        return {}
    out: dict = {}
    for split in SPLITS:
        start = np.array([result.per_seed[s]["success"][config.arms[0].label][split][0] for s in seeds])
        diffs = [
            np.array([result.per_seed[s]["success"][m.label][split][-1] for s in seeds]) - start
            for m in config.arms
            if m.label != START
        ]
        sd_diff = float(np.sqrt(np.mean([d.var(ddof=1) for d in diffs]))) if diffs else math.nan
        out[split] = {
            "sd_start_over_seeds": float(start.std(ddof=1)),
            "sd_paired_difference": sd_diff,
            "detectable_effect": detectable_effect(sd_diff, len(seeds)) if math.isfinite(sd_diff) else None,
            "seeds_for_5_points": seeds_needed(sd_diff, 0.05) if math.isfinite(sd_diff) else None,
        }
    return out


def result_json(result: ExperimentResult, summary: dict) -> dict:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result.config).items()}
    return {
        "config": config,
        "rollouts_per_iteration": {
            "train": result.config.train_games * result.config.rollouts,
            "heldout": result.config.heldout_games * result.config.rollouts,
        },
        "per_seed": {str(s): r for s, r in sorted(result.per_seed.items())},
        "summary": summary,
        "seconds": result.seconds,
    }


def quick(config: ExperimentConfig) -> ExperimentConfig:
    """The reduced sizes of `--quick`."""
    return replace(
        config, seeds=config.seeds[:3], train_games=8, heldout_games=4, rollouts=6, bc_games=16, bc_steps=600
    )


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
