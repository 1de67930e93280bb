"""Offline policy objectives, one value per action token, as pure torch functions.

Every function here takes flat 1-D tensors over the action tokens of a micro-batch (the
tokens of all its sequences, concatenated) and returns per-token losses; `token_weights`
then turns them into one scalar with the chosen aggregation. Nothing here reads files,
draws random numbers or knows about models: the formulas can be checked by hand.

Shapes and dtypes (N = number of action tokens in the micro-batch):
    logp           float32 [N]  log π_θ(y_t | x, y_<t) under the policy being trained (has grad)
    behavior_logp  float32 [N]  log μ(y_t | …) under the policy that produced the log (no grad)
    ref_logp       float32 [N]  log π_ref(y_t | …) under the starting model (no grad)
    adv            float32 [N]  the advantage A of the token's step, repeated on its tokens

Sign convention: every function returns a loss to *minimise*.
"""

from __future__ import annotations

from typing import Protocol

import torch

#: log-ratios are clamped to ±this before exp (as verl does) so that a stale behavior
#: log-prob cannot overflow the ratio; inside the clamp the gradient is exact.
MAX_LOG_RATIO = 20.0


def importance_ratio(logp: torch.Tensor, behavior_logp: torch.Tensor) -> torch.Tensor:
    """r_t = exp(clamp(log π_θ − log μ, −20, 20)), float32 [N]."""
    return torch.exp(torch.clamp(logp - behavior_logp, -MAX_LOG_RATIO, MAX_LOG_RATIO))


def clipped_surrogate(
    logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, Eq. 7; asymmetric ε as in DAPO):

        r_t  = exp(log π_θ(y_t) − log μ(y_t))
        ℓ_t  = −min( r_t·A,  clip(r_t, 1 − ε_low, 1 + ε_high)·A )

    Where the clipped branch is the smaller one the token carries no gradient (it already
    moved far enough from μ in the direction A asks for).

    Worked example (ε_low = ε_high = 0.2), checked in tests/lm/test_train_losses.py:

        r     A     r·A    clip(r)·A    ℓ       clipped
        1.5   +1    1.5    1.2         −1.2     yes (ratio above 1 + ε, A > 0)
        0.5   +1    0.5    0.8         −0.5     no  (pessimistic branch: unclipped)
        1.1   −2   −2.2   −2.2          2.2     no  (inside the trust region)
        0.5   −1   −0.5   −0.8          0.8     yes (ratio below 1 − ε, A < 0)

    token-mean = (−1.2 − 0.5 + 2.2 + 0.8) / 4 = 0.325. The gradient of ℓ_t with respect to
    log π_θ is −r_t·A where unclipped and 0 where clipped: (0, −0.5, 2.2, 0).

    Returns (ℓ [N], r [N] detached, clipped [N] bool).
    """
    ratio = importance_ratio(logp, behavior_logp)
    unclipped = ratio * adv
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = clipped_ratio * adv
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = clipped.detach() < unclipped.detach()
    return loss, ratio.detach(), was_clipped


def policy_gradient(
    logp: torch.Tensor,
    adv: torch.Tensor,
    behavior_logp: torch.Tensor | None = None,
    is_cap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage-weighted log-likelihood (REINFORCE on the logs), per token:

        ℓ_t = −w_t · A · log π_θ(y_t),   w_t = sg(min(r_t, c))  with  c = is_cap,  else w_t = 1

    sg = stop-gradient: the truncated importance weight (Espeholt et al. 2018, IMPALA's
    truncation) corrects for the logs coming from μ but does not itself get a gradient, so
    ∂ℓ_t/∂log π_θ = −w_t·A. Example: log π_θ = −2, A = 0.5, r = 3, c = 2 gives ℓ = −2·0.5·(−2)
    = 2 and gradient −1.

    Returns (ℓ [N], w [N] detached).
    """
    if is_cap is not None:
        if behavior_logp is None:
            raise ValueError("truncated importance weights need behavior log-probs")
        weight = torch.clamp(importance_ratio(logp.detach(), behavior_logp), max=is_cap)
    else:
        weight = torch.ones_like(logp).detach()
    return -weight * adv * logp, weight


def awr_weights(adv: torch.Tensor, temperature: float, max_weight: float) -> torch.Tensor:
    """w = min(exp(A / τ), w_max) (Peng et al. 2019, AWR Eq. 7 with the paper's weight clip)."""
    return torch.clamp(torch.exp(torch.clamp(adv / temperature, max=80.0)), max=max_weight)


