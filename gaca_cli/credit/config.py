"""The parameters of `gaca advantages`: their defaults (docs/estimators.md), their help texts (the
fields with a help text are the command's options) and their validation."""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field

from gaca_cli.config import check_choices, invalid

EPS = 1e-6  # ε in norm(x) = (x − mean) / (std + ε)

Z_STD_FLOOR = 1e-8  # z_t = 0 where the scope's population std is below this

Method = typing.Literal["grpo", "gigpo", "gaca", "hgpo"]
METHODS: tuple[Method, ...] = typing.get_args(Method)  # the keys of estimators.ESTIMATORS (a test checks it)
Norm = typing.Literal["std", "mean"]
EpisodeStats = typing.Literal["trajectories", "steps"]
SimilarityMetric = typing.Literal["lcs", "difflib"]
SimilarityOrder = typing.Literal["sorted", "rows"]
SingletonGroups = typing.Literal["zero", "raw"]
NllScope = typing.Literal["trajectory", "group", "batch"]
NllReduce = typing.Literal["mean", "sum"]


@dataclass(frozen=True)
class AdvantagesConfig:
    """Every parameter of `gaca advantages`; the defaults are the spec's."""

    method: Method = field(default="gaca", metadata={"help": "The estimator.", "short": "-m"})
    gamma: float = field(default=0.95, metadata={"help": "Discount γ of the return-to-go G_t."})
    norm: Norm | None = field(  # None: the method's default
        default=None,
        metadata={
            "help": "Normalise by std, or only subtract the mean, at both levels.",
            "default_text": "std (grpo, hgpo), mean (gigpo, gaca)",
        },
    )
    step_weight: float = field(
        default=1.0, metadata={"only": ("method", ("gigpo", "gaca")), "help": "ω: weight of the step-level signal."}
    )
    episode_stats: EpisodeStats = field(
        default="trajectories",
        metadata={"help": "Episode mean/std over trajectories, or over step rows (`steps`, as verl-agent)."},
    )
    anchor_similarity: float | None = field(
        default=None,
        metadata={
            "only": ("method", ("gigpo", "gaca", "hgpo")),
            "help": "θ in (0, 1): merge anchors with 2·LCS/(|a|+|b|) ≥ θ.",
            "default_text": "exact",
        },
    )
    similarity_metric: SimilarityMetric = field(
        default="lcs",
        metadata={
            "only": ("anchor_similarity", "given"),
            "help": "Similarity of --anchor-similarity: 2·LCS/(|a|+|b|), or `difflib` (SequenceMatcher ratio, as verl-agent).",
        },
    )
    similarity_order: SimilarityOrder = field(
        default="sorted",
        metadata={
            "only": ("anchor_similarity", "given"),
            "help": "The order anchors are clustered in: texts sorted, or `rows` (first row first, as verl-agent).",
        },
    )
    singleton_groups: SingletonGroups = field(
        default="zero",
        metadata={
            "help": "A^E of an episode group of one (of one row with --episode-stats steps, as verl-agent counts): "
            "0, or `raw` (its own return, as verl-agent)."
        },
    )
    epsilon: float = field(default=EPS, metadata={"help": "ε in (x − mean)/(std + ε)."})
    beta: float = field(
        default=0.1,
        metadata={"only": ("method", ("gaca",)), "help": "β: how strongly NLL moves λ away from λ̄ = ω/(1+ω)."},
    )
    nll_scope: NllScope = field(
        default="trajectory",
        metadata={"only": ("method", ("gaca",)), "help": "Standardise NLL within trajectory, group or batch."},
    )
    nll_reduce: NllReduce = field(
        default="mean",
        metadata={
            "only": ("method", ("gaca",)),
            "help": "Criticality = NLL per token (`mean`, nats/token) or total (`sum`, nats).",
        },
    )
    lambda_min: float = field(default=0.0, metadata={"only": ("method", ("gaca",)), "help": "Lower clip of λ_t."})
    lambda_max: float = field(default=1.0, metadata={"only": ("method", ("gaca",)), "help": "Upper clip of λ_t."})
    history_length: int = field(
        default=2,
        metadata={"only": ("method", ("hgpo",)), "help": "K: history groups match the last 1..K+1 anchors (hgpo)."},
    )
    length_weight_alpha: float = field(
        default=1.0,
        metadata={
            "only": ("method", ("hgpo",)),
            "help": "α: the history group of the last k anchors weighs (k+1)^α (hgpo).",
        },
    )
    base_group: bool = field(
        default=False,
        metadata={
            "only": ("method", ("hgpo",)),
            "negatable": True,
            "help": "Add the episode advantage A^E as an item of weight 1 (hgpo).",
        },
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if not (math.isfinite(self.gamma) and 0.0 <= self.gamma <= 1.0):
            invalid(self, "gamma", "a discount in [0, 1], e.g. 0.95")
        if not (math.isfinite(self.step_weight) and self.step_weight >= 0.0):
            invalid(
                self,
                "step_weight",
                "a finite weight ≥ 0 (0 leaves the episode signal alone: grpo's, under the same --norm)",
            )
        if self.anchor_similarity is not None and not (0.0 < self.anchor_similarity < 1.0):
            invalid(
                self, "anchor_similarity", "a threshold strictly between 0 and 1, or leave it unset for exact anchors"
            )
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0.0):
            invalid(self, "epsilon", "a finite value ≥ 0, e.g. 1e-06")
        if isinstance(self.history_length, bool) or not (
            isinstance(self.history_length, int) and self.history_length >= 0
        ):
            invalid(self, "history_length", "a whole number of past steps ≥ 0, e.g. 2")
        if not (abs(self.length_weight_alpha) * math.log(self.history_length + 2) < 700):  # (K+2)^α in float64
            invalid(
                self,
                "length_weight_alpha",
                f"an exponent with (K+2)^α finite and > 0 (K = {self.history_length}), e.g. 1",
            )
        if not (math.isfinite(self.beta) and self.beta >= 0.0):
            invalid(self, "beta", "a finite value ≥ 0 (0 reproduces gigpo)")
        given = f"(lambda_min {self.lambda_min:g} and lambda_max {self.lambda_max:g} given)"
        if not (0.0 <= self.lambda_min <= self.lambda_max <= 1.0):
            # the option to change: the one out of [0, 1], else the one moved from its default
            if not 0.0 <= self.lambda_min <= 1.0:
                name = "lambda_min"
            elif not 0.0 <= self.lambda_max <= 1.0:
                name = "lambda_max"
            else:
                name = "lambda_max" if self.lambda_max != 1.0 else "lambda_min"
            invalid(self, name, f"0 ≤ lambda_min ≤ lambda_max ≤ 1 {given}")
        if self.method == "gaca" and not (self.lambda_min <= self.lambda_bar <= self.lambda_max):
            name = "lambda_max" if self.lambda_bar > self.lambda_max else "lambda_min"
            invalid(
                self,
                name,
                f"bounds around λ̄ = ω/(1+ω) = {self.lambda_bar:.4g}, the weight of steps without a step signal {given}",
            )

    @property
    def normalize_by_std(self) -> bool:
        if self.norm is None:
            return self.method in ("grpo", "hgpo")
        return self.norm == "std"

    @property
    def lambda_bar(self) -> float:
        """λ̄ = ω / (1 + ω)."""
        return self.step_weight / (1.0 + self.step_weight)

    def as_metadata(self) -> dict:
        params = asdict(self)
        params["norm"] = "std" if self.normalize_by_std else "mean"
        return params
