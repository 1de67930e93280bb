"""`gaca demo`: the whole pipeline, small, on CPU, from nothing.

1. TextWorld games are generated and compiled locally (no network) and a tiny Llama is fitted
   to their walkthroughs by behaviour cloning, so that its success rate starts between 0 and 1.
2. The offline improvement loop, for each method from the same start model and seeds:
   collect → `gaca score` → `gaca advantages --method M` → `gaca train-offline` → collect.
   The gaca steps run as subprocesses, exactly as a user types them (their output goes to
   OUT/commands.log).
3. The estimator-quality table on the tabular environment with exact Q − V (`quality.py`).

The library reports progress through a callback and returns plain data; the command renders.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gaca_cli.config import ConfigError, check_choices, invalid
from gaca_cli.credit.config import METHODS, Method
from gaca_cli.errors import GacaError

#: progress callback: (stage, done, total, message)
Progress = Callable[[str, int, int, str], None]
Z_975 = 1.959963984540054  # the 0.975 quantile of the standard normal


def wilson_interval(wins: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a success rate p̂ = wins/n (n ≥ 1):
    (p̂ + z²/2n ± z·√(p̂(1 − p̂)/n + z²/4n²)) / (1 + z²/n), z = z_0.975. Unlike p̂ ± z·√(p̂(1 − p̂)/n),
    it stays inside [0, 1] and does not shrink to a point at 0 or n wins."""
    p, z2 = wins / n, Z_975**2
    centre, half = p + z2 / (2 * n), Z_975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (centre - half) / (1 + z2 / n), (centre + half) / (1 + z2 / n)