def advantage_weighted_regression(
    logp: torch.Tensor, adv: torch.Tensor, temperature: float, max_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """ℓ_t = −min(exp(A/τ), w_max) · log π_θ(y_t): weighted behaviour cloning.

    All weights are positive, so AWR moves π_θ towards the distribution ∝ μ·exp(A/τ): an action
    whose normalised weight is below its current probability loses probability. Example:
    A = 1, τ = 1, w_max = 20, log π_θ = −3 gives w = e ≈ 2.718 and ℓ ≈ 8.155.

    Returns (ℓ [N], w [N]).
    """
    weight = awr_weights(adv, temperature, max_weight).detach()
    return -weight * logp, weight


def filtered_bc(logp: torch.Tensor, adv: torch.Tensor, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Supervised fine-tuning on the steps with A > threshold:  ℓ_t = −1[A > θ] · log π_θ(y_t).

    Returns (ℓ [N], kept [N] as 0/1 float)."""
    keep = (adv > threshold).to(logp.dtype)
    return -keep * logp, keep


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate "k3" (Schulman 2020, "Approximating KL divergence"):

        δ_t = log π_ref(y_t) − log π_θ(y_t),    k3_t = exp(δ_t) − δ_t − 1  ≥ 0

    Unbiased for KL(π_θ‖π_ref) when y ~ π_θ, zero iff the two agree on the token. Example:
    δ = log 2 gives 2 − 0.6931 − 1 = 0.3069; δ = 0 gives 0. The log-ratio is clamped to ±20.
    """
    delta = torch.clamp(ref_logp - logp, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(delta) - delta - 1.0


def token_weights(
    seq_of_token: torch.Tensor,
    seq_lengths: torch.Tensor,
    aggregation: str,
    n_tokens_total: float,
    n_seqs_total: float,
) -> torch.Tensor:
    """Weights c_t such that the optimiser step's loss is Σ_t c_t·ℓ_t over all its micro-batches.

        token-mean:  c_t = 1 / Ntok                 (every token of the step counts the same)
        seq-mean:    c_t = 1 / (|y_i| · Nseq)       (mean over the tokens of sequence i, then
                                                     over the sequences of the step)

    Ntok and Nseq count the whole optimiser step (all micro-batches, all processes), so that
    gradient accumulation and data parallelism give the same gradient as one big batch.
    seq_of_token: int64 [N] index (into seq_lengths) of each token's sequence;
    seq_lengths: [B] action-token counts. Example: two sequences of 1 and 3 tokens; token-mean
    gives (¼, ¼, ¼, ¼), seq-mean gives (½, ⅙, ⅙, ⅙).
    """
    if aggregation == "token-mean":
        return torch.full(seq_of_token.shape, 1.0 / n_tokens_total, dtype=torch.float32, device=seq_of_token.device)
    if aggregation == "seq-mean":
        lengths = seq_lengths.to(torch.float32)[seq_of_token]
        return 1.0 / (lengths * n_seqs_total)
    raise ValueError(f"unknown aggregation {aggregation!r}; use token-mean or seq-mean")


class LossParams(Protocol):
    """The objective's knobs, read by attribute (`train_config.TrainConfig` has them all)."""

    @property
    def clip_low(self) -> float: ...
    @property
    def clip_high(self) -> float: ...
    @property
    def is_cap(self) -> float | None: ...
    @property
    def awr_temperature(self) -> float: ...
    @property
    def awr_max_weight(self) -> float: ...
    @property
    def bc_threshold(self) -> float: ...


def _ppo(logp, adv, behavior_logp, p: LossParams):
    if behavior_logp is None:
        raise ValueError("ppo needs behavior log-probs")
    loss, _, clipped = clipped_surrogate(logp, behavior_logp, adv, p.clip_low, p.clip_high)
    return loss, {"clipped": clipped}


def _pg(logp, adv, behavior_logp, p: LossParams):
    loss, _ = policy_gradient(logp, adv, behavior_logp, p.is_cap)
    return loss, {}


def _awr(logp, adv, behavior_logp, p: LossParams):
    loss, _ = advantage_weighted_regression(logp, adv, p.awr_temperature, p.awr_max_weight)
    return loss, {}


def _filtered_bc(logp, adv, behavior_logp, p: LossParams):
    loss, _ = filtered_bc(logp, adv, p.bc_threshold)
    return loss, {}


#: --loss NAME -> per-token objective, one signature: (logp, adv, behavior_logp | None, params)
#: -> (ℓ [N], detached per-token diagnostics). The CLI's choices (train_config.LOSSES) match its keys.
TOKEN_LOSSES = {"ppo": _ppo, "pg": _pg, "awr": _awr, "filtered-bc": _filtered_bc}


def policy_token_loss(
    name: str,
    logp: torch.Tensor,
    adv: torch.Tensor,
    behavior_logp: torch.Tensor | None,
    params: LossParams,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The objective `name`'s per-token loss ℓ_t [N] and detached per-token diagnostics:
    `ratio` (r_t, whenever behavior log-probs are given) and `clipped` (ppo)."""
    if name not in TOKEN_LOSSES:
        raise ValueError(f"unknown loss {name!r}; use one of {', '.join(TOKEN_LOSSES)}")
    loss, stats = TOKEN_LOSSES[name](logp, adv, behavior_logp, params)
    if behavior_logp is not None:
        stats["ratio"] = importance_ratio(logp.detach(), behavior_logp)
    return loss, stats
