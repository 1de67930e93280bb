"""The parameters of `gaca advantages`: their defaults (docs/estimators.md), their help texts (the
fields with a help text are the command's options) and their validation."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from gaca_cli.config import ConfigError

EPS = 1e-6  # ε in norm(x) = (x − mean) / (std + ε)


Z_STD_FLOOR = 1e-8  # z_t = 0 where the scope's population std is below this


METHODS = ("grpo", "gigpo", "gaca")


NORMS = ("std", "mean")


EPISODE_STATS = ("trajectories", "steps")


NLL_SCOPES = ("trajectory", "group", "batch")


NLL_REDUCES = ("mean", "sum")


SIMILARITY_METRICS = ("lcs", "difflib")


SIMILARITY_ORDERS = ("sorted", "rows")


SINGLETON_GROUPS = ("zero", "raw")


@dataclass(frozen=True)
class AdvantagesConfig:
    """Every parameter of `gaca advantages`; the defaults are the spec's."""

    method: str = field(default="gaca", metadata={"help": f"Estimator: {' | '.join(METHODS)}.", "short": "-m"})
    gamma: float = field(default=0.95, metadata={"help": "Discount γ of the return-to-go G_t."})
    norm: str | None = field(  # None: the method's default (grpo: std; gigpo, gaca: mean)
        default=None, metadata={"help": "std | mean (default: std for grpo, mean for gigpo and gaca)."}
    )
    step_weight: float = field(
        default=1.0, metadata={"only": ("method", ("gigpo", "gaca")), "help": "ω: weight of the step-level signal."}
    )
    episode_stats: str = field(
        default="trajectories", metadata={"help": "Episode statistics over: trajectories | steps."}
    )
    anchor_similarity: float | None = field(
        default=None,
        metadata={
            "only": ("method", ("gigpo", "gaca")),
            "help": "θ in (0, 1): merge anchors with 2·LCS/(|a|+|b|) ≥ θ (default: exact equality).",
        },
    )
    similarity_metric: str = field(
        default="lcs",
        metadata={
            "only": ("anchor_similarity", "given"),
            "help": "Similarity of --anchor-similarity: lcs (2·LCS/(|a|+|b|)) | difflib (SequenceMatcher ratio, as verl-agent).",
        },
    )
    similarity_order: str = field(
        default="sorted",
        metadata={
            "only": ("anchor_similarity", "given"),
            "help": "Order --anchor-similarity clusters anchors in: sorted (texts sorted) | rows (first row in the file, as verl-agent).",
        },
    )
    singleton_groups: str = field(
        default="zero",
        metadata={
            "help": "A^E of an episode group of one (one row with --episode-stats steps, as verl-agent counts): "
            "zero | raw (mean 0, std 1: its own return, as verl-agent)."
        },
    )
    epsilon: float = field(default=EPS, metadata={"help": "ε in norm(x) = (x − mean) / (std + ε)."})
    beta: float = field(
        default=0.1,
        metadata={"only": ("method", ("gaca",)), "help": "β: how strongly NLL moves λ away from ω/(1+ω) (gaca)."},
    )
    nll_scope: str = field(
        default="trajectory",
        metadata={"only": ("method", ("gaca",)), "help": "Standardise NLL within: trajectory | group | batch."},
    )
    nll_reduce: str = field(
        default="mean",
        metadata={"only": ("method", ("gaca",)), "help": "Criticality u_t: mean (nats/token) | sum (nats)."},
    )
    lambda_min: float = field(default=0.0, metadata={"only": ("method", ("gaca",)), "help": "Lower clip of λ_t."})
    lambda_max: float = field(default=1.0, metadata={"only": ("method", ("gaca",)), "help": "Upper clip of λ_t."})

    def __post_init__(self) -> None:
        def bad(name: str, value: object, use: str) -> None:
            raise ConfigError(name, f"{name} = {value!r} is not valid; use {use}")

        choices = {
            "method": METHODS,
            "episode_stats": EPISODE_STATS,
            "nll_scope": NLL_SCOPES,
            "nll_reduce": NLL_REDUCES,
            "similarity_metric": SIMILARITY_METRICS,
            "similarity_order": SIMILARITY_ORDERS,
            "singleton_groups": SINGLETON_GROUPS,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                bad(name, getattr(self, name), " | ".join(allowed))
        if self.norm is not None and self.norm not in NORMS:
            bad("norm", self.norm, "std | mean")
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            bad("gamma", self.gamma, "a discount in [0, 1], e.g. 0.95")
        if not (math.isfinite(self.step_weight) and self.step_weight >= 0.0):
            bad(
                "step_weight",
                self.step_weight,
                "a finite weight ≥ 0 (0 leaves the episode signal alone: grpo's, under the same --norm)",
            )
        if self.anchor_similarity is not None and not (0.0 < self.anchor_similarity < 1.0):
            bad(
                "anchor_similarity",
                self.anchor_similarity,
                "a threshold strictly between 0 and 1, or leave it unset for exact anchors",
            )
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0.0):
            bad("epsilon", self.epsilon, "a finite value ≥ 0, e.g. 1e-06")
        if not (math.isfinite(self.beta) and self.beta >= 0.0):
            bad("beta", self.beta, "a finite value ≥ 0 (0 reproduces gigpo)")
        given = f"(lambda_min {self.lambda_min:g} and lambda_max {self.lambda_max:g} given)"
        if not (0.0 <= self.lambda_min <= self.lambda_max <= 1.0):
            # the option to change: the one out of [0, 1], else the one moved from its default
            if not 0.0 <= self.lambda_min <= 1.0:
                name = "lambda_min"
            elif not 0.0 <= self.lambda_max <= 1.0:
                name = "lambda_max"
            else:
                name = "lambda_max" if self.lambda_max != 1.0 else "lambda_min"
            bad(name, getattr(self, name), f"0 ≤ lambda_min ≤ lambda_max ≤ 1 {given}")
        if self.method == "gaca" and not (self.lambda_min <= self.lambda_bar <= self.lambda_max):
            name = "lambda_max" if self.lambda_bar > self.lambda_max else "lambda_min"
            bad(
                name,
                getattr(self, name),
                f"bounds around λ̄ = ω/(1+ω) = {self.lambda_bar:.4g}, the weight of steps without a step signal {given}",
            )

    @property
    def normalize_by_std(self) -> bool:
        if self.norm is None:
            return self.method == "grpo"
        return self.norm == "std"

    @property
    def lambda_bar(self) -> float:
        """λ̄ = ω / (1 + ω)."""
        return self.step_weight / (1.0 + self.step_weight)

    def as_metadata(self) -> dict:
        params = asdict(self)
        params["norm"] = "std" if self.normalize_by_std else "mean"
        return params