@dataclass(frozen=True)
class DemoConfig:
    """Sizes of the demo; the defaults run in a few minutes on 2 CPU cores. The fields with a
    help text are the options of `gaca demo`."""

    out: Path
    games: int = field(default=3, metadata={"help": "TextWorld games (episode groups)."})
    rollouts: int = field(default=8, metadata={"help": "Rollouts per game and iteration."})
    max_steps: int = 10
    iterations: int = field(default=1, metadata={"help": "Offline updates per method."})
    methods: tuple[Method, ...] = field(
        default=("grpo", "gigpo", "gaca"), metadata={"help": "Comma-separated estimators to compare."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the warm start, the collections and the updates."})
    bc_steps: int = field(default=120, metadata={"help": "Behaviour-cloning steps of the start model."})
    lr: float = 2e-4
    epochs: int = 1
    quality_seeds: tuple[int, ...] = (0, 1, 2)
    games_dir: Path | None = None

    def __post_init__(self) -> None:
        check_choices(self)
        for name in ("games", "rollouts", "max_steps", "bc_steps", "epochs"):
            if getattr(self, name) < 1:
                invalid(self, name, "an integer ≥ 1")
        if self.rollouts < 2:
            invalid(self, "rollouts", "≥ 2 (a group needs a baseline)")
        if self.iterations < 0:
            invalid(self, "iterations", "an integer ≥ 0")
        if not self.methods:
            raise ConfigError("methods", "methods = '' is not valid; use names from " + ", ".join(METHODS))
        if not 0 <= self.seed < 2**32:
            invalid(self, "seed", "an integer in [0, 2**32)")
        if not self.lr > 0:
            invalid(self, "lr", "a learning rate > 0, e.g. 2e-4")


@dataclass
class DemoResult:
    success: dict[str, list[float]] = field(default_factory=dict)  # method -> per iteration
    rollouts: int = 0  # trajectories behind each success rate (games × rollouts)
    annotated: Path | None = None  # iteration-0 log annotated by gaca (for the inspect view)
    quality: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def _require_textworld() -> None:
    try:
        import textworld  # noqa: F401
    except ImportError:
        raise GacaError(
            "gaca demo plays TextWorld games, and the textworld package is not installed; "
            "run: pip install 'gaca-cli[textworld]'"
        ) from None


def _gaca(args: list[str], log_file: Path) -> None:
    """Run one gaca command in a subprocess; on failure raise with the end of its output."""
    cmd = [sys.executable, "-m", "gaca_cli", *args]
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write("$ gaca " + shlex.join(args) + "\n")
        fh.flush()
        env = {**os.environ, "NO_COLOR": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = " | ".join(log_file.read_text(encoding="utf-8").splitlines()[-3:])
        raise GacaError(f"`gaca {args[0]}` failed with status {proc.returncode} ({tail}); see {log_file}")


def _collect(model: Path, games, config: DemoConfig, seed: int, out: Path) -> float:
    """Collect with the model at `model` into `out` (kept when it exists); the success rate."""
    import pyarrow.parquet as pq

    from gaca_cli.demo import textworld_games as tw
    from gaca_cli.log.writing import write_parquet_atomic

    if not out.exists():
        policy = tw.LMPolicy(model, temperature=1.0, max_new_tokens=12, seed=seed)
        table = tw.collect(games, policy, config.rollouts, config.max_steps, seed)
        write_parquet_atomic(table, out, {})
    return tw.success_rate(pq.read_table(out, columns=["step_idx", "success"]))


def _has_signal(annotated: Path) -> bool:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    advantage = pq.read_table(annotated, columns=["advantage"])["advantage"]
    return bool(pc.any(pc.not_equal(advantage, 0.0)).as_py())


def _update(model: Path, log: Path, method: str, work: Path, config: DemoConfig, log_file: Path) -> tuple[Path, Path]:
    """score → advantages → train-offline. Returns (new model, annotated log); the model is
    unchanged when every advantage is 0 (no group had both wins and losses)."""
    work.mkdir(parents=True, exist_ok=True)
    scored, annotated, new_model = work / "scored.parquet", work / f"{method}.parquet", work / "model"
    if not scored.exists():
        _gaca(["score", str(log), "--model", str(model), "-o", str(scored)], log_file)
    if not annotated.exists():
        _gaca(["advantages", str(scored), "--method", method, "-o", str(annotated)], log_file)
    if not _has_signal(annotated):
        return model, annotated
    if not (new_model / "config.json").exists():
        inputs = ["train-offline", str(annotated), "--model", str(model), "-o", str(new_model)]
        recipe = ["--loss", "ppo", "--lr", str(config.lr), "--epochs", str(config.epochs), "--batch-size", "16"]
        _gaca([*inputs, *recipe, "--seed", str(config.seed)], log_file)
    return new_model, annotated


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoResult:
    """Run the demo into config.out (resumable: finished stages are kept and skipped)."""
    _require_textworld()
    from gaca_cli.demo import textworld_bc as bc
    from gaca_cli.demo import textworld_games as tw
    from gaca_cli.demo.quality import QualityConfig, estimator_quality
    from gaca_cli.lm.models import quiet_transformers

    quiet_transformers()
    say = progress or (lambda *_: None)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = out / "commands.log"
    result = DemoResult(rollouts=config.games * config.rollouts)
    clock = time.perf_counter()

    specs = tw.game_specs(config.games, 0)
    games_dir = Path(config.games_dir) if config.games_dir else out / "games"
    games = []
    for i, spec in enumerate(specs):
        say("games", i, len(specs), f"compiling TextWorld game {spec.name}")
        games.append((spec.name, tw.make_game(spec, games_dir)))
    say("games", len(specs), len(specs), f"{len(specs)} games ready")

    start = out / "start-model"
    if not (start / "config.json").exists():
        say("warm start", 0, config.bc_steps, "behaviour cloning on the walkthroughs")
        bc.warm_start(
            start,
            games,
            config.bc_steps,
            max_steps=config.max_steps,
            seed=config.seed,
            log=lambda step, loss: say("warm start", step, config.bc_steps, f"loss {loss:.3f}"),
        )
    say("warm start", config.bc_steps, config.bc_steps, "start model ready")
    result.seconds["setup"] = time.perf_counter() - clock

    clock = time.perf_counter()
    total = len(config.methods) * config.iterations + 1
    done = 0
    say("loop", done, total, "collecting with the start model")
    first = _collect(start, games, config, config.seed * 1000, out / "iter0.parquet")
    done += 1
    for method in config.methods:
        model, curve = start, [first]
        for k in range(config.iterations):
            work = out / method / f"iter{k}"
            log = out / "iter0.parquet" if k == 0 else work / "rollouts.parquet"
            say("loop", done, total, f"{method}: score → advantages → train-offline (iteration {k + 1})")
            model, annotated = _update(model, log, method, work, config, log_file)
            if k == 0 and method == "gaca":
                result.annotated = annotated
            say("loop", done, total, f"{method}: collecting with the updated policy")
            collected = out / method / f"iter{k + 1}" / "rollouts.parquet"
            curve.append(_collect(model, games, config, config.seed * 1000 + k + 1, collected))
            done += 1
        result.success[method] = curve
    if result.annotated is None:  # gaca not among the methods, or no iteration: annotate anyway
        result.annotated = out / "iter0.gaca.parquet"
        if not result.annotated.exists():
            _gaca(["advantages", str(out / "iter0.parquet"), "--method", "gaca", "-o", str(result.annotated)], log_file)
    result.seconds["loop"] = time.perf_counter() - clock

    clock = time.perf_counter()
    seeds = config.quality_seeds
    say("quality", 0, len(seeds), "estimators against exact Q − V")
    finished = []

    def on_seed(seed: int) -> None:
        finished.append(seed)
        say("quality", len(finished), len(seeds), f"seed {seed} done")

    result.quality = estimator_quality(QualityConfig(seeds=seeds, groups=8, rollouts=8), on_seed=on_seed)
    result.seconds["quality"] = time.perf_counter() - clock
    config_values = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    summary = {"config": config_values, **asdict(result)}  # the annotated log's path written as text
    (out / "demo.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    return result
